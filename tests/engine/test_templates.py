"""Chat templates written for these tests, one per tool-call family: tools, tool results and assistant
tool_calls turns render in each family's own layout, and the family is detected from the template."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.chat import CHATML, ChatTemplate
from engine.tools import detect_format, plan_tools

TEMPLATES = Path(__file__).resolve().parents[1] / "assets" / "templates"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C, sunny"},
]


def render(family: str, messages=CONVERSATION, tools=TOOLS) -> str:
    source = (TEMPLATES / f"{family}.jinja").read_text()
    fmt = detect_format(source)
    plan = plan_tools(fmt, messages, tools, "auto")
    return fmt, ChatTemplate(source, "<s>", "</s>").render(plan.messages, **plan.template_kwargs)


@pytest.mark.parametrize("family, expected", [
    ("hermes", ['<tools>\n{"type": "function", "function": {"name": "get_weather"',
                '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                "<tool_response>\n18 C, sunny\n</tool_response>", "<|im_start|>assistant\n"]),
    ("llama_json", ["Environment: ipython", '"name": "get_weather"',
                    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>',
                    "<|start_header_id|>ipython<|end_header_id|>\n\n18 C, sunny<|eot_id|>"]),
    # this template has no system branch: the system text opens the user turn rather than being dropped
    ("mistral", ['[AVAILABLE_TOOLS][{"type": "function"', "[INST]Be brief.\n\nWeather in Paris?[/INST]",
                 '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_1"}]</s>',
                 '[TOOL_RESULTS]{"content": "18 C, sunny", "call_id": "call_1"}[/TOOL_RESULTS]']),
    ("harmony", ["namespace functions {", "type get_weather = (_: {",
                 '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                 '{"city": "Paris"}<|call|>',
                 "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18 C, sunny<|end|>",
                 "<|start|>assistant"]),
])
def test_family_templates_render_tools_calls_and_results(family, expected):
    fmt, text = render(family)
    assert fmt == family
    for piece in expected:
        assert piece in text, (piece, text)


def test_gemma_layout_joins_tools_into_the_first_turn_and_replays_code_blocks():
    fmt, text = render("gemma")
    assert fmt == "gemma"
    assert text.startswith("<s><start_of_turn>user\nBe brief.\n\nYou can call these functions:")
    assert '<start_of_turn>model\n```tool_code\nget_weather(city="Paris")\n```<end_of_turn>' in text
    assert "<start_of_turn>user\n```tool_output\n18 C, sunny\n```<end_of_turn>" in text


def test_generic_format_puts_tools_in_the_system_prompt_and_replays_turns_as_text():
    fmt = detect_format(CHATML)
    assert fmt == "generic"
    plan = plan_tools(fmt, CONVERSATION, TOOLS, "auto")
    text = ChatTemplate(CHATML, "", "").render(plan.messages)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools:")
    assert '"name": "get_weather"' in text and '{"response": "<your answer>"}' in text
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}' in text
    assert "<|im_start|>user\nTool result (get_weather): 18 C, sunny" in text
    assert plan.grammar and "root ::=" in plan.grammar


def test_forced_call_grammars_per_family():
    harmony = plan_tools("harmony", CONVERSATION[:2], TOOLS, "required")
    assert ('root ::= "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" f0-root '
            '"<|call|>"') in harmony.grammar and not harmony.grammar_triggers
    assert plan_tools("harmony", CONVERSATION[:2], TOOLS, "auto").grammar_triggers
    gemma = plan_tools("gemma", CONVERSATION[:2], TOOLS, "required")
    assert 'root ::= "```tool_code\\n" ("get_weather" f0-root) "\\n```"' in gemma.grammar
    assert 'f0-city-kv ::= "city=" f0-string' in gemma.grammar and 'f0-root ::= "(" f0-city-kv ")"' in gemma.grammar
    for family, start in (("hermes", '"<tool_call>\\n"'), ("mistral", '"[TOOL_CALLS]"')):
        source = (TEMPLATES / f"{family}.jinja").read_text()
        plan = plan_tools(detect_format(source), CONVERSATION[:2], TOOLS,
                          {"type": "function", "function": {"name": "get_weather"}})
        assert f"root ::= {start} payload" in plan.grammar
        assert '"\\"get_weather\\""' in plan.grammar
    plan = plan_tools("generic", CONVERSATION[:2], TOOLS, "required")
    assert "response" not in plan.grammar  # required: no plain-answer branch
    auto = plan_tools("generic", CONVERSATION[:2], TOOLS, "auto")
    assert "response" in auto.grammar
    json.dumps(plan.messages)  # plain JSON-able messages


# a template that asks for <tool_call> blocks but never prints the tools it is given, and one that reads
# content only as a list of typed parts
NO_TOOL_LIST = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                "Answer, or call a tool in <tool_call></tool_call>.\n<|assistant|>")
PARTS_ONLY = "{% for m in messages %}[{{ m.role }}]{% for p in m.content %}{{ p.text }}{% endfor %}\n{% endfor %}"


def test_tools_a_template_does_not_print_are_described_in_the_system_message():
    t = ChatTemplate(NO_TOOL_LIST, "", "")
    assert not t.caps.tools and detect_format(NO_TOOL_LIST) == "hermes"
    plan = plan_tools("hermes", CONVERSATION[:2], TOOLS, "auto")
    text = t.render(plan.messages, **plan.template_kwargs)
    assert text.startswith('<|system|>Be brief.\n\nYou can call these tools:\n[{"type": "function", "function": '
                           '{"name": "get_weather"'), text


def test_a_template_that_reads_typed_content_parts_gets_them():
    t = ChatTemplate(PARTS_ONLY, "", "")
    assert not t.caps.string_content
    assert t.render(CONVERSATION[:2]) == "[system]Be brief.[user]Weather in Paris?"
    parts = [{"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "here?"}]}]
    assert t.render(parts) == "[user]Weather here?"
