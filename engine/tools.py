"""Tool calling and reasoning: wire formats per model family, their parsers (buffered and
streaming, one implementation), and the grammars that make a forced call valid.

Formats (detected from the chat template): hermes (`<tool_call>{json}</tool_call>`, Qwen2.5/3),
llama_json (Llama 3.x: a bare `{"name", "parameters"}` object, maybe after `<|python_tag|>`),
mistral (`[TOOL_CALLS][{...}]`), harmony (gpt-oss channels), gemma (Gemma 3 has no tool tokens; its
documented convention is a Python call in a ```tool_code block, results in ```tool_output), and
generic — for templates with no tool format (SmolLM2's ChatML, TinyLlama's zephyr): tools are
described in the system prompt and the reply is a JSON object `{"tool_calls": [...]}` or
`{"response": "..."}`.
"""
from __future__ import annotations

import ast
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from engine.errors import InvalidRequest
from engine.text import partial_suffix



def detect_format(template: str) -> str:
    """The tool-call wire format a chat template speaks ('generic' when it has none)."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|channel|>" in template:
        return "harmony"
    if "<|python_tag|>" in template or ("ipython" in template and "<|eot_id|>" in template):
        return "llama_json"
    if "<start_of_turn>" in template:
        return "gemma"
    return "generic"


def thinks(template: str) -> bool:
    """Whether the template marks reasoning with <think>...</think>."""
    return "<think>" in template


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# ---- parsing ---------------------------------------------------------------------------------

@dataclass
class Event:
    """A piece of parsed output: content text, reasoning text, or one complete tool call."""

    kind: str  # content | reasoning | tool_call | tool_call_start | tool_args | tool_call_end
    text: str = ""  # content or reasoning text, or an argument fragment (tool_args)
    call: dict[str, Any] | None = None  # {"id", "name", "arguments" (a JSON string)}; id and name for a start


def _call(name: Any, arguments: Any) -> dict[str, Any] | None:
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
    return {"id": new_call_id(), "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def _json_calls(text: str, args_key: str = "arguments") -> list[dict] | None:
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
        c = _call(it.get("name"), it.get(args_key, it.get("arguments", it.get("parameters"))))
        if c is None:
            return None
        calls.append(c)
    return calls or None


class ReplyReader:
    """Reads one choice's text as its OutputReading says: content, reasoning and tool calls as events, the
    calls after the first dropped when parallel_tool_calls is false (where no grammar already stops them)."""

    def __init__(self, reading):
        r = reading
        self.parser = OutputParser(r.tool_format, r.tools_active, r.reasoning, r.in_reasoning,
                                   stream_calls=r.constrained_calls) if r.tools_active or r.reasoning else None
        self.parallel = r.parallel_tool_calls
        self.calls = 0  # calls started so far
        self._skipping = False  # inside a call dropped by parallel_tool_calls=false

    def events(self, text: str | None) -> list[Event]:
        """Events for new text (None: the generation ended)."""
        events = self.parser.feed(text) if text is not None else self.parser.finish()
        out = []
        for e in events:
            if e.kind in ("tool_call", "tool_call_start"):
                self._skipping = bool(self.calls) and not self.parallel
                if not self._skipping:
                    self.calls += 1
            if self._skipping and e.kind in ("tool_call", "tool_call_start", "tool_args", "tool_call_end"):
                continue
            out.append(e)
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
            calls = _json_calls(body)
            if calls is None and "[ARGS]" in body:  # newer layout: name[ARGS]{json}
                name, _, args = body.partition("[ARGS]")
                c = _call(name.strip(), args.strip())
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


# ---- prompts and grammars --------------------------------------------------------------------

@dataclass
class ToolPlan:
    """What a tool-using request needs: messages for the template, template kwargs, grammar, parser."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    grammar: str | None = None
    grammar_triggers: list[str] = field(default_factory=list)  # set: a lazy grammar that starts at the opener
    tools_active: bool = False


def _functions(tools: list[dict]) -> list[dict]:
    fns = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function" or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise InvalidRequest(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}",
                                 "tools")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise InvalidRequest(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        fns.append({"name": fn["name"], "description": fn.get("description", ""), "parameters": params})
    return fns


def _call_schema(fns: list[dict], args_key: str = "arguments") -> dict:
    options = [{"type": "object", "properties": {"name": {"const": f["name"]}, args_key: f["parameters"]},
                "required": ["name", args_key]} for f in fns]
    return options[0] if len(options) == 1 else {"anyOf": options}


# The converter spells out every repetition a schema asks for (minLength 10**9 took 77 s and 5 GB on the
# event loop) and llama.cpp refuses grammars with more than a few thousand repeats anyway.
MAX_SCHEMA_REPEAT = 4096
MAX_GRAMMAR_CHARS = 4 << 20
_COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
                   "maxContains")
_PATTERN_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _schema_cost_problem(schema: Any) -> str | None:
    """Why schema is too costly (or unsafe) to turn into a grammar, or None. Iterative: no recursion to exhaust."""
    stack = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
            continue
        if not isinstance(v, dict):
            continue
        for key in _COUNT_KEYWORDS:
            n = v.get(key)
            if isinstance(n, (int, float)) and not isinstance(n, bool) and n > MAX_SCHEMA_REPEAT:
                return f"'{key}' {n} is more than the {MAX_SCHEMA_REPEAT} a grammar can spell out"
        pattern = v.get("pattern")
        if isinstance(pattern, str):
            for m in _PATTERN_REPEAT.finditer(pattern):
                if any(g and (len(g) > 6 or int(g) > MAX_SCHEMA_REPEAT) for g in m.groups()):
                    return f"the pattern repeats {m.group()}, more than the {MAX_SCHEMA_REPEAT} a grammar can spell out"
        ref = v.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return f"'$ref' {ref[:80]!r} is not a local reference ('#/...'); schemas are never fetched"
        stack.extend(x for x in v.values() if isinstance(x, (dict, list)))
    return None


def schema_grammar(schema: dict, prefix: str = "", suffix: str = "", param: str = "response_format") -> str:
    """A GBNF grammar for JSON matching schema, optionally wrapped in literal text; param: the request field
    the schema came from (named by the InvalidRequest a bad schema raises)."""
    problem = _schema_cost_problem(schema)
    if problem:
        raise InvalidRequest(f"cannot build a grammar from this JSON schema: {problem}", param)
    try:
        gbnf = json_schema_to_gbnf(json.dumps(schema))
    except Exception as e:  # the converter's own message names what it cannot do
        raise InvalidRequest(f"cannot build a grammar from this JSON schema: {e}", param) from None
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(f"this JSON schema makes a grammar of {len(gbnf)} characters, more than the "
                             f"{MAX_GRAMMAR_CHARS} allowed", param)
    if not prefix and not suffix:
        return gbnf
    gbnf = re.sub(r"^root ::=", "payload ::=", gbnf, count=1, flags=re.M)
    return gbnf + f"\nroot ::= {json.dumps(prefix)} payload {json.dumps(suffix)}\n"


def _replay_as_text(messages: list[dict], result_text, calls_text) -> list[dict]:
    """Tool results and assistant tool_calls turns rewritten as plain turns (templates without tool support);
    calls_text gets each turn's calls as (name, arguments) pairs."""
    out: list[dict] = []
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            out.append({"role": "user", "content": result_text(m)})
        elif m.get("role") == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": calls_text(_replayed_calls(m["tool_calls"], i))})
        else:
            out.append(m)
    return out


def _replayed_calls(calls: Any, i: int) -> list[tuple[str, Any]]:
    """(name, arguments) of a history turn's tool_calls; InvalidRequest naming the one that has no such shape."""
    if not isinstance(calls, list):
        raise InvalidRequest(f"messages[{i}].tool_calls must be an array", "messages")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"messages[{i}].tool_calls[{j}].function.name must be a non-empty string",
                                 "messages")
        out.append((fn["name"], _args(fn.get("arguments"))))
    return out


def _with_spec(messages: list[dict], spec: str | None) -> list[dict]:
    """The tool description appended to the system message (one is added when there is none)."""
    if not spec:
        return messages
    if messages and messages[0].get("role") in ("system", "developer"):
        first = {**messages[0], "role": "system", "content": _text(messages[0].get("content")) + "\n\n" + spec}
        return [first, *messages[1:]]
    return [{"role": "system", "content": spec}, *messages]


def _generic_messages(messages: list[dict], fns: list[dict], choice: str) -> list[dict]:
    """Tool definitions (if any) into the system prompt; tool turns rewritten as JSON and text."""
    how = ('Reply with one JSON object: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]} '
           "to call tools")
    how += "." if choice in ("required",) or choice.startswith("fn:") else ', or {"response": "<your answer>"} to answer.'
    spec = "You can call these tools:\n" + json.dumps(fns, ensure_ascii=False) + "\n" + how if fns else None
    replayed = _replay_as_text(
        messages,
        lambda m: f"Tool result ({m.get('name') or m.get('tool_call_id', 'tool')}): {_text(m.get('content'))}",
        lambda calls: json.dumps({"tool_calls": [{"name": name, "arguments": args} for name, args in calls]},
                                 ensure_ascii=False))
    return _with_spec(replayed, spec)


def _gemma_messages(messages: list[dict], fns: list[dict]) -> list[dict]:
    """Gemma's convention: tools described up front, calls in ```tool_code, results in ```tool_output."""
    spec = ("You can call these functions:\n" + json.dumps(fns, ensure_ascii=False) + "\nTo call one, reply with a "
            "Python call in a tool_code block, for example:\n```tool_code\nfunction_name(argument=\"value\")\n```"
            ) if fns else None

    def code(calls: list[tuple[str, Any]]) -> str:
        lines = [f"{name}(" + _keyword_args(args) + ")" for name, args in calls]
        return "```tool_code\n" + "\n".join(lines) + "\n```"
    replayed = _replay_as_text(messages, lambda m: f"```tool_output\n{_text(m.get('content'))}\n```", code)
    return _with_spec(replayed, spec)


def _keyword_args(args: Any) -> str:
    """Call arguments as Python keywords; arguments that are no object (a model's broken JSON) as they came."""
    if isinstance(args, dict):
        return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args.items())
    return "" if args is None else args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _python_call_grammar(fns: list[dict]) -> str:
    """A tool_code block calling one of fns with keyword arguments valid for its schema (JSON literals)."""
    rules, alts = [], []
    for i, f in enumerate(fns):
        g = schema_grammar({**f["parameters"], "type": "object"}, param="tools")
        g = re.sub(r'^(\S+)-kv ::= "\\"([^"\\]+)\\"" space ":" space (.*)$', r'\1-kv ::= "\2=" \3', g, flags=re.M)
        g = re.sub(r'^root ::= "\{" space (.*)"\}" space$', r'root ::= "(" \1")"', g, flags=re.M)
        rules.append(_prefix_rules(g, f"f{i}-"))  # own names, so several functions share one grammar
        alts.append(f'{json.dumps(f["name"])} f{i}-root')
    return "\n".join(rules) + '\nroot ::= "```tool_code\\n" (' + " | ".join(alts) + ') "\\n```"\n'


def _each_function_grammar(fns: list[dict], wrap) -> str:
    """One of fns' calls: wrap(f) gives the literal text before and after f's JSON arguments."""
    rules, alts = [], []
    for i, f in enumerate(fns):
        rules.append(_prefix_rules(schema_grammar(f["parameters"], param="tools"), f"f{i}-"))
        before, after = wrap(f)
        alts.append(f"{json.dumps(before)} f{i}-root {json.dumps(after)}")
    return "\n".join(rules) + "\nroot ::= " + " | ".join(alts) + "\n"


_GBNF_LITERAL = re.compile(r'("(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\])')


def _prefix_rules(gbnf: str, prefix: str) -> str:
    """gbnf with every rule name prefixed (string literals and character classes left alone)."""
    names = set(re.findall(r"^(\S+) ::=", gbnf, flags=re.M))
    word = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")(?![\w-])")
    parts = _GBNF_LITERAL.split(gbnf)
    return "".join(p if k % 2 else word.sub(lambda m: prefix + m.group(1), p) for k, p in enumerate(parts))


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content or ""


def _args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def plan_tools(fmt: str, messages: list[dict], tools: list[dict] | None, tool_choice: Any,
               parallel: bool = True) -> ToolPlan:
    """How to render and constrain a request with tools in the model's wire format."""
    if not tools or tool_choice == "none":
        if any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):  # replay calls and results
            if fmt == "generic":
                messages = _generic_messages(messages, [], "none")
            elif fmt == "gemma":
                messages = _gemma_messages(messages, [])
        return ToolPlan(messages=messages)
    fns = _functions(tools)
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        chosen = [f for f in fns if f["name"] == name]
        if not chosen:
            raise InvalidRequest(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
        choice, constrained = f"fn:{name}", chosen
    elif tool_choice in (None, "auto"):
        choice, constrained = "auto", fns
    elif tool_choice == "required":
        choice, constrained = "required", fns
    else:
        raise InvalidRequest("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}", "tool_choice")
    forced = choice != "auto"
    # bounded, or a small model can repeat calls until max_tokens cuts the JSON
    most = 1 if choice.startswith("fn:") or not parallel else len(constrained)
    call_list = {"type": "array", "items": _call_schema(constrained), "minItems": 1, "maxItems": most}
    if fmt == "generic":
        calls = {"type": "object", "properties": {"tool_calls": call_list}, "required": ["tool_calls"]}
        answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
        grammar = schema_grammar(calls if forced else {"anyOf": [calls, answer]}, param="tools")
        return ToolPlan(_generic_messages(messages, fns, choice), grammar=grammar, tools_active=True)
    if fmt == "gemma":
        return ToolPlan(_gemma_messages(messages, fns), grammar=_python_call_grammar(constrained),
                        grammar_triggers=[] if forced else [r"(```tool_code)"], tools_active=True)
    grammar, triggers = None, []
    if fmt == "harmony":
        grammar = _each_function_grammar(constrained, lambda f: (
            f"<|channel|>commentary to=functions.{f['name']} <|constrain|>json<|message|>", "<|call|>"))
        triggers = [r"(<\|channel\|>commentary to=functions\.)"]
    elif fmt == "hermes":
        grammar = schema_grammar(_call_schema(constrained), "<tool_call>\n", "\n</tool_call>", param="tools")
        if most > 1:  # parallel calls, one block each
            grammar = grammar.replace("\nroot ::= ", "\ncall ::= ") + f'root ::= call ("\\n" call){{0,{most - 1}}}\n'
        triggers = [r"(<tool_call>)"]
    elif fmt == "llama_json":
        grammar = schema_grammar(_call_schema(constrained, "parameters"), param="tools")
        triggers = [r"^\s*(\{)[\s\S]*$"]
    elif fmt == "mistral":
        grammar = schema_grammar(call_list, "[TOOL_CALLS]", param="tools")
        triggers = [r"(\[TOOL_CALLS\])"]
    # required/forced: the grammar holds from the first token; auto: it starts at the call opener, so a
    # reply may be text, but a call the model starts always completes with arguments valid for its schema
    return ToolPlan(messages=messages, template_kwargs={"tools": tools}, grammar=grammar,
                    grammar_triggers=[] if forced else triggers, tools_active=True)
