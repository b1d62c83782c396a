"""From a caller's request to requests on the scheduler thread: the output spec compiled into one grammar
and one way of reading the text, the chat template rendered and tokenized (off the loop), the sampler
built, and the request with its n > 1 choices handed to the model's runner. Embeddings and reranking too."""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import itertools
import re
import uuid
from typing import Any, Callable

from engine import tools
from engine.chat import image_urls, turns
from engine.core.generation import Generation
from engine.core.request import Request
from engine.errors import ContextLengthExceeded, EngineStopped, InvalidRequest, QueueFull, UnsupportedByModel
from engine.llama import LlamaModel
from engine.models.loaded import LoadedModel
from engine.models.manager import ModelManager
from engine.requests import KEEP, ChatRequest, CompletionRequest, OutputReading, SamplingParams

MAX_QUEUED = 32  # requests waiting for a stream, per model, before 503


def format_grammar(spec: dict[str, Any] | None) -> str | None:
    """The GBNF a response_format spec asks for (None for plain text)."""
    if spec is None:
        return None
    if spec["type"] == "json_object":
        # any JSON object; built by the schema converter, whose numbers have bounded digits (a small model
        # under llama-cpp-python's plain JSON grammar can write "11.1111…" until max_tokens)
        return tools.schema_grammar({"type": "object"})
    return tools.schema_grammar(spec["schema"])


def compile_output(m: LoadedModel, req: ChatRequest) -> tuple[ChatRequest, SamplingParams, OutputReading]:
    """The one place that turns what the output must be (response_format, tools, tool_choice, parallel
    calls) into one grammar, the messages and template arguments to render, and how to read the text that
    comes back."""
    if req.tools and req.tool_choice != "none" and m.tool_format == "none":
        raise UnsupportedByModel(f"model '{m.id}' is configured without tool calling (tool_format = \"none\")",
                                 "tools")
    plan = tools.plan_tools(m.tool_format, req.messages, req.tools, req.tool_choice, req.parallel_tool_calls)
    sampling = req.sampling
    fmt = format_grammar(req.response_format) or sampling.grammar
    if plan.grammar and fmt and not plan.grammar_triggers:
        raise InvalidRequest("response_format cannot be combined with a required or forced tool call",
                             "response_format")
    constrained = False
    if plan.grammar and not fmt:  # with response_format and tool_choice auto, the format wins
        sampling = dataclasses.replace(sampling, grammar=plan.grammar, grammar_triggers=plan.grammar_triggers)
        constrained = True
    elif fmt:
        sampling = dataclasses.replace(sampling, grammar=fmt, grammar_triggers=[])
    req = dataclasses.replace(req, messages=plan.messages,
                              template_kwargs={**req.template_kwargs, **plan.template_kwargs})
    reasoning = m.thinks and req.template_kwargs.get("enable_thinking") is not False
    reading = OutputReading(tool_format=m.tool_format, tools_active=plan.tools_active, constrained_calls=constrained,
                            reasoning=reasoning, parallel_tool_calls=req.parallel_tool_calls)
    return req, sampling, reading


def _fim_tokens(m: LoadedModel, prefix: str, suffix: str, prompt: str,
                extra: list[tuple[str, str]] = ()) -> list[int]:
    """An infill prompt as llama-server lays it out: [BOS] [extra context] <fim_pre> prefix <fim_suf> suffix
    <fim_mid> prompt. Each extra (filename, text) chunk goes after <fim_sep> and its filename where the model
    has that token, else after llama-server's plain-text separator."""
    lm = m.model
    pre, suf, mid = lm.fim

    def tok(text: str) -> list[int]:
        return lm.tokenize(text, add_special=False, parse_special=False) if text else []
    context: list[int] = []
    if extra and lm.fim_rep >= 0:
        context += [lm.fim_rep, *tok("myproject\n")]
    for filename, text in extra:
        context += [lm.fim_sep, *tok(filename + "\n")] if lm.fim_sep >= 0 else tok(_CHUNK_SEPARATOR)
        context += tok(text)
    if extra and lm.fim_sep >= 0:
        context += [lm.fim_sep, *tok("filename\n")]  # the file being completed (llama-server names it so too)
    head = [lm.bos_id] if lm.add_bos and lm.bos_id >= 0 else []
    return [*head, *context, pre, *tok(prefix), suf, *tok(suffix), mid, *tok(prompt)]


_CHUNK_SEPARATOR = "\n\n--- snip ---\n\n"  # llama-server's, between extra chunks of a model without <fim_sep>


class Generator:
    """Chat, completions and embeddings over the loaded models."""

    def __init__(self, roster: ModelManager, run: Callable[[Callable[[], Any]], asyncio.Future],
                 worker: Callable[[], Any], refuse_while_benching: Callable[[], None]):
        self.roster = roster
        self._run = run
        self._worker = worker  # the scheduler thread (None when stopped)
        self._not_benching = refuse_while_benching
        self._prep = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="llamadesk-prep")
        self._ids = itertools.count(1)

    def close(self) -> None:
        self._prep.shutdown(wait=False)

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._prep, fn, *args)

    async def chat(self, req: ChatRequest, n: int = 1) -> list[Generation]:
        """Render, tokenize and queue a chat completion with n choices; iterate each one's chunks()."""
        self._not_benching()
        async with self.roster.lease(req.model, req.keep_alive) as m:
            req, sampling, reading = compile_output(m, req)
            prompt, text = await self._off_loop(self._chat_tokens, m, req)
            # templates that open <think> in the generation prompt: the reply starts inside the reasoning, unless a
            # grammar binds it from its first token (a required call, a response_format), which is then no reasoning
            bound = sampling.grammar is not None and not sampling.grammar_triggers
            opens = reading.reasoning and text.rstrip().endswith("<think>") and not bound
            reading = dataclasses.replace(reading, in_reasoning=opens)
            try:
                return await self._submit(m, prompt, sampling, n, reading, truncatable=req.truncation is not None)
            except InvalidRequest as e:
                if e.param is None:  # llama.cpp refused the grammar: name the field it was compiled from
                    e.param = "tools" if reading.constrained_calls else "response_format"
                raise

    async def complete(self, req: CompletionRequest, n: int = 1) -> list[Generation]:
        """Tokenize and queue a raw completion with n choices."""
        self._not_benching()
        async with self.roster.lease(req.model, req.keep_alive) as m:
            if isinstance(req.prompt, str):
                prompt = await self._off_loop(self._tokenize, m, req.prompt)
            else:
                prompt = list(req.prompt)
                m.check_tokens(prompt, "prompt")
            if not prompt:
                raise InvalidRequest("the prompt is empty", "prompt")
            return await self._submit(m, prompt, req.sampling, n, OutputReading(), chat=False)

    async def _submit(self, m: LoadedModel, prompt: list[int], sampling: SamplingParams, n: int,
                      reading: OutputReading, chat: bool = True, truncatable: bool = True) -> list[Generation]:
        """Check the request against the model, build each choice's sampler (a grammar llama.cpp refuses is a
        400 here, before anything streams) and hand the request to the scheduler thread: the prompt is
        prefilled once, the other choices fork its KV (seeds seed, seed+1, ... when a seed is given)."""
        worker = self._worker()
        if worker is None:
            raise EngineStopped("the engine is not running")
        if m.outstanding + n > m.settings.streams + MAX_QUEUED:
            m.stats.rejected_requests += 1
            raise QueueFull(f"model '{m.id}' is busy: {m.settings.streams} streams generating and "
                            f"{MAX_QUEUED} requests queued; retry later")
        special = reading.tools_active or reading.reasoning
        base = f"{next(self._ids):x}{uuid.uuid4().hex[:12]}"
        choices = [dataclasses.replace(sampling, seed=None if sampling.seed is None else sampling.seed + i)
                   for i in range(n)]
        reqs = [m.make_request(base if i == 0 else f"{base}-{i}", prompt, sp, special, chat, truncatable)
                for i, sp in enumerate(choices)]
        m.outstanding += n  # the places are taken while the samplers are built; given back if that fails
        fut = asyncio.get_running_loop().run_in_executor(self._prep, lambda: _samplers(m, choices))
        try:
            samplers = await asyncio.shield(fut)
        except BaseException:
            m.outstanding -= n
            # the client left while the samplers were built: free them once they exist
            fut.add_done_callback(lambda f: f.cancelled() or f.exception() or [s.free() for s in f.result()])
            raise
        for r, s in zip(reqs, samplers):
            r.sampler = s
        # the choices fork the first one's KV when they fit the model's streams together; more queue as
        # requests of their own (each prefills; the prefix cache usually has the prompt by then)
        families = [reqs] if n <= m.settings.streams else [[r] for r in reqs]
        for parent, *children in families:
            for child in children:
                child.parent = parent
            parent.children = children

        def cancel(r: Request) -> None:
            worker.call(lambda: m.runner.cancel(r))

        def closed() -> None:
            m.outstanding -= 1
        gens = []
        for r in reqs:
            gen = Generation(r, m.id, reading, cancel, closed)
            r.sink = gen
            gens.append(gen)
        m.stats.requests += n
        for parent, *_ in families:
            m.runner.submit(parent)
        worker.wake()
        return gens

    def _tokenize(self, m: LoadedModel, text: str, messages: list[dict[str, Any]] | None = None) -> list[int]:
        add_bos = m.model.add_bos and not (m.template.bos and text.startswith(m.template.bos))
        if messages is not None and image_urls(messages):  # their markers become the images' rows
            return m.image_prompt(text, messages, add_bos)
        return m.model.tokenize(text, add_special=add_bos, parse_special=True)

    def _chat_tokens(self, m: LoadedModel, req: ChatRequest) -> tuple[list[int], str]:
        """The prompt tokens and text; with truncation 'auto', oldest user-led turns go until it fits."""
        messages = req.messages
        text = m.template.render(messages, **req.template_kwargs)
        tokens = self._tokenize(m, text, messages)
        if req.truncation != "auto":
            return tokens, text
        need = req.sampling.max_tokens or min(m.settings.default_max_tokens, m.ctx // 4)
        if len(tokens) + need <= m.ctx:
            return tokens, text
        system, groups = turns(messages)

        def without(k: int) -> tuple[list[int], str]:  # the prompt with the oldest k user-led turns dropped
            kept = [req.messages[i] for i in system + [i for g in groups[k:] for i in g]]
            t = m.template.render(kept, **req.template_kwargs)
            return self._tokenize(m, t, kept), t
        # the fewest turns to drop, by bisection: dropping more never makes the prompt longer, and
        # rendering once per dropped turn would cost time quadratic in the conversation's length
        lo, hi = 1, len(groups) - 1  # the latest turn always stays
        fitting = None
        while lo <= hi:
            mid = (lo + hi) // 2
            cand = without(mid)
            if len(cand[0]) + need <= m.ctx:
                fitting, hi = cand, mid - 1
            else:
                lo = mid + 1
        if fitting is not None:
            return fitting
        if len(groups) > 1:
            tokens, text = without(len(groups) - 1)
        if len(tokens) + need > m.ctx:
            raise ContextLengthExceeded(
                f"even with truncation the system prompt and latest turn take {len(tokens)} tokens, which with "
                f"{need} for the completion exceeds the context of {m.ctx}", "messages")
        return tokens, text

    # ---- llama-server's utilities ----------------------------------------------------------------

    async def tokenize(self, model: str | None, text: str, add_special: bool, parse_special: bool,
                       with_pieces: bool = False) -> list[int] | list[dict[str, Any]]:
        """The model's token ids for text, or with_pieces each as {id, piece} (off the loop: a long text's
        pieces take the loop a second)."""
        async with self.roster.lease(model) as m:
            def run() -> list:
                toks = m.model.tokenize(text, add_special=add_special, parse_special=parse_special)
                return [{"id": t, "piece": _piece(m.model.piece(t, special=True))} for t in toks] if with_pieces \
                    else toks
            return await self._off_loop(run)

    async def detokenize(self, model: str | None, tokens: list[int]) -> str:
        """The text token ids stand for (special tokens as their text; invalid UTF-8 as U+FFFD)."""
        async with self.roster.lease(model) as m:
            m.check_tokens(tokens, "tokens")
            return await self._off_loop(
                lambda: b"".join(m.model.piece(t, special=True) for t in tokens).decode("utf-8", "replace"))

    async def infill(self, model: str | None, prefix: str, suffix: str, prompt: str, sampling: SamplingParams,
                     n: int = 1, keep_alive: Any = KEEP, field: str = "model",
                     extra: list[tuple[str, str]] = ()) -> list[Generation]:
        """Fill in the middle (llama-server's /infill, and /v1/completions with a suffix): the model's FIM tokens
        around prefix and suffix, then generate what goes between (prompt: text the middle starts with; extra:
        (filename, text) chunks of context from other files). A model without FIM tokens is a 400 naming field."""
        self._not_benching()
        async with self.roster.lease(model, keep_alive) as m:
            if m.model.fim is None:
                raise UnsupportedByModel(f"'{field}' needs fill-in-the-middle tokens, and model '{m.id}' has none "
                                         "(a code model has them)", field)
            tokens = await self._off_loop(_fim_tokens, m, prefix, suffix, prompt, extra)
            return await self._submit(m, tokens, sampling, n, OutputReading(), chat=False)

    async def apply_template(self, req: ChatRequest) -> str:
        """The prompt a chat request renders to (its tools and output format applied), not generated."""
        async with self.roster.lease(req.model) as m:
            req, _, _ = compile_output(m, req)
            return (await self._off_loop(self._chat_tokens, m, req))[1]

    async def count_tokens(self, req: ChatRequest) -> int:
        """How many prompt tokens a chat request renders to (what its usage would count), not generated."""
        async with self.roster.lease(req.model) as m:
            req, _, _ = compile_output(m, req)
            return len((await self._off_loop(self._chat_tokens, m, req))[0])

    # ---- embeddings ----------------------------------------------------------------------------

    async def embed(self, model: str | None, inputs: list[str | list[int]], keep_alive: Any = KEEP,
                    ) -> tuple[str, list, int]:
        """(model id, unit-norm vectors, prompt tokens) for every input, batched into few decodes."""
        self._not_benching()
        async with self.roster.lease(model, keep_alive) as m:
            toks = await self._off_loop(self._embed_tokens, m, inputs)
            vectors = []
            for group in m.embed_groups(toks):  # one decode per call: generation ticks run between them
                vectors += await self._run(lambda g=group: m.embed(g))
            return m.id, vectors, sum(len(t) for t in toks)

    def _embed_tokens(self, m: LoadedModel, inputs: list[str | list[int]]) -> list[list[int]]:
        out = []
        limit = m.embed_limit()
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                if not item:
                    raise InvalidRequest(f"input[{i}] is an empty string", "input")
                toks = m.model.tokenize(item, add_special=True, parse_special=False)
            else:
                toks = list(item)
                if not toks:
                    raise InvalidRequest(f"input[{i}] is an empty list of token ids", "input")
                m.check_tokens(toks, "input")
            if len(toks) > limit:
                raise ContextLengthExceeded(f"input[{i}] is {len(toks)} tokens; model '{m.id}' embeds at most "
                                            f"{limit}", "input")
            out.append(toks)
        return out

    # ---- reranking -----------------------------------------------------------------------------

    async def rerank(self, model: str | None, query: str, documents: list[str]) -> tuple[str, list[float], int]:
        """(model id, each document's relevance score to query, prompt tokens) from a reranker's classifier
        head, the query and document pairs batched into few decodes."""
        self._not_benching()
        async with self.roster.lease(model) as m:
            if not m.model.is_reranker:
                raise UnsupportedByModel(
                    f"model '{m.id}' is not a reranker: /v1/rerank needs a GGUF with rank pooling "
                    f"({m.model.arch}.pooling_type = 4) and a classifier head, such as bge-reranker or "
                    "Qwen3-Reranker", "model")
            toks = await self._off_loop(self._rerank_tokens, m, query, documents)
            scores = []
            for group in m.embed_groups(toks):  # one decode per call: generation ticks run between them
                scores += await self._run(lambda g=group: m.rank(g))
            return m.id, scores, sum(len(t) for t in toks)

    def _rerank_tokens(self, m: LoadedModel, query: str, documents: list[str]) -> list[list[int]]:
        """Each pair's tokens, as llama-server lays them out (format_prompt_rerank): the GGUF's rerank prompt
        with {query} and {document} filled in, or else [BOS] query [EOS] [SEP] document [EOS] (each marker
        where the vocabulary adds it)."""
        limit = m.embed_limit()
        out = []
        for i, doc in enumerate(documents):
            toks = _rerank_pair(m.model, query, doc)
            if len(toks) > limit:
                alone = len(_rerank_pair(m.model, query, ""))
                param = "query" if alone > limit // 2 else "documents"
                raise ContextLengthExceeded(f"the query with documents[{i}] is {len(toks)} tokens; model '{m.id}' "
                                            f"ranks at most {limit} (the query alone takes {alone})", param)
            out.append(toks)
        return out


_RERANK_SLOTS = re.compile(r"\{query\}|\{document\}")


def _rerank_pair(model: LlamaModel, query: str, doc: str) -> list[int]:
    """One query and document pair's tokens (see Generator._rerank_tokens)."""
    if model.rerank_template is not None:
        # one pass, so that a query holding the text "{document}" stays as it is
        text = _RERANK_SLOTS.sub(lambda s: query if s.group() == "{query}" else doc, model.rerank_template)
        return model.tokenize(text, add_special=False, parse_special=True)
    eos = model.eos_id if model.eos_id >= 0 else model.sep_id
    q = model.tokenize(query, add_special=False, parse_special=False)
    d = model.tokenize(doc, add_special=False, parse_special=False)
    return [*([model.bos_id] if model.add_bos else []), *q, *([eos] if model.add_eos else []),
            *([model.sep_id] if model.add_sep else []), *d, *([eos] if model.add_eos else [])]


def _piece(b: bytes) -> str | list[int]:
    """A token's text; its bytes when it holds part of a multi-byte character (as llama-server sends them)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _samplers(m: LoadedModel, choices: list[SamplingParams]) -> list:
    """One native sampler chain per choice; all freed again if one cannot be built."""
    made = []
    try:
        for sp in choices:
            made.append(m.new_sampler(sp))
    except BaseException:
        for s in made:
            s.free()
        raise
    return made
