"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on the same engine, templates, tool
parsers, grammars and reasoning split as chat completions: a translation layer, no second engine path. A body
becomes a ChatRequest (system -> a system message, tool_use blocks -> assistant tool_calls, tool_result blocks
-> tool messages, image blocks -> image_url data-URI parts, thinking -> enable_thinking); a remote model's goes
upstream as chat completions (server/remote.py). The reply's content, reasoning and calls become text, thinking
and tool_use blocks, buffered or as Anthropic's SSE events. Errors come in Anthropic's shape
{"type": "error", "error": {"type", "message"}} (server/errors.py answers so for every /v1/messages path)."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from aiohttp import web
from pydantic import Field, field_validator, model_validator

from engine.core.generation import Generation
from engine.errors import EngineError, InvalidRequest
from engine.requests import ChatRequest, SamplingParams
from engine.tools import Event, assemble
from server import remote, schemas, sse
from server.errors import anthropic_error_event
from server.keys import SERVICE
from server.schemas import _TOOL_NAME, read_json
from server.shapes import Closed, Shape, documents, parse

routes = web.RouteTableDef()

# ---- the request shapes -----------------------------------------------------------------------------


class CacheControl(Closed):
    """A prompt-caching breakpoint: accepted and without effect (the prefix cache reuses prompts by itself)."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class _Block(Closed):
    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict] | None = None  # accepted; nothing here cites


class Base64Source(Closed):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(Closed):
    """Declared so that the 400 can say why: remote URLs are never fetched."""

    type: Literal["url"]
    url: str


class ImageBlock(_Block):
    """An image, sent inline as base64 (a url source is refused)."""

    type: Literal["image"]
    source: Annotated[Union[Base64Source, UrlSource], Field(discriminator="type")]


class DocumentBlock(Shape):
    """Refused with a clear 400 (no PDF or document input here)."""

    type: Literal["document"]


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[Union[TextBlock, ImageBlock, DocumentBlock], Field(discriminator="type")]] = ""
    is_error: bool | None = None


class ThinkingBlock(Closed):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # opaque; never checked here


class RedactedThinkingBlock(Closed):
    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[Union[TextBlock, ImageBlock, DocumentBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock,
                               RedactedThinkingBlock], Field(discriminator="type")]


class Message(Closed):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[ContentBlock], Field(min_length=1)]


class Tool(Closed):
    """A client tool: the model writes its input, the client runs it."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_server_tools(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind is not None and kind != "custom":  # web_search_*, bash_*, text_editor_*, computer_*, ...
            raise ValueError(f"tool type {kind!r} is not supported here (server and Anthropic-defined tools run "
                             "on Anthropic's side); declare a client tool with name, description and input_schema")
        return data

    @field_validator("name")
    @classmethod
    def _usable_name(cls, name: str) -> str:
        if not _TOOL_NAME.fullmatch(name):
            raise ValueError(f"must be 1 to 64 letters, digits, '_', '-' or '.', got {name[:80]!r}")
        return name


class ToolChoiceAuto(Closed):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Closed):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Closed):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Closed):
    type: Literal["none"]


ToolChoice = Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                       Field(discriminator="type")]


class ThinkingEnabled(Closed):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=1)  # accepted; the reasoning is not cut at it (max_tokens bounds it all)
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Closed):
    type: Literal["disabled"]


class ThinkingAdaptive(Closed):
    type: Literal["adaptive"]  # the model decides: its chat template's default
    display: Literal["summarized", "omitted"] | None = None


Thinking = Annotated[Union[ThinkingEnabled, ThinkingDisabled, ThinkingAdaptive], Field(discriminator="type")]


class JsonOutputFormat(Closed):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Closed):
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # accepted; without effect here


class Metadata(Closed):
    user_id: str | None = None  # accepted; never logged


class CountTokensRequest(Shape):
    """POST /v1/messages/count_tokens: what the prompt of a Messages request would be, not generated."""

    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages: Anthropic's Messages API."""

    max_tokens: int = Field(ge=1)
    stop_sequences: Annotated[list[str], Field(max_length=16)] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = None
    stream: bool = False

    @model_validator(mode="after")
    def _budget_below_max_tokens(self) -> MessagesRequest:
        # Anthropic's own rule: the thinking budget is part of max_tokens, so it must leave room for the answer
        if isinstance(self.thinking, ThinkingEnabled) and self.thinking.budget_tokens >= self.max_tokens:
            raise InvalidRequest(f"thinking.budget_tokens: must be less than max_tokens ({self.max_tokens}), got "
                                 f"{self.thinking.budget_tokens}", "thinking")
        return self


# ---- the request as a ChatRequest -------------------------------------------------------------------

def _joined(blocks: list[TextBlock]) -> str:
    return "\n\n".join(b.text for b in blocks)


def _refuse_documents(block: Any, at: str) -> None:
    if isinstance(block, DocumentBlock):
        raise InvalidRequest(f"{at}: document blocks are not supported", "messages")


def _image_part(b: ImageBlock, at: str) -> dict:
    """An image block as a chat-completions image_url part (a data: URI)."""
    if isinstance(b.source, UrlSource):
        raise InvalidRequest(f"{at}.source: remote URLs are never fetched; send the image as a base64 source",
                             "messages")
    return {"type": "image_url", "image_url": {"url": f"data:{b.source.media_type};base64,{b.source.data}"}}


def _user(parts: list[dict]) -> dict:
    """A user message of text and image parts (its text joined as one string when it has no image)."""
    if all(p["type"] == "text" for p in parts):
        return {"role": "user", "content": "\n\n".join(p["text"] for p in parts)}
    return {"role": "user", "content": parts}


def _tool_message(b: ToolResultBlock, at: str, names: dict[str, str]) -> dict:
    """A tool_result block as a chat-completions tool message (the tool's name looked up from its tool_use)."""
    if b.tool_use_id not in names:
        raise InvalidRequest(f"{at}.tool_use_id {b.tool_use_id!r} answers no tool_use block of an earlier "
                             "assistant message", "messages")
    if isinstance(b.content, str):
        text = b.content
    else:
        for k, part in enumerate(b.content):
            _refuse_documents(part, f"{at}.content[{k}]")
            if isinstance(part, ImageBlock):
                raise InvalidRequest(f"{at}.content[{k}]: images are not supported in a tool_result; send them as "
                                     "image blocks of the user turn", "messages")
        text = _joined(b.content)
    return {"role": "tool", "tool_call_id": b.tool_use_id, "name": names[b.tool_use_id],
            "content": f"Error: {text}" if b.is_error else text}


def _user_messages(blocks: list, i: int, names: dict[str, str]) -> list[dict]:
    """A user turn's blocks in order: tool results as tool messages, the text and images between them as user
    messages."""
    out, run = [], []
    for j, b in enumerate(blocks):
        at = f"messages[{i}].content[{j}]"
        _refuse_documents(b, at)
        if isinstance(b, TextBlock):
            run.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageBlock):
            run.append(_image_part(b, at))
        elif isinstance(b, ToolResultBlock):
            if run:
                out.append(_user(run))
                run = []
            out.append(_tool_message(b, at, names))
        else:
            raise InvalidRequest(f"{at}: a {b.type} block belongs in an assistant message", "messages")
    if run:
        out.append(_user(run))
    return out


def _assistant_message(blocks: list, i: int, names: dict[str, str]) -> dict:
    """An assistant turn: its text, its tool_use blocks as tool_calls, its thinking as reasoning_content
    (templates that replay reasoning render it; redacted thinking is dropped)."""
    texts, calls, thinking = [], [], []
    for j, b in enumerate(blocks):
        if isinstance(b, TextBlock):
            texts.append(b)
        elif isinstance(b, ToolUseBlock):
            names[b.id] = b.name
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}})
        elif isinstance(b, ThinkingBlock):
            thinking.append(b.thinking)
        elif not isinstance(b, RedactedThinkingBlock):
            raise InvalidRequest(f"messages[{i}].content[{j}]: a {b.type} block belongs in a user message",
                                 "messages")
    msg: dict[str, Any] = {"role": "assistant", "content": _joined(texts) if texts or not calls else None}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def _chat_messages(body: CountTokensRequest) -> list[dict]:
    """The conversation as chat-completions messages (checked as chat completions' are)."""
    out: list[dict] = []
    system = body.system if isinstance(body.system, str) else _joined(body.system or [])
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            out.append(_assistant_message(m.content, i, names))
        else:
            out += _user_messages(m.content, i, names)
    if body.messages[-1].role != "user":
        raise InvalidRequest(f"messages[{len(body.messages) - 1}]: the last message must be the user's (continuing "
                             "a prefilled assistant message is not supported)", "messages")
    schemas.check_messages(out)
    return out


def _tools(body: CountTokensRequest) -> tuple[list[dict] | None, Any, bool]:
    """(tools, tool_choice, parallel_tool_calls) in chat-completions form."""
    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.input_schema,
                                               **({"description": t.description} if t.description else {})}}
             for t in body.tools or []] or None
    schemas.tools_field(tools)
    c = body.tool_choice
    if c is None:
        return tools, None, True
    if c.type in ("any", "tool") and not tools:
        raise InvalidRequest(f"tool_choice type '{c.type}' needs 'tools'", "tool_choice")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(c.type) or \
        {"type": "function", "function": {"name": c.name}}
    return tools, choice, not getattr(c, "disable_parallel_tool_use", None)


def chat_request(body: CountTokensRequest) -> ChatRequest:
    """A Messages (or count_tokens) body as the engine's ChatRequest."""
    messages = _chat_messages(body)
    tools, choice, parallel = _tools(body)
    kwargs = {}
    if body.thinking is not None and body.thinking.type != "adaptive":
        kwargs["enable_thinking"] = body.thinking.type == "enabled"
    fmt = body.output_config.format if body.output_config else None
    if isinstance(body, MessagesRequest):
        sampling = SamplingParams(max_tokens=body.max_tokens, max_tokens_ceiling=True,
                                  temperature=1.0 if body.temperature is None else body.temperature,
                                  top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
                                  stop=list(body.stop_sequences or []))
    else:
        sampling = SamplingParams()
    return ChatRequest(body.model, messages, sampling, template_kwargs=kwargs, tools=tools, tool_choice=choice,
                       parallel_tool_calls=parallel, truncation=None,  # Messages has no truncation field
                       response_format={"type": "json_schema", "schema": fmt.schema_} if fmt else None)


# ---- the reply --------------------------------------------------------------------------------------

class _Reply:
    """One generation's text read as Anthropic content blocks: whole (buffered) or as stream events."""

    def __init__(self, gen: Generation | remote.RemoteGeneration, body: MessagesRequest, streaming: bool):
        self.gen = gen
        self.max_tokens = body.max_tokens
        self.reader = remote.reply_reader(gen, streaming)
        self.omit_thinking = getattr(body.thinking, "display", None) == "omitted"
        self.signature = f"llamadesk-{gen.id}"  # opaque to the client, which sends it back unread
        self.index = -1  # the latest block's index (streaming)
        self.open: str | None = None  # the type of the block being streamed, if one is open

    def _events(self, text: str | None) -> list[Event]:
        if self.reader.parser is None:  # plain text: nothing to split
            return [Event("content", text)] if text else []
        return self.reader.events(text)

    def stop_reason(self) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) once the generation ended."""
        gen = self.gen
        if gen.finish_reason == "length":  # max_tokens, or the context had no room for more
            out = gen.usage.get("completion_tokens", 0)
            return ("max_tokens" if out >= self.max_tokens else "model_context_window_exceeded"), None
        if self.reader.calls and not self.reader.cut_call:
            return "tool_use", None
        if gen.stop_sequence is not None:
            return "stop_sequence", gen.stop_sequence
        return "end_turn", None

    def usage(self) -> dict[str, int]:
        """Anthropic's usage: input_tokens are the prompt tokens not read from the prefix cache."""
        u = self.gen.usage
        cached = u.get("cached_tokens", 0)
        return {"input_tokens": u.get("prompt_tokens", self.gen.prompt_tokens) - cached,
                "output_tokens": u.get("completion_tokens", 0), "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0}

    def envelope(self, content: list[dict]) -> dict:
        return {"id": f"msg_{self.gen.id}", "type": "message", "role": "assistant", "model": self.gen.model,
                "content": content, "stop_reason": None, "stop_sequence": None}

    def message(self, text: str) -> dict:
        """The whole message of a buffered reply."""
        content, thinking, calls = assemble(self._events(text) + self._events(None))
        blocks: list[dict] = []
        if thinking:
            blocks.append(self._thinking("" if self.omit_thinking else thinking))
        if content.strip() or (content and not calls):
            blocks.append({"type": "text", "text": content})
        blocks += [_tool_use(c, _input(c["arguments"])) for c in calls]
        stop_reason, stop_sequence = self.stop_reason()
        return {**self.envelope(blocks or [{"type": "text", "text": ""}]), "stop_reason": stop_reason,
                "stop_sequence": stop_sequence, "usage": self.usage()}

    def _thinking(self, text: str) -> dict:
        return {"type": "thinking", "thinking": text, "signature": self.signature}

    # streaming: content_block_start / _delta / _stop events, one block open at a time

    def feed(self, text: str | None) -> list[bytes]:
        """The SSE events for new text (None: the generation ended, and the open block closes)."""
        out = [b for e in self._events(text) for b in self._on(e)]
        if text is None:
            if self.index < 0:  # nothing came: one empty text block, as the buffered reply has
                out += self._start("text", {"type": "text", "text": ""})
            out += self._stop()
        return out

    def _on(self, e: Event) -> list[bytes]:
        if e.kind == "content":
            return self._into("text", {"type": "text", "text": ""}) + self._delta("text_delta", text=e.text)
        if e.kind == "reasoning":
            head = self._into("thinking", self._thinking(""))
            return head if self.omit_thinking else head + self._delta("thinking_delta", thinking=e.text)
        if e.kind == "tool_call":  # a whole call: its block opens and closes at once
            c = e.call
            return self._stop() + self._start("tool_use", _tool_use(c, {})) + \
                self._delta("input_json_delta", partial_json=c["arguments"]) + self._stop()
        if e.kind == "tool_call_start":
            return self._stop() + self._start("tool_use", _tool_use(e.call, {}))
        if e.kind == "tool_args":
            return self._delta("input_json_delta", partial_json=e.text)
        return self._stop()  # tool_call_end

    def _into(self, kind: str, block: dict) -> list[bytes]:
        return [] if self.open == kind else self._stop() + self._start(kind, block)

    def _start(self, kind: str, block: dict) -> list[bytes]:
        self.index += 1
        self.open = kind
        return [_event("content_block_start", index=self.index, content_block=block)]

    def _delta(self, kind: str, **fields: str) -> list[bytes]:
        return [_event("content_block_delta", index=self.index, delta={"type": kind, **fields})]

    def _stop(self) -> list[bytes]:
        if self.open is None:
            return []
        out = self._delta("signature_delta", signature=self.signature) if self.open == "thinking" else []
        self.open = None
        return out + [_event("content_block_stop", index=self.index)]


def _tool_use(call: dict, input_: dict) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["name"],
            "input": input_}


def _input(arguments: str) -> dict:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(name: str, **data: Any) -> bytes:
    """One of Anthropic's SSE events: its name, and its data with the name as its type."""
    return f"event: {name}\n".encode() + sse.event({"type": name, **data})


# ---- routes -----------------------------------------------------------------------------------------

@documents("POST", "/v1/messages", "Anthropic Messages: the assistant's reply to a conversation (or its SSE "
           "events)", MessagesRequest)
@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    """A Messages reply: buffered, or Anthropic's SSE events with "stream": true."""
    body = parse(MessagesRequest, await read_json(request), "messages")
    gen, = await remote.chat(request, chat_request(body), body.stream)
    reply = _Reply(gen, body, body.stream)
    if body.stream:
        return await _stream(request, gen, reply)
    try:
        text = await gen.text()
    finally:
        gen.cancel()  # a no-op when finished; ends the engine's work when the client went away
    return web.json_response(reply.message(text))


async def _stream(request: web.Request, gen: Generation | remote.RemoteGeneration, reply: _Reply) -> web.StreamResponse:
    """message_start, ping, the blocks' events, message_delta, message_stop; an engine failure after the start
    ends the stream with an error event. The engine request is aborted on the way out (client gone or done)."""
    resp = await sse.open_stream(request)
    try:
        start = {**reply.envelope([]), "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0,
                                                 "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}
        await resp.write(_event("message_start", message=start) + _event("ping"))
        async for text in gen.chunks():
            for e in reply.feed(text):
                await resp.write(e)
        ending = reply.feed(None)
        stop_reason, stop_sequence = reply.stop_reason()
        ending.append(_event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                             usage=reply.usage()))
        await resp.write(b"".join(ending) + _event("message_stop"))
    except EngineError as e:
        await resp.write(anthropic_error_event(e))
    finally:
        gen.cancel()
    await resp.write_eof()
    return resp


@documents("POST", "/v1/messages/count_tokens", "Anthropic Messages: the prompt tokens a request would take",
           CountTokensRequest)
@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    """{"input_tokens": N}: the prompt a Messages body renders to through the model's chat template, counted."""
    body = parse(CountTokensRequest, await read_json(request), "messages.count_tokens")
    return web.json_response({"input_tokens": await request.app[SERVICE].generator.count_tokens(chat_request(body))})
