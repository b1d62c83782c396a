"""llama-server's utilities: /tokenize, /detokenize, /apply-template, on the served models."""
from __future__ import annotations

from tests.http import call

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


def test_tokenize_and_detokenize_round_trip(smol_server):
    text = "Hello world, déjà vu 🙂"
    status, out = call(smol_server, "POST", "/tokenize", {"content": text})
    assert status == 200 and all(isinstance(t, int) for t in out["tokens"]) and len(out["tokens"]) > 5
    status, back = call(smol_server, "POST", "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and back["content"] == text
    status, pieces = call(smol_server, "POST", "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == out["tokens"]
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces["tokens"])
    assert joined.decode() == text  # the emoji's bytes come as byte lists where a piece splits it


def test_special_tokens_parse_or_not(smol_server):
    special = call(smol_server, "POST", "/tokenize", {"content": "<|im_start|>"})[1]["tokens"]
    literal = call(smol_server, "POST", "/tokenize", {"content": "<|im_start|>", "parse_special": False})[1]["tokens"]
    assert len(special) == 1 and len(literal) > 1
    assert call(smol_server, "POST", "/detokenize", {"tokens": special})[1]["content"] == "<|im_start|>"


def test_apply_template_is_the_prompt_chat_completions_prefill(smol_server):
    status, out = call(smol_server, "POST", "/apply-template", {"messages": MESSAGES})
    assert status == 200
    prompt = out["prompt"]
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    toks = call(smol_server, "POST", "/tokenize", {"content": prompt})[1]["tokens"]
    reply = smol_server.client().chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)
    assert reply.usage.prompt_tokens == len(toks)


def test_utility_errors_name_the_field(smol_server):
    status, out = call(smol_server, "POST", "/detokenize", {"tokens": [10**7]})
    assert status == 400 and out["error"]["param"] == "tokens"
    status, out = call(smol_server, "POST", "/detokenize", {"tokens": ["a"]})
    assert status == 400 and out["error"]["param"] == "tokens"
    status, out = call(smol_server, "POST", "/tokenize", {"content": "x", "model": "nope"})
    assert status == 404 and out["error"]["param"] == "model"
    status, out = call(smol_server, "POST", "/apply-template", {"messages": []})
    assert status == 400 and out["error"]["param"] == "messages"


def test_add_special_adds_the_models_own_markers(smol_server):
    plain = call(smol_server, "POST", "/tokenize", {"content": "hello there", "model": "minilm"})[1]["tokens"]
    marked = call(smol_server, "POST", "/tokenize", {"content": "hello there", "model": "minilm",
                                                     "add_special": True})[1]["tokens"]
    assert len(marked) == len(plain) + 2 and marked[1:-1] == plain  # BERT's [CLS] ... [SEP]
