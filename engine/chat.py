"""Chat prompts: the GGUF's own Jinja template rendered in a sandbox, with what it cannot express polyfilled.

What a template can express is found once, when it is loaded, by rendering probe conversations and looking
for their marker strings in the output (llama.cpp's chat layer does the same, common/chat.cpp and its Jinja
capability check): a system role, tool definitions, assistant tool calls with string or object arguments and
free-form ids, tool results, string content. A request is then rewritten into what the template can render
(gemma-2 has no system role: the system text opens the first user turn; Qwen3-Coder needs arguments as
objects; Mistral-Nemo accepts only 9-character call ids), never by the template's name.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from engine.errors import InvalidRequest
from engine.tools.formats import short_call_id

# Used when a GGUF carries no tokenizer.chat_template (llama-server does the same).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
ROLES = ("system", "developer", "user", "assistant", "tool")
# Where each image goes in the rendered text: libmtmd's default media marker, replaced by the image's rows (and
# whatever begin/end tokens its projector wants) when the prompt is tokenized (engine/vision.py).
MEDIA_MARKER = "<__media__>"
# What the renderer itself passes to every template; a request's chat_template_kwargs may not replace them.
TEMPLATE_VARIABLES = frozenset({"messages", "tools", "tool_choice", "functions", "function_call",
                                "add_generation_prompt", "bos_token", "eos_token", "raise_exception", "strftime_now"})
_FIXED = TEMPLATE_VARIABLES - {"tools", "tool_choice", "functions", "function_call"}  # render()'s kwargs may set those

# Marker strings of the probe conversations: a capability is there when its marker reaches the output.
_USER, _SYSTEM, _DEVELOPER = "probe-user-7f3a", "probe-system-7f3a", "probe-developer-7f3a"
_TOOL, _ARG, _RESULT = "probe_tool_7f3a", "probe-argument-7f3a", "probe-result-7f3a"
_LONG_ID, _SHORT_ID = "call_7f3a0c2e9b1d4f6a8c0e2b4d", "a7f3a0c2e"
_PROBE_TOOL = {"type": "function", "function": {
    "name": _TOOL, "description": "A probe.",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "An argument."}},
                   "required": ["arg"]}}}
_SHORT_ID_FORM = re.compile(r"[A-Za-z0-9]{9}")


@dataclass(frozen=True)
class Capabilities:
    """What a chat template renders as it is given (False: render() rewrites the request into what it does)."""

    string_content: bool = True  # content as a string (else as a list of typed text parts)
    system_role: bool = True
    developer_role: bool = False  # OpenAI's "developer" messages (else they are system messages)
    tools: bool = True  # the tool definitions it is passed
    tool_description_optional: bool = True  # a tool without a "description" (else an empty one is filled in)
    tool_calls: bool = True  # an assistant turn's tool_calls (else they are written into its content)
    string_arguments: bool = True  # tool_calls[].function.arguments as a JSON string (else as an object)
    any_call_id: bool = True  # any tool call id (else ids of 9 letters and digits)
    tool_responses: bool = True  # "tool" messages (else they are user messages)
    tools_when_none: list | None = None  # `tools` for a request without any ([] where the template iterates it)
    problem: str | None = None  # why the template fails even on a plain conversation


class ChatTemplate:
    """A compiled chat template with the model's BOS/EOS strings and what it can express."""

    def __init__(self, template: str | None, bos: str, eos: str):
        self.source = template or CHATML
        self.bos = bos
        self._formatter = Jinja2ChatFormatter(self.source, eos_token=eos, bos_token=bos, add_generation_prompt=True)
        self.caps = _Probe(self._formatter, self.source).capabilities()

    def render(self, messages: list[dict[str, Any]], /, **kwargs: Any) -> str:
        """The prompt text for messages (add_generation_prompt on); kwargs are more template variables."""
        clash = sorted(kwargs.keys() & _FIXED)
        if clash:
            raise InvalidRequest(f"chat_template_kwargs may not set the template's own variables: {', '.join(clash)}",
                                 "chat_template_kwargs")
        messages, tools = self.fit(messages, kwargs.pop("tools", None))
        try:
            return self._formatter(messages=messages, tools=tools, **kwargs).prompt
        except InvalidRequest:
            raise
        except Exception as e:  # the template's own raise_exception, or a template bug
            why = f"the model's chat template rejected the messages: {e}"
            if self.caps.problem:
                why += (" (it fails on a plain user message too, so it cannot serve as it is: give the model a "
                        "working chat_template)")
            raise InvalidRequest(why, "messages") from None

    def fit(self, messages: list[dict[str, Any]], tools: list | None) -> tuple[list[dict[str, Any]], list | None]:
        """The messages and tools rewritten into what this template can render."""
        caps = self.caps
        msgs = [_flatten(m) for m in messages]
        if caps.tool_calls and not caps.string_arguments:  # first: its errors name the request's indices
            msgs = [_object_arguments(m, i) for i, m in enumerate(msgs)]
        if not caps.developer_role:
            msgs = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in msgs]
        if tools and not caps.tools:
            msgs, tools = _tools_in_system(msgs, tools), None
        if tools and not caps.tool_description_optional:
            tools = [_with_description(t) for t in tools]
        if not caps.any_call_id:
            msgs = _short_call_ids(msgs)
        if not caps.tool_responses:  # before the calls turn into text: results are named after their call
            msgs = _results_as_user(msgs)
        if not caps.tool_calls:
            msgs = [_calls_as_text(m) for m in msgs]
        if not caps.system_role:
            msgs = _system_in_first_user(msgs)
        if not caps.string_content:
            msgs = [_typed(m) for m in msgs]
        return msgs, tools if tools else caps.tools_when_none


class _Probe:
    """Renders the probe conversations of one template (each an ordinary render whose errors only mean no)."""

    def __init__(self, formatter: Jinja2ChatFormatter, source: str):
        self.formatter = formatter
        self.source = source
        self.tools_when_none: list | None = None
        self.typed = False  # content written as typed parts (a template that reads no strings)

    def render(self, messages: list[dict], tools: list | None = None) -> str | None:
        if self.typed:
            messages = [_typed(m) for m in messages]
        try:
            return self.formatter(messages=messages, tools=tools if tools else self.tools_when_none).prompt
        except Exception:
            return None

    def shows(self, marker: str, messages: list[dict], tools: list | None = None) -> bool:
        out = self.render(messages, tools)
        return out is not None and marker in out

    def capabilities(self) -> Capabilities:
        user = {"role": "user", "content": _USER}
        plain, problem = self._plain(user)
        if plain is None:
            return Capabilities(problem=problem)
        string_content = _USER in plain or not self.shows(_USER, [_typed(user)])
        self.typed = not string_content  # and the probes below write their content so too
        system_role = self.shows(_SYSTEM, [{"role": "system", "content": _SYSTEM}, user])
        # a template that prints any role's name would show the marker under a "developer" header it was never
        # trained on: only one that names the role has one
        developer_role = re.search(r"""["']developer["']""", self.source) is not None and \
            self.shows(_DEVELOPER, [{"role": "developer", "content": _DEVELOPER}, user])
        tools = self.shows(_TOOL, [user], [_PROBE_TOOL])
        bare = {"type": "function", "function": {k: v for k, v in _PROBE_TOOL["function"].items()
                                                 if k != "description"}}
        description_optional = not tools or self.render([user], [bare]) is not None
        defs = [_PROBE_TOOL] if tools else None
        found = self._call_form(user, defs)
        as_string, call_id = found or (True, _LONG_ID)
        call = _probe_call(as_string, call_id) if found else {"role": "assistant", "content": _ARG}
        result = {"role": "tool", "tool_call_id": call_id, "name": _TOOL, "content": _RESULT}
        return Capabilities(
            string_content=string_content, system_role=system_role, developer_role=developer_role, tools=tools,
            tool_description_optional=description_optional, tool_calls=found is not None,
            string_arguments=as_string, any_call_id=call_id == _LONG_ID,
            tool_responses=self.shows(_RESULT, [user, call, result], defs), tools_when_none=self.tools_when_none)

    def _call_form(self, user: dict, defs: list | None) -> tuple[bool, str] | None:
        """How the template takes tool calls: (arguments as a JSON string?, a call id it accepts); None when it
        renders none. A string must come out as it went in: Mistral-Nemo's `arguments|tojson` quotes a string
        into a string, and wants the object."""
        verbatim = json.dumps({"arg": _ARG})
        for call_id in (_LONG_ID, _SHORT_ID):
            as_string = self.render([user, _probe_call(True, call_id)], defs)
            if as_string is not None and verbatim in as_string:
                return True, call_id
            if self.shows(_ARG, [user, _probe_call(False, call_id)], defs):
                return False, call_id
            if as_string is not None and _ARG in as_string:
                return True, call_id
        return None

    def _plain(self, user: dict) -> tuple[str | None, str | None]:
        """A plain conversation rendered, with `tools` absent as None or, failing that, as [] (Hermes-3 and
        Command-R iterate it unguarded); or None and the template's error."""
        try:
            return self.formatter(messages=[user], tools=None).prompt, None
        except Exception as e:
            problem = str(e) or type(e).__name__
        self.tools_when_none = []
        out = self.render([user])
        if out is None:
            self.tools_when_none = None
        return out, None if out is not None else problem


def _probe_call(as_string: bool, call_id: str) -> dict:
    args = {"arg": _ARG}
    return {"role": "assistant", "content": "", "tool_calls": [{
        "id": call_id, "type": "function",
        "function": {"name": _TOOL, "arguments": json.dumps(args) if as_string else args}}]}


def _flatten(msg: dict[str, Any]) -> dict[str, Any]:
    """Content given as a list of parts becomes plain text for templates that expect a string; no content
    (an assistant turn of tool calls) an empty string, which Jinja would otherwise print as "None"; an
    empty or null tool_calls is no tool_calls (templates test whether it is defined)."""
    content = msg.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                image_url(part)  # a remote URL is refused before anything renders
                texts.append(MEDIA_MARKER)
                continue
            if kind != "text":
                raise InvalidRequest(f"content part type {kind!r} is not supported by this model", "messages")
            text = part.get("text", "")
            if not isinstance(text, str):
                raise InvalidRequest("a text content part's 'text' must be a string", "messages")
            texts.append(text)
        msg = {**msg, "content": "".join(texts)}
    elif content is None:
        msg = {**msg, "content": ""}
    if "tool_calls" in msg and not msg["tool_calls"]:
        msg = {k: v for k, v in msg.items() if k != "tool_calls"}
    return msg


def image_url(part: dict[str, Any]) -> str:
    """The data: URI of an image_url content part (OpenAI's {"type": "image_url", "image_url": {"url": ...}});
    InvalidRequest for any other URL: remote images are never fetched."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        raise InvalidRequest("an image_url content part needs \"image_url\": {\"url\": \"data:image/...;base64,...\"}",
                             "messages")
    if url[:5].lower() != "data:":
        shown = url if len(url) <= 80 else url[:80] + "…"
        raise InvalidRequest(f"image URL {shown!r} is not a data: URI; remote URLs are never fetched: send the image "
                             "inline as data:image/png;base64,...", "messages")
    return url


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    """The data: URIs of every image_url part, in the order the rendered prompt holds their markers."""
    return [image_url(part) for m in messages if isinstance(m.get("content"), list)
            for part in m["content"] if isinstance(part, dict) and part.get("type") == "image_url"]


def _typed(msg: dict) -> dict:
    """A message whose string content is one typed text part."""
    if isinstance(msg.get("content"), str):
        return {**msg, "content": [{"type": "text", "text": msg["content"]}]}
    return msg


def _tools_in_system(msgs: list[dict], tools: list) -> list[dict]:
    """Tool definitions the template does not render, described in the system message."""
    spec = "You can call these tools:\n" + json.dumps(tools, ensure_ascii=False)
    if msgs and msgs[0].get("role") == "system":
        return [{**msgs[0], "content": msgs[0]["content"] + "\n\n" + spec}, *msgs[1:]]
    return [{"role": "system", "content": spec}, *msgs]


def _with_description(tool: Any) -> Any:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if isinstance(fn, dict) and "description" not in fn:
        return {**tool, "function": {**fn, "description": ""}}
    return tool


def _calls_as_text(msg: dict) -> dict:
    """An assistant turn's calls as JSON in its content (a template that renders no tool calls)."""
    if msg.get("role") != "assistant" or "tool_calls" not in msg:
        return msg
    calls = [{"name": (c.get("function") or {}).get("name"), "arguments": _loaded((c.get("function") or {})
                                                                                    .get("arguments"))}
             for c in msg["tool_calls"] if isinstance(c, dict)]
    text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    rest = {k: v for k, v in msg.items() if k != "tool_calls"}
    return {**rest, "content": (msg["content"] + "\n" if msg["content"] else "") + text}


def _object_arguments(msg: dict, i: int) -> dict:
    """Call arguments as objects (templates that iterate them); InvalidRequest for arguments that are no
    JSON object, which such a template cannot write."""
    if "tool_calls" not in msg:
        return msg
    calls = []
    for j, c in enumerate(msg["tool_calls"]):
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            args = _loaded(fn["arguments"])
            if not isinstance(args, dict):
                raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object "
                                     "for this model's chat template", "messages")
            c = {**c, "function": {**fn, "arguments": args}}
        calls.append(c)
    return {**msg, "tool_calls": calls}


def _loaded(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def _short_call_ids(msgs: list[dict]) -> list[dict]:
    """Call ids in the 9-letters-and-digits form the template accepts, the same for a call and its result
    and distinct for distinct ids (one table per request)."""
    table: dict[str, str] = {}

    def short(call_id: Any) -> Any:
        if not isinstance(call_id, str):
            return call_id
        if call_id not in table:
            s = call_id if _SHORT_ID_FORM.fullmatch(call_id) else short_call_id(call_id)
            while s in table.values():
                s = short_call_id(s + call_id)
            table[call_id] = s
        return table[call_id]
    out = []
    for m in msgs:
        if "tool_calls" in m:
            m = {**m, "tool_calls": [{**c, "id": short(c.get("id"))} if isinstance(c, dict) and "id" in c else c
                                     for c in m["tool_calls"]]}
        if m.get("role") == "tool" and "tool_call_id" in m:
            m = {**m, "tool_call_id": short(m["tool_call_id"])}
        out.append(m)
    return out


def _results_as_user(msgs: list[dict]) -> list[dict]:
    """Tool results as user turns (a template without a tool role), named after the call they answer."""
    names = {c.get("id"): (c.get("function") or {}).get("name") for m in msgs for c in m.get("tool_calls") or ()
             if isinstance(c, dict)}
    out = []
    for m in msgs:
        if m.get("role") == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id")) or "tool"
            m = {"role": "user", "content": f"Tool result ({name}): {m['content']}"}
        out.append(m)
    return out


def _system_in_first_user(msgs: list[dict]) -> list[dict]:
    """System text opening the next user turn (a template without a system role); one with no user turn
    after it becomes a user turn of its own."""
    out, pending = [], []
    for m in msgs:
        if m.get("role") == "system":
            pending.append(m["content"])
            continue
        if pending and m.get("role") == "user":
            m = {**m, "content": "\n\n".join([*pending, m["content"]] if m["content"] else pending)}
        elif pending:
            out.append({"role": "user", "content": "\n\n".join(pending)})
        pending = []
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def turns(messages: list[dict[str, Any]]) -> tuple[list[int], list[list[int]]]:
    """Split message indices into leading system messages and user-led turns (for truncation)."""
    system, groups = [], []
    for i, m in enumerate(messages):
        if m.get("role") in ("system", "developer") and not groups:
            system.append(i)
        elif m.get("role") == "user" or not groups:
            groups.append([i])
        else:
            groups[-1].append(i)
    return system, groups
