"""The mechanism: every call into llama.cpp (llama-cpp-python's low-level API) lives here.

Model weights, vocabularies, batch contexts, embedding contexts and sampler chains. Nothing
here decides *what* to run; engine/core/scheduler.py does. All context calls happen on the
scheduler thread; vocab reads (tokenize, pieces) are read-only and safe from any thread.
(Over 400 lines on purpose: the one module that touches the native API, so that a llama.cpp upgrade is
reviewed in one place.)
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import llama_cpp as L
import numpy as np

from engine import backends, rpc
from engine.errors import EngineError, InvalidRequest, ModelLoadError

log = logging.getLogger("llamadesk.llama")

KV_TYPES = {"f16": L.GGML_TYPE_F16, "q8_0": L.GGML_TYPE_Q8_0, "q4_0": L.GGML_TYPE_Q4_0}
_GGUF_MAGIC = b"GGUF"

_init_lock = threading.Lock()
_initialized = False
# llama.cpp's recent error lines, to explain a failed load without a traceback.
_recent_errors: deque[str] = deque(maxlen=8)
# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continues the previous line's level.
_LOG_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = logging.DEBUG


@L.llama_log_callback
def _on_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _last_level
    py_level = _last_level if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
    _last_level = py_level
    msg = text.decode("utf-8", "replace").rstrip()
    if not msg:
        return
    if py_level >= logging.ERROR:
        _recent_errors.append(msg)
    log.log(py_level, "%s", msg)


def init_backend(model: Path | None = None) -> None:
    """Initialise llama.cpp once per process and route its log into Python logging; a GGML_BACKEND_DL build
    first loads the CPU variant that survives a probe decode of model (engine/backends.py)."""
    global _initialized
    with _init_lock:
        if not _initialized:
            L.llama_log_set(_on_llama_log, ctypes.c_void_p(0))
            backends.before_init(model)
            L.llama_backend_init()
            _initialized = True


def system_info() -> str:
    """llama.cpp's one-line description of the CPU features it uses."""
    return L.llama_print_system_info().decode().strip()


def default_threads() -> int:
    """One llama.cpp thread per available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class GpuDevice:
    """A GPU that ggml's backend registry offers (Vulkan0, CUDA0, MTL0…), with its memory as of the call."""
    name: str
    description: str
    free: int
    total: int


_GPU, _IGPU = 1, 2  # GGML_BACKEND_DEVICE_TYPE_GPU and _IGPU (ggml-backend.h)
_registry_api: ctypes.CDLL | None = None


def _registry() -> ctypes.CDLL:
    """The libggml copy libllama links (its registry holds the backends loaded), with the device calls bound."""
    global _registry_api
    if _registry_api is None:
        lib = backends._ggml(backends.library_dir())
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for fn, args, res in ((lib.ggml_backend_dev_count, [], sz), (lib.ggml_backend_dev_get, [sz], vp),
                              (lib.ggml_backend_dev_type, [vp], ctypes.c_int),
                              (lib.ggml_backend_dev_name, [vp], ctypes.c_char_p),
                              (lib.ggml_backend_dev_description, [vp], ctypes.c_char_p),
                              (lib.ggml_backend_dev_backend_reg, [vp], vp),
                              (lib.ggml_backend_reg_name, [vp], ctypes.c_char_p),
                              (lib.ggml_backend_dev_memory, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None)):
            fn.argtypes, fn.restype = args, res
        _registry_api = lib
    return _registry_api


def _gpu_device(api: ctypes.CDLL, dev: int) -> GpuDevice:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    api.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return GpuDevice(api.ggml_backend_dev_name(dev).decode("utf-8", "replace"),
                     api.ggml_backend_dev_description(dev).decode("utf-8", "replace"), free.value, total.value)


def gpu_devices() -> list[GpuDevice]:
    """The GPUs llama.cpp offloads a model's layers to when it is given none (llama_prepare_model_devices): the
    discrete GPUs, else the integrated ones; an rpc-server's devices are a model's own (`--rpc`). None in a CPU
    build, or before init_backend."""
    if not _initialized or not L.llama_supports_gpu_offload():
        return []
    api, found = _registry(), {_GPU: [], _IGPU: []}
    for i in range(api.ggml_backend_dev_count()):
        dev = api.ggml_backend_dev_get(i)
        kind = api.ggml_backend_dev_type(dev)
        if kind in found and api.ggml_backend_reg_name(api.ggml_backend_dev_backend_reg(dev)) != b"RPC":
            found[kind].append(_gpu_device(api, dev))
    return found[_GPU] or found[_IGPU]


class RpcLost(RuntimeError):
    """An rpc-server holding part of the model went away: the decode's output is garbage (engine/rpc.py)."""


_rpc_api: ctypes.CDLL | None = None


def _rpc() -> ctypes.CDLL:
    """libggml-rpc (the wheel is built with GGML_RPC=ON) with the ggml registry calls it needs, bound once."""
    global _rpc_api
    if _rpc_api is None:
        from llama_cpp._ctypes_extensions import load_shared_library
        try:
            lib = load_shared_library("ggml-rpc", L.llama_cpp._base_path)
        except (OSError, FileNotFoundError, RuntimeError) as e:
            raise ModelLoadError(f"this llama-cpp-python was built without RPC ({e}); rebuild it with "
                                 "CMAKE_ARGS=-DGGML_RPC=ON (the Makefile's wheel does)") from None
        base = load_shared_library("ggml-base", L.llama_cpp._base_path)
        vp = ctypes.c_void_p
        for fn, args, res in ((lib.ggml_backend_rpc_add_server, [ctypes.c_char_p], vp),
                              (base.ggml_backend_reg_dev_count, [vp], ctypes.c_size_t),
                              (base.ggml_backend_reg_dev_get, [vp, ctypes.c_size_t], vp)):
            fn.argtypes, fn.restype = args, res
        lib.dev_count, lib.dev_get = base.ggml_backend_reg_dev_count, base.ggml_backend_reg_dev_get
        _rpc_api = lib
    return _rpc_api


def _rpc_devices(links: list[rpc.Link]) -> list[int]:
    """The ggml devices of the rpc-servers behind links, as llama-server's --rpc makes them (add_rpc_devices):
    not registered globally, so only the model given them uses them."""
    api = _rpc()
    devices = []
    for link in links:
        reg = api.ggml_backend_rpc_add_server(link.endpoint.encode())
        n = api.dev_count(reg) if reg else 0
        if not n:
            raise ModelLoadError(f"rpc-server {link.address} offers no device")
        devices += [api.dev_get(reg, i) for i in range(n)]
    return devices


def _open_links(addresses: tuple[str, ...]) -> list[rpc.Link]:
    """A relay (engine/rpc.py) to each rpc-server; ModelLoadError naming the one that does not answer."""
    links: list[rpc.Link] = []
    try:
        for address in addresses:
            links.append(rpc.acquire(address))
    except rpc.RpcUnreachable as e:
        for link in links:
            rpc.release(link)
        raise ModelLoadError(str(e)) from None
    return links


class LlamaModel:
    """A loaded GGUF: weights (mmap'd), vocabulary and metadata. gpu_layers of its layers go to the GPUs
    (llama.cpp's n_gpu_layers: -1 all; engine/models/gpu.py decides how many); with none (gpu "off", or 0
    layers) it has no GPU device at all. With rpc addresses, every layer is offloaded to those rpc-servers'
    devices instead (split by their memory, as llama.cpp does) and the input embeddings stay here."""

    def __init__(self, path: Path, gpu: str = "auto", progress: Callable[[float], None] | None = None,
                 rpc_servers: tuple[str, ...] = (), gpu_layers: int = -1):
        init_backend(Path(path))
        self.path = Path(path)
        check_gguf(self.path)
        params = L.llama_model_default_params()
        params.n_gpu_layers = -1 if rpc_servers else 0 if gpu == "off" else gpu_layers
        self.links = self._held = _open_links(rpc_servers)  # _held: until free() lets them go
        self.devices = [f"RPC {link.address}" for link in self.links] + ["CPU"] if rpc_servers else []
        self.ptr = None
        try:
            self._load(params, progress)
            self.check_rpc()  # a server lost while the weights went over: they are not all there
        except BaseException as e:
            self.free()
            lost = next((link for link in self.links if link.lost is not None), None)
            if lost is None or not isinstance(e, (RpcLost, ModelLoadError)):
                raise
            raise ModelLoadError(f"cannot load model {self.path}: the rpc-server at {lost.address} went away while "
                                 f"it loaded ({lost.lost})") from None

    def _load(self, params, progress: Callable[[float], None] | None) -> None:
        # No layer on a GPU: give the model no GPU device at all, else its contexts still create the GPU backend
        # and run a prompt's large matmuls there (llama.cpp's op_offload), which --gpu off and 0 layers rule out.
        devices = _rpc_devices(self.links) if self.links else [] if params.n_gpu_layers == 0 else None
        if devices is not None:
            listed = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)  # NULL-terminated
            params.devices = ctypes.cast(listed, ctypes.c_void_p)
        if progress is not None:  # llama.cpp reports 0..1 while it reads the weights
            def on_progress(fraction: float, _user) -> bool:
                progress(fraction)
                return True
            keep = L.llama_progress_callback(on_progress)  # referenced until the load returns
            params.progress_callback = keep
        _recent_errors.clear()
        ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not ptr:
            detail = "; ".join(_recent_errors) or "llama.cpp could not load it"
            raise ModelLoadError(f"cannot load model {self.path}: {detail}")
        self.ptr = ptr
        self.vocab = L.llama_model_get_vocab(ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = L.llama_model_n_ctx_train(ptr)
        self.n_embd = L.llama_model_n_embd(ptr)
        self.n_params = L.llama_model_n_params(ptr)
        self.arch = self.meta("general.architecture") or "unknown"
        # An embedding model (BERT and kin) declares a pooling type and has no causal decoder.
        self.is_embedding_model = self.meta(f"{self.arch}.pooling_type") is not None or \
            self.meta(f"{self.arch}.attention.causal") == "false"
        # A reranker (a cross-encoder, a Qwen3-Reranker) pools with rank: its classifier head scores the input;
        # its GGUF may carry the prompt a query and a document go into ({query}, {document}).
        self.is_reranker = self.meta(f"{self.arch}.pooling_type") == str(L.LLAMA_POOLING_TYPE_RANK)
        rerank = L.llama_model_chat_template(ptr, b"rerank")
        self.rerank_template = rerank.decode("utf-8") if rerank else None
        tmpl = L.llama_model_chat_template(ptr, None)
        self.chat_template = tmpl.decode("utf-8") if tmpl else None
        self.add_bos = bool(L.llama_vocab_get_add_bos(self.vocab))
        fim = (L.llama_vocab_fim_pre(self.vocab), L.llama_vocab_fim_suf(self.vocab), L.llama_vocab_fim_mid(self.vocab))
        self.fim = fim if min(fim) >= 0 else None  # fill-in-the-middle tokens (prefix, suffix, middle), if any
        # the repository and file separators of repo-level FIM (llama-server's input_extra); -1: none
        self.fim_rep, self.fim_sep = L.llama_vocab_fim_rep(self.vocab), L.llama_vocab_fim_sep(self.vocab)
        self.bos_id = L.llama_vocab_bos(self.vocab)
        self.eos_id = L.llama_vocab_eos(self.vocab)
        self.sep_id = L.llama_vocab_sep(self.vocab)
        self.add_eos = bool(L.llama_vocab_get_add_eos(self.vocab))
        self.add_sep = bool(L.llama_vocab_get_add_sep(self.vocab))
        self.eog_ids = frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t)) \
            if self.n_vocab <= 300_000 else frozenset({self.eos_id})
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        self._special_pieces: dict[int, bytes] = {}
        self._byte_tokens: dict[int, int] | None = None
        self._bytes_lock = threading.Lock()
        buf = ctypes.create_string_buffer(256)
        n = L.llama_model_desc(ptr, buf, 256)
        self.description = buf.value[:n].decode("utf-8", "replace")
        self.file_size = self.path.stat().st_size

    def check_rpc(self) -> None:
        """RpcLost when an rpc-server of the model has gone (the last decode's output is then garbage)."""
        for link in self.links:
            if link.lost is not None:
                raise RpcLost(f"the rpc-server at {link.address} went away ({link.lost}); model unusable until "
                              "reloaded (without rpc, or once the rpc-server is back)")

    def _close_links(self) -> None:
        links, self._held = self._held, []
        for link in links:
            rpc.release(link)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when the key is absent."""
        buf = ctypes.create_string_buffer(512)
        n = L.llama_model_meta_val_str(self.ptr, key.encode(), buf, 512)
        if n < 0:
            return None
        if n >= 512:
            buf = ctypes.create_string_buffer(n + 1)
            L.llama_model_meta_val_str(self.ptr, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """Text to token ids (special tokens such as <|im_start|> recognised when parse_special)."""
        data = text.encode("utf-8")
        cap = len(data) + 16
        arr = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for; control tokens render as nothing unless special."""
        if special:  # raw bytes: a piece may end inside a character that the next token completes
            cached = self._special_pieces.get(token)
            if cached is None:
                cached = self._special_pieces[token] = self._raw_piece(token, True)
            return cached
        cached = self._pieces[token]
        if cached is None:
            cached = self._pieces[token] = self._raw_piece(token, False)
        return cached

    def _raw_piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:max(n, 0)]

    def byte_tokens(self) -> dict[int, int]:
        """A token for each byte value that one token spells alone (to feed a grammar text byte by byte)."""
        with self._bytes_lock:
            if self._byte_tokens is None:
                found: dict[int, int] = {}
                buf = ctypes.create_string_buffer(8)
                for t in range(self.n_vocab):
                    if L.llama_token_to_piece(self.vocab, t, buf, 8, 0, True) == 1:
                        found.setdefault(buf.raw[0], t)
                        if len(found) == 256:
                            break
                self._byte_tokens = found
            return self._byte_tokens

    def token_text(self, token: int) -> str:
        """The literal text of a token, special ones included (for chat templates)."""
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, 64, 0, True)
        return buf.raw[:max(n, 0)].decode("utf-8", "replace")

    def quant(self) -> str:
        """The file type name (Q4_1, F16, …) as recorded in general.file_type."""
        ft = self.meta("general.file_type")
        names = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
                 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
                 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}
        return names.get(int(ft), f"type {ft}") if ft and ft.isdigit() else "unknown"

    def free(self) -> None:
        """Release the weights."""
        if self.ptr:
            L.llama_model_free(self.ptr)
            self.ptr = None
        self._close_links()


def check_gguf(path: Path) -> None:
    """ModelLoadError unless path is a readable regular file starting with the GGUF magic."""
    shown = str(path) if len(str(path)) <= 300 else str(path)[:300] + "…"
    try:
        if not path.exists():
            raise ModelLoadError(f"model file not found: {shown}")
        if not path.is_file():
            raise ModelLoadError(f"model path is not a file: {shown}")
        with open(path, "rb") as f:
            magic = f.read(4)
    except (OSError, ValueError) as e:  # a name too long, a NUL byte, no permission
        raise ModelLoadError(f"cannot open model file {shown}: {getattr(e, 'strerror', None) or e}") from None
    if magic != _GGUF_MAGIC:
        raise ModelLoadError(f"{shown} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")


class _Context:
    """A llama.cpp context plus the batch it decodes; subclasses say what kind."""

    def __init__(self, model: LlamaModel, what: str, *, n_ctx: int, n_batch: int, n_seq: int, threads: int,
                 **fields) -> None:
        p = L.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_batch
        p.n_seq_max = n_seq
        p.n_threads = threads
        p.n_threads_batch = threads
        p.no_perf = True
        for k, v in fields.items():
            setattr(p, k, v)
        self.model = model
        self.ctx = L.llama_init_from_model(model.ptr, p)
        if not self.ctx:
            raise ModelLoadError(f"cannot create {what} for {model.path} (ctx {n_ctx}, {n_seq} sequences): "
                                 + ("; ".join(_recent_errors) or "out of memory?"))
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(n_batch, 0, n_seq)

    def free(self) -> None:
        """Release the context and its batch."""
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None


class BatchContext(_Context):
    """A generation context with one KV sequence per stream, decoded one batch per tick."""

    def __init__(self, model: LlamaModel, n_seq: int, ctx_per_seq: int, n_batch: int, threads: int,
                 kv_dtype: str, unified: bool = True):
        extra = {"flash_attn_type": 1} if kv_dtype != "f16" else {}  # a quantized V cache needs flash attention
        # unified: one pool of ctx_per_seq x n_seq cells that every sequence draws from, so sequences can share
        # a prefix's cells (llama_memory_seq_cp is then bookkeeping, no copy); the scheduler keeps each
        # sequence within ctx_per_seq, so the pool never runs out. Not unified: each sequence owns its cells.
        super().__init__(model, "a context", n_ctx=ctx_per_seq * n_seq, n_batch=n_batch, n_seq=n_seq,
                         threads=threads, type_k=KV_TYPES[kv_dtype], type_v=KV_TYPES[kv_dtype], kv_unified=unified,
                         **extra)
        self.unified = unified
        self.n_batch = n_batch
        self.n_seq = n_seq
        self.n_vocab = model.n_vocab
        self.threads = threads
        b = self.batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self._nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,))
        self._seq_ptrs = [b.seq_id[i] for i in range(n_batch)]
        self._nseq[:] = 1
        self._rows: EmbdBatch | None = None  # image rows' batch, made at the first image

    def decode_prefill(self, seq: int, tokens: list[int], start_pos: int, offset: int, want_last: bool) -> None:
        """Fill batch rows offset.. with a prefill slice of one sequence (vectorised)."""
        n = len(tokens)
        sl = slice(offset, offset + n)
        self._tok[sl] = tokens
        self._pos[sl] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self._out[sl] = 0
        if want_last:
            self._out[offset + n - 1] = 1
        for i in range(offset, offset + n):
            self._seq_ptrs[i][0] = seq

    def set_row(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Fill one batch row (a decoding stream's next token)."""
        self._tok[i] = token
        self._pos[i] = pos
        self._seq_ptrs[i][0] = seq
        self._out[i] = logits

    def set_threads(self, n: int) -> None:
        """Use n threads from the next decode on."""
        if n != self.threads:
            L.llama_set_n_threads(self.ctx, n, n)
            self.threads = n

    def run(self, n_tokens: int) -> None:
        """Decode the first n_tokens rows filled with set_row/decode_prefill."""
        self.batch.n_tokens = n_tokens
        rc = L.llama_decode(self.ctx, self.batch)
        self.model.check_rpc()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {n_tokens} tokens")

    def run_rows(self, slices: list[tuple[int, np.ndarray, int]], non_causal: bool = False) -> None:
        """Decode embedding rows (images) in one llama_decode, no logits: each slice is (sequence, rows, first
        position). Before the token batch of the same tick, whose logits are then the ones sampled. A
        non-causal projector's rows attend to each other both ways (one image per slice, whole)."""
        if self._rows is None:
            self._rows = EmbdBatch(self.n_batch, L.llama_model_n_embd_inp(self.model.ptr), self.n_seq)
        n = self._rows.fill(slices)
        if non_causal:
            L.llama_set_causal_attn(self.ctx, False)
        try:
            rc = L.llama_decode(self.ctx, self._rows.batch)
        finally:
            if non_causal:
                L.llama_set_causal_attn(self.ctx, True)
        self.model.check_rpc()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for a batch of {n} image rows")

    def free(self) -> None:
        if self._rows is not None and self.ctx:
            self._rows.free()
            self._rows = None
        super().free()

    def logits(self, row: int) -> np.ndarray:
        """The logits of batch row `row` from the last decode (a view, valid until the next decode)."""
        ptr = L.llama_get_logits_ith(self.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def keep_prefix(self, seq: int, n_keep: int) -> bool:
        """Drop a sequence's cached KV from position n_keep on; False if the memory cannot do it."""
        return bool(L.llama_memory_seq_rm(self.mem, seq, n_keep, -1))

    def clear_seq(self, seq: int) -> None:
        """Forget everything a sequence holds."""
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def copy_seq(self, src: int, dst: int) -> None:
        """Make dst hold what src holds (n > 1 choices sharing one prompt): in a unified pool dst shares
        src's cells; with a KV stream per sequence llama.cpp copies the whole buffer before the next decode."""
        L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def attach(self, src: int, dst: int, n: int) -> None:
        """dst holds the first n positions of src, and nothing else (unified pool only: shared cells)."""
        L.llama_memory_seq_rm(self.mem, dst, -1, -1)
        L.llama_memory_seq_cp(self.mem, src, dst, 0, n)

    def save_seq(self, seq: int) -> bytes:
        """A sequence's KV state, to restore into any sequence later (the host-RAM prompt cache)."""
        size = L.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(self.ctx, buf, size, seq)
        return bytes(memoryview(buf)[:n])

    def restore_seq(self, seq: int, data: bytes) -> bool:
        """Load a state from save_seq into seq (emptied first); False when llama.cpp cannot place it."""
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if L.llama_state_seq_set_data(self.ctx, buf, len(data), seq) == 0:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)
            return False
        return True

class EmbdBatch:
    """A llama_batch of embedding rows instead of token ids (what a vision projector's output prefills)."""

    def __init__(self, n_rows: int, n_embd: int, n_seq: int):
        self.batch = L.llama_batch_init(n_rows, n_embd, n_seq)
        b = self.batch
        self._embd = np.ctypeslib.as_array(b.embd, shape=(n_rows, n_embd))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n_rows,))
        self._out = np.ctypeslib.as_array(ctypes.cast(b.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_rows,))
        self._seq_ptrs = [b.seq_id[i] for i in range(n_rows)]
        np.ctypeslib.as_array(b.n_seq_id, shape=(n_rows,))[:] = 1
        self._out[:] = 0  # rows inside a prompt: nothing to sample from them

    def fill(self, slices: list[tuple[int, np.ndarray, int]]) -> int:
        """Lay out (sequence, rows, first position) slices from row 0; returns the rows filled."""
        i = 0
        for seq, rows, start in slices:
            n = len(rows)
            self._embd[i:i + n] = rows
            self._pos[i:i + n] = np.arange(start, start + n, dtype=np.int32)
            for j in range(i, i + n):
                self._seq_ptrs[j][0] = seq
            i += n
        self.batch.n_tokens = i
        return i

    def free(self) -> None:
        L.llama_batch_free(self.batch)


class EmbedContext(_Context):
    """A mean-pooling embedding context; several inputs go through one decode as separate sequences."""

    MAX_SEQS = 16
    POOLING = L.LLAMA_POOLING_TYPE_MEAN
    WHAT = "an embedding context"

    def __init__(self, model: LlamaModel, threads: int, n_batch: int):
        # n_ubatch = n_batch: non-causal encoders need a whole input in one micro-batch
        super().__init__(model, self.WHAT, n_ctx=n_batch, n_batch=n_batch, n_seq=self.MAX_SEQS,
                         threads=threads, embeddings=True, pooling_type=self.POOLING, kv_unified=True)
        self.n_batch = n_batch

    def embed_group(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Mean-pooled, L2-normalised vectors of several token lists decoded in one batch."""
        self._decode(inputs)
        n_embd = self.model.n_embd
        out = []
        for s in range(len(inputs)):
            ptr = L.llama_get_embeddings_seq(self.ctx, s)
            v = np.ctypeslib.as_array(ptr, shape=(n_embd,)).astype(np.float32)
            norm = float(np.linalg.norm(v))
            out.append(v / norm if norm > 0 else v)
        return out

    def _decode(self, inputs: list[list[int]]) -> None:
        """Decode the token lists as sequences 0.. of one batch (the memory of earlier ones cleared first)."""
        b = self.batch
        i = 0
        for s, toks in enumerate(inputs):
            for p, t in enumerate(toks):
                b.token[i] = t
                b.pos[i] = p
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = s
                b.logits[i] = 1
                i += 1
        b.n_tokens = i
        if self.mem:
            L.llama_memory_clear(self.mem, True)
        rc = L.llama_decode(self.ctx, b)
        self.model.check_rpc()
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} in {self.WHAT}")


class RankContext(EmbedContext):
    """A rank-pooling context: a reranker's classifier head scores each input (a query and document pair)."""

    POOLING = L.LLAMA_POOLING_TYPE_RANK
    WHAT = "a ranking context"

    def rank_group(self, inputs: list[list[int]]) -> list[float]:
        """The relevance score of each token list, decoded in one batch: the head's first output (llama-server's
        score; a Qwen3-style head softmaxes its yes/no pair, so that is P(yes))."""
        self._decode(inputs)
        return [float(L.llama_get_embeddings_seq(self.ctx, s)[0]) for s in range(len(inputs))]

class ImageChunk:
    """One image chunk of a prompt libmtmd tokenized: its bitmap's id, its row count, and its rows on demand."""

    def __init__(self, tower: VisionTower, chunk, image_id: str, n_rows: int):
        self._tower = tower
        self._chunk = chunk
        self.id = image_id
        self.n_rows = n_rows

    def encode(self) -> np.ndarray:
        """The projector's output rows (n_rows x n_embd float32): a copy, valid after the chunks are freed."""
        mt = self._tower.mt
        _recent_errors.clear()
        if mt.mtmd_encode_chunk(self._tower.ctx, self._chunk) != 0:
            raise EngineError("the vision projector could not encode the image: "
                              + ("; ".join(_recent_errors) or "libmtmd failed"))
        out = mt.mtmd_get_output_embd(self._tower.ctx)
        return np.ctypeslib.as_array(out, shape=(self.n_rows, self._tower.n_embd)).copy()


class VisionTower:
    """A vision projector (an mmproj GGUF) loaded by libmtmd beside its text model: it splits a prompt at its
    media markers into text tokens and image chunks (each image resized and cut as the projector wants) and
    encodes an image chunk into rows of the text model's embedding width. Not thread-safe: one caller at a
    time (engine/vision.py's worker)."""

    def __init__(self, path: Path, model: LlamaModel, threads: int, gpu: str, marker: str):
        init_backend()
        check_gguf(path)
        from llama_cpp import mtmd_cpp as mt  # libmtmd is loaded only for a model that has a projector
        self.mt = mt
        mt.mtmd_log_set(_on_llama_log, ctypes.c_void_p(0))
        p = mt.mtmd_context_params_default()
        p.use_gpu = gpu != "off"
        p.print_timings = False
        p.n_threads = threads
        self._marker = marker.encode()  # referenced for as long as the context reads it
        p.media_marker = self._marker
        _recent_errors.clear()
        self.path = path
        self.ctx = mt.mtmd_init_from_file(str(path).encode(), model.ptr, p)
        if not self.ctx:
            raise ModelLoadError(f"cannot load vision projector {path} for {model.path.name}: "
                                 + ("; ".join(_recent_errors) or "libmtmd could not load it"))
        why = None if mt.mtmd_support_vision(self.ctx) else "it has no vision encoder (an audio projector?)"
        if why is None and mt.mtmd_decode_use_mrope(self.ctx):
            why = "its model places image rows by M-RoPE (Qwen2-VL and kin), which llamadesk cannot prefill yet"
        if why is not None:
            self.free()
            raise ModelLoadError(f"cannot use vision projector {path}: {why}")
        self.n_embd = L.llama_model_n_embd_inp(model.ptr)
        self.non_causal = bool(mt.mtmd_decode_use_non_causal(self.ctx, None))  # rows see each other both ways

    @contextlib.contextmanager
    def tokenized(self, text: str, images: list[tuple[int, int, bytes, str]], add_special: bool):
        """The prompt as libmtmd splits it, in order: token id lists for text, ImageChunk for images (valid
        inside the block). images: (width, height, RGB bytes, id) per media marker in text, in order."""
        mt = self.mt
        bitmaps = []
        chunks = mt.mtmd_input_chunks_init()
        try:
            for w, h, rgb, image_id in images:
                bm = mt.mtmd_bitmap_init(w, h, ctypes.cast(ctypes.c_char_p(rgb), ctypes.POINTER(ctypes.c_uint8)))
                if not bm:
                    raise InvalidRequest(f"an image of {w}x{h} pixels could not be taken by the projector", "messages")
                bitmaps.append(bm)
                mt.mtmd_bitmap_set_id(bm, image_id.encode())
            data = text.encode("utf-8")
            inp = mt.mtmd_input_text(text=data, text_len=len(data), add_special=add_special, parse_special=True)
            arr = (mt.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            _recent_errors.clear()
            rc = mt.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                raise InvalidRequest(f"the prompt could not be split at its {len(bitmaps)} image(s): "
                                     + ("; ".join(_recent_errors) or f"libmtmd returned {rc}"), "messages")
            yield [self._part(mt.mtmd_input_chunks_get(chunks, i)) for i in range(mt.mtmd_input_chunks_size(chunks))]
        finally:
            mt.mtmd_input_chunks_free(chunks)
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)

    def _part(self, chunk) -> list[int] | ImageChunk:
        mt = self.mt
        kind = mt.mtmd_input_chunk_get_type(chunk)
        if kind == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t(0)
            ids = mt.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return list(ids[:n.value])
        if kind != mt.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            raise InvalidRequest("the prompt holds a media chunk that is not an image", "messages")
        return ImageChunk(self, chunk, (mt.mtmd_input_chunk_get_id(chunk) or b"").decode(),
                          mt.mtmd_input_chunk_get_n_tokens(chunk))

    def free(self) -> None:
        """Release the projector."""
        if self.ctx:
            self.mt.mtmd_free(self.ctx)
            self.ctx = None


def token_logprobs(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-probability and the `top` most likely tokens, from raw logits."""
    m = float(logits.max())
    lse = m + float(np.log(np.exp(logits - m).sum()))
    best: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-logits, top)[:top]
        idx = idx[np.argsort(-logits[idx])]
        best = [(int(i), float(logits[i]) - lse) for i in idx]
    return float(logits[token]) - lse, best


_grammar_lock = threading.Lock()


def _grammar_sampler(model: LlamaModel, grammar: str):
    """llama.cpp's grammar sampler for GBNF; InvalidRequest with llama.cpp's reason when it cannot parse it."""
    with _grammar_lock:  # parse errors arrive through the one log callback: one parse at a time
        _recent_errors.clear()
        g = L.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
        if not g:
            raise InvalidRequest("the output grammar could not be parsed by llama.cpp: "
                                 + ("; ".join(_recent_errors) or "invalid GBNF"))
        return g


class Candidates:
    """The whole vocabulary as a llama_token_data_array over one numpy buffer, loaded from a row's logits."""

    DTYPE = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data's layout

    def __init__(self, n_vocab: int):
        self.rows = np.zeros(n_vocab, self.DTYPE)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._data = self.rows.ctypes.data_as(ctypes.POINTER(L.llama_token_data))
        self.array = L.llama_token_data_array(data=self._data, size=n_vocab, selected=-1, sorted=False)
        self.ref = ctypes.byref(self.array)

    def load(self, logits: np.ndarray, banned: list[int]) -> None:
        """Every token with its logit, the banned ones impossible, nothing selected (samplers reorder and cut)."""
        self.rows["id"] = self._ids
        self.rows["logit"] = logits
        self.rows["p"] = 0.0
        if banned:
            self.rows["logit"][banned] = -np.inf
        a = self.array
        a.data, a.size, a.selected, a.sorted = self._data, len(self.rows), -1, False

    def any_possible(self) -> bool:
        return bool(np.isfinite(self.rows["logit"]).any())

    def selected(self) -> int:
        return int(self.array.data[self.array.selected].id)


class Grammar:
    """A GBNF grammar driven from here rather than from inside a llama.cpp chain, so that its sampler never
    accepts a token it rejects: llama.cpp throws a C++ exception then ("Unexpected empty grammar stack after
    accepting piece"), which cannot be caught through ctypes and ends the process. llama.cpp's own lazy
    grammars did exactly that: when a trigger matched, the text from the trigger on, including whatever the
    token that completed it carried after it (`{{` after a llama-3 `{` trigger), was replayed into the grammar
    unchecked. Here a trigger is found in Python, the replay is tried on a copy byte by byte, each byte checked
    before it is accepted, and a token whose replay the grammar rejects is refused (the caller samples again).

    Lazy (triggers given): free text until a trigger regex matches the text generated so far; the grammar
    applies from the trigger's first non-empty group (or its match) on."""

    def __init__(self, model: LlamaModel, gbnf: str, triggers: list[str] | None):
        self.model = model
        self._fresh = _grammar_sampler(model, gbnf)  # the grammar before any text; copied when a trigger fires
        self.triggers = [re.compile(t.encode()) for t in triggers or ()]
        self.active = None if self.triggers else self._fresh  # the grammar in force; None: awaiting a trigger
        self._text = b""  # what was generated while awaiting (bytes: a piece may end inside a character)
        self._scan_from = 0  # where a trigger may start (past an opener the grammar could not take)
        self._bytes = model.byte_tokens() if self.triggers else {}
        self._one = (L.llama_token_data * 1)()
        self._one_array = L.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)

    def allows(self, sampler, token: int) -> bool:
        """Whether sampler's grammar may take token next (its mask on a single candidate)."""
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 0.0, 0.0
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        L.llama_sampler_apply(sampler, ctypes.byref(self._one_array))
        return self._one[0].logit != -np.inf

    def offer(self, token: int) -> bool:
        """Take token if the grammar can; False leaves everything as it was (the caller picks another)."""
        if self.active is not None:
            if not self.allows(self.active, token):
                return False
            if token not in self.model.eog_ids:  # an end-of-generation token is nothing for a grammar to follow
                L.llama_sampler_accept(self.active, token)
            return True
        text = self._text + self.model.piece(token, special=True)
        start = self._trigger(text)
        if start is not None:
            started = self._replayed(text[start:])
            if started is None:
                return False
            self.active, self._text = started, b""
            return True
        self._text = text
        return True

    def pass_over(self, token: int) -> None:
        """Let token through unconstrained though the grammar refused it (the caller found no other): while
        awaiting, it is free text, and no trigger starting before its end counts any more."""
        if self.active is None:
            self._text += self.model.piece(token, special=True)
            self._scan_from = len(self._text)

    def _trigger(self, text: bytes) -> int | None:
        """Where the constrained text starts if a trigger matches text, else None."""
        for pattern in self.triggers:
            m = pattern.search(text, self._scan_from)
            if m:
                return next((m.start(i) for i in range(1, len(m.groups()) + 1) if m.start(i) < m.end(i)), m.start())
        return None

    def _replayed(self, text: bytes):
        """A copy of the fresh grammar that has taken text, or None when it cannot (checked byte by byte)."""
        g = L.llama_sampler_clone(self._fresh)
        for b in text:
            tok = self._bytes.get(b)
            if tok is None or not self.allows(g, tok):
                L.llama_sampler_free(g)
                return None
            L.llama_sampler_accept(g, tok)
        return g

    def free(self) -> None:
        """Release the native grammars (the fresh one is the active one when there are no triggers)."""
        if self.active is not None and self.active is not self._fresh:
            L.llama_sampler_free(self.active)
        if self._fresh is not None:
            L.llama_sampler_free(self._fresh)
        self._fresh = self.active = None


class SamplerChain:
    """A per-stream llama.cpp sampler chain, with a numpy fast path for plain greedy decoding; a grammar is
    driven from Python beside the chain (see Grammar)."""

    MAX_PICKS = 8  # tokens refused by a grammar before the last one is taken as free text

    def __init__(self, model: LlamaModel, *, temperature: float, top_k: int, top_p: float, min_p: float,
                 repeat_penalty: float, presence_penalty: float, frequency_penalty: float, penalty_last_n: int,
                 seed: int, logit_bias: dict[int, float], grammar: str | None = None,
                 grammar_triggers: list[str] | None = None):
        penalties = repeat_penalty != 1.0 or presence_penalty != 0.0 or frequency_penalty != 0.0
        self.model = model
        self.greedy_fast = temperature <= 0 and not penalties and not grammar
        self.bias_ids = np.array(list(logit_bias), dtype=np.int64)
        self.bias_vals = np.array(list(logit_bias.values()), dtype=np.float32)
        self.chain = None
        self.grammar = Grammar(model, grammar, grammar_triggers) if grammar else None
        self._candidates = Candidates(model.n_vocab) if grammar else None
        if self.greedy_fast:
            return  # the whole-vocabulary greedy chain costs 10x a numpy argmax (perf notes)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if logit_bias:
            arr = (L.llama_logit_bias * len(logit_bias))(*[L.llama_logit_bias(t, b) for t, b in logit_bias.items()])
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(model.n_vocab, len(logit_bias), arr))
        if penalties:
            # this llama.cpp's penalties sampler takes the vocabulary size first (llama.h)
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_penalties(
                model.n_vocab, penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty))
        if temperature <= 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(min_p, 1))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(temperature))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        self.chain = chain

    def sample(self, bctx: BatchContext, row: int) -> int:
        """Pick the next token from batch row `row` of the last decode."""
        if self.grammar is not None:
            return self._constrained(bctx.logits(row))
        if self.greedy_fast:
            logits = bctx.logits(row)
            if self.bias_ids.size:
                logits = logits.copy()
                logits[self.bias_ids] += self.bias_vals
            return int(np.argmax(logits))
        return int(L.llama_sampler_sample(self.chain, bctx.ctx, row))

    def _constrained(self, logits: np.ndarray) -> int:
        """The chain's pick among the tokens the grammar allows; a token whose trigger replay the grammar
        rejects is banned and the chain picks again. When the grammar allows nothing, an end of generation."""
        banned: list[int] = []
        for _ in range(self.MAX_PICKS):
            tok = self._select(logits, banned)
            if tok is None:
                return self._end_token()
            if self.grammar.offer(tok):
                break
            banned.append(tok)
        else:
            self.grammar.pass_over(tok)
        L.llama_sampler_accept(self.chain, tok)  # the penalties' history; never the grammar's business
        return tok

    def _select(self, logits: np.ndarray, banned: list[int]) -> int | None:
        """The chain's pick, checked against the grammar alone; only when the grammar rejects it is the whole
        vocabulary masked (a full mask costs milliseconds) and the chain picks again: the same distribution as
        masking first (llama.cpp's common sampler does the same). None: the grammar allows no token."""
        c, g = self._candidates, self.grammar.active
        c.load(logits, banned)
        L.llama_sampler_apply(self.chain, c.ref)
        tok = c.selected()
        if g is None or self.grammar.allows(g, tok):
            return tok
        c.load(logits, banned)
        L.llama_sampler_apply(g, c.ref)
        if not c.any_possible():
            return None
        L.llama_sampler_apply(self.chain, c.ref)
        return c.selected()

    def _end_token(self) -> int:
        eos = self.model.eos_id
        return eos if eos >= 0 else min(self.model.eog_ids, default=0)

    def free(self) -> None:
        """Release the native chain and grammar."""
        if self.chain:
            L.llama_sampler_free(self.chain)
            self.chain = None
        if self.grammar is not None:
            self.grammar.free()
            self.grammar = None
