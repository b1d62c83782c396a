"""n > 1 choices: the prompt is rendered, tokenized and prefilled once, the other choices fork its KV
(llama_memory_seq_cp) and sample from its last row with their own seeds."""
from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.http import call

MODEL = "tiny-random-llama"


@pytest.fixture(scope="module")
def server(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--streams", "4", "--ctx", "2048"], "",
                     tmp_path_factory.mktemp("choices"))
    yield srv
    srv.stop()


def _counters(server) -> tuple[int, int, int]:
    m = next(m for m in server.get("/v1/stats")["models"] if m["id"] == MODEL)
    return m["prefill_tokens"], m["forked_choices"], m["requests"]


def _prompt(tag: str) -> str:
    return f"{tag}: " + " ".join(f"w{i}" for i in range(150))  # unique: nothing of it is in the prefix cache


def test_n_3_prefills_the_prompt_once_and_gives_three_choices(server):
    prefilled, forked, requests = _counters(server)
    status, out = call(server, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": _prompt("three")}], "n": 3, "max_tokens": 12, "temperature": 1.0,
        "seed": 11, "ignore_eos": True})
    assert status == 200, out
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    prompt_tokens, cached = out["usage"]["prompt_tokens"], out["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert out["usage"]["completion_tokens"] == 36
    now_prefilled, now_forked, now_requests = _counters(server)
    assert now_prefilled - prefilled == prompt_tokens - cached  # once, not three times
    assert now_forked - forked == 2 and now_requests - requests == 3
    texts = [c["message"]["content"] for c in out["choices"]]
    assert len(set(texts)) == 3  # seeds 11, 12, 13


def test_forked_choices_match_the_same_seeds_sent_alone(server):
    body = {"prompt": _prompt("seeds"), "max_tokens": 10, "temperature": 1.0, "ignore_eos": True}
    status, together = call(server, "POST", "/v1/completions", {**body, "n": 3, "seed": 5})
    assert status == 200
    alone = [call(server, "POST", "/v1/completions", {**body, "seed": 5 + i})[1]["choices"][0]["text"]
             for i in range(3)]
    assert [c["text"] for c in together["choices"]] == alone


def test_forked_choices_stream(server):
    prefilled, forked, _ = _counters(server)
    with server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": _prompt("s")}],
                                                 n=3, max_tokens=8, stream=True, temperature=0,
                                                 extra_body={"ignore_eos": True}) as stream:
        text = {0: "", 1: "", 2: ""}
        finish = {}
        for chunk in stream:
            for c in chunk.choices:
                text[c.index] += c.delta.content or ""
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert text[0] == text[1] == text[2] and text[0]  # greedy: the same continuation of the same KV
    assert _counters(server)[1] - forked == 2


def test_more_choices_than_streams_queue_as_requests_of_their_own(server):
    _, forked, _ = _counters(server)
    status, out = call(server, "POST", "/v1/completions", {"prompt": _prompt("six"), "n": 6, "max_tokens": 4,
                                                           "temperature": 0, "ignore_eos": True})
    assert status == 200 and len(out["choices"]) == 6
    assert len({c["text"] for c in out["choices"]}) == 1
    assert _counters(server)[1] == forked  # nothing forked: each prefilled (the prefix cache helps the later ones)
