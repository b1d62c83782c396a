"""Which ggml backends this process loads: the CPU variant that is safe on this machine, plus any GPU/RPC backend the
build carries.

A wheel built with GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS (the bundles') ships one `libggml-cpu-<variant>`
per CPU class next to libllama; each scores itself against the CPU it runs on (its `ggml_backend_score`), and
llama.cpp would load the best scoring one. Some machines advertise instructions that fault: this box's VM reports
AMX, and ggml's AMX kernel dies with SIGILL on the first quantized matmul. So before the first model loads, a child
process loads the best variant and decodes with that model; if the child dies, that variant is excluded and the
next one tried. The verdicts are remembered per CPU (a hash of its identity and flags) in the cache dir, so the probe
runs once per machine and variant. A native build (no variant files) loads as llama.cpp always did.

Run as `python -m engine.backends probe VARIANT MODEL` (or `llamadesk probe-cpu …` in a bundle) it is that child.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

log = logging.getLogger("llamadesk.engine")
PROBE_TIMEOUT_S = 120.0
_SUFFIX = {"win32": ".dll", "darwin": ".so"}.get(sys.platform, ".so")  # ggml names its modules .so on macOS too


@dataclass(frozen=True)
class Variant:
    name: str  # "haswell", "sapphirerapids", …
    path: Path
    score: int  # the variant's own ggml_backend_score on this CPU; 0 = cannot run here


@dataclass
class Choice:
    """What was loaded, and what was passed over and why (for the log, /v1/stats and the benchmark)."""
    variant: Variant | None  # None: a build without CPU variants (llama.cpp loads its one CPU backend)
    excluded: list[tuple[str, str]] = field(default_factory=list)
    others: list[str] = field(default_factory=list)  # GPU/RPC backend modules loaded beside it
    note: str | None = None  # why the variant in use was not proven here: "unprobed: …", "the last resort: …"

    def describe(self) -> str:
        if self.variant is None:
            return "built-in CPU backend"
        said = [self.note] if self.note else []
        if self.excluded:
            said.append("excluded: " + ", ".join(f"{n}: {why}" for n, why in self.excluded))
        return f"CPU variant {self.variant.name}" + (f" ({'; '.join(said)})" if said else "")


def library_dir() -> Path:
    """Where llama-cpp-python keeps libllama and the ggml modules."""
    import llama_cpp
    return Path(llama_cpp.__file__).parent / "lib"


def cpu_variants(libdir: Path) -> list[Variant]:
    """The CPU variants in libdir that can run on this CPU, best first (an empty list for a native build)."""
    found = []
    for path in sorted(libdir.glob(f"*ggml-cpu-*{_SUFFIX}")):
        name = path.name.split("ggml-cpu-", 1)[1].removesuffix(_SUFFIX)
        score = _score(path)
        if score > 0:
            found.append(Variant(name, path, score))
    return sorted(found, key=lambda v: -v.score)


def _score(path: Path) -> int:
    """The variant's own verdict on this CPU (it only reads cpuid; loading it runs none of its kernels)."""
    try:
        lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
        fn = lib.ggml_backend_score
    except (OSError, AttributeError):
        return 0
    fn.restype = ctypes.c_int
    return int(fn())


def cpu_signature() -> str:
    """A stable id of this CPU model and the features it advertises (a VM can hide or fake some)."""
    ident = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
        ident += [ln for ln in first.splitlines()
                  if ln.split(":")[0].strip() in ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")]
    except OSError:
        pass
    return hashlib.sha1("\n".join(ident).encode()).hexdigest()[:16]


class Verdicts:
    """Per CPU signature, per variant: "ok" or the reason it failed; a JSON file in the cache dir."""

    def __init__(self, path: Path | None, signature: str):
        self.path, self.signature = path, signature
        self._all: dict[str, dict[str, str]] = {}
        if path is not None:
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                data = None  # none yet, or unreadable: probe again
            # only {signature: {variant: verdict}} is read: anything else in the file is probed again
            self._all = {sig: {v: why for v, why in mine.items() if isinstance(why, str)}
                         for sig, mine in (data.items() if isinstance(data, dict) else ()) if isinstance(mine, dict)}

    def get(self, variant: str) -> str | None:
        return self._all.get(self.signature, {}).get(variant)

    def put(self, variant: str, verdict: str) -> None:
        self._all.setdefault(self.signature, {})[variant] = verdict
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._all, indent=1))
                tmp.replace(self.path)
            except OSError as e:
                log.warning("cannot remember the CPU variant verdict in %s: %s", self.path, e)


OK = "ok"  # passed with a quantized model (the kernels that fault, AMX's, are quantized matmuls)
OK_FLOAT = "ok with a float model"  # passed, but ran no quantized kernel: a quantized model probes again


@dataclass(frozen=True)
class Outcome:
    """What one probe child showed: passed (why is None); failed because of the variant (a fault, or it would not
    load), conclusive and remembered; or nothing about it (the model would not load, no answer in time): then
    the variant is used unprobed, and nothing is remembered."""
    why: str | None = None
    conclusive: bool = True


def choose(variants: list[Variant], probe: Callable[[Variant], Outcome] | None, verdicts: Verdicts,
           quantized: bool = True) -> Choice:
    """The best variant whose probe passes (remembered verdicts are not probed again; a pass with a float model
    is, when this model is quantized); the last resort is the lowest one, which uses no instruction beyond the
    baseline, unprobed. Without a probe (no model to probe with) the best one not remembered as failing,
    unprobed; a probe that shows nothing about its variant (inconclusive) leaves that one in use, unprobed."""
    choice = Choice(None)
    for v in variants:
        verdict = verdicts.get(v.name)
        if verdict == OK_FLOAT and quantized:
            verdict = None
        if verdict is None and probe is None:
            choice.variant = v
            return choice
        if verdict is None:
            outcome = probe(v)
            if not outcome.conclusive:
                choice.variant, choice.note = v, f"unprobed: {outcome.why}"
                return choice
            verdict = outcome.why or (OK if quantized else OK_FLOAT)
            verdicts.put(v.name, verdict)
        if verdict in (OK, OK_FLOAT):
            choice.variant = v
            return choice
        choice.excluded.append((v.name, verdict))
    if variants:  # every one failed: the baseline, which needs nothing beyond the architecture's own
        choice.variant = variants[-1]
        choice.note = f"the last resort: {choice.excluded.pop()[1]}"
    return choice


def probe_command(variant: Path, model: Path) -> list[str]:
    if getattr(sys, "frozen", False):  # a PyInstaller bundle: its executable dispatches the subcommand
        return [sys.executable, "probe-cpu", str(variant), str(model)]
    return [sys.executable, "-m", "engine.backends", "probe", str(variant), str(model)]


# the probe child's exit statuses that are about the variant (probe_child): it would not load, or decoding failed
_VARIANT_FAILED = {3, 6}


def run_probe(variant: Variant, model: Path, timeout: float = PROBE_TIMEOUT_S,
              command: Callable[[Path, Path], list[str]] = probe_command) -> Outcome:
    """Run the probe child for variant: passed, failed ("killed by SIGILL", conclusive), or inconclusive (the model
    would not load, no answer in time: a loaded machine or a slow disk say nothing about the CPU)."""
    try:
        r = subprocess.run(command(variant.path, model), capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(f"no answer in {timeout:.0f} s", conclusive=False)
    if r.returncode == 0:
        return Outcome()
    if r.returncode < 0:
        try:
            return Outcome(f"killed by {signal.Signals(-r.returncode).name}")
        except ValueError:
            return Outcome(f"killed by signal {-r.returncode}")
    tail = r.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return Outcome(f"exit status {r.returncode} {tail[0][:200]}".strip(), r.returncode in _VARIANT_FAILED)


_choice: Choice | None = None


def current() -> Choice | None:
    """What load() chose in this process (None before the first model loads)."""
    return _choice


def load(model: Path | None, cache_dir: Path | None) -> Choice:
    """Load the backends this process will use, once, before llama.cpp initialises: with CPU variants present, the
    best that survives the probe with this model (unprobed when no model is given), then the other backend modules."""
    global _choice
    if _choice is not None:
        return _choice
    libdir = library_dir()
    variants = cpu_variants(libdir)
    if not variants:
        _choice = Choice(None)
        return _choice
    verdicts = Verdicts(cache_dir / "cpu-variants.json" if cache_dir else None, cpu_signature())
    choice = choose(variants, (lambda v: run_probe(v, model)) if model else None, verdicts,
                    quantized=model is not None and is_quantized(model))
    ggml = _ggml(libdir)
    if not ggml.ggml_backend_load(str(choice.variant.path).encode()):
        raise OSError(f"cannot load {choice.variant.path}")
    for path in sorted(libdir.glob(f"*ggml-*{_SUFFIX}")):  # GPU and RPC modules the build carries
        kind = path.name.split("ggml-", 1)[1].removesuffix(_SUFFIX)
        if kind not in ("base", "cpu") and not kind.startswith("cpu-") and "." not in kind:
            if ggml.ggml_backend_load(str(path).encode()):
                choice.others.append(kind)
    if choice.excluded or choice.note:
        log.warning("CPU: using the %s variant%s%s", choice.variant.name, f" ({choice.note})" if choice.note else "",
                    "".join(f"; {n} excluded ({why})" for n, why in choice.excluded))
    else:
        log.info("CPU: using the %s variant", choice.variant.name)
    _choice = choice
    return choice


_FLOAT_FILE_TYPES = {0, 1, 32}  # llama.cpp's ALL_F32, MOSTLY_F16, MOSTLY_BF16


def is_quantized(model: Path) -> bool:
    """Whether the GGUF's weights are mostly quantized (its general.file_type); unreadable: not known to be."""
    from engine.models.gguf import read_metadata
    try:
        file_type = read_metadata(model).get("general.file_type")
    except (OSError, ValueError):
        return False
    return isinstance(file_type, int) and file_type not in _FLOAT_FILE_TYPES


def before_init(model: Path | str | None) -> Choice:
    """What engine/llama.py's init_backend runs before llama_backend_init: load() with the app's cache dir (where the
    verdicts are kept). A native build returns at once; a GGML_BACKEND_DL build has no CPU backend without it."""
    import platformdirs
    from engine.config import APP_NAME
    return load(Path(model) if model else None, Path(platformdirs.user_cache_dir(APP_NAME)))


# A wheel cannot hold symlinks, so libggml.so and libggml.so.0 are two copies (a bundle may hold a third), and the
# dynamic linker takes two files for two libraries, each with its own backend registry. A backend must be registered
# in the copy libllama links, or llama.cpp says "no backends are loaded": that is the one already loaded under its
# soname (RTLD_NOLOAD opens nothing new), else the file of that name beside libllama.
_LIBGGML = {"win32": ("ggml.dll",), "darwin": ("libggml.0.dylib", "libggml.dylib")}.get(
    sys.platform, ("libggml.so.0", "libggml.so"))


def _ggml(libdir: Path) -> ctypes.CDLL:
    lib = _loaded(_LIBGGML[0]) or ctypes.CDLL(
        str(next((libdir / n for n in _LIBGGML if (libdir / n).exists()), libdir / _LIBGGML[-1])))
    lib.ggml_backend_load.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_load.restype = ctypes.c_void_p
    return lib


def _loaded(soname: str) -> ctypes.CDLL | None:
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is None:
        return None
    try:
        return ctypes.CDLL(soname, mode=noload | os.RTLD_LAZY)
    except OSError:
        return None


def probe_child(variant: str, model: str) -> int:
    """The child: this variant alone, the model loaded as a server would (weights in the variant's extra buffer
    types, where the AMX kernel lives), a few tokens decoded. A fault kills this process, not the app."""
    _die_with_parent()
    import llama_cpp as L
    if not _ggml(library_dir()).ggml_backend_load(variant.encode()):
        print(f"cannot load {variant}", file=sys.stderr)
        return 3
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    m = L.llama_model_load_from_file(model.encode(), mp)
    if not m:
        print(f"cannot load {model}", file=sys.stderr)
        return 4
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, 32, 32
    ctx = L.llama_init_from_model(m, cp)
    if not ctx:
        print("cannot create a context", file=sys.stderr)
        return 5
    vocab = L.llama_model_get_vocab(m)
    n = 16
    tokens = (L.llama_token * n)(*[i % max(1, L.llama_vocab_n_tokens(vocab)) for i in range(1, n + 1)])
    rc = L.llama_decode(ctx, L.llama_batch_get_one(tokens, n))
    L.llama_free(ctx)
    L.llama_model_free(m)
    return 0 if rc == 0 else 6


def _die_with_parent() -> None:
    """On Linux, this child is killed when the app that waits for it dies (a SIGTERM during start-up)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "probe":
        sys.exit(probe_child(sys.argv[2], sys.argv[3]))
    print("usage: python -m engine.backends probe VARIANT MODEL", file=sys.stderr)
    sys.exit(2)
