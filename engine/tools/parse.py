"""Reading a reply: content, reasoning and tool calls per wire format, chunk by chunk (buffered and
streaming share one implementation; a call that does not parse comes back as content)."""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from engine.text import partial_suffix
from engine.tools.formats import new_call_id


@dataclass
class Event:
    """A piece of parsed output: content text, reasoning text, or one complete tool call."""

    kind: str  # content | reasoning | tool_call | tool_call_start | tool_args | tool_call_end
    text: str = ""  # content or reasoning text, or an argument fragment (tool_args)
    call: dict[str, Any] | None = None  # {"id", "name", "arguments" (a JSON string)}; id and name for a start
    index: int = -1  # the call's place among the reply's calls (set by ReplyReader)


def _call(name: Any, arguments: Any, fmt: str = "") -> dict[str, Any] | None:
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return {"id": new_call_id(fmt), "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def _json_calls(text: str, args_key: str = "arguments", fmt: str = "") -> list[dict] | None:
    """Calls from a JSON object or array of {"name", args_key}; None if text is not exactly that."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    items = doc if isinstance(doc, list) else [doc]
    calls = []
    for it in items:
        if not isinstance(it, dict):
            return None
        c = _call(it.get("name"), it.get(args_key, it.get("arguments", it.get("parameters"))), fmt)
        if c is None:
            return None
        calls.append(c)
    return calls or None


class ReplyReader:
    """Reads one choice's text as its OutputReading says: content, reasoning and tool calls as events, the
    calls after the first dropped when parallel_tool_calls is false (where no grammar already stops them)."""

    def __init__(self, reading, streaming: bool = True):
        r = reading
        # calls stream (id and name first, then their arguments) only to a streaming client: a buffered reply
        # waits for each call to close, so a call cut short by max_tokens comes back as the text it was
        self.parser = OutputParser(r.tool_format, r.tools_active, r.reasoning, r.in_reasoning,
                                   stream_calls=r.constrained_calls and streaming) \
            if r.tools_active or r.reasoning else None
        self.parallel = r.parallel_tool_calls
        self.calls = 0  # calls started so far
        self._skipping = False  # inside a call dropped by parallel_tool_calls=false
        self._blank = ""  # whitespace between or before calls: content only if text follows

    @property
    def cut_call(self) -> bool:
        """Whether the reply ended inside a streamed call (max_tokens): the reply finished by length."""
        return self.parser is not None and self.parser.cut

    def events(self, text: str | None) -> list[Event]:
        """Events for new text (None: the generation ended), each call with its index."""
        events = self.parser.feed(text) if text is not None else self.parser.finish()
        out = []
        for e in events:
            if e.kind in ("tool_call", "tool_call_start"):
                self._skipping = bool(self.calls) and not self.parallel
                if not self._skipping:
                    self.calls += 1
                self._blank = ""
            if self._skipping and e.kind in ("tool_call", "tool_call_start", "tool_args", "tool_call_end"):
                continue
            if e.kind == "content" and self.parser.tools and not e.text.strip():
                self._blank += e.text  # as the buffered reply's content: null around calls
                continue
            if e.kind == "content" and self._blank:
                e = dataclasses.replace(e, text=self._blank + e.text)
                self._blank = ""
            if e.kind in ("tool_call", "tool_call_start", "tool_args", "tool_call_end"):
                e = dataclasses.replace(e, index=self.calls - 1)
            out.append(e)
        if text is None and self._blank and not self.calls:
            out.append(Event("content", self._blank))
            self._blank = ""
        return out


class OutputParser:
    """Splits generated text into content, reasoning and tool calls, chunk by chunk.

    Feeding the text in any split (down to single characters) gives the same events as feeding
    it whole; text that might be the start of a marker is held back until it is decided. A call
    that does not parse comes back as content, never as an error.
    """

    def __init__(self, fmt: str, tools: bool, reasoning: bool, in_reasoning: bool = False,
                 stream_calls: bool = False):
        self.fmt = fmt
        # hermes calls under a grammar always complete: their id and name can go out first and their
        # arguments as they are generated (without a grammar a call is only known good once closed)
        self.stream_calls = stream_calls and fmt == "hermes"
        self.started: dict[str, Any] | None = None  # the call being streamed
        self.cut = False  # the reply ended inside a streamed call
        self.args_at = self.args_sent = 0
        self.tools = tools
        self.tags: dict[str, tuple[str, str]] = {}  # opener -> (closer, kind)
        if reasoning:
            self.tags["<think>"] = ("</think>", "reasoning")
        if tools and fmt == "hermes":
            self.tags["<tool_call>"] = ("</tool_call>", "tool")
        if tools and fmt == "gemma":
            self.tags["```tool_code"] = ("```", "tool")
        # formats whose call is the whole reply: decided by how the reply starts
        self.prefixes = {"llama_json": ("<|python_tag|>", "{"), "mistral": ("[TOOL_CALLS]",),
                         "generic": ("{",)}.get(fmt, ()) if tools else ()
        self.whole = fmt == "harmony" or (fmt == "generic" and tools)
        self.buf = ""
        self.mode: str | None = "<think>" if reasoning and in_reasoning else None  # the open tag, if inside one
        self.decided = not self.prefixes and not self.whole
        self.buffer_all = self.whole

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        if not self.decided:
            head = self.buf.lstrip()
            if not head:
                return []
            if any(p.startswith(head) or head.startswith(p) for p in self.prefixes):
                if any(head.startswith(p) for p in self.prefixes):
                    self.decided = self.buffer_all = True
                return []  # still could be a call
            self.decided = True
        if self.buffer_all:
            return []
        return self._scan(final=False)

    def finish(self) -> list[Event]:
        if self.buffer_all:
            return self._whole(self.buf)
        self.decided = True
        return self._scan(final=True)

    def _scan(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while True:
            if self.mode is None:
                hits = [(self.buf.find(o), o) for o in self.tags if o in self.buf]
                if hits:
                    i, opener = min(hits)
                    if i:
                        out.append(Event("content", self.buf[:i]))
                    self.buf = self.buf[i + len(opener):]
                    self.mode = opener
                    continue
                keep = 0 if final else partial_suffix(self.buf, self.tags)
                emit, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                if emit:
                    out.append(Event("content", emit))
                return _merge(out)
            closer, kind = self.tags[self.mode]
            j = self.buf.find(closer)
            if j >= 0:
                inner, self.buf = self.buf[:j], self.buf[j + len(closer):]
                out += self._closed(self.mode, kind, inner)
                self.mode = None
                continue
            if kind == "reasoning":  # reasoning streams as it comes
                keep = 0 if final else partial_suffix(self.buf, {closer: None})
                emit, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                if emit:
                    out.append(Event("reasoning", emit))
                if final:
                    self.mode = None
            elif final:  # an unclosed call: give it back as text (or end the one being streamed)
                if self.started:
                    out += [Event("tool_args", self.buf[self.args_at + self.args_sent:]), Event("tool_call_end")]
                    self.started = None
                    self.cut = True
                else:
                    out.append(Event("content", self.mode + self.buf))
                self.buf, self.mode = "", None
            elif self.stream_calls:
                out += self._call_progress()
            return _merge(out)

    _CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*')

    def _call_progress(self) -> list[Event]:
        """A call's id and name once known, then its argument text as far as it is surely arguments."""
        out = []
        if self.started is None:
            m = self._CALL_HEAD.match(self.buf)
            if not m:
                return []
            self.started = {"id": new_call_id(), "name": m.group(1)}
            self.args_at, self.args_sent = m.end(), 0
            out.append(Event("tool_call_start", call=dict(self.started)))
        body = self.buf[self.args_at:]
        body = body[:len(body) - partial_suffix(body, {"</tool_call>": None})].rstrip()
        if body.endswith("}"):  # may be the call object's own closing brace: wait for the closer
            body = body[:-1].rstrip()
        if len(body) > self.args_sent:
            out.append(Event("tool_args", body[self.args_sent:]))
            self.args_sent = len(body)
        return out

    def _closed(self, opener: str, kind: str, inner: str) -> list[Event]:
        if kind == "reasoning":
            return [Event("reasoning", inner)] if inner else []
        if self.stream_calls and self.started is None:
            self.buf, rest = inner, self.buf
            head = self._call_progress()  # a call that arrived whole in one chunk
            self.buf = rest
        else:
            head = []
        if self.started is not None:
            args = inner[self.args_at:].rstrip()
            args = args[:-1].rstrip() if args.endswith("}") else args
            self.started = None
            return head + [Event("tool_args", args[self.args_sent:]), Event("tool_call_end")]
        calls = _python_calls(inner) if self.fmt == "gemma" else _json_calls(inner.strip())
        if calls:
            return [Event("tool_call", call=c) for c in calls]
        return [Event("content", opener + inner + self.tags[opener][0])]

    def _whole(self, text: str) -> list[Event]:
        if self.fmt == "harmony":
            return parse_harmony(text)
        stripped = text.strip()
        if self.fmt == "generic":
            try:
                doc = json.loads(stripped)
            except json.JSONDecodeError:
                return [Event("content", text)] if text else []
            if isinstance(doc, dict) and isinstance(doc.get("response"), str):
                return [Event("content", doc["response"])]
            calls = _json_calls(json.dumps(doc.get("tool_calls"))) if isinstance(doc, dict) else None
            return [Event("tool_call", call=c) for c in calls] if calls else [Event("content", text)]
        if self.fmt == "llama_json":
            body = stripped.removeprefix("<|python_tag|>").strip()
            parts = [p for p in (s.strip() for s in body.split(";")) if p] if body else []
            calls = [c for p in parts for c in (_json_calls(p, "parameters") or [None])]
            if calls and all(calls):
                return [Event("tool_call", call=c) for c in calls]
            return [Event("content", text)]
        if self.fmt == "mistral":
            body = stripped.removeprefix("[TOOL_CALLS]").strip()
            calls = _json_calls(body, fmt=self.fmt)
            if calls is None and "[ARGS]" in body:  # newer layout: name[ARGS]{json}
                name, _, args = body.partition("[ARGS]")
                c = _call(name.strip(), args.strip(), self.fmt)
                calls = [c] if c else None
            return [Event("tool_call", call=c) for c in calls] if calls else [Event("content", text)]
        return [Event("content", text)] if text else []


_PY_NAMES = {"true": True, "false": False, "null": None}


def _python_calls(code: str) -> list[dict] | None:
    """Calls from Python call expressions with literal keyword arguments (`f(a="x", n=2)`), one per line."""
    calls = []
    try:
        tree = ast.parse(code.strip(), mode="exec")
    except SyntaxError:
        return None
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name) and not stmt.value.args):
            return None
        args = {}
        for kw in stmt.value.keywords:
            if kw.arg is None:
                return None
            v = kw.value
            if isinstance(v, ast.Name) and v.id in _PY_NAMES:  # JSON's true/false/null
                args[kw.arg] = _PY_NAMES[v.id]
                continue
            try:
                args[kw.arg] = ast.literal_eval(v)
            except ValueError:
                return None
        c = _call(stmt.value.func.id, args)
        if c is None:
            return None
        calls.append(c)
    return calls or None


_HARMONY_MSG = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>(\w+)(?:\s+to=functions\.([\w.-]+))?"
                          r"[^<]*?(?:<\|constrain\|>\w+)?<\|message\|>(.*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|$)",
                          re.S)


def parse_harmony(text: str) -> list[Event]:
    """gpt-oss output: analysis -> reasoning, final -> content, commentary to=functions.X -> a call."""
    events: list[Event] = []
    matched = False
    for m in _HARMONY_MSG.finditer(text):
        matched = True
        channel, fn, body = m.group(1), m.group(2), m.group(3)
        if fn:
            c = _call(fn, body.strip() or "{}")
            events.append(Event("tool_call", call=c) if c else Event("content", body))
        elif channel == "analysis":
            events.append(Event("reasoning", body))
        else:
            events.append(Event("content", body))
    return events if matched else ([Event("content", text)] if text else [])


def _merge(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for e in events:
        if e.kind in ("content", "reasoning", "tool_args"):
            if not e.text:
                continue
            if out and out[-1].kind == e.kind:
                out[-1] = Event(e.kind, out[-1].text + e.text)
                continue
        out.append(e)
    return out


def assemble(events: list[Event]) -> tuple[str, str, list[dict]]:
    """(content, reasoning, calls) from a parser's events; streamed calls are put back together."""
    content, reasoning, calls = "", "", []
    for e in events:
        if e.kind == "content":
            content += e.text
        elif e.kind == "reasoning":
            reasoning += e.text
        elif e.kind == "tool_call":
            calls.append(dict(e.call))
        elif e.kind == "tool_call_start":
            calls.append({**e.call, "arguments": ""})
        elif e.kind == "tool_args" and calls:
            calls[-1]["arguments"] += e.text
    return content, reasoning, calls
