"""A loaded model: one GGUF's weights, its chat template and tool format, the batched generation context
its runner ticks, and a lazily created embedding context. (llama-server calls one sequence a slot; here
a model has `streams` sequences.)"""
from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine import llama, tools
from engine.chat import ChatTemplate
from engine.core.promptcache import PromptCache, model_key
from engine.core.request import Request, RequestState
from engine.core.runner import Runner
from engine.errors import ContextLengthExceeded, InvalidRequest, ModelLoadError, UnsupportedByModel
from engine.llama import BatchContext, EmbedContext, LlamaModel, RankContext, SamplerChain
from engine.models import gguf, gpu
from engine.requests import SamplingParams
from engine.text import StopMatcher
from engine.vision import Projector

log = logging.getLogger("llamadesk.engine")
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file is Jinja text; the largest real ones are ~20 KB


def read_chat_template(path: str) -> str:
    """The text of a chat template file: a regular UTF-8 file of at most 1 MB (ModelLoadError otherwise,
    so /dev/zero or a binary file is refused before anything is read into memory)."""
    p = Path(path).expanduser()
    shown = path if len(path) <= 300 else path[:300] + "…"
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ModelLoadError(f"chat_template {shown} is not a regular file")
            if st.st_size > MAX_TEMPLATE_BYTES:
                raise ModelLoadError(f"chat_template {shown} is {st.st_size} bytes; a template may have at most "
                                     f"{MAX_TEMPLATE_BYTES} bytes")
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read chat_template {shown}: {getattr(e, 'strerror', None) or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"chat_template {shown} is not UTF-8 text (a Jinja template file)") from None
    if "\x00" in text:
        raise ModelLoadError(f"chat_template {shown} is a binary file, not a Jinja template")
    return text


@dataclass
class ModelSettings:
    """A loaded model's shape: streams, per-stream context, prefill chunk, KV type, threads."""

    streams: int
    ctx: int
    chunk: int
    kv_dtype: str
    threads: int
    default_max_tokens: int
    gpu: str = "auto"
    gpu_layers: str | int = "auto"  # layers offloaded: "auto" (as many as fit), "all", N (engine/models/gpu.py)
    chat_template: str | None = None  # a Jinja file that replaces the GGUF's template
    tool_format: str | None = None  # None: detected from the template; "none": tools are refused
    kv_unified: bool = True
    cache_ram: int = 0  # bytes of host-RAM prompt cache (0: off)
    cache_disk: int = 0  # bytes of it kept on disk across restarts (0: off)
    cache_dir: Path | None = None  # where: a folder per model file and KV type is made below it
    image_mmproj: str | None = None  # a vision projector GGUF: chat messages may hold images
    rpc: tuple[str, ...] = ()  # rpc-servers (host:port) that hold every layer; empty: all here


class LoadedModel:
    """One served model: weights, a generation context with `streams` sequences and its runner."""

    def __init__(self, model_id: str, path: Path, settings: ModelSettings,
                 progress: Callable[[float], None] | None = None):
        self.id = model_id
        self.settings = settings
        self.placement = self._placement(path, settings)
        self.model = LlamaModel(path, settings.gpu, progress, settings.rpc, self.placement.gpu_layers)
        self.state = "loading"
        self.embedding_only = self.model.is_embedding_model
        self.projector = self._projector(settings)
        self.vision = self.projector is not None  # chat takes image_url parts (/v1/models: capabilities)
        self.ctx = min(settings.ctx, self.model.n_ctx_train) if self.model.n_ctx_train > 0 else settings.ctx
        source = read_chat_template(settings.chat_template) if settings.chat_template else self.model.chat_template
        self.template = ChatTemplate(source, self.model.token_text(self.model.bos_id),
                                     self.model.token_text(self.model.eos_id))
        self.tool_format = settings.tool_format or tools.detect_format(self.template.source)
        self.thinks = tools.thinks(self.template.source)
        bctx = None
        if not self.embedding_only:
            bctx = BatchContext(self.model, settings.streams, self.ctx, settings.chunk + settings.streams,
                                settings.threads, settings.kv_dtype, settings.kv_unified)
        self.cache = None
        if bctx is not None and settings.cache_ram > 0:
            disk = settings.cache_dir / model_key(path, settings.kv_dtype) \
                if settings.cache_dir is not None and settings.cache_disk > 0 else None
            self.cache = PromptCache(settings.cache_ram, disk, settings.cache_disk)
            if n := self.cache.load_index():
                log.info("%s: %d prompt-cache entries on disk from an earlier run", model_id, n)
        self.runner = Runner(model_id, self.model, bctx, settings.streams, settings.chunk, self.ctx, settings.threads,
                             self.cache)
        self.stats = self.runner.stats
        self._ectx: EmbedContext | None = None
        self._rctx: RankContext | None = None  # a reranker's, made at its first /v1/rerank
        self.outstanding = 0  # requests submitted and not yet ended (event loop only)
        self.created = int(time.time())
        self.state = "ready"

    @staticmethod
    def _placement(path: Path, settings: ModelSettings) -> gpu.Placement:
        """How many layers go to the GPUs the build offers (all to the rpc-servers when it has some)."""
        llama.check_gguf(path)
        llama.init_backend(path)
        try:
            if settings.rpc:
                n = gpu.model_layers(path).count
                return gpu.Placement(gpu.ALL, n, n, why="rpc-servers")
            return gpu.place(path, settings.ctx, settings.streams, settings.kv_dtype, settings.chunk, settings.gpu,
                             settings.gpu_layers, llama.gpu_devices())
        except gguf.NotGGUF as e:
            raise ModelLoadError(f"cannot load model {path}: {e}") from None

    def _projector(self, settings: ModelSettings) -> Projector | None:
        """The vision projector the settings name (loaded beside the weights), or None."""
        if not settings.image_mmproj:
            return None
        try:
            if self.embedding_only:
                raise ModelLoadError(f"model '{self.id}' is an embedding model: it takes no image_mmproj")
            return Projector(Path(settings.image_mmproj).expanduser(), self.model, settings.threads, settings.gpu)
        except BaseException:
            self.model.free()
            raise

    def image_prompt(self, text: str, messages: list[dict[str, Any]], add_bos: bool) -> list[int]:
        """The prompt of rendered chat text holding a media marker per image of messages: its images encoded
        and placed (blocking: a prep thread); UnsupportedByModel when the model has no vision projector."""
        if self.projector is None:
            raise UnsupportedByModel(f"model '{self.id}' has no vision: it was loaded without a projector "
                                     "(image_mmproj in its roster entry, --image-mmproj for --model), so it cannot "
                                     "take image_url parts", "messages")
        return self.projector.prompt(text, messages, add_bos)

    # ---- admission (event loop) ------------------------------------------------------------------

    def make_request(self, request_id: str, prompt: list[int], sampling: SamplingParams,
                     render_special: bool = False, chat: bool = True, truncatable: bool = True) -> Request:
        """Check a prompt against the context and wrap it as a request (raises ContextLengthExceeded); chat:
        the prompt came from messages, else from a raw prompt; truncatable: the client's protocol can send
        "truncation": "auto" (which shortens the messages), so the error may advise it."""
        if self.embedding_only:
            serves = "a reranker: it serves /v1/rerank" if self.model.is_reranker else \
                "an embedding model: it serves /v1/embeddings"
            raise UnsupportedByModel(f"model '{self.id}' is {serves} only", "model")
        n = len(prompt)
        room = self.ctx - n
        if room < 1:
            advice = _over_context_advice(chat, truncatable)
            raise ContextLengthExceeded(
                f"the prompt is {n} tokens but the context of model '{self.id}' is {self.ctx} tokens "
                f"per stream; {advice}", "messages" if chat else "prompt")
        wanted = sampling.max_tokens or self.settings.default_max_tokens
        if sampling.max_tokens is not None and wanted > room and not sampling.max_tokens_ceiling:
            raise ContextLengthExceeded(
                f"this model's context is {self.ctx} tokens per stream, but {n + wanted} were requested "
                f"({n} in the prompt, {wanted} for the completion)", "max_tokens")
        self.check_sampling(sampling)
        images = getattr(prompt, "images", ())
        too_big = next((im for im in images if im.whole and len(im.rows) > self.settings.chunk), None)
        if too_big is not None:  # it could never be scheduled: such an image prefills in one decode
            raise InvalidRequest(f"an image takes {len(too_big.rows)} positions, more than the {self.settings.chunk} "
                                 f"model '{self.id}' prefills at once (its chunk): raise chunk", "messages")
        return Request(id=request_id, prompt=prompt, sampling=sampling, max_tokens=min(wanted, room),
                       render_special=render_special, stops=StopMatcher(sampling.stop), images=images)

    def check_tokens(self, tokens: list[int], param: str) -> None:
        """400 unless every token id is in this model's vocabulary."""
        bad = next((t for t in tokens if not 0 <= t < self.model.n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary of model '{self.id}' "
                                 f"(0..{self.model.n_vocab - 1})", param)

    def check_sampling(self, sp: SamplingParams) -> None:
        """400s for sampling settings this model cannot take (before the request is admitted)."""
        self.check_tokens(list(sp.logit_bias), "logit_bias")

    def new_sampler(self, sp: SamplingParams) -> SamplerChain:
        """The request's native sampler chain (InvalidRequest for a grammar llama.cpp refuses). Built off the
        scheduler thread, before admission: it reads only the vocabulary."""
        bias = dict(sp.logit_bias)
        if sp.ignore_eos:
            bias.update({t: -float("inf") for t in self.model.eog_ids})
        seed = sp.seed if sp.seed is not None else int.from_bytes(np.random.bytes(4), "little")
        return SamplerChain(
            self.model, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p,
            repeat_penalty=sp.repeat_penalty, presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty, penalty_last_n=sp.penalty_last_n, seed=seed, logit_bias=bias,
            grammar=sp.grammar, grammar_triggers=sp.grammar_triggers)

    # ---- embeddings (scheduler thread) -------------------------------------------------------------

    def embed_limit(self) -> int:
        """Longest input (in tokens) one embedding can take."""
        return min(self.model.n_ctx_train or 2048, 2048)

    def embed_groups(self, inputs: list[list[int]]) -> list[list[list[int]]]:
        """The inputs packed into groups that each fit one embedding decode (any thread)."""
        n_batch = self.embed_limit()
        groups: list[list[list[int]]] = []
        used = 0
        for toks in inputs:
            if groups and groups[-1] and used + len(toks) <= n_batch and len(groups[-1]) < EmbedContext.MAX_SEQS:
                groups[-1].append(toks)
                used += len(toks)
            else:
                groups.append([toks])
                used = len(toks)
        return groups

    def embed(self, group: list[list[int]]) -> list[np.ndarray]:
        """Unit-norm vectors of one group from embed_groups, in one decode (scheduler thread)."""
        if self._ectx is None:
            self._ectx = EmbedContext(self.model, self.settings.threads, self.embed_limit())
        vectors = self._ectx.embed_group(group)
        self.stats.embedding_inputs += len(group)
        self.stats.embedding_decodes += 1
        return vectors

    def rank(self, group: list[list[int]]) -> list[float]:
        """Relevance scores of one group from embed_groups (query and document pairs), in one decode
        (scheduler thread)."""
        if self._rctx is None:
            self._rctx = RankContext(self.model, self.settings.threads, self.embed_limit())
        scores = self._rctx.rank_group(group)
        self.stats.embedding_inputs += len(group)
        self.stats.embedding_decodes += 1
        return scores

    # ---- snapshots (any thread) --------------------------------------------------------------------

    def live_requests(self) -> list[Request]:
        return self.runner.live()

    def request_info(self, r: Request) -> dict[str, Any]:
        """One request as /v1/streams shows it."""
        now = r.ended_at or time.monotonic()
        tok_s = 0.0
        if r.first_token_at is not None and len(r.generated) > 1:
            tok_s = (len(r.generated) - 1) / max(now - r.first_token_at, 1e-6)
        state = "queued" if r.state is RequestState.INBOX else r.state.value  # the thread has not taken it yet
        info = {"id": r.id, "model": self.id, "state": state, "prompt_tokens": len(r.prompt),
                "prompt_done": min(r.num_cached_tokens, len(r.prompt)), "gen_tokens": len(r.generated),
                "max_tokens": r.max_tokens, "tok_s": round(tok_s, 2), "tail": r.tail,
                "seq": r.seq if r.seq >= 0 else None,
                # where the prompt's reused tokens came from: the sequence's own KV, cells attached from another
                # sequence, the host-RAM or the disk prompt cache; the rest was prefilled
                "cache": {**{k: r.reuse.get(k, 0) for k in ("kv", "attached", "ram", "disk")},
                          "prefilled": max(0, min(r.num_cached_tokens, len(r.prompt)) - r.reused_tokens)}}
        if r.state is RequestState.DONE:
            info["finish_reason"] = r.finish_reason
            if r.evict_ticks is not None:
                info["evict_ticks"] = r.evict_ticks
        return info

    def requests_info(self) -> list[dict[str, Any]]:
        """The recently finished requests, then the live ones."""
        return [self.request_info(r) for r in [*list(self.runner.done), *self.live_requests()]]

    def stats_entry(self) -> dict[str, Any]:
        st = self.stats
        gen_rate, prefill_rate = st.rates()
        live = self.live_requests()
        return {
            "id": self.id, "state": self.state, "ctx": self.ctx, "streams": self.settings.streams,
            "chunk": self.settings.chunk, "kv_dtype": self.settings.kv_dtype,
            "embedding_only": self.embedding_only,
            "gen_tokens": st.gen_tokens, "prefill_tokens": st.prefill_tokens, "decode_calls": st.decode_calls,
            "max_streams_per_decode": st.max_streams_per_decode,
            "prefix_cache_hits": st.prefix_cache_hits, "prefix_cache_reused_tokens": st.prefix_cache_reused_tokens,
            "forked_choices": st.forked_choices, "kv_unified": self.settings.kv_unified,
            "kv_reused_tokens": st.kv_reused_tokens, "prefix_attaches": st.prefix_attaches,
            "attached_tokens": st.attached_tokens, "ram_reused_tokens": st.ram_reused_tokens,
            "disk_reused_tokens": st.disk_reused_tokens,
            "prompt_cache": self.cache.stats() if self.cache is not None else None,
            "active_streams": sum(1 for r in live if r.state in (RequestState.PREFILL, RequestState.DECODE)),
            "queued_streams": sum(1 for r in live if r.state in (RequestState.INBOX, RequestState.QUEUED)),
            "rejected_requests": st.rejected_requests, "requests": st.requests,
            "embedding_inputs": st.embedding_inputs, "embedding_decodes": st.embedding_decodes,
            "ttft_ms": st.ttft(), "gen_tok_s": round(gen_rate, 2), "prefill_tok_s": round(prefill_rate, 2),
        }

    def describe(self) -> dict[str, Any]:
        m = self.model
        return {"path": str(m.path), "file_size": m.file_size, "arch": m.arch, "quant": m.quant(),
                "params": m.n_params, "n_ctx_train": m.n_ctx_train, "description": m.description,
                "embedding_only": self.embedding_only, "reranker": m.is_reranker, "chunk": self.settings.chunk,
                "kv_dtype": self.settings.kv_dtype, "vision": self.vision,
                "devices": self.devices(), "gpu_layers": {"offloaded": self.placement.offloaded,
                                                          "total": self.placement.total}}

    def devices(self) -> list[str]:
        """Where it runs: the rpc-servers or GPUs holding its layers, then here ("local": all of it here)."""
        if self.model.devices:
            return self.model.devices
        return [*self.placement.devices, "CPU"] if self.placement.devices else ["local"]

    def free(self) -> None:
        """Release every native object of the model (scheduler thread, after all its requests ended)."""
        self.runner.free()
        if self.runner.bctx:
            self.runner.bctx.free()
        if self._ectx:
            self._ectx.free()
        if self._rctx:
            self._rctx.free()
        if self.projector is not None:
            self.projector.free()
        self.model.free()
        self.state = "unloaded"


def _over_context_advice(chat: bool, truncatable: bool) -> str:
    """What a client can do about a prompt longer than the context, in the terms of its protocol."""
    if not chat:
        return "shorten it or raise the model's ctx"
    if truncatable:
        return "shorten the conversation, send \"truncation\": \"auto\" or raise the model's ctx"
    return "shorten the conversation or raise the model's ctx"
