"""Tool-call and reasoning parsers per wire format, on realistic outputs, whole and split at every byte."""
from __future__ import annotations

import json

import pytest

from engine.tools import OutputParser, assemble, detect_format, plan_tools


def run(fmt: str, text: str, tools: bool = True, reasoning: bool = False, step: int | None = None,
        stream_calls: bool = False):
    p = OutputParser(fmt, tools, reasoning, stream_calls=stream_calls)
    events = []
    if step is None:
        events += p.feed(text)
    else:
        for i in range(0, len(text), step):
            events += p.feed(text[i:i + step])
    events += p.finish()
    content, reasoning_text, calls = assemble(events)
    return content, reasoning_text, [(c["name"], json.loads(c["arguments"])) for c in calls]


CASES = [
    # (format, model output, reasoning, expected content, expected reasoning, expected calls)
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     False, "Let me check.\n", "", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", '
               '"arguments": {"x": 1}}\n</tool_call>', False, "\n", "", [("a", {}), ("b", {"x": 1})]),
    ("hermes", "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
               "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", True, "\n\n", "\nThe user wants weather.\n",
     [("get_weather", {"city": "Oslo"})]),
    ("hermes", "<think>short</think>The answer is 4.", True, "The answer is 4.", "short", []),
    ("hermes", "Plain answer with a < sign and <tool but no call.", False,
     "Plain answer with a < sign and <tool but no call.", "", []),
    # malformed: broken JSON comes back as content, never an error
    ("hermes", 'Sure <tool_call>{"name": "x", "arguments": {oops}}</tool_call> done', False,
     'Sure <tool_call>{"name": "x", "arguments": {oops}}</tool_call> done', "", []),
    # partial: the stream ended inside a call
    ("hermes", 'ok <tool_call>{"name": "x", "argu', False, 'ok <tool_call>{"name": "x", "argu', "", []),
    ("llama_json", '{"name": "get_weather", "parameters": {"city": "Rome"}}', False, "", "",
     [("get_weather", {"city": "Rome"})]),
    ("llama_json", '<|python_tag|>{"name": "a", "parameters": {"q": "x"}}; {"name": "b", "parameters": {}}',
     False, "", "", [("a", {"q": "x"}), ("b", {})]),
    ("llama_json", "The weather in Rome is sunny.", False, "The weather in Rome is sunny.", "", []),
    ("llama_json", '{"name": "broken", "parameters": ', False, '{"name": "broken", "parameters": ', "", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}]', False, "", "",
     [("get_weather", {"city": "Lyon"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}', False, "", "", [("get_weather", {"city": "Nice"})]),
    ("mistral", "No tools needed here.", False, "No tools needed here.", "", []),
    ("harmony", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Bern"}<|call|>', False, "",
     "Need weather.", [("get_weather", {"city": "Bern"})]),
    ("harmony", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
     False, "4", "Easy.", []),
    ("gemma", 'Checking.\n```tool_code\nget_weather(city="Paris", unit="celsius")\n```', False, "Checking.\n", "",
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("gemma", '```tool_code\nf(flag=true, n=2)\ng()\n```', False, "", "", [("f", {"flag": True, "n": 2}), ("g", {})]),
    ("gemma", '```tool_code\nimport os\n```', False, '```tool_code\nimport os\n```', "", []),
    ("gemma", "```python\nprint(1)\n```", False, "```python\nprint(1)\n```", "", []),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Kyiv"}}]}', False, "", "",
     [("get_weather", {"city": "Kyiv"})]),
    ("generic", '{"response": "Hello there!"}', False, "Hello there!", "", []),
    ("generic", '{"tool_calls": [{"name": "x"', False, '{"tool_calls": [{"name": "x"', "", []),
]


@pytest.mark.parametrize("fmt, text, reasoning, content, thought, calls", CASES)
def test_parsers_whole_and_split_at_every_byte(fmt, text, reasoning, content, thought, calls):
    assert run(fmt, text, reasoning=reasoning) == (content, thought, calls)
    for step in (1, 2, 3, 7):
        assert run(fmt, text, reasoning=reasoning, step=step) == (content, thought, calls)


GRAMMAR_CALLS = [c for c in CASES if c[0] == "hermes" and c[5]]  # well-formed calls, as a grammar guarantees


@pytest.mark.parametrize("fmt, text, reasoning, content, thought, calls", GRAMMAR_CALLS)
def test_streamed_call_fragments_reassemble(fmt, text, reasoning, content, thought, calls):
    for step in (None, 1, 2, 5):
        assert run(fmt, text, reasoning=reasoning, step=step, stream_calls=True) == (content, thought, calls)


def test_call_id_and_name_leave_before_the_arguments_end():
    p = OutputParser("hermes", True, False, stream_calls=True)
    first = p.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa')
    assert [e.kind for e in first] == ["tool_call_start", "tool_args"]
    assert first[0].call["name"] == "get_weather" and first[1].text == '{"city": "Pa'
    rest = p.feed('ris"}}\n</tool_call>') + p.finish()
    assert [(e.kind, e.text) for e in rest] == [("tool_args", 'ris"}'), ("tool_call_end", "")]


def test_streaming_emits_content_before_the_end():
    p = OutputParser("hermes", True, True)
    early = p.feed("<think>plan") + p.feed(" more</think>Hel") + p.feed("lo <tool")
    assert [(e.kind, e.text) for e in early] == [("reasoning", "plan"), ("reasoning", " more"), ("content", "Hel"),
                                                 ("content", "lo ")]
    rest = p.feed('_call>{"name": "f", "arguments": {}}</tool_call>') + p.finish()
    assert [e.kind for e in rest] == ["tool_call"]


def test_no_tools_means_no_call_parsing():
    assert run("hermes", '<tool_call>{"name": "a", "arguments": {}}</tool_call>', tools=False)[2] == []


def test_detect_format_from_templates():
    assert detect_format("{{ '<tool_call>' }}") == "hermes"
    assert detect_format("[TOOL_CALLS]") == "mistral"
    assert detect_format("<|start|>{{ x }}<|channel|>") == "harmony"
    assert detect_format("<|python_tag|>") == "llama_json"
    assert detect_format("<start_of_turn>user") == "gemma"
    assert detect_format("{% for m in messages %}<|im_start|>{% endfor %}") == "generic"


def test_plan_rejects_bad_tools_and_unknown_forced_function():
    from engine.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match="tools\\[0\\]"):
        plan_tools("generic", [], [{"type": "function"}], "auto")
    with pytest.raises(InvalidRequest, match="not in tools"):
        plan_tools("generic", [], [{"type": "function", "function": {"name": "a"}}],
                   {"type": "function", "function": {"name": "b"}})


def test_reply_that_starts_inside_reasoning():
    p = OutputParser("generic", False, True, in_reasoning=True)
    events = p.feed("weighing it up</th") + p.feed("ink>\n\nParis.") + p.finish()
    assert [(e.kind, e.text) for e in events] == [("reasoning", "weighing it up"), ("content", "\n\nParis.")]


@pytest.mark.parametrize("fmt", ["generic", "gemma"])
@pytest.mark.parametrize("calls, where", [
    ([1], r"messages\[1\]\.tool_calls\[0\]"), ("x", r"messages\[1\]\.tool_calls must"),
    ([{"id": "1"}], r"messages\[1\]\.tool_calls\[0\]"), ([None], r"messages\[1\]\.tool_calls\[0\]"),
    ([{"function": {}}], r"tool_calls\[0\]\.function\.name"), ([{"function": "f"}], r"tool_calls\[0\]"),
    ([{"function": {"name": "a"}}, {"function": {"name": ""}}], r"messages\[1\]\.tool_calls\[1\]"),
    ({"a": 1}, r"messages\[1\]\.tool_calls must"),
])
def test_replaying_malformed_tool_calls_names_the_call(fmt, calls, where):
    """The engine's own check behind the request schema's (was KeyError: 'function', a 500)."""
    from engine.errors import InvalidRequest
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": calls}]
    for tools in (None, [{"type": "function", "function": {"name": "f"}}]):
        with pytest.raises(InvalidRequest, match=where) as e:
            plan_tools(fmt, history, tools, "auto")
        assert e.value.param == "messages"


def test_replayed_arguments_that_are_no_object_stay_text():
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}},
                                                    {"function": {"name": "g", "arguments": "[1, 2]"}},
                                                    {"function": {"name": "h"}}]},
               {"role": "tool", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "ok"}]}]
    gemma = plan_tools("gemma", history, None, None).messages
    assert gemma[1]["content"] == "```tool_code\nf(not json)\ng([1, 2])\nh()\n```"
    assert gemma[2]["content"] == "```tool_output\nok\n```"
    generic = plan_tools("generic", history, None, None).messages
    assert json.loads(generic[1]["content"]) == {"tool_calls": [{"name": "f", "arguments": "not json"},
                                                                {"name": "g", "arguments": [1, 2]},
                                                                {"name": "h", "arguments": None}]}


@pytest.mark.parametrize("tools", [["x"], [1], [None], [{"type": "function", "function": "f"}],
                                   [{"type": "function", "function": {"name": ""}}]])
def test_plan_rejects_tools_that_are_no_function_objects(tools):
    from engine.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match=r"tools\[0\]") as e:
        plan_tools("hermes", [{"role": "user", "content": "q"}], tools, "auto")
    assert e.value.param == "tools"


@pytest.mark.parametrize("choice", [{"type": "function", "function": "f"}, {"function": None}, {}])
def test_plan_rejects_a_tool_choice_without_a_function_name(choice):
    from engine.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match="tool_choice") as e:
        plan_tools("generic", [], [{"type": "function", "function": {"name": "f"}}], choice)
    assert e.value.param == "tool_choice"


@pytest.mark.parametrize("schema, words", [
    ({"type": "string", "minLength": 10**9}, "minLength"), ({"type": "array", "maxItems": 10**7}, "maxItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "maxLength": 5000}}}, "maxLength"),
    ({"type": "string", "pattern": "^a{1000000000}$"}, "pattern"),
    ({"type": "string", "pattern": "^a{1," + "9" * 5000 + "}$"}, "pattern"),
    ({"$ref": "https://example.com/schema.json"}, "local reference"), ({"$ref": "file:///etc/passwd"}, "local"),
])
def test_schemas_too_costly_for_a_grammar_are_refused_quickly(schema, words):
    """The converter spells repetitions out: minLength 10**9 took 77 s and 5 GB before this check."""
    import time
    from engine.errors import InvalidRequest
    from engine.tools import schema_grammar
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest, match=words) as e:
        schema_grammar(schema)
    assert e.value.param == "response_format" and time.monotonic() - t0 < 1
    fn = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": schema}}}}
    for fmt in ("generic", "hermes", "gemma", "llama_json", "mistral", "harmony"):
        with pytest.raises(InvalidRequest, match=words) as e:
            plan_tools(fmt, [{"role": "user", "content": "q"}], [fn], "required")
        assert e.value.param == "tools"  # a tool's schema is named as the tools' fault
    assert schema_grammar({"type": "string", "maxLength": 64, "pattern": "^[a-z]{1,32}$"})  # ordinary bounds pass


def test_a_gemma_call_grammar_quotes_the_function_name():
    plan = plan_tools("gemma", [{"role": "user", "content": "q"}],
                      [{"type": "function", "function": {"name": 'we"ird\\'}}], "required")
    assert '"we\\"ird\\\\" f0-root' in plan.grammar


def test_template_kwargs_may_not_replace_the_renderers_own_variables():
    from engine.chat import CHATML, ChatTemplate
    from engine.errors import InvalidRequest
    template = ChatTemplate(CHATML, "<s>", "</s>")
    msgs = [{"role": "user", "content": "q"}]
    for clash in ({"messages": 5}, {"bos_token": "x"}, {"add_generation_prompt": False}):
        with pytest.raises(InvalidRequest, match=next(iter(clash))) as e:
            template.render(msgs, **clash)
        assert e.value.param == "chat_template_kwargs"
    assert "<|im_start|>user\nq" in template.render(msgs, tools=[], enable_thinking=False)
    with pytest.raises(InvalidRequest, match="'text' must be a string"):
        template.render([{"role": "user", "content": [{"type": "text", "text": 5}]}])
