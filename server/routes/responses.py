"""The OpenAI Responses API (/v1/responses) on the same engine, templates, tool parsers, grammars and reasoning
split as chat completions: a translation layer, no second engine path.

The body is declared once below (pydantic shapes); its input items become chat messages (input_image parts
image_url data-URI parts), and the whole becomes a chat-completions body checked and run as one (a remote
model's sent upstream as chat completions: server/remote.py). The reply's events (content, reasoning, tool calls) become
Responses output items: whole, or built before the client's eyes as the typed SSE event sequence. Responses
are kept (`store`, the default) in server/store.py's SQLite file, so a request can continue a conversation by
`previous_response_id`, also after a restart.
"""
from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from itertools import count
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union

import platformdirs
from aiohttp import web
from pydantic import ConfigDict, Discriminator, Field, StringConstraints, Tag

from engine.config import APP_NAME
from engine.core.generation import Generation
from engine.errors import EngineError, InvalidRequest, NotFound
from engine.tools import Event
from server import remote, schemas, sse
from server.keys import CONFIG, SERVICE
from server.schemas import read_json
from server.shapes import Shape, documents, parse
from server.store import ResponseStore

routes = web.RouteTableDef()
STORE = web.AppKey("response_store", ResponseStore)

Status = Literal["in_progress", "completed", "incomplete"]


# ---- the request, declared once --------------------------------------------------------------------

class InputText(Shape):
    type: Literal["input_text"]
    text: str


class OutputText(Shape):
    type: Literal["output_text"]
    text: str


class Refusal(Shape):
    type: Literal["refusal"]
    refusal: str


class InputImage(Shape):
    """An image as a data: URI in image_url (remote URLs are never fetched; file_id is refused: no Files API)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] | None = None  # accepted; a projector reads an image one way


class MediaPart(Shape):
    """Files and audio: declared so that the 400 can say they are not read."""

    type: Literal["input_file", "input_audio"]


Part = Annotated[Union[InputText, OutputText, Refusal, InputImage, MediaPart], Field(discriminator="type")]


class Message(Shape):
    """A message item (OpenAI's EasyInputMessage when it has no type)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: Status | None = None


class FunctionCall(Shape):
    """A call the model made earlier, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: Annotated[str, StringConstraints(min_length=1)]
    name: Annotated[str, StringConstraints(min_length=1)]
    arguments: str
    id: str | None = None
    status: Status | None = None


class FunctionCallOutput(Shape):
    """What the client's function returned for call_id."""

    type: Literal["function_call_output"]
    call_id: Annotated[str, StringConstraints(min_length=1)]
    output: str | list[Part]
    id: str | None = None
    status: Status | None = None


class SummaryText(Shape):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Shape):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Shape):
    """Reasoning from an earlier turn (its text goes with the next assistant turn, as reasoning_content)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Status | None = None


def _item_type(v: Any) -> Any:
    """An item's tag: its type, "message" when it has none (EasyInputMessage), or for what is no object."""
    if isinstance(v, dict):
        return v.get("type", "message")
    return getattr(v, "type", "message")


Item = Annotated[Union[Annotated[Message, Tag("message")], Annotated[FunctionCall, Tag("function_call")],
                       Annotated[FunctionCallOutput, Tag("function_call_output")],
                       Annotated[ReasoningItem, Tag("reasoning")]], Discriminator(_item_type)]


class FunctionTool(Shape):
    """A function the model may call (the only tool type a local server runs: the client executes it)."""

    type: Literal["function"]
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(Shape):
    type: Literal["function"]
    name: Annotated[str, StringConstraints(min_length=1)]


class FormatText(Shape):
    type: Literal["text"]


class FormatJsonObject(Shape):
    type: Literal["json_object"]


class FormatJsonSchema(Shape):
    type: Literal["json_schema"]
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(Shape):
    format: Annotated[Union[FormatText, FormatJsonObject, FormatJsonSchema], Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # echoed; a local model has no such knob


class ReasoningConfig(Shape):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ResponsesRequest(Shape):
    """POST /v1/responses (OpenAI's fields, and llama.cpp's sampling extras seed, top_k, min_p and stop)."""

    input: str | list[Item]
    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = None
    store: bool | None = None
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    user: str | None = None
    seed: int | None = None
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    stop: str | list[str] | None = None


class InputItemsQuery(Shape):
    """GET /v1/responses/{id}/input_items's query (strings read as their types)."""

    model_config = ConfigDict(strict=False)
    limit: int = Field(20, ge=1, le=100)
    order: Literal["asc", "desc"] = "desc"
    after: str | None = None


# ---- input items -> chat messages --------------------------------------------------------------------

def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as the items a Response lists (ids given, text content as parts), as stored."""
    if isinstance(req.input, str):
        return [_message_item(None, "user", req.input, "input")]
    return [_item(item, f"input[{i}]") for i, item in enumerate(req.input)]


def _item(item: Message | FunctionCall | FunctionCallOutput | ReasoningItem, at: str) -> dict[str, Any]:
    if isinstance(item, Message):
        return _message_item(item.id, item.role, item.content, at)
    if isinstance(item, FunctionCall):
        return {"id": item.id or _new_id("fc"), "type": "function_call", "status": "completed",
                "call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    if isinstance(item, FunctionCallOutput):
        for j, part in enumerate(item.output if isinstance(item.output, list) else []):
            if isinstance(part, InputImage):  # a tool message is text to every chat template: said, not dropped
                raise InvalidRequest(f"'{at}.output[{j}]': images are not supported in a function_call_output; "
                                     "send them as input_image parts of a user message", "input")
        output = item.output if isinstance(item.output, str) else _parts(item.output, "input_text", f"{at}.output")
        return {"id": item.id or _new_id("fco"), "type": "function_call_output", "status": "completed",
                "call_id": item.call_id, "output": output}
    return {"id": item.id or _new_id("rs"), "type": "reasoning", "summary": [s.model_dump() for s in item.summary],
            "content": [c.model_dump() for c in item.content or []]}


def _message_item(mid: str | None, role: str, content: str | list, at: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    parts = _parts([InputText(type="input_text", text=content)] if isinstance(content, str) else content, kind,
                   f"{at}.content")
    return {"id": mid or _new_id("msg"), "type": "message", "role": role, "status": "completed", "content": parts}


def _parts(parts: list, kind: str, at: str) -> list[dict[str, Any]]:
    out = []
    for j, p in enumerate(parts):
        if isinstance(p, MediaPart):
            raise InvalidRequest(f"'{at}[{j}]': {p.type} parts are not supported: no served model reads files or "
                                 "audio", "input")
        if isinstance(p, InputImage):
            out.append(_image(p, f"{at}[{j}]"))
        elif isinstance(p, Refusal):
            out.append({"type": "refusal", "refusal": p.refusal})
        else:  # input_text and output_text alike: the role says which the model wrote
            out.append({"type": kind, "text": p.text, **({"annotations": []} if kind == "output_text" else {})})
    return out


def _image(p: InputImage, at: str) -> dict[str, Any]:
    if p.file_id is not None or p.image_url is None:
        raise InvalidRequest(f"'{at}': files are not supported here (no Files API, so no file_id): send the image "
                             "as a data: URI in image_url", "input")
    return {"type": "input_image", "image_url": p.image_url, "detail": p.detail or "auto"}


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", p.get("refusal", "")) for p in content)


def _content(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's content in chat-completions form: its text, or with images its text and image_url parts."""
    if isinstance(content, str) or all(p["type"] != "input_image" for p in content):
        return _text(content)
    return [{"type": "image_url", "image_url": {"url": p["image_url"]}} if p["type"] == "input_image" else
            {"type": "text", "text": _text([p])} for p in content]


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items (the conversation's, then this request's) as chat-completions messages: calls join the assistant
    message before them, outputs become tool messages (named after their call), reasoning goes with the next
    assistant turn. Developer messages are system messages (local templates know no developer role)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}
    reasoning = ""

    def assistant(content: str | None) -> dict[str, Any]:
        nonlocal reasoning
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"], reasoning = reasoning, ""
        out.append(msg)
        return msg
    for item in items:
        kind = item["type"]
        if kind == "message" and item["role"] == "assistant":
            assistant(_text(item["content"]))
        elif kind == "message":
            out.append({"role": "system" if item["role"] == "developer" else item["role"],
                        "content": _content(item["content"])})
        elif kind == "function_call":
            last = out[-1] if out and out[-1]["role"] == "assistant" else assistant(None)
            last.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function",
                 "function": {"name": item["name"], "arguments": item["arguments"]}})
            names[item["call_id"]] = item["name"]
        elif kind == "function_call_output":
            msg = {"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])}
            if item["call_id"] in names:
                msg["name"] = names[item["call_id"]]
            out.append(msg)
        elif kind == "reasoning":
            reasoning += _text(item.get("content") or item.get("summary") or [])
    return out


# ---- the request -> a chat-completions body -----------------------------------------------------------

# The chat-completions checks name their fields; these are the Responses fields the values came from.
_PARAMS = {"messages": "input", "response_format": "text", "max_tokens": "max_output_tokens",
           "enable_thinking": "reasoning"}
_SAMPLING = ("temperature", "top_p", "seed", "top_k", "min_p", "stop", "truncation", "parallel_tool_calls")


@contextmanager
def _responses_params() -> Iterator[None]:
    """Errors of the chat-completions checks and the engine name the Responses field."""
    try:
        yield
    except InvalidRequest as e:
        e.param = _PARAMS.get(e.param, e.param)
        raise


def chat_body(req: ResponsesRequest, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat-completions body this request amounts to (items: the whole conversation's)."""
    body: dict[str, Any] = {"messages": chat_messages(req.instructions, items)}
    if req.model is not None:
        body["model"] = req.model
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    for name in _SAMPLING:
        if getattr(req, name) is not None:
            body[name] = getattr(req, name)
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(include={"name", "description", "parameters",
                                                                               "strict"}, exclude_none=True)}
                         for t in req.tools]
    if isinstance(req.tool_choice, ToolChoiceFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text else None
    if isinstance(fmt, FormatJsonSchema):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.json_schema,
                                                                          "strict": fmt.strict}}
    elif isinstance(fmt, FormatJsonObject):
        body["response_format"] = {"type": "json_object"}
    effort = req.reasoning.effort if req.reasoning else None
    if effort is not None:  # the model thinks or not; how hard is not a knob a chat template has
        body["enable_thinking"] = effort not in ("none", "minimal")
    return body


# ---- the reply -> output items and stream events ---------------------------------------------------------

class Output:
    """A reply's events as Responses output items, and the stream events that build them, in order (a stream
    event here is its type and fields; the writer numbers them)."""

    def __init__(self, summary: bool):
        self.items: list[dict[str, Any]] = []
        self.summary = summary  # reasoning items carry their text as a summary too (reasoning.summary asked)
        self._open: dict[str, Any] | None = None
        self._text = ""  # the open item's text, or its arguments

    def add(self, e: Event, cut: bool = False) -> list[dict[str, Any]]:
        """The stream events one parser event makes (cut: the reply ended inside the call this event ends)."""
        if e.kind in ("content", "reasoning"):
            return self._write("message" if e.kind == "content" else "reasoning", e.text)
        if e.kind == "tool_call":
            return [*self._begin_call(e.call), *self._args(e.call["arguments"]), *self._close("completed")]
        if e.kind == "tool_call_start":
            return self._begin_call(e.call)
        if e.kind == "tool_args":
            return self._args(e.text)
        return self._close("incomplete" if cut else "completed")  # tool_call_end

    def finish(self, status: str) -> list[dict[str, Any]]:
        """The events that end the reply (an empty reply still has its message, with no text)."""
        events = self._close(status)
        if not self.items:
            events += self._begin("message") + self._close(status)
        return events

    @property
    def reasoning(self) -> str:
        return "".join(_text(i["content"]) for i in self.items if i["type"] == "reasoning")

    def _write(self, kind: str, text: str) -> list[dict[str, Any]]:
        events = []
        if self._open is None or self._open["type"] != kind:
            events = self._close("completed") + self._begin(kind)
        self._text += text
        where = self._where()
        if kind == "message":
            events.append({"type": "response.output_text.delta", **where, "content_index": 0, "delta": text,
                           "logprobs": []})
        else:
            events.append({"type": "response.reasoning_text.delta", **where, "content_index": 0, "delta": text})
        return events

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1}

    def _begin(self, kind: str) -> list[dict[str, Any]]:
        if kind == "message":
            item = {"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": _new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self._add(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": {**item}},
                {"type": "response.content_part.added", **self._where(), "content_index": 0, "part": part}]

    def _begin_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close("completed")
        item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call["id"],
                "name": call["name"], "arguments": ""}
        self._add(item)
        return events + [{"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": {**item}}]

    def _args(self, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        self._text += text
        return [{"type": "response.function_call_arguments.delta", **self._where(), "delta": text}]

    def _add(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self._open, self._text = item, ""

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        where, text = self._where(), self._text
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [part]
            events = [{"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []},
                      {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
        elif item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            events = [{"type": "response.reasoning_text.done", **where, "content_index": 0, "text": text},
                      {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
            if self.summary:
                events += self._summary(item, text)
        else:
            item["arguments"] = text
            events = [{"type": "response.function_call_arguments.done", **where, "name": item["name"],
                       "arguments": text}]
        item["status"] = status
        self._open, self._text = None, ""
        return events + [{"type": "response.output_item.done", "output_index": where["output_index"], "item": item}]

    def _summary(self, item: dict[str, Any], text: str) -> list[dict[str, Any]]:
        """The reasoning as its own summary: a local model writes no separate one, and clients that show
        reasoning read the summary."""
        part = {"type": "summary_text", "text": text}
        item["summary"] = [part]
        at = {**self._where(), "summary_index": 0}
        return [{"type": "response.reasoning_summary_part.added", **at, "part": {"type": "summary_text", "text": ""}},
                {"type": "response.reasoning_summary_text.delta", **at, "delta": text},
                {"type": "response.reasoning_summary_text.done", **at, "text": text},
                {"type": "response.reasoning_summary_part.done", **at, "part": part}]


class Turn:
    """One response being made: the request, its generation, the output so far, and the Response object."""

    def __init__(self, request: web.Request, req: ResponsesRequest, gen: Generation | remote.RemoteGeneration,
                 items: list[dict[str, Any]]):
        self.app = request.app
        self.req = req
        self.gen = gen
        self.items = items  # this request's own input items (what input_items lists)
        self.id = _new_id("resp")
        self.created = int(time.time())
        self.reader = remote.reply_reader(gen, streaming=bool(req.stream))
        self.output = Output(summary=bool(req.reasoning and req.reasoning.summary))
        self.stored = req.store is not False and self.app[STORE].enabled

    def events(self, text: str | None) -> list[dict[str, Any]]:
        """The stream events new text makes (None: the generation ended)."""
        if self.reader.parser is None:
            parsed = [Event("content", text)] if text else []
        else:
            parsed = self.reader.events(text)
        cut = text is None and self.reader.cut_call  # max_output_tokens ended it inside a streamed call
        out = [ev for e in parsed for ev in self.output.add(e, cut)]
        if text is None:
            out += self.output.finish("incomplete" if self.cut else "completed")
        return out

    @property
    def cut(self) -> bool:
        """Whether max_output_tokens ended the reply."""
        return self.gen.finish_reason == "length" or self.reader.cut_call

    def response(self, status: str, usage: dict | None = None, error: dict | None = None) -> dict[str, Any]:
        """The Response object in its current state."""
        req = self.req
        fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format \
            else {"type": "text"}
        tool_choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, ToolChoiceFunction) \
            else req.tool_choice or "auto"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.gen.model,
            "output": self.output.items if status != "in_progress" else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": req.reasoning.summary if req.reasoning else None},
            "store": self.stored, "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt, **({"verbosity": req.text.verbosity} if req.text and req.text.verbosity else {})},
            "tool_choice": tool_choice,
            "tools": [t.model_dump(include={"type", "name", "description", "parameters", "strict"})
                      for t in req.tools or []],
            "top_p": 1.0 if req.top_p is None else req.top_p, "truncation": req.truncation or "disabled",
            "usage": usage, "user": req.user, "metadata": req.metadata or {}, "background": False,
        }

    async def usage(self) -> dict[str, Any]:
        """The Responses usage object; reasoning tokens are the reasoning text's count (the engine counts the
        reply's tokens, not which part of it they went to)."""
        u = self.gen.usage
        thought = u["reasoning_tokens"] if "reasoning_tokens" in u else await self._count(self.output.reasoning)
        return {"input_tokens": u["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": u["cached_tokens"], "cache_write_tokens": 0},
                "output_tokens": u["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": min(thought, u["completion_tokens"])},
                "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}

    async def _count(self, text: str) -> int:
        return len(await self.app[SERVICE].generator.tokenize(self.gen.model, text, False, True)) if text else 0

    async def finished(self) -> dict[str, Any]:
        """The final Response object, kept in the store when asked to."""
        response = self.response("incomplete" if self.cut else "completed", await self.usage())
        if self.stored:
            await self.app[STORE].put(response, self.items)
        return response


# ---- routes ------------------------------------------------------------------------------------------

@documents("POST", "/v1/responses", "Create a model response (OpenAI Responses API)", ResponsesRequest)
@routes.post("/v1/responses")
async def create_response(request: web.Request) -> web.StreamResponse:
    req = parse(ResponsesRequest, await read_json(request), "responses")
    items = input_items(req)
    history = await _conversation(request, req.previous_response_id) if req.previous_response_id else []
    with _responses_params():
        chat, _ = schemas.chat_request(chat_body(req, [*history, *items]))
        gen, = await remote.chat(request, chat, bool(req.stream))
    turn = Turn(request, req, gen, items)
    if req.stream:
        return await _stream(request, turn)
    try:
        text = await gen.text()
    finally:
        gen.cancel()
    turn.events(text)
    turn.events(None)
    return web.json_response(await turn.finished())


async def _conversation(request: web.Request, rid: str) -> list[dict[str, Any]]:
    try:
        return await request.app[STORE].conversation(rid)
    except NotFound as e:
        raise NotFound(e.message, "previous_response_id") from None


def _sse(seq: int, event: dict[str, Any]) -> bytes:
    """An SSE event as OpenAI sends it: its type as the event name, and its sequence number."""
    data = json.dumps({**event, "sequence_number": seq}, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _stream(request: web.Request, turn: Turn) -> web.StreamResponse:
    """The typed event sequence: created, in_progress, each item's events as they come, then completed (or
    incomplete); an engine failure after the start ends it with response.failed. The generation is aborted
    on the way out (client gone or done)."""
    resp = await sse.open_stream(request)
    seq = count()
    start = turn.response("in_progress")
    try:
        await resp.write(_sse(next(seq), {"type": "response.created", "response": start}))
        await resp.write(_sse(next(seq), {"type": "response.in_progress", "response": start}))
        async for text in turn.gen.chunks():
            for event in turn.events(text):
                await resp.write(_sse(next(seq), event))
        for event in turn.events(None):
            await resp.write(_sse(next(seq), event))
        final = await turn.finished()
        await resp.write(_sse(next(seq), {"type": f"response.{final['status']}", "response": final}))
    except EngineError as e:
        error = {"code": "server_error", "message": e.message}
        await resp.write(_sse(next(seq), {"type": "response.failed", "response": turn.response("failed", error=error)}))
    finally:
        turn.gen.cancel()
    await resp.write_eof()
    return resp


@documents("GET", "/v1/responses/{id}", "A stored response")
@routes.get("/v1/responses/{id}")
async def get_response(request: web.Request) -> web.Response:
    return web.json_response((await request.app[STORE].get(request.match_info["id"])).response)


@documents("DELETE", "/v1/responses/{id}", "Delete a stored response")
@routes.delete("/v1/responses/{id}")
async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["id"]
    await request.app[STORE].delete(rid)
    return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})


@documents("GET", "/v1/responses/{id}/input_items", "The input items of a stored response (a page of them)")
@routes.get("/v1/responses/{id}/input_items")
async def list_input_items(request: web.Request) -> web.Response:
    rid = request.match_info["id"]
    q = parse(InputItemsQuery, dict(request.query), "responses.input_items")
    items = (await request.app[STORE].get(rid)).input
    if q.order == "desc":
        items = items[::-1]
    start = 0
    if q.after is not None:
        ids = [i["id"] for i in items]
        if q.after not in ids:
            raise InvalidRequest(f"'after': response '{rid}' has no input item '{q.after}'", "after")
        start = ids.index(q.after) + 1
    page = items[start:start + q.limit]
    return web.json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None,
                              "has_more": start + q.limit < len(items)})


# ---- the store's lifetime ----------------------------------------------------------------------------

def install(app: web.Application) -> None:
    """Add the routes, and the response store: opened as the application starts, closed as it stops."""
    app.add_routes(routes)
    path = Path(platformdirs.user_data_dir(APP_NAME)) / "responses.sqlite3"
    app[STORE] = ResponseStore(path, app[CONFIG].responses_store_mb << 20)
    app.cleanup_ctx.append(_store_lifetime)


async def _store_lifetime(app: web.Application):
    await app[STORE].open()
    yield
    await app[STORE].close()
