"""Writing a tool-using request: the messages and template arguments each format expects (tools described,
calls and results replayed), and the grammars that make a required or forced call valid; JSON-schema
grammars bounded before they are built."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from llama_cpp.llama_grammar import json_schema_to_gbnf

from engine.errors import InvalidRequest


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


_RAW_CHAR = re.compile(r'^char ::= \[\^"\\\\\] \|', re.M)
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'  # any character but ", \ and the controls; those as escapes


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
    # the converter's string characters admit raw control characters, which JSON does not (a newline inside
    # a string made json.loads fail on a finished reply): only escapes for those
    gbnf = _RAW_CHAR.sub(lambda _: _JSON_CHAR, gbnf)
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
        triggers = [r'^\s*(\{\s*"name")']  # a reply that opens a call object; `{{ x }}` stays text
    elif fmt == "mistral":
        grammar = schema_grammar(call_list, "[TOOL_CALLS]", param="tools")
        triggers = [r"(\[TOOL_CALLS\])"]
    # required/forced: the grammar holds from the first token; auto: it starts at the call opener, so a
    # reply may be text, but a call the model starts always completes with arguments valid for its schema
    return ToolPlan(messages=messages, template_kwargs={"tools": tools}, grammar=grammar,
                    grammar_triggers=[] if forced else triggers, tools_active=True)
