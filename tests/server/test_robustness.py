"""An engine no request can stop: every sampling knob on every sampling path, bad token ids, a failing
tick or scheduler loop, broken weights, files that are no templates. Each case was once a hang, a dead
scheduler thread, a leaked slot or a 500."""
from __future__ import annotations

import asyncio
import logging
import struct
import json
import threading
import time
from pathlib import Path

import openai
import pytest

from tests.assets import tiny_gguf
from tests.conftest import LiveServer
from tests.http import call

MODEL = "tiny-random-llama"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(assets, tmp_path_factory):
    """The tiny model with one stream, so requests queue behind each other."""
    srv = LiveServer(["--model", str(assets["tiny"]), "--streams", "1", "--ctx", "4096"], "",
                     tmp_path_factory.mktemp("robust"))
    yield srv
    srv.stop()


def _model(server):
    return server.service.roster.loaded[MODEL]


def _idle(server) -> None:
    """Every request has ended and given its place back."""
    deadline = time.monotonic() + 30
    while _model(server).outstanding or _model(server).live_requests():
        assert time.monotonic() < deadline, "a request kept its place"
        time.sleep(0.02)
    stats = server.get("/v1/stats")
    assert stats["active_streams"] == 0 and stats["queued_streams"] == 0


PENALTIES = [{"presence_penalty": 0.5}, {"frequency_penalty": 1.0}, {"repeat_penalty": 1.3},
             {"presence_penalty": -0.5, "frequency_penalty": 0.5, "repeat_penalty": 1.1}]
PATHS = {
    "greedy": {"temperature": 0},
    "sampled": {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7},
    "grammar": {"temperature": 0, "response_format": {"type": "json_object"}},
    "logit_bias": {"temperature": 0, "logit_bias": {"5": 3, "6": -100}},
    "sampled_bias": {"temperature": 1.0, "logit_bias": {"5": 3}, "seed": 3},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: "+".join(p))
def test_penalties_answer_on_every_sampling_path(server, path, penalty):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, **PATHS[path], **penalty}
    status, out = call(server, "POST", "/v1/chat/completions", body)
    assert status == 200, out
    assert out["choices"][0]["finish_reason"] in ("length", "stop")
    assert out["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda p: "+".join(p))
def test_penalties_stream(server, penalty):
    with server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, stream=True,
                                                 temperature=0, extra_body=penalty) as stream:
        finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("length", "stop")


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repeat_penalty": 1.5}],
                         ids=lambda p: "+".join(p))
def test_penalties_change_what_greedy_decoding_repeats(server, penalty):
    # the random model loops greedily over a few bytes; a penalty must push it to other tokens
    def text(extra: dict) -> str:
        status, out = call(server, "POST", "/v1/completions", {"model": MODEL, "prompt": "the the the", "max_tokens": 40,
                                                               "temperature": 0, "ignore_eos": True, **extra})
        assert status == 200, out
        return out["choices"][0]["text"]
    plain, penalized = text({}), text(penalty)
    assert len(set(penalized)) > len(set(plain)), (plain, penalized)


def test_forty_penalty_requests_leak_no_place(server):
    # each of these once hung and kept its place; after 36 every request was "busy"
    for _ in range(40):
        status, out = call(server, "POST", "/v1/chat/completions",
                           {"messages": MESSAGES, "max_tokens": 2, "presence_penalty": 0.5})
        assert status == 200, out
    _idle(server)


@pytest.mark.parametrize("token", ["100000000000000000000000", "-1", "-5", "n_vocab", "9999999"])
@pytest.mark.parametrize("temperature", [0, 1.0])
def test_logit_bias_outside_the_vocabulary_is_a_400(server, token, temperature):
    n_vocab = _model(server).model.n_vocab
    token = str(n_vocab) if token == "n_vocab" else token
    status, out = call(server, "POST", "/v1/chat/completions", {"messages": MESSAGES, "temperature": temperature,
                                                                "logit_bias": {token: 1}})
    assert status == 400 and out["error"]["param"] == "logit_bias", out
    assert f"0..{n_vocab - 1}" in out["error"]["message"] or "token id" in out["error"]["message"]
    _idle(server)


def test_a_bad_logit_bias_does_not_touch_another_clients_stream(assets, tmp_path):
    srv = LiveServer(["--model", str(assets["tiny"]), "--streams", "2", "--ctx", "4096"], "", tmp_path)
    try:
        async def scenario() -> tuple[str | None, int, list[int]]:
            client = srv.async_client(timeout=120)
            stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2000,
                                                          stream=True, extra_body={"ignore_eos": True})
            chunks, finish, statuses = 0, None, []
            async for c in stream:
                chunks += 1
                if chunks == 5:  # mid-stream, other clients send ids past the vocabulary
                    for tok in ("100000000000000000000000", "100000", "-3"):
                        try:
                            await client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0,
                                                                 logit_bias={tok: 1})
                        except openai.BadRequestError as e:
                            statuses.append(e.status_code)
                if c.choices and c.choices[0].finish_reason:
                    finish = c.choices[0].finish_reason
            await client.close()
            return finish, chunks, statuses
        finish, chunks, statuses = asyncio.run(scenario())
        assert statuses == [400, 400, 400]
        assert finish == "length" and chunks > 18
        assert srv.get("/v1/stats")["scheduler"]["tick_errors"] == 0
    finally:
        srv.stop()


class _Injected(Exception):
    """A fault injected into the scheduler tick."""


def _gate(server) -> threading.Event:
    """Hold the scheduler thread between ticks until the returned event is set."""
    release, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(30)
    server.service.worker.call(hold)
    assert held.wait(10)
    return release


def test_a_failing_tick_ends_its_streams_and_the_next_request_is_answered(server):
    """Streams running, queued and still in the inbox when a tick raises: each gets an error, none keeps a
    place, the thread lives on (this once killed it: ValueError ending an inbox stream)."""
    runner = _model(server).runner
    errors_before = server.get("/v1/stats")["scheduler"]["tick_errors"]

    async def scenario() -> list:
        client = server.async_client(timeout=60)

        async def one() -> object:
            try:
                return await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1500,
                                                            extra_body={"ignore_eos": True})
            except openai.APIError as e:
                return e
        running = [asyncio.ensure_future(one()) for _ in range(3)]  # 1 decoding, 2 queued (streams = 1)
        deadline = time.monotonic() + 30
        while not (len(runner.scheduler.running) == 1 and len(runner.scheduler.waiting) == 2):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        release = await asyncio.to_thread(_gate, server)
        inbox = [asyncio.ensure_future(one()) for _ in range(2)]
        while len(runner.inbox) < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        real_step = runner.step

        def faulty(out):  # once, before the tick takes the inbox
            runner.step = real_step
            raise _Injected("injected")
        runner.step = faulty
        release.set()
        results = await asyncio.gather(*running, *inbox)
        await client.close()
        return results
    results = asyncio.run(scenario())
    assert all(isinstance(r, openai.InternalServerError) for r in results), results
    assert all("internal error in the scheduler" in r.message for r in results)
    _idle(server)
    reply = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert reply.choices[0].finish_reason in ("length", "stop")
    stats = server.get("/v1/stats")
    assert stats["scheduler"]["tick_errors"] == errors_before + 1 and stats["scheduler"]["alive"]
    assert server.get("/health")["status"] == "ok"


class _LoopFault(BaseException):
    """Not an Exception: escapes the per-model handler and fails the whole loop."""


def test_a_failing_scheduler_loop_is_restarted(server):
    runner = _model(server).runner
    before = server.get("/v1/stats")["scheduler"]["restarts"]
    release = _gate(server)
    real_step = runner.step

    def faulty(out):
        runner.step = real_step
        raise _LoopFault()
    runner.step = faulty
    release.set()
    reply = server.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert reply.choices[0].finish_reason in ("length", "stop")
    stats = server.get("/v1/stats")
    assert stats["scheduler"]["restarts"] == before + 1 and stats["scheduler"]["alive"]
    assert server.get("/health")["status"] == "ok"
    _idle(server)


def test_nan_weights_give_valid_json_logprobs(tmp_path):
    path = tmp_path / "nan.gguf"
    tiny_gguf.write(path, nan_output=True)
    srv = LiveServer(["--model", str(path), "--streams", "1"], "", tmp_path)
    try:
        status, out = call(srv, "POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3,
                                                                 "logprobs": True, "top_logprobs": 2})
        assert status == 200  # call() parsed it: strict JSON (no bare NaN)
        entries = out["choices"][0]["logprobs"]["content"]
        assert entries and all(e["logprob"] == -9999.0 for e in entries)
        assert all(t["logprob"] == -9999.0 for e in entries for t in e["top_logprobs"])
        status, out = call(srv, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "logprobs": 2})
        assert status == 200 and out["choices"][0]["logprobs"]["token_logprobs"] == [-9999.0, -9999.0]
    finally:
        srv.stop()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("template", ["/dev/zero", "binary", "directory", "huge", "latin1"])
def test_a_chat_template_that_is_no_template_is_refused_quickly(server, assets, tmp_path, template):
    path = {"/dev/zero": Path("/dev/zero"), "binary": assets["tiny"], "directory": tmp_path,
            "huge": tmp_path / "huge.jinja", "latin1": tmp_path / "latin1.jinja"}[template]
    if template == "huge":
        path.write_text("{{ messages }}" * 200_000)
    if template == "latin1":
        path.write_bytes("{{ 'caf\xe9' }}".encode("latin-1"))
    rss = _rss()
    t0 = time.monotonic()
    status, out = call(server, "POST", "/v1/models/load", {"path": str(assets["tiny"]), "name": "t-" + template,
                                                           "chat_template": str(path)})
    assert status == 400 and out["error"]["code"] == "model_load_failed", out
    assert "chat_template" in out["error"]["message"]
    assert time.monotonic() - t0 < 5 and _rss() - rss < 100 * 2**20
    assert [m["id"] for m in server.get("/v1/models")["data"]] == [MODEL]


@pytest.mark.parametrize("route, key", [("/v1/models/load", "path"), ("/catalog/import", "path")])
def test_a_path_too_long_for_the_os_is_a_400(server, route, key):
    status, out = call(server, "POST", route, {key: "/tmp/" + "a" * 100_000})
    assert status == 400 and out["error"]["code"] == "model_load_failed", out
    assert len(out["error"]["message"]) < 1000


@pytest.mark.parametrize("body", [b"[1, 2]", b"{not json", b"\xff\xfe{}", b'"x"'])
def test_bench_with_a_body_that_is_no_object_is_a_400(server, body):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(server.url + "/bench", method="POST", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["type"] == "invalid_request_error"
    e.value.close()
    assert server.get("/bench")["state"] in ("idle", "done")


def test_clients_that_vanish_mid_request_leave_no_error_and_no_stream(server, caplog):
    """Abrupt disconnects (FIN or RST) at random moments of buffered and streamed replies: once 15 of 1,407
    logged 'Cannot write to closing transport' tracebacks at ERROR."""
    import random
    import socket
    from urllib.parse import urlsplit
    u = urlsplit(server.url)
    rnd = random.Random(1)
    with caplog.at_level(logging.INFO):
        for _ in range(150):
            body = json.dumps({"messages": MESSAGES, "max_tokens": rnd.choice([5, 50, 300]), "ignore_eos": True,
                               "stream": rnd.random() < 0.7}).encode()
            s = socket.create_connection((u.hostname, u.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + u.netloc.encode() +
                      b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(rnd.choice([0, 0.001, 0.005, 0.02, 0.05]))
            if rnd.random() < 0.5:  # RST instead of FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        _idle(server)
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors[:5]
