"""Remote backends: roster entries another OpenAI-compatible server serves. A (a llamadesk serving the tiny model
itself) relays them to B (the SmolLM2 server) and to stand-in upstreams on loopback; the official openai client
talks to A, and what B or the stand-ins answer on their own is the reference."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest
from aiohttp import web

from engine.config import ConfigError, load
from server import remote
from tests.conftest import LiveServer
from tests.http import request

WORDS = ["Hello", " from", " the", " stand-in"]
STANDIN_TEXT = "".join(WORDS)
SLOW_FIRST_BYTE_S = 1.0  # the slow upstream's wait before it answers: requests caught in it when it goes away
CHUNK_S = 0.02
KEY_ENV = "LLAMADESK_TEST_REMOTE_KEY"
UNSET_ENV = "LLAMADESK_TEST_REMOTE_KEY_NEVER_SET"
HI = [{"role": "user", "content": "Name three colors."}]
GREEDY = {"max_tokens": 12, "temperature": 0}
REFUSAL = {"type": "permission_error", "param": "model", "code": "model_not_enabled"}  # the refuse stand-in's


class Upstream:
    """A stand-in OpenAI-compatible server on a loopback port, in a thread of its own. The first path segment
    is its behaviour: ok answers at once, slow after SLOW_FIRST_BYTE_S, broken with a 500, refuse with a 403
    naming the model it was sent (REFUSAL's fields), hang never, cut drops the connection after its first event.
    It records what it was sent, and can go away and come back on its port."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        self.waiting = 0  # slow requests not answered yet
        self._transports: set[asyncio.Transport] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="upstream-standin", daemon=True)
        self._thread.start()
        self._call(self._start())

    def _call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        app = web.Application(middlewares=[self._track])
        app.router.add_get("/{mode}/v1/models", self._models)
        app.router.add_post("/{mode}/v1/{route:.+}", self._answer)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1)
        await self.runner.setup()
        await self._listen(0)

    async def _listen(self, port: int) -> None:
        self.site = web.TCPSite(self.runner, "127.0.0.1", port, reuse_address=True)
        await self.site.start()
        self.port = self.site._server.sockets[0].getsockname()[1]

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def count(self, mode: str) -> int:
        return sum(1 for s in self.seen if s["mode"] == mode)

    def go_away(self) -> None:
        """Stop listening and drop every connection, as a killed process would."""
        async def down() -> None:
            await self.site.stop()
            for t in list(self._transports):
                t.abort()
        self._call(down())

    def come_back(self) -> None:
        self._call(self._listen(self.port))

    def stop(self) -> None:
        async def down() -> None:
            for t in list(self._transports):
                t.abort()
            await self.runner.cleanup()
        self._call(down())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    @web.middleware
    async def _track(self, request: web.Request, handler) -> web.StreamResponse:
        self._transports = {t for t in self._transports if not t.is_closing()} | {request.transport}
        return await handler(request)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "standin", "object": "model"}]})

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        mode, body = request.match_info["mode"], await request.json()
        self.seen.append({"mode": mode, "route": request.match_info["route"], "body": body,
                          "auth": request.headers.get("Authorization"),
                          "hops": request.headers.get(remote.HOPS_HEADER)})
        if mode == "broken":
            return web.json_response({"error": {"message": "the stand-in broke", "type": "server_error"}}, status=500)
        if mode == "refuse":
            return web.json_response({"error": {**REFUSAL, "message": f"The model '{body['model']}' is not enabled "
                                                "for this key"}}, status=403)
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "slow":
            self.waiting += 1
            try:
                await asyncio.sleep(SLOW_FIRST_BYTE_S)
            finally:
                self.waiting -= 1
        if not body.get("stream"):
            return web.json_response({"id": "chatcmpl-standin", "object": "chat.completion", "created": 0,
                                      "model": body["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": STANDIN_TEXT}}],
                                      "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in WORDS:
            chunk = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(CHUNK_S)
            if mode == "cut":
                await asyncio.sleep(0.1)  # the event is on its way; then the connection breaks
                request.transport.abort()
                await asyncio.sleep(3600)
        await resp.write(b"data: [DONE]\n\n")
        return resp


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _remote(name: str, **keys) -> str:
    lines = [f'name = "{name}"', 'backend = "remote"'] + [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    return "[[models]]\n" + "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def standin():
    u = Upstream()
    yield u
    u.stop()


@pytest.fixture(scope="module")
def replica_c():
    u = Upstream()
    yield u
    u.stop()


@pytest.fixture(scope="module")
def front(assets, smol_server, standin, replica_c, tmp_path_factory):
    """A: the tiny model of its own, and remote entries for B, the stand-ins and a port nobody listens on."""
    b = smol_server.url
    os.environ[KEY_ENV] = "sk-from-env"
    toml = "".join([
        _remote("smol-remote", url=b + "/v1", remote_model="smollm2"),
        _remote("minilm-remote", url=b, remote_model="minilm"),  # a bare host:port means its /v1
        _remote("pair", urls=[b + "/v1", replica_c.url("slow")], remote_model="smollm2"),
        _remote("keyed", url=standin.url("ok") + "/", api_key="sk-entry", remote_model="upstream-id"),
        _remote("env-keyed", url=standin.url("ok"), api_key_env=KEY_ENV),
        _remote("unset-env", url=standin.url("ok"), api_key_env=UNSET_ENV),
        _remote("keyless", url=standin.url("ok")),
        _remote("broken", url=standin.url("broken")),
        _remote("hang", url=standin.url("hang"), timeout=1),
        _remote("refused", url=f"http://127.0.0.1:{_closed_port()}/v1"),
        _remote("cut", url=standin.url("cut")),
    ])
    srv = LiveServer(["--model", str(assets["tiny"]), "--streams", "2"], toml, tmp_path_factory.mktemp("front"))
    yield srv
    srv.stop()
    os.environ.pop(KEY_ENV, None)


def _on_loop(srv: LiveServer, fn):
    """fn() run on the server's loop (where the relay's counters change)."""
    async def call():
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), srv.loop).result(10)


def _cards(srv: LiveServer) -> dict[str, dict]:
    return {c["id"]: c for c in _on_loop(srv, lambda: remote.model_cards(srv.server.runner.app))}


def _stats(srv: LiveServer) -> dict[str, dict]:
    return {s["id"]: s for s in _on_loop(srv, lambda: remote.remote_stats(srv.server.runner.app))}


def _requests_on(server: LiveServer, model: str) -> int:
    return next(m for m in server.get("/v1/stats")["models"] if m["id"] == model)["requests"]


# ---- relaying to another llamadesk ---------------------------------------------------------------------


def test_chat_through_a_remote_entry_equals_the_upstreams_own_answer(front, smol_server):
    direct = smol_server.client().chat.completions.create(model="smollm2", messages=HI, **GREEDY)
    via = front.client().chat.completions.create(model="smol-remote", messages=HI, **GREEDY)
    assert direct.choices[0].message.content
    assert via.choices[0].message.content == direct.choices[0].message.content
    assert via.usage.prompt_tokens == direct.usage.prompt_tokens
    assert via.usage.completion_tokens == direct.usage.completion_tokens

    chunks = list(front.client().chat.completions.create(model="smol-remote", messages=HI, stream=True,
                                                         stream_options={"include_usage": True}, **GREEDY))
    assert len(chunks) > 3  # relayed event by event, not one blob
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        direct.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens


def test_completions_through_a_remote_entry_equal_the_upstreams_own(front, smol_server):
    prompt = "The three primary colors are"
    direct = smol_server.client().completions.create(model="smollm2", prompt=prompt, **GREEDY)
    via = front.client().completions.create(model="smol-remote", prompt=prompt, **GREEDY)
    assert direct.choices[0].text and via.choices[0].text == direct.choices[0].text
    streamed = front.client().completions.create(model="smol-remote", prompt=prompt, stream=True, **GREEDY)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == direct.choices[0].text


def test_embeddings_pass_through(front, smol_server):
    texts = ["hello world", "remote backends in the roster"]
    direct = smol_server.client().embeddings.create(model="minilm", input=texts)
    via = front.client().embeddings.create(model="minilm-remote", input=texts)  # its url is B's bare host:port
    assert [d.embedding for d in via.data] == [d.embedding for d in direct.data]
    assert len(via.data[0].embedding) == 384 and via.usage.prompt_tokens == direct.usage.prompt_tokens


def test_upstream_4xx_passes_through_as_it_is(front, smol_server):
    bad = {"messages": HI, "max_tokens": -5}
    direct = request(smol_server.url + "/v1/chat/completions", "POST", {**bad, "model": "smollm2"})
    via = request(front.url + "/v1/chat/completions", "POST", {**bad, "model": "smol-remote"})
    assert direct[0] == 400 and direct[1]["error"]["param"] == "max_tokens"
    assert via == direct


def test_a_client_that_leaves_frees_the_upstream_stream_within_a_tick(front, smol_server):
    long = {"model": "smol-remote", "messages": [{"role": "user", "content": "go"}], "max_tokens": 1500,
            "ignore_eos": True, "temperature": 0, "stream": True}

    async def main():
        async with aiohttp.ClientSession() as session:
            resp = await session.post(front.url + "/v1/chat/completions", json=long)
            assert resp.status == 200, await resp.text()
            chunks = 0
            while chunks < 5:  # B is really generating it
                line = await resp.content.readline()
                if line.startswith(b"data: {"):
                    chunks += 1
            stream_id = json.loads(line[6:])["id"].removeprefix("chatcmpl-")
            live = (await asyncio.to_thread(smol_server.get, "/v1/streams"))["streams"]
            assert next(s for s in live if s["id"] == stream_id)["state"] == "decode"
            resp.close()  # the client goes away from A
            mine = await stream_done(smol_server, stream_id)
            assert mine["finish_reason"] == "cancelled"
            assert mine["evict_ticks"] <= 1
            assert mine["gen_tokens"] < 1500
    asyncio.run(main())
    wait_idle(front, "smol-remote")


async def stream_done(server: LiveServer, stream_id: str) -> dict:
    """The server's stream stream_id once it is done (within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        streams = (await asyncio.to_thread(server.get, "/v1/streams"))["streams"]
        stream = next(s for s in streams if s["id"] == stream_id)
        if stream["state"] == "done":
            return stream
        assert time.monotonic() < deadline, stream
        await asyncio.sleep(0.01)


def wait_idle(front: LiveServer, model: str) -> None:
    """Until no request for the remote model is outstanding (within 5 s)."""
    deadline = time.monotonic() + 5
    while _stats(front)[model]["outstanding"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


# ---- what goes upstream ----------------------------------------------------------------------------------


def test_the_upstream_gets_the_entrys_key_and_model_id_never_the_clients(front, standin):
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="client-secret", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "say hi"}]
    cases = [("keyed", "Bearer sk-entry", "upstream-id"), ("env-keyed", "Bearer sk-from-env", "env-keyed"),
             ("unset-env", None, "unset-env"), ("keyless", None, "keyless")]
    with client:
        for model, auth, upstream_model in cases:
            r = client.chat.completions.create(model=model, messages=messages, temperature=0.5, max_tokens=7,
                                               extra_body={"top_k": 3})
            assert r.choices[0].message.content == STANDIN_TEXT
            seen = standin.seen[-1]
            assert (seen["route"], seen["auth"], seen["body"]["model"]) == ("chat/completions", auth, upstream_model)
            assert seen["hops"] == "1"
            # every other field goes as the client sent it
            assert {k: v for k, v in seen["body"].items() if k != "model"} == \
                {"messages": messages, "temperature": 0.5, "max_tokens": 7, "top_k": 3}
    assert _cards(front)["unset-env"]["error"] == f"api_key_env: ${UNSET_ENV} is not set; requests go without a key"
    assert "error" not in _cards(front)["env-keyed"]


def test_config_shows_a_remote_models_key_as_stars(front, standin):
    raw = urllib.request.urlopen(front.url + "/config", timeout=30).read().decode()
    assert "sk-entry" not in raw
    models = {m["name"]: m for m in json.loads(raw)["models"]}
    assert (models["keyed"]["api_key"], models["keyed"]["url"]) == ("***", standin.url("ok") + "/")
    assert (models["env-keyed"]["api_key"], models["env-keyed"]["api_key_env"]) == (None, KEY_ENV)


# ---- upstream failures ------------------------------------------------------------------------------------


def test_upstream_500_timeout_and_refusal_are_502_504_502_and_local_models_keep_serving(front, standin, assets):
    client = front.client()
    cases = [("broken", 502, "upstream_error", standin.url("broken"), "the stand-in broke"),
             ("hang", 504, "upstream_timeout", standin.url("hang"), "sent nothing for 1 s"),
             ("refused", 502, "upstream_error", _cards(front)["refused"]["replicas"][0]["url"], "could not be reached")]
    for model, status, code, upstream, said in cases:
        for stream in (False, True):
            t0 = time.monotonic()
            with pytest.raises(openai.APIStatusError) as e:
                client.chat.completions.create(model=model, messages=HI, max_tokens=4, stream=stream)
            assert time.monotonic() - t0 < 15
            assert e.value.status_code == status, e.value.body
            err = e.value.body
            assert (err["type"], err["code"]) == ("server_error", code)
            assert f"remote model '{model}'" in err["message"] and upstream in err["message"]
            assert said in err["message"], err["message"]
    assert standin.count("broken") == 2 and standin.count("hang") == 2  # one attempt each: no replica is left
    local = client.chat.completions.create(model=Path(assets["tiny"]).stem, messages=HI, max_tokens=4)
    assert local.choices[0].finish_reason in ("stop", "length")
    assert client.chat.completions.create(model="smol-remote", messages=HI, max_tokens=4).choices[0].message.content
    stats = _stats(front)
    assert (stats["broken"]["errors"], stats["hang"]["errors"]) == (2, 2)
    # a timeout takes the replica out (its /models answers, so the health check soon puts it back); a 500 is an
    # answer: the replica stays in
    assert "sent nothing for 1 s" in _cards(front)["hang"]["replicas"][0]["last_error"]
    assert _cards(front)["broken"]["replicas"][0] == {"url": standin.url("broken"), "healthy": True, "last_error": None}


def test_a_stream_broken_after_its_first_event_ends_with_an_error_event(front, standin):
    got = []
    with pytest.raises(openai.APIError) as e:
        for chunk in front.client().chat.completions.create(model="cut", messages=HI, stream=True):
            got.append(chunk.choices[0].delta.content)
    assert got == [WORDS[0]]
    assert "remote model 'cut'" in e.value.message and standin.url("cut") in e.value.message
    assert "mid-stream" in e.value.message


def test_bad_bodies_on_relayed_routes_are_400s_and_other_models_reach_their_handlers(front, assets):
    status, body = request(front.url + "/v1/chat/completions", "POST", "not an object")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = request(front.url + "/v1/chat/completions", "POST", {"model": 5, "messages": HI})
    assert status == 400 and body["error"]["param"] == "model"
    # a relay loop (a remote entry pointing back at a relaying server) ends
    req = urllib.request.Request(front.url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": "keyless", "messages": HI}).encode(),
                                 headers={"Content-Type": "application/json", remote.HOPS_HEADER: "8"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 502 and "relayed 8 times already" in json.loads(e.value.read())["error"]["message"]
    # the body the relay read is read again by the handler of a local model
    r = front.client().completions.create(model=Path(assets["tiny"]).stem, prompt="hi", max_tokens=3)
    assert r.usage.completion_tokens >= 1 and r.model == Path(assets["tiny"]).stem


def test_remote_entries_are_not_loaded_here_nor_routed_to_the_local_engine(front, smol_server, assets):
    listed = {m["id"]: m for m in front.get("/v1/models")["data"]}
    assert all(listed[n].get("owned_by") == "remote" for n in _cards(front) if n in listed)
    status, body = request(front.url + "/v1/messages/count_tokens", "POST",  # a route the relay does not cover
                           {"model": "smol-remote", "messages": HI})
    assert status == 404 and "remote backend" in body["error"]["message"]
    status, body = request(front.url + "/v1/models/load", "POST", {"path": str(assets["tiny"]), "name": "pair"})
    assert status == 409 and "remote model" in body["error"]["message"]
    card = _cards(front)["smol-remote"]
    assert {k: card[k] for k in ("object", "owned_by", "backend", "remote_model", "healthy")} == \
        {"object": "model", "owned_by": "remote", "backend": "remote", "remote_model": "smollm2", "healthy": True}
    assert card["replicas"] == [{"url": smol_server.url + "/v1", "healthy": True, "last_error": None}]
    assert _cards(front)["minilm-remote"]["replicas"][0]["url"] == smol_server.url + "/v1"
    refused = _cards(front)["refused"]  # checked from the start: nobody listens there
    assert refused["healthy"] is False and "could not be reached" in refused["replicas"][0]["last_error"]


# ---- replicas ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    chunks: int = 0
    text: str = ""
    error: Exception | None = None


async def _stream_pair(client: openai.AsyncOpenAI) -> Outcome:
    out = Outcome()
    try:
        stream = await client.chat.completions.create(model="pair", messages=HI, stream=True, **GREEDY)
        async for chunk in stream:
            out.chunks += 1
            if chunk.choices:
                out.text += chunk.choices[0].delta.content or ""
    except openai.APIError as e:
        out.error = e
    return out


def _by_b(outcomes: list[Outcome]) -> int:
    """How many were answered whole by B (C's answer is the stand-in's text)."""
    return sum(1 for o in outcomes if o.error is None and o.text and o.text != STANDIN_TEXT)


def test_replicas_share_the_load_lose_no_unstarted_request_and_come_back(front, smol_server, replica_c):
    c = replica_c

    async def burst(n: int, during=None) -> list[Outcome]:
        async with front.async_client(timeout=120) as client:
            tasks = [asyncio.ensure_future(_stream_pair(client)) for _ in range(n)]
            if during is not None:
                await during()
            return await asyncio.gather(*tasks)

    # both replicas take a share, each answering with its own text
    b0, c0 = _requests_on(smol_server, "smollm2"), c.count("slow")
    outcomes = asyncio.run(burst(8))
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    on_b, on_c = _requests_on(smol_server, "smollm2") - b0, c.count("slow") - c0
    assert on_b >= 2 and on_c >= 2 and on_b + on_c == 8, (on_b, on_c)
    assert (_by_b(outcomes), sum(o.text == STANDIN_TEXT for o in outcomes)) == (on_b, on_c)

    # C goes away while requests wait for its first byte: B answers them
    caught = []

    async def kill_c_when_it_holds_requests() -> None:
        deadline = time.monotonic() + 10
        while c.waiting < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the whole burst has arrived
        caught.append(c.waiting)
        await asyncio.to_thread(c.go_away)

    outcomes = asyncio.run(burst(8, kill_c_when_it_holds_requests))
    assert caught[0] >= 1
    assert all(o.error is None or o.chunks > 0 for o in outcomes), [o.error for o in outcomes if o.error]
    assert _by_b(outcomes) >= caught[0] + 1  # the ones caught at C, and B's own share
    stats = _stats(front)["pair"]["replicas"]
    assert stats[1]["errors"] >= caught[0] and stats[1]["healthy"] is False
    outcomes = asyncio.run(burst(4))  # while it is away every request goes to B
    assert _by_b(outcomes) == 4

    # C comes back: the health check puts it back in service, and it takes requests again
    c.come_back()
    deadline = time.monotonic() + 40
    while not _cards(front)["pair"]["replicas"][1]["healthy"]:
        assert time.monotonic() < deadline, _cards(front)["pair"]
        time.sleep(0.1)
    c0 = c.count("slow")
    outcomes = asyncio.run(burst(6))
    assert all(o.error is None for o in outcomes)
    assert c.count("slow") - c0 >= 2
    final = _stats(front)["pair"]
    assert final["outstanding"] == 0
    assert all(r["latency_ms"]["p50"] > 0 for r in final["replicas"])


# ---- a roster served only elsewhere -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def remote_only(smol_server, standin, tmp_path_factory):
    """A front server with no model of its own: a stand-in first, and B's SmolLM2 marked default."""
    toml = _remote("keyless", url=standin.url("ok")) + \
        _remote("smol-remote", url=smol_server.url + "/v1", remote_model="smollm2", default=True)
    srv = LiveServer([], toml, tmp_path_factory.mktemp("remote-only"))
    yield srv
    srv.stop()


def test_a_roster_of_remote_models_only_is_serving_and_routes_no_model_to_its_default(remote_only, smol_server):
    assert remote_only.get("/health")["status"] == "ok"
    assert remote_only.get("/v1/stats")["setup"] is False
    direct = smol_server.client().chat.completions.create(model="smollm2", messages=HI, **GREEDY)
    via = remote_only.client().chat.completions.create(model="", messages=HI, **GREEDY)
    assert direct.choices[0].message.content and via.choices[0].message.content == direct.choices[0].message.content
    status, body = request(remote_only.url + "/v1/chat/completions", "POST", {"messages": HI, **GREEDY})
    assert status == 200 and body["choices"][0]["message"]["content"] == direct.choices[0].message.content
    via_responses = remote_only.client().responses.create(model="", input=HI[0]["content"], max_output_tokens=12,
                                                          temperature=0)
    assert via_responses.output_text == direct.choices[0].message.content
    assert via_responses.model == "smol-remote"


@pytest.mark.parametrize("roster, default", [
    ([("far", False), ("farther", False)], "far"),  # no local model, none marked: the first remote entry
    ([("far", False), ("farther", True)], "farther"),
    ([("far", False), ("near", False), ("farther", False)], "near"),  # a local model comes before any remote
    ([("far", True), ("near", False)], "far"),
])
def test_the_default_model_is_the_marked_one_else_the_first_local_else_the_first_remote(tmp_path, roster, default):
    from engine.models.manager import ModelManager
    toml = "".join(f'[[models]]\nname = "near"\npath = "/m.gguf"\npreload = false\ndefault = {str(d).lower()}\n'
                   if name == "near" else _remote(name, url="http://gpu-box/v1", default=d) for name, d in roster)
    manager = ModelManager(_load(tmp_path, toml), run=None, refuse_while_benching=None)
    manager.load_all()
    assert manager.default_id == default and not manager.loaded


# ---- configuration ----------------------------------------------------------------------------------------


def _load(tmp_path: Path, toml: str):
    p = tmp_path / "llamadesk.toml"
    p.write_text(toml)
    return load(["--config", str(p)])


@pytest.mark.parametrize("keys, says", [
    ({"url": "ftp://gpu-box/v1"}, "an upstream is an http:// or https:// URL"),
    ({"url": "gpu-box:8000/v1"}, "an upstream is an http:// or https:// URL"),
    ({"url": "http:///v1"}, "with a host"),
    ({"url": "http://gpu-box:99999/v1"}, "invalid URL 'http://gpu-box:99999/v1'"),
    ({"url": "http://me:pw@gpu-box/v1"}, "no user, query or fragment"),
    ({"url": "http://gpu-box/v1?x=1"}, "no user, query or fragment"),
    ({"url": ""}, "invalid value for 'url'"),
    ({"url": 8000}, "invalid value for 'url'"),
    ({}, "needs a 'url'"),
    ({"urls": []}, "needs a 'url'"),
    ({"urls": "http://gpu-box/v1"}, "invalid value for 'urls'"),
    ({"urls": ["http://gpu-box/v1", 5]}, "5 is not a string"),
    ({"url": "http://gpu-box/v1", "urls": ["file:///etc/passwd"]}, "an upstream is an http:// or https:// URL"),
    ({"url": "http://gpu-box/v1", "path": "/m.gguf"}, "'path' does not apply to a remote model"),
    ({"url": "http://gpu-box/v1", "ctx": 4096}, "'ctx' does not apply to a remote model"),
    ({"url": "http://gpu-box/v1", "default": 1}, "invalid value for 'default'"),
    ({"url": "http://gpu-box/v1", "default": "yes"}, "invalid value for 'default'"),
    ({"url": "http://gpu-box/v1", "api_key": "k", "api_key_env": "K"}, "both 'api_key' and 'api_key_env'"),
    ({"url": "http://gpu-box/v1", "api_key_env": ""}, "invalid value for 'api_key_env'"),
    ({"url": "http://gpu-box/v1", "remote_model": 3}, "invalid value for 'remote_model'"),
    ({"url": "http://gpu-box/v1", "timeout": 0}, "invalid value for 'timeout'"),
    ({"url": "http://gpu-box/v1", "timeout": True}, "invalid value for 'timeout'"),
    ({"url": "http://gpu-box/v1", "backend": "vllm"}, "allowed: local, remote"),
])
def test_a_bad_remote_entry_is_a_config_error_naming_the_key(tmp_path, keys, says):
    entry = {"name": "far", "backend": "remote", **keys}
    toml = '[[models]]\nname = "near"\npath = "/m.gguf"\n\n[[models]]\n' + \
        "\n".join(f"{k} = {json.dumps(v)}" for k, v in entry.items()) + "\n"
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, toml)
    assert says in str(e.value) and "entry 2" in str(e.value), str(e.value)


def test_remote_keys_on_a_local_entry_a_nameless_remote_and_a_shared_name_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="'url' in \\[\\[models\\]\\] entry 1 is for a remote model"):
        _load(tmp_path, '[[models]]\npath = "/m.gguf"\nurl = "http://gpu-box/v1"\n')
    with pytest.raises(ConfigError, match="needs a 'name'"):
        _load(tmp_path, '[[models]]\nbackend = "remote"\nurl = "http://gpu-box/v1"\n')
    with pytest.raises(ConfigError, match="named 'm'; a remote model's name must be its own"):
        _load(tmp_path, '[[models]]\npath = "/m.gguf"\n\n' + _remote("m", url="http://gpu-box/v1"))


def test_remote_entries_survive_a_roster_save(tmp_path):
    cfg = _load(tmp_path, '[[models]]\nname = "near"\npath = "/m.gguf"\ndefault = true\n\n' +
                _remote("far", url="http://gpu-box:8000/v1", urls=["https://other:8443/v1"], api_key_env="FAR_KEY",
                        remote_model="meta/llama", timeout=30) +
                _remote("other", url="http://ollama-box:11434", api_key="sk-x") +
                '[[models]]\nname = "explicit"\nbackend = "local"\npath = "/e.gguf"\n')
    before = list(cfg.models)
    assert [m.remote for m in before] == [False, True, True, False]
    cfg.save()
    saved = (tmp_path / "llamadesk.toml").read_text()
    assert 'path = ""' not in saved and 'backend = "local"' not in saved
    assert _load(tmp_path, saved).models == before
