"""Many sampled generations under tool grammars, lazy ones above all, on real templates' prompts and on
few-shot prompts that lead SmolLM2 to open a call and write something else straight after the opener.

Run as a subprocess by test_lazy_grammar.py: a grammar sampler that accepts a token its grammar rejects throws
a C++ exception through ctypes, which ends the process (`Unexpected empty grammar stack after accepting
piece`). Prints one JSON line per generation: {"case", "format", "seed", "text", "finish"}.
Usage: python -m tests.engine.grammar_stress MODEL TEMPLATES_DIR ROUNDS [CASE-SUBSTRING]
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
import tempfile
from pathlib import Path

from engine.chat import ChatTemplate
from engine.config import load
from engine.requests import CompletionRequest, SamplingParams
from engine.service import Service
from engine.tools import detect_format, plan_tools

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
          "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                           "parameters": PARAMS}}]
ASK = [{"role": "system", "content": "You call tools when they help. You can also write Jinja, e.g. {{ name }}."},
       {"role": "user", "content": "Weather in Oslo? Or write a Jinja line with {{ city }} in it."}]
# (case, template file, tool_choice): chat prompts rendered by real templates
CHATS = [("llama-3.3", "meta-llama-Llama-3.3-70B-Instruct.jinja", "auto"),
         ("llama-3.2-forced", "meta-llama-Llama-3.2-3B-Instruct.jinja", "required"),
         ("hermes-3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "auto")]
# format -> few-shot answers that put text straight after the call opener, inside the token that completes it
# in SmolLM2's vocabulary (`>>`, `",`, `]]`, `codes`): a model that copies them hands the grammar, at its trigger,
# text it cannot follow
JUNK = {"hermes": ["<tool_call>> Rome", "<tool_call>, Paris", '<tool_call>" Berlin', "<tool_call>. Madrid"],
        "llama_json": ['{"name", "Rome"}', '{"name"] Paris', '{"name"}} Berlin', '{"name", "Madrid"}'],
        "mistral": ["[TOOL_CALLS]] Rome", "[TOOL_CALLS]: Paris", "[TOOL_CALLS]) Berlin", "[TOOL_CALLS]] Madrid"],
        "gemma": ["```tool_codes Rome```", "```tool_codes Paris```", "```tool_code_ Berlin```"]}


CHOICES = 4  # per request, sampled in parallel streams
MAX_TOKENS = 36  # enough for a whole call, most of the time


def raw_prompt(shots: list[str]) -> str:
    """Q/A examples answered by shots (each ends with its city), then the question to answer."""
    cities = [re.sub(r"\W", "", s.split()[-1]) for s in shots]
    return "".join(f"Q: weather in {c}\nA: {s}\n" for c, s in zip(cities, shots)) + "Q: weather in Oslo\nA:"


def cases(templates: Path) -> list[tuple[str, str, str, list, list]]:
    """(case, format, prompt, grammar, triggers) for every chat and every junk prompt."""
    out = []
    for case, file, choice in CHATS:
        source = (templates / file).read_text()
        fmt = detect_format(source)
        plan = plan_tools(fmt, ASK, TOOLS, choice)
        text = ChatTemplate(source, "", "").render(plan.messages, **plan.template_kwargs)
        out.append((case, fmt, text, plan.grammar, plan.grammar_triggers))
    for fmt, shots in JUNK.items():
        plan = plan_tools(fmt, [], TOOLS, "auto")
        out.append((f"junk-{fmt}", fmt, raw_prompt(shots), plan.grammar, plan.grammar_triggers))
    return out


async def main(model: str, templates: Path, rounds: int, only: str = "") -> None:
    cfg = Path(tempfile.mkdtemp(prefix="grammar-stress-")) / "c.toml"
    cfg.write_text("")
    svc = Service(load(["--config", str(cfg), "--model", model, "--ctx", "1024", "--streams", str(CHOICES),
                        "--cache-ram", "0"]))
    svc.load_models()
    svc.start()

    async def one(case, fmt, prompt, grammar, triggers, seed):
        # n choices: the prompt is prefilled once and each choice samples with its own seed
        sampling = SamplingParams(temperature=0.9, top_k=40, max_tokens=MAX_TOKENS, seed=seed, grammar=grammar,
                                  grammar_triggers=triggers)
        gens = await svc.complete(CompletionRequest(None, prompt, sampling), n=CHOICES)
        for i, gen in enumerate(gens):
            text = await gen.text()
            print(json.dumps({"case": case, "format": fmt, "seed": seed + i, "text": text,
                              "finish": gen.finish_reason}), flush=True)
    try:
        for case in cases(templates):
            if only in case[0]:
                for r in range(rounds):
                    await one(*case, r * CHOICES)
    finally:
        await svc.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:]))
