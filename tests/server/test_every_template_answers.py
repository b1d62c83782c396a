"""Every chat template in llama.cpp's models/templates answers what real clients send, through the openai
client and the whole engine path: plain chat with a system message, a forced tool call, and an agent-loop
resend. One server holds the tiny random model once per template (the roster's `chat_template`), so each
generation is cheap; tests/engine/test_real_templates.py checks what each renders, this that each answers."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.conftest import LiveServer
from tests.engine.test_real_templates import REFUSE
from tests.server.test_real_templates import PLAIN, resend, template_roster

# an enum: the random model's free strings are bytes that are no UTF-8; here it picks one of two cities
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
FORCED_MAX_TOKENS = 200  # the grammar-constrained call, with what whitespace the random model puts in it


@pytest.fixture(scope="module")
def every(assets, tmp_path_factory):
    # the tiny model's tokens are bytes: the longest templates' tool prompts take a few thousand
    toml = template_roster(assets["tiny"], {p.stem: p for p in sorted(assets["templates"].glob("*.jinja"))}, 8192)
    srv = LiveServer(["--cache-ram", "0", "--threads", "1"], toml, tmp_path_factory.mktemp("every-template"))
    yield srv
    srv.stop()


def answers(c: openai.OpenAI, model: str) -> None:
    """The three conversations on one template's model, each generating; AssertionError saying which failed."""
    plain = c.chat.completions.create(model=model, messages=PLAIN, max_tokens=3, temperature=0)
    assert plain.choices[0].finish_reason in ("stop", "length"), f"plain chat: {plain.choices[0].finish_reason}"
    forced = c.chat.completions.create(model=model, messages=PLAIN, tools=TOOLS, tool_choice="required",
                                       max_tokens=FORCED_MAX_TOKENS, temperature=0)
    calls = forced.choices[0].message.tool_calls or []
    assert forced.choices[0].finish_reason == "tool_calls" and [k.function.name for k in calls] == ["get_weather"], \
        f"forced call: {forced.choices[0].finish_reason} {forced.choices[0].message}"
    jsonschema.validate(json.loads(calls[0].function.arguments), PARAMS)
    again = c.chat.completions.create(model=model, messages=resend("call_" + "7" * 24, '{"city": "Paris"}'),
                                      tools=TOOLS, max_tokens=3, temperature=0)
    assert again.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"resend: {again.choices[0]}"


def refuses(c: openai.OpenAI, model: str, why: str) -> None:
    """Each of the three conversations is the 400 that says the template cannot render it."""
    for kw in ({}, {"tools": TOOLS, "tool_choice": "required"}):
        for messages in (PLAIN, resend("call_" + "7" * 24, '{"city": "Paris"}')):
            with pytest.raises(openai.BadRequestError) as e:
                c.chat.completions.create(model=model, messages=messages, max_tokens=3, **kw)
            assert e.value.body["param"] == "messages" and "fails on a plain user message too" in e.value.message, why


def test_every_template_answers_plain_chat_a_forced_call_and_a_resend(every):
    c = every.client()
    models = [m.id for m in c.models.list().data]
    assert len(models) >= 60
    failures = {}
    for model in models:
        try:
            if model in REFUSE:
                refuses(c, model, REFUSE[model])
            else:
                answers(c, model)
        except (AssertionError, openai.APIError, jsonschema.ValidationError, json.JSONDecodeError) as e:
            failures[model] = f"{type(e).__name__}: {e}"[:1500]
    assert failures == {}
    assert every.get("/health")
