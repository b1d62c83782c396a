"""What a GGUF needs in memory, read from its header without loading it.

The header's scalar metadata (block count, heads, embedding size) is enough to size the KV cache; arrays
(the vocabulary) are skipped, not parsed, so a 150k-token vocabulary costs one pass over its length fields.
llama.cpp cannot tell this without loading the weights (a vocab-only load leaves the layer shapes unset), and
the `gguf` package's reader builds an object per array element, which takes seconds on large vocabularies.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class NotGGUF(ValueError):
    """The file is not a GGUF this reader understands (or is cut short)."""


def read_metadata(path: Path) -> dict[str, object]:
    """The header's scalar and string metadata; arrays appear as their length (key + '.length')."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        try:
            return _parse(m)
        except (struct.error, IndexError, UnicodeDecodeError) as e:
            raise NotGGUF(f"{path.name}: the GGUF header is cut short or malformed ({e})") from None


def _parse(m) -> dict[str, object]:
    return _header(m)[0]


def _header(m) -> tuple[dict[str, object], int]:
    """The metadata and where the tensor infos that follow it start."""
    if m[:4] != b"GGUF":
        raise NotGGUF("not a GGUF file")
    version, _, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        raise NotGGUF(f"GGUF version {version} is too old")
    pos, out = 24, {}

    def string(p: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", m, p)
        return bytes(m[p + 8:p + 8 + n]).decode("utf-8"), p + 8 + n

    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", m, pos)
        pos += 4
        if kind in _SCALARS:
            (out[key],) = struct.unpack_from(_SCALARS[kind], m, pos)
            pos += struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            out[key], pos = string(pos)
        elif kind == _ARRAY:
            item, n = struct.unpack_from("<IQ", m, pos)
            pos += 12
            out[key + ".length"] = n
            if item == _STRING:
                for _ in range(n):
                    (k,) = struct.unpack_from("<Q", m, pos)
                    pos += 8 + k
            elif item in _SCALARS:
                pos += n * struct.calcsize(_SCALARS[item])
            else:
                raise NotGGUF(f"array of type {item} in '{key}'")
        else:
            raise NotGGUF(f"unknown metadata type {kind} in '{key}'")
        if pos > len(m):
            raise NotGGUF("the header runs past the end of the file")
    return out, pos


def tensor_sizes(path: Path) -> dict[str, int]:
    """Bytes each tensor takes in the file, by name (from the data offsets: the type tables are not needed)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        try:
            meta, pos = _header(m)
            (n_tensors,) = struct.unpack_from("<Q", m, 8)
            offsets = {}
            for _ in range(n_tensors):
                (n,) = struct.unpack_from("<Q", m, pos)
                name = bytes(m[pos + 8:pos + 8 + n]).decode("utf-8")
                (n_dims,) = struct.unpack_from("<I", m, pos + 8 + n)
                pos += 8 + n + 4 + 8 * n_dims + 4  # the name, its dimensions and its type
                (offsets[name],) = struct.unpack_from("<Q", m, pos)
                pos += 8
        except (struct.error, IndexError, UnicodeDecodeError) as e:
            raise NotGGUF(f"{path.name}: the GGUF tensor table is cut short or malformed ({e})") from None
        align = int(meta.get("general.alignment", 32) or 32)
        data_size = len(m) - (pos + -pos % align)
    ends = sorted(offsets.values())[1:] + [data_size]
    # max: a file cut short inside its tensor data (llama.cpp then refuses it, saying so)
    return {name: max(0, end - start) for (name, start), end in zip(sorted(offsets.items(), key=lambda t: t[1]), ends)}


@dataclass(frozen=True)
class Footprint:
    """Bytes a model would take when served: weights (the file, mmap'd), KV cache, compute buffers."""

    weights: int
    kv: int
    compute: int
    embedding: bool = False  # an embedding model (a pooling type, or no causal attention): no chat

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def footprint(path: Path, ctx: int, streams: int, kv_dtype: str, chunk: int) -> Footprint:
    """An estimate of what serving path with ctx x streams cells of kv_dtype and chunk-token batches needs."""
    meta = read_metadata(path)
    arch = meta.get("general.architecture", "llama")

    def hp(name: str, default: int = 0) -> int:
        v = meta.get(f"{arch}.{name}", default)
        return int(v) if isinstance(v, (int, float)) else default
    n_layer, n_embd = hp("block_count"), hp("embedding_length")
    n_head = hp("attention.head_count", 1) or 1
    n_head_kv = hp("attention.head_count_kv", n_head) or n_head
    k_dim = hp("attention.key_length", n_embd // n_head)
    v_dim = hp("attention.value_length", n_embd // n_head)
    n_ctx = min(ctx, hp("context_length", ctx) or ctx) * streams if ctx else hp("context_length", 4096) * streams
    embedding = f"{arch}.pooling_type" in meta or meta.get(f"{arch}.attention.causal") is False
    # an embedding model is served by batch contexts without a KV cache to keep
    kv = 0 if embedding else int(n_layer * n_ctx * n_head_kv * (k_dim + v_dim) * _KV_BYTES.get(kv_dtype, 2.0))
    n_vocab = int(meta.get("tokenizer.ggml.tokens.length", 32000))
    # llama.cpp's CPU compute buffer: a batch of activations and one row of logits per output
    compute = 4 * chunk * (n_vocab + 8 * n_embd) + (64 << 20)
    return Footprint(path.stat().st_size, kv, compute, embedding)
