"""A lazy grammar (tool_choice auto): free text until the call opener, then arguments valid for the schema; and
sampled tool grammars that never end the process."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from engine.config import load
from engine.requests import CompletionRequest, SamplingParams
from engine.service import Service
from engine.tools import OutputParser, plan_tools
from tests.engine import grammar_stress as stress

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


STRESS_ROUNDS = 3  # x 4 choices (seeds 0-11) x 7 prompts


def test_sampled_lazy_grammars_never_end_the_process_and_calls_stay_valid(assets):
    """Many seeds at temperature 0.9 under tool grammars (tests/engine/grammar_stress.py), in a subprocess: a
    grammar handed text it rejects ends the process. The junk prompts make SmolLM2 complete a call opener with
    a token that carries more (`<tool_call>>`), which llama.cpp's own lazy replay fed the grammar unchecked."""
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "tests.engine.grammar_stress", str(assets["smollm2"]),
                           str(assets["templates"]), str(STRESS_ROUNDS)], cwd=repo, capture_output=True, text=True,
                          timeout=600)
    died = [line for line in proc.stderr.splitlines() if "terminate called" in line or "what():" in line]
    assert proc.returncode == 0 and not died, died or proc.stderr[-3000:]
    replies = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    cases = len(stress.CHATS) + len(stress.JUNK)
    assert len(replies) == cases * STRESS_ROUNDS * stress.CHOICES
    calls: dict[str, int] = {}
    for r in replies:
        p = OutputParser(r["format"], True, False)
        found = [e.call for e in p.feed(r["text"]) + p.finish() if e.kind == "tool_call"]
        for c in found:
            assert c["name"] == "get_weather", r
            jsonschema.validate(json.loads(c["arguments"]), stress.PARAMS)
        if r["case"].endswith("-forced"):  # the grammar holds from the first token and ends the reply
            assert len(found) == 1 and r["finish"] == "stop", r
        calls[r["case"]] = calls.get(r["case"], 0) + len(found)
    # the openers followed by junk were refused and the grammar took over from a clean opener
    junk = {case: n for case, n in calls.items() if case.startswith("junk-")}
    assert sum(junk.values()) >= 6 and sum(1 for n in junk.values() if n) >= 2, calls
