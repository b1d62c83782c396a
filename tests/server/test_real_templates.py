"""SmolLM2 served with real families' chat templates (llama.cpp's models/templates, as chat_template
overrides) answers what real clients send, through the openai client: plain chat with a system message, a
forced tool call, and the agent loop's resend with the client's `call_...` ids and JSON-string arguments.
(tests/engine/test_real_templates.py renders every template; these few generate.)"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import openai
import pytest

from tests.conftest import LiveServer

# the refusals (no system role, object arguments only, 9-character ids, `tools` iterated unguarded),
# the llama 3.x JSON-style calls of the process that died, and a generation prompt that opens <think>
FAMILIES = {"gemma-2": "google-gemma-2-2b-it", "qwen3-coder": "Qwen3-Coder", "glm-4.6": "GLM-4.6",
            "nemo": "mistralai-Mistral-Nemo-Instruct-2407", "hermes-3": "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
            "llama-3.3": "meta-llama-Llama-3.3-70B-Instruct", "firefunction": "fireworks-ai-llama-3-firefunction-v2",
            "qwen3.5": "Qwen3.5-4B"}
ANSWERING = [name for name in FAMILIES if name != "firefunction"]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]  # no description
PLAIN = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Weather in Paris?"}]


def resend(call_id: str, arguments: str) -> list[dict]:
    return PLAIN + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 C, sunny"}]


def template_roster(model: Path, templates: dict[str, Path], ctx: int) -> str:
    """A roster serving one model file once per chat template (by roster name), one stream each."""
    return "".join(f"""
[[models]]
name = "{name}"
path = "{model}"
chat_template = "{template}"
streams = 1
ctx = {ctx}
""" for name, template in templates.items())


@pytest.fixture(scope="module")
def families(assets, tmp_path_factory):
    toml = template_roster(assets["smollm2"], {n: assets["templates"] / f"{f}.jinja" for n, f in FAMILIES.items()},
                           1024)
    srv = LiveServer(["--cache-ram", "0"], toml, tmp_path_factory.mktemp("families"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("model", ANSWERING)
def test_each_family_answers_chat_a_forced_call_and_the_resend(families, model):
    c = families.client()
    plain = c.chat.completions.create(model=model, messages=PLAIN, max_tokens=3, temperature=0)
    assert plain.choices[0].finish_reason in ("stop", "length")
    forced = c.chat.completions.create(model=model, messages=PLAIN, tools=TOOLS, tool_choice="required",
                                       max_tokens=40, temperature=0)
    call, = forced.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and forced.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    again = c.chat.completions.create(model=model, messages=resend("call_" + "7" * 24, '{"city": "Paris"}'),
                                      tools=TOOLS, max_tokens=3, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls")
    if model == "nemo":  # its own calls carry the ids its template takes back
        assert re.fullmatch(r"[A-Za-z0-9]{9}", call.id), call.id
        mine = c.chat.completions.create(model=model, messages=resend(call.id, call.function.arguments),
                                         tools=TOOLS, max_tokens=3, temperature=0)
        assert mine.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_streamed_auto_tool_choice_on_llama_3_3_at_default_temperature_completes(families):
    """The requests during which the process died: tools with tool_choice auto, streamed, sampled."""
    c = families.client()
    for seed in range(4):
        chunks = list(c.chat.completions.create(model="llama-3.3", messages=PLAIN, tools=TOOLS, stream=True,
                                                max_tokens=24, seed=seed))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert families.get("/health")


def test_a_grammar_bound_reply_after_an_opened_think_is_no_reasoning(families):
    """Qwen3.5's generation prompt ends inside <think>; a required call or a response_format binds the reply
    from its first token, so it is the call or the content, not reasoning."""
    c = families.client()
    forced = c.chat.completions.create(model="qwen3.5", messages=PLAIN, tools=TOOLS, tool_choice="required",
                                       max_tokens=40, temperature=0)
    assert forced.choices[0].message.tool_calls and not getattr(forced.choices[0].message, "reasoning_content", None)
    shaped = c.chat.completions.create(model="qwen3.5", messages=PLAIN, max_tokens=40, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "weather", "schema": PARAMS}})
    assert shaped.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(shaped.choices[0].message.content), PARAMS)
    free = c.chat.completions.create(model="qwen3.5", messages=PLAIN, max_tokens=4, temperature=0)
    assert free.choices[0].message.reasoning_content  # unbound, the same prompt's reply starts as reasoning


def test_a_template_that_cannot_render_plain_chat_is_a_400_saying_so_and_the_server_serves_on(families):
    c = families.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="firefunction", messages=PLAIN, max_tokens=3)
    assert e.value.status_code == 400 and e.value.body["param"] == "messages"
    assert "fails on a plain user message too" in e.value.message
    ok = c.chat.completions.create(model="gemma-2", messages=PLAIN, max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")
