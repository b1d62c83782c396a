"""A lazy grammar (tool_choice auto): free text until the call opener, then arguments valid for the schema."""
from __future__ import annotations

import asyncio
import json

import jsonschema

from engine.config import load
from engine.requests import CompletionRequest, SamplingParams
from engine.service import Service
from engine.tools import OutputParser, plan_tools

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
# A few-shot raw prompt after which SmolLM2 opens a call by itself (and, unconstrained, goes on to invent
# the next user turn: "User: weather in Tokyo").
SHOT = 'User: weather in {c}\nAssistant: <tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>\n'
PROMPT = "".join(SHOT.format(c=c) for c in ("Rome", "Paris", "Berlin")) + "User: weather in Oslo\nAssistant:"


def test_lazy_grammar_constrains_only_after_the_opener(assets, tmp_path):
    plan = plan_tools("hermes", [], TOOLS, "auto")
    assert plan.grammar_triggers == ["(<tool_call>)"]
    cfg = tmp_path / "c.toml"
    cfg.write_text("")

    async def main():
        svc = Service(load(["--config", str(cfg), "--model", str(assets["smollm2"]), "--ctx", "1024"]))
        svc.load_models()
        svc.start()
        try:
            sampling = SamplingParams(temperature=0, max_tokens=60, grammar=plan.grammar,
                                      grammar_triggers=plan.grammar_triggers)
            gen, = await svc.complete(CompletionRequest(None, PROMPT, sampling))
            return await gen.text(), gen.finish_reason
        finally:
            await svc.stop()
    text, finish = asyncio.run(main())
    assert text.startswith(" <tool_call>\n"), text
    p = OutputParser("hermes", True, False)
    calls = [e.call for e in p.feed(text) + p.finish() if e.kind == "tool_call"]
    assert calls and calls[0]["name"] == "get_weather", text
    jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS)
    assert "User:" not in text and finish == "stop"  # the grammar completed: only end-of-generation could follow


def test_every_family_grammar_is_accepted_by_llama_cpp(assets):
    from engine.llama import LlamaModel, SamplerChain
    from engine.config import TOOL_FORMATS as FORMATS
    from engine.tools import schema_grammar
    model = LlamaModel(assets["tiny"])
    try:
        tools = TOOLS + [{"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"tz": {"type": "string"}, "dst": {"type": "boolean"}}}}}]
        grammars = [schema_grammar({"type": "object"})]
        for fmt in FORMATS:
            for choice in ("auto", "required", {"type": "function", "function": {"name": "get_time"}}):
                plan = plan_tools(fmt, [{"role": "user", "content": "hi"}], tools, choice)
                if plan.grammar:
                    grammars.append((plan.grammar, plan.grammar_triggers))
        assert len(grammars) >= 14
        for g in grammars[1:]:
            chain = SamplerChain(model, temperature=0, top_k=0, top_p=1, min_p=0, repeat_penalty=1,
                                 presence_penalty=0, frequency_penalty=0, penalty_last_n=64, seed=0, logit_bias={},
                                 grammar=g[0], grammar_triggers=g[1])
            assert chain.chain  # llama.cpp parsed it
            chain.free()
        import pytest
        from engine.errors import InvalidRequest
        with pytest.raises(InvalidRequest, match="grammar"):
            SamplerChain(model, temperature=0, top_k=0, top_p=1, min_p=0, repeat_penalty=1, presence_penalty=0,
                         frequency_penalty=0, penalty_last_n=64, seed=0, logit_bias={}, grammar='root ::= ("x"')
    finally:
        model.free()
