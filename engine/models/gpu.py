"""How many of a model's layers go to the GPU (`--gpu auto`, `--gpu-layers N`).

llama.cpp counts a model's repeating blocks plus its output head as layers, and offloads from the top: with
n_gpu_layers = k the head goes first, then the last k - 1 blocks (llama-model.cpp, i_gpu_start); the input
embeddings always stay on the CPU. Auto offloads as many as fit the GPUs' free memory, each block with its
share of the KV cache, after a reserve for the compute buffers and a margin. The decision (fit_layers, decide)
is pure; place() gathers what it is made from.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.models import gguf

log = logging.getLogger("llamadesk.engine")
ALL = -1  # llama.cpp's n_gpu_layers for every layer
# what the driver, the display, other programs and the error of this estimate may take; llama.cpp's own
# fitting (llama-server --fit) leaves 1 GiB
MARGIN = 512 << 20
_BLOCK = re.compile(r"blk\.(\d+)\.")
_COUNT = re.compile(r"-1|\d{1,9}")


class Device(Protocol):
    """A GPU as ggml's backend registry describes it (engine/llama.py's GpuDevice)."""
    name: str
    description: str
    free: int
    total: int


@dataclass(frozen=True)
class Layers:
    """A GGUF's weights as llama.cpp places them: bytes per repeating block, and of the output head."""
    blocks: tuple[int, ...]
    output: int

    @property
    def count(self) -> int:
        """Layers as llama.cpp counts them (the head is one)."""
        return len(self.blocks) + 1


@dataclass(frozen=True)
class Placement:
    """Where a model runs: llama.cpp's n_gpu_layers, and what /v1/models and the log say about it."""
    gpu_layers: int
    offloaded: int  # layers on the GPU devices, of total
    total: int
    devices: tuple[str, ...] = ()  # the GPU devices holding them (empty: all on the CPU)
    why: str = ""


def requested(value: str | int | None) -> int | None:
    """--gpu-layers as a count: None for auto (as many as fit), ALL for all (or -1); ValueError for anything
    else."""
    if value is None or value == "auto":
        return None
    if value == "all":
        return ALL
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            isinstance(value, str) and not _COUNT.fullmatch(value):
        raise ValueError(value)
    if int(value) < ALL:
        raise ValueError(value)
    return int(value)


def model_layers(path: Path) -> Layers:
    """Per-block and head sizes from the GGUF's tensor table."""
    sizes = gguf.tensor_sizes(path)
    blocks: dict[int, int] = {}
    for name, size in sizes.items():
        if m := _BLOCK.match(name):
            blocks[int(m[1])] = blocks.get(int(m[1]), 0) + size
    head = sum(size for name, size in sizes.items() if name.startswith("output"))  # output.weight, output_norm
    if "output.weight" not in sizes:  # tied embeddings: llama.cpp copies token_embd into the head's buffer
        head += sizes.get("token_embd.weight", 0)
    return Layers(tuple(blocks[i] for i in sorted(blocks)), head)


def fit_layers(free: int, layers: Layers, kv_per_block: int, reserve: int) -> int:
    """How many layers fit in free bytes of device memory after reserve, in llama.cpp's order (the head,
    then blocks from the last), each block with its KV cache."""
    budget = free - reserve - layers.output
    if budget < 0:
        return 0
    n = 1
    for size in reversed(layers.blocks):
        budget -= size + kv_per_block
        if budget < 0:
            break
        n += 1
    return n


def decide(devices: list[Device], layers: Layers, kv_per_block: int, reserve: int,
           wanted: int | None) -> Placement:
    """The placement on devices (llama.cpp splits the layers across them by free memory): wanted layers
    (ALL: every one), or as many as fit when wanted is None."""
    total = layers.count
    if not devices:
        return Placement(0, 0, total, why="llama.cpp finds no GPU device (a CPU-only build, or no GPU driver)")
    free = sum(d.free for d in devices)
    if wanted is None:
        n = fit_layers(free, layers, kv_per_block, reserve)
        why = f"{n} of {total} layers fit {free >> 20} MiB free"
    else:
        n = total if wanted == ALL else min(wanted, total)
        why = f"--gpu-layers {'all' if wanted == ALL else wanted}"
    names = tuple(d.name if d.description in ("", d.name) else f"{d.name} ({d.description})" for d in devices)
    return Placement(n, n, total, names if n else (), why)


_said_no_gpu = False


def place(path: Path, ctx: int, streams: int, kv_dtype: str, chunk: int, gpu: str, gpu_layers: str | int | None,
          devices: list[Device]) -> Placement:
    """Where the model at path runs with these settings on devices (the GPUs the build offers): --gpu off keeps
    it on the CPU; otherwise decide() with its per-layer sizes and KV share from the GGUF."""
    layers = model_layers(path)
    if gpu == "off":
        return Placement(0, 0, layers.count, why="--gpu off")
    fp = gguf.footprint(path, ctx, streams, kv_dtype, chunk)
    placement = decide(devices, layers, fp.kv // max(1, len(layers.blocks)), fp.compute + MARGIN,
                       requested(gpu_layers))
    global _said_no_gpu
    if devices:
        if placement.offloaded:
            log.info("%s: %d/%d layers on %s (%s)", path.name, placement.offloaded, placement.total,
                     ", ".join(placement.devices), placement.why)
        else:
            log.info("%s: all %d layers on the CPU (%s)", path.name, placement.total, placement.why)
    elif not _said_no_gpu:
        _said_no_gpu = True
        log.info("GPU: %s; models run on the CPU", placement.why)
    return placement
