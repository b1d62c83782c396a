"""The OpenAI request bodies (chat completions, completions, embeddings) declared once as pydantic shapes, and
their translation into engine requests; and the JSON body reader every route uses.

The parts other protocols share are declared here once: the sampling fields and their bounds (`Temperature`,
`TopP`, ...; Ollama's options and /infill use them), chat messages and function tools (Anthropic's and
Ollama's translations are checked with them: `check_messages`, `tools_field`). A field a request leaves out
keeps the engine's default: defaults are written in engine/requests.py only.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from aiohttp import web
from pydantic import AfterValidator, Discriminator, Field, Tag, field_validator

from engine.chat import ROLES, TEMPLATE_VARIABLES
from engine.errors import InvalidRequest, UnsupportedMediaType
from engine.models.tenancy import parse_keep_alive
from engine.requests import KEEP, ChatRequest, CompletionRequest, SamplingParams
from server.errors import MAX_BODY_KEY
from server.shapes import NonEmpty, Shape, between, parse, refuse

MAX_DEPTH = 64  # deepest nesting of arrays and objects a JSON body may have


async def read_json(request: web.Request, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (InvalidRequest if it is not one; 413 over the JSON limit; 415 unless
    it is sent as application/json). empty_ok: an empty body (no Content-Type needed) reads as {}."""
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    if empty_ok and request.content_length == 0:
        return {}
    # A web page can send text/plain, form or multipart bodies to any origin without a CORS preflight;
    # JSON routes take only JSON, so such a "simple" request never reaches a handler.
    if request.content_type != "application/json":
        got = request.headers.get("Content-Type")
        raise UnsupportedMediaType(f"send the body as JSON with 'Content-Type: application/json' (got "
                                   f"{got!r})" if got else "send the body as JSON with 'Content-Type: "
                                   "application/json' (the request had no Content-Type)")
    raw = await request.read()
    if len(raw) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(raw))
    if empty_ok and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:  # deeper than the parser goes
        raise InvalidRequest(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep") \
            from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer literal over 4300 digits
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if _depth_exceeds(body, MAX_DEPTH):
        raise InvalidRequest(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep")
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, not {_json_type(body)}")
    return body


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether value nests lists and dicts deeper than limit (iteratively: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, (list, dict)))
    return False


# ---- sampling: the fields every generating route reads -------------------------------------------

Temperature = between(0, 2)
TopP = between(0, 1)
TopK = between(0, 2**31 - 1, int)
MinP = between(0, 1)
RepeatPenalty = between(0.01, 10)
Penalty = between(-2, 2)  # presence and frequency
MaxTokens = Annotated[int, Field(ge=1)]
Stop = Union[str, Annotated[list[str], Field(max_length=16)]]


def sampling_params(values: dict[str, Any]) -> SamplingParams:
    """SamplingParams from checked values under the engine's names; None or absent: the engine's default."""
    given = {k: v for k, v in values.items() if v is not None}
    if isinstance(given.get("stop"), str):
        given["stop"] = [given["stop"]]
    if "logit_bias" in given:
        given["logit_bias"] = {int(k): float(v) for k, v in given["logit_bias"].items()}
    return SamplingParams(**given)


class Sampling(Shape):
    """The sampling fields of chat completions, completions and llama-server's routes."""

    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None  # the newer name: it wins over max_tokens
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    repeat_penalty: RepeatPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    logit_bias: dict[str, between(-100, 100)] | None = None  # token id (as a string) -> bias
    stop: Stop | None = None
    ignore_eos: bool | None = None  # llama-server's: generate until max_tokens

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for k in bias or {}:
            if not (k.isascii() and k.isdigit() and int(k) < 2**31):
                raise refuse(f"keys must be token ids, got {k[:40]!r}")
        return bias

    def sampling(self) -> SamplingParams:
        """These fields as the engine's SamplingParams."""
        return sampling_params({
            "max_tokens": self.max_completion_tokens or self.max_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p, "repeat_penalty": self.repeat_penalty,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "seed": self.seed, "logit_bias": self.logit_bias, "stop": self.stop, "ignore_eos": self.ignore_eos})


class Lifetime(Shape):
    """How long the model stays loaded once idle after this request: Ollama's keep_alive (seconds or a duration
    such as "5m"; 0: unload when done; negative: until unloaded) or LM Studio's ttl (seconds; -1: forever)."""

    keep_alive: float | str | None = None
    ttl: Annotated[int, Field(ge=-1)] | None = None

    def keep(self) -> Any:
        """The engine's keep_alive: seconds, None (until unloaded), or KEEP (the model's time-to-live stands)."""
        if self.keep_alive is not None and self.ttl is not None:
            raise InvalidRequest("send 'keep_alive' or 'ttl', not both", "ttl")
        if self.keep_alive is not None:
            return parse_keep_alive(self.keep_alive)
        if self.ttl is not None:
            return None if self.ttl < 0 else float(self.ttl)
        return KEEP


@dataclass
class StreamOptions:
    """How the response is delivered."""

    stream: bool
    include_usage: bool
    n: int = 1  # choices, generated as parallel streams
    logprobs: bool = False


class StreamOptionsField(Shape):
    include_usage: bool | None = None  # a last chunk with the usage of the whole request


class Delivery(Sampling, Lifetime):
    """What chat completions and completions share: the model, sampling, lifetime, and how the reply comes."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptionsField | None = None
    n: between(1, 8, int) | None = None  # choices, generated as parallel streams of one prefill

    def delivery(self) -> StreamOptions:
        """How the reply is delivered: streamed or not, with a usage chunk, how many choices."""
        opts = self.stream_options
        return StreamOptions(bool(self.stream), bool(opts and opts.include_usage),
                             **({"n": self.n} if self.n is not None else {}))


# ---- chat messages and tools -------------------------------------------------------------------------

_TOOL_NAME_WORDS = "1 to 64 letters, digits, '_', '-' or '.'"
_TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # OpenAI's (plus '.'): it goes into grammars and call syntax
_TOOL_NAME = re.compile(_TOOL_NAME_PATTERN[1:-1])


def _usable_tool_name(name: str) -> str:
    if not _TOOL_NAME.fullmatch(name):
        raise refuse(f"must be {_TOOL_NAME_WORDS}, got {name[:80]!r}")
    return name


ToolName = Annotated[str, Field(json_schema_extra={"pattern": _TOOL_NAME_PATTERN}),
                     AfterValidator(_usable_tool_name)]


class TextPart(Shape):
    type: Literal["text"]
    text: str


class OtherPart(Shape):
    """image_url, input_audio, file, ...: passed to the chat template as they are (a template that cannot
    render them says so)."""

    type: str


def _part_kind(v: Any) -> str:
    kind = v.get("type") if isinstance(v, dict) else getattr(v, "type", None)
    return "text-part" if kind == "text" else "other-part"


ContentPart = Annotated[Union[Annotated[TextPart, Tag("text-part")], Annotated[OtherPart, Tag("other-part")]],
                        Discriminator(_part_kind)]


class CalledFunction(Shape):
    name: NonEmpty
    arguments: str | dict[str, Any] | None = None  # a JSON string (OpenAI's), or an object


class ToolCall(Shape):
    """A call the assistant made earlier, sent back with the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(Shape):
    """One message of a conversation (other fields, such as reasoning_content, go to the template as they are)."""

    role: Literal[ROLES]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None  # a tool message: the call it answers
    tool_calls: list[ToolCall] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The message as the engine's chat template receives it: what was sent."""
        return self.model_dump(exclude_unset=True)


class FunctionDef(Shape):
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema for the arguments


class ChatTool(Shape):
    """A function the model may call (the client runs it)."""

    type: Literal["function"] = "function"
    function: FunctionDef

    def as_dict(self) -> dict[str, Any]:
        """The tool as the chat template and the grammar receive it: what was sent."""
        return self.model_dump(exclude_unset=True)


class NamedFunction(Shape):
    name: NonEmpty


class NamedToolChoice(Shape):
    """The one function the model must call."""

    type: Literal["function"] = "function"
    function: NamedFunction


class _Conversation(Shape):
    messages: list[ChatMessage] = []
    tools: list[ChatTool] | None = None


def check_messages(messages: list[dict[str, Any]]) -> None:
    """Messages translated from another protocol, checked as chat completions' are (400 naming the message)."""
    parse(_Conversation, {"messages": messages}, "messages")


def tools_field(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Tools translated from another protocol, checked as chat completions' are; returned as they are."""
    parse(_Conversation, {"tools": tools}, "tools")
    return tools


# ---- output formats -----------------------------------------------------------------------------------

class ResponseFormatText(Shape):
    type: Literal["text"]


class ResponseFormatJSONObject(Shape):
    type: Literal["json_object"]


class JSONSchema(Shape):
    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormatJSONSchema(Shape):
    type: Literal["json_schema"]
    json_schema: JSONSchema


ResponseFormat = Annotated[Union[ResponseFormatText, ResponseFormatJSONObject, ResponseFormatJSONSchema],
                          Field(discriminator="type")]


def output_spec(fmt: ResponseFormatText | ResponseFormatJSONObject | ResponseFormatJSONSchema | None,
                ) -> dict[str, Any] | None:
    """The engine's output spec (compiled into a grammar) for a response_format; None for plain text."""
    if isinstance(fmt, ResponseFormatJSONObject):
        return {"type": "json_object"}
    if isinstance(fmt, ResponseFormatJSONSchema):
        return {"type": "json_schema", "schema": fmt.json_schema.schema_}
    return None


# ---- the routes' bodies ------------------------------------------------------------------------------------

class ChatCompletionRequest(Delivery):
    """POST /v1/chat/completions (OpenAI's fields, and llama-server's sampling extras and chat_template_kwargs)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: between(0, 20, int) | None = None  # with logprobs: the most likely alternatives per token
    truncation: Literal["auto", "disabled"] | None = None  # auto: drop the oldest turns until the prompt fits
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the chat template
    enable_thinking: bool | None = None  # the chat template's thinking switch

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_the_templates_own(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted((kwargs or {}).keys() & TEMPLATE_VARIABLES)
        if taken:
            raise refuse(f"may not set the chat template's own variables ({', '.join(taken)}); use the request's "
                         "fields for them")
        return kwargs

    def to_engine(self) -> tuple[ChatRequest, StreamOptions]:
        """The engine's ChatRequest, and how its reply is delivered."""
        sampling, opts = self.sampling(), self.delivery()
        if self.logprobs:
            opts.logprobs = True
            sampling.logprobs = self.top_logprobs or 0
        kwargs = dict(self.chat_template_kwargs or {})
        if self.enable_thinking is not None:
            kwargs["enable_thinking"] = self.enable_thinking
        choice = self.tool_choice.model_dump() if isinstance(self.tool_choice, Shape) else self.tool_choice
        optional = {"truncation": self.truncation, "parallel_tool_calls": self.parallel_tool_calls}
        req = ChatRequest(self.model, [m.as_dict() for m in self.messages], sampling, template_kwargs=kwargs,
                          tools=[t.as_dict() for t in self.tools] if self.tools is not None else None,
                          tool_choice=choice, response_format=output_spec(self.response_format),
                          keep_alive=self.keep(), **{k: v for k, v in optional.items() if v is not None})
        return req, opts


TokenIds = Annotated[list[int], Field(min_length=1)]


class TextCompletionRequest(Delivery):
    """POST /v1/completions: a raw text or token-id prompt, no chat template."""

    prompt: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]
    logprobs: between(0, 5, int) | None = None  # the chosen token's logprob and this many alternatives
    echo: bool | None = None  # the reply starts with the prompt
    suffix: str | None = None  # fill in the middle: the text after the completion (the model's FIM tokens)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and not isinstance(prompt[0], int):
            if len(prompt) > 1:
                raise refuse("must be a string, an array of token ids, or an array of one of those; several prompts "
                             "in one request are not supported yet")
            return prompt[0]
        return prompt

    def to_engine(self) -> tuple[CompletionRequest, StreamOptions]:
        """The engine's CompletionRequest, and how its reply is delivered."""
        sampling, opts = self.sampling(), self.delivery()
        if self.logprobs is not None:
            opts.logprobs = True
            sampling.logprobs = self.logprobs
        if self.suffix is not None and not isinstance(self.prompt, str):
            raise InvalidRequest("'suffix' needs a text prompt (the code before the gap), not token ids", "suffix")
        return CompletionRequest(self.model, self.prompt, sampling, bool(self.echo), keep_alive=self.keep()), opts


class EmbeddingRequest(Lifetime):
    """POST /v1/embeddings: one text or token list, or up to 2048 of them."""

    input: str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1, max_length=2048)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"

    def inputs(self) -> list[str | list[int]]:
        """Every input to embed, in order."""
        if isinstance(self.input, str) or isinstance(self.input[0], int):
            return [self.input]
        return list(self.input)


def chat_request(body: dict[str, Any]) -> tuple[ChatRequest, StreamOptions]:
    """A /v1/chat/completions body (or one translated into that form) as an engine ChatRequest."""
    return parse(ChatCompletionRequest, body, "chat.completions").to_engine()


def completion_request(body: dict[str, Any]) -> tuple[CompletionRequest, StreamOptions, str | None]:
    """A /v1/completions body as an engine CompletionRequest, how it is delivered, and its suffix (None: no fill
    in the middle)."""
    parsed = parse(TextCompletionRequest, body, "completions")
    return *parsed.to_engine(), parsed.suffix


def embedding_request(body: dict[str, Any]) -> tuple[str | None, list[str | list[int]], str, Any]:
    """(model, inputs, encoding_format, keep_alive) of a /v1/embeddings body."""
    req = parse(EmbeddingRequest, body, "embeddings")
    return req.model, req.inputs(), req.encoding_format, req.keep()


def _json_type(v: Any) -> str:
    return _TYPE_NAMES.get(type(v), type(v).__name__)


_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
               dict: "an object"}
