"""Every chat template in llama.cpp's models/templates (from the llama-cpp-python sdist, prepared with the
test assets) renders what real clients send: plain chat with a system message, a forced tool call and an
agent-loop resend (assistant tool_calls with JSON-string arguments and `call_...` ids, then the tool's
result), each rewritten into what that template can express (engine/chat.py's capability probes)."""
from __future__ import annotations

import json
import re

import pytest

from engine.chat import ChatTemplate
from engine.errors import InvalidRequest
from engine.tools import detect_format, new_call_id, plan_tools
from engine.tools.parse import OutputParser

# Templates that cannot render these conversations as llamadesk passes them, and why (each must refuse with a
# 400 that says so; every other template must render all three).
REFUSE = {
    "fireworks-ai-llama-3-firefunction-v2": "it joins `functions` (Fireworks' own string of function specs, which no "
                                            "OpenAI request carries) and `datetime` into its system prompt",
}
SYSTEM, QUESTION = "Answer in one word.", "Weather in Paris?"
# no "description": Hermes-3's template read it unguarded
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
PLAIN = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
CALL_ID = "call_Q2x7" + "f" * 20
RESEND = PLAIN + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": CALL_ID, "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": CALL_ID, "content": "18 C, sunny"}]


@pytest.fixture(scope="module")
def real_templates(assets) -> dict[str, str]:
    found = {p.stem: p.read_text() for p in sorted(assets["templates"].glob("*.jinja"))}
    assert len(found) >= 60, "the sdist's templates were not prepared"
    return found


def render(template: ChatTemplate, messages: list[dict], tools=None, choice=None, **kwargs) -> str:
    """The prompt as the engine writes it: the tool plan of the template's format, then the template."""
    plan = plan_tools(detect_format(template.source), messages, tools, choice)
    return template.render(plan.messages, **plan.template_kwargs, **kwargs)


def check_all_three(t: ChatTemplate) -> None:
    plain = render(t, PLAIN)
    assert SYSTEM in plain and QUESTION in plain, "plain chat lost the system or user text"
    forced = render(t, PLAIN, TOOLS, "required")
    assert "get_weather" in forced and SYSTEM in forced, "the forced call's prompt lost the tools or system text"
    resend = render(t, RESEND, TOOLS, "auto")
    assert "Paris" in resend and "18 C, sunny" in resend, "the resend lost the call or its result"
    assert '\\"city\\"' not in resend, "the call's arguments were written as a quoted string"
    assert "None" not in resend, "a null content came out as None"


def test_every_template_renders_plain_chat_a_forced_call_and_a_resend(real_templates):
    failures = {}
    for name, source in real_templates.items():
        try:
            check_all_three(ChatTemplate(source, "<s>", "</s>"))
        except InvalidRequest as e:
            failures[name] = f"400: {e}"
        except AssertionError as e:
            failures[name] = f"wrong prompt: {e}"
    assert {n: why for n, why in failures.items() if n not in REFUSE} == {}
    for name in REFUSE:
        assert failures.get(name, "").startswith("400: "), (name, failures.get(name))


def test_a_template_that_fails_on_any_conversation_says_so(real_templates):
    t = ChatTemplate(real_templates["fireworks-ai-llama-3-firefunction-v2"], "<s>", "</s>")
    assert t.caps.problem
    with pytest.raises(InvalidRequest, match="fails on a plain user message too.*working chat_template") as e:
        render(t, PLAIN)
    assert e.value.param == "messages"
    # what it lacks, given as template variables, makes it render: the refusal is about them, not the messages
    text = render(t, PLAIN, functions="[]", datetime="Jan 01 2025")
    assert SYSTEM in text and "Today is Jan 01 2025." in text


def test_gemma_2_has_no_system_role_so_the_system_text_opens_the_first_user_turn(real_templates):
    t = ChatTemplate(real_templates["google-gemma-2-2b-it"], "<bos>", "<eos>")
    assert not t.caps.system_role
    text = render(t, PLAIN + [{"role": "assistant", "content": "Rain."}, {"role": "user", "content": "And Rome?"}])
    assert text == ("<bos><start_of_turn>user\nAnswer in one word.\n\nWeather in Paris?<end_of_turn>\n"
                    "<start_of_turn>model\nRain.<end_of_turn>\n<start_of_turn>user\nAnd Rome?<end_of_turn>\n"
                    "<start_of_turn>model\n")


@pytest.mark.parametrize("name, written", [
    ("Qwen3-Coder", "<function=get_weather>\n<parameter=city>\nParis\n</parameter>"),
    ("GLM-4.6", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>"),
    # tojson of the client's string would have quoted it into a string
    ("Qwen-Qwen2.5-7B-Instruct", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    ("meta-llama-Llama-3.3-70B-Instruct", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
])
def test_templates_that_want_object_arguments_get_the_clients_json_string_parsed(real_templates, name, written):
    t = ChatTemplate(real_templates[name], "<s>", "</s>")
    assert not t.caps.string_arguments
    assert written in render(t, RESEND, TOOLS, "auto")
    broken = [*RESEND[:2], {**RESEND[2], "tool_calls": [{**RESEND[2]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": '{"city": "Par'}}]}, RESEND[3]]
    with pytest.raises(InvalidRequest, match=r"messages\[2\]\.tool_calls\[0\]\.function\.arguments must be a JSON "
                                             "object") as e:
        render(t, broken, TOOLS, "auto")
    assert e.value.param == "messages"


def test_hermes_3_tool_use_renders_chat_without_tools_and_tools_without_description(real_templates):
    t = ChatTemplate(real_templates["NousResearch-Hermes-3-Llama-3.1-8B-tool_use"], "<s>", "</s>")
    assert t.caps.tools_when_none == [] and not t.caps.tool_description_optional
    assert render(t, PLAIN).endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert "get_weather(city: str) - \n" in render(t, PLAIN, TOOLS, "auto")


def test_mistral_nemo_gets_nine_character_ids_stable_and_distinct_within_a_request(real_templates):
    t = ChatTemplate(real_templates["mistralai-Mistral-Nemo-Instruct-2407"], "<s>", "</s>")
    assert not t.caps.any_call_id
    other = "call_" + "e" * 24
    two = PLAIN + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": other, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": other, "content": "20 C"},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "18 C"}]
    text = render(t, two, TOOLS, "auto")
    call_ids = re.findall(r'"id": "([^"]*)"', text)
    result_ids = re.findall(r'"call_id": "([^"]*)"', text)
    assert len(call_ids) == 2 and all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in call_ids), text
    assert call_ids[0] != call_ids[1] and result_ids == [call_ids[1], call_ids[0]], text
    assert render(t, two, TOOLS, "auto") == text  # the same ids each time
    # a call this family generates already has such an id, and comes back unchanged in the resend
    mine = new_call_id("mistral")
    assert re.fullmatch(r"[A-Za-z0-9]{9}", mine)
    p = OutputParser("mistral", True, False)
    parsed, = [e.call for e in p.feed('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]')
               + p.finish() if e.kind == "tool_call"]
    assert re.fullmatch(r"[A-Za-z0-9]{9}", parsed["id"])
    back = PLAIN + [{"role": "assistant", "content": None, "tool_calls": [{"id": parsed["id"], "type": "function",
                                                                           "function": parsed}]},
                    {"role": "tool", "tool_call_id": parsed["id"], "content": "5 C"}]
    assert f'"id": "{parsed["id"]}"' in render(t, back, TOOLS, "auto")


def test_tool_results_become_user_turns_and_calls_text_where_a_template_has_neither(real_templates):
    t = ChatTemplate(real_templates["microsoft-Phi-3.5-mini-instruct"], "<s>", "</s>")
    assert not t.caps.tool_calls and not t.caps.tool_responses
    text = t.render(RESEND)  # the messages as they come, no tool plan: the template alone
    assert '<|assistant|>\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}' in text
    assert "<|user|>\nTool result (get_weather): 18 C, sunny" in text
    assert json.loads(text.split("<|assistant|>\n")[1].split("<|end|>")[0])  # valid JSON


def test_developer_messages_are_system_messages_unless_the_template_names_the_role(real_templates):
    dev = [{"role": "developer", "content": SYSTEM}, PLAIN[1]]
    llama = ChatTemplate(real_templates["meta-llama-Llama-3.3-70B-Instruct"], "", "")
    assert "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date" in llama.render(dev)
    assert "developer" not in llama.render(dev)
    oss = ChatTemplate(real_templates["openai-gpt-oss-120b"], "", "")
    assert oss.caps.developer_role and "<|start|>developer<|message|># Instructions\n\nAnswer in one word." in \
        oss.render(dev)
