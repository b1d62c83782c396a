"""What this process and machine are: version, resident memory, the hardware line; and the one
percentile summary every latency counter uses."""
from __future__ import annotations

import os
import platform

import numpy as np

from engine import backends, llama

VERSION = "0.1.0"


def percentiles(vals) -> dict[str, float]:
    """avg, p50 and p95 of vals (linear interpolation between ranks, as numpy does); zeros when empty."""
    vals = list(vals)
    if not vals:
        return {"avg": 0.0, "p50": 0.0, "p95": 0.0}
    p50, p95 = np.percentile(vals, [50, 95])
    return {"avg": round(float(np.mean(vals)), 2), "p50": round(float(p50), 2), "p95": round(float(p95), 2)}


def rss_bytes() -> int:
    """Resident memory of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def hardware_line() -> str:
    """One line naming the CPU, core count, memory, in a build with CPU variants the variant in use (and any passed
    over as unsafe here), the GPUs llama.cpp can offload to, then llama.cpp's CPU features: the long list last, so
    a line cut short for display still says what runs the models."""
    choice = backends.current()
    variant = f"; {choice.describe()}" if choice is not None and choice.variant is not None else ""
    gpus = "".join(f"; GPU {d.name}: {d.description}, {d.total / 2**30:.1f} GiB" for d in llama.gpu_devices())
    machine, features = _machine()
    return f"{machine}{variant}{gpus}; llama.cpp: {features or 'no CPU backend loaded yet'}"


_machine_line: str | None = None
_features: str = ""


def _machine() -> tuple[str, str]:
    """The CPU, cores and memory (read once); llama.cpp's CPU features, read until a CPU backend is loaded (a
    GGML_BACKEND_DL build has none before its first model: setup mode)."""
    global _machine_line, _features
    if _machine_line is None:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        except OSError:
            pass
        ram = total_ram_bytes()
        _machine_line = f"{cpu}, {os.cpu_count()} cores" + (f", {ram / 2**30:.0f} GiB RAM" if ram else "")
    if not _features:
        # "CPU : SSE3 = 1 | SSSE3 = 1 | …": the names of the features it uses, without the section's label
        _features = " ".join(p.split("=")[0].split(":")[-1].strip() for p in llama.system_info().split("|")
                             if p.strip().endswith("= 1"))
    return _machine_line, _features


def total_ram_bytes() -> int:
    """This machine's physical memory in bytes (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
