"""Models come and go on demand: loaded by the first request naming them (one load for many waiters, the other
models serving meanwhile), unloaded when idle past their ttl or keep_alive, evicted LRU to fit a memory budget,
and what a user set up (a model opened, its ctx) kept in the roster across a restart."""
from __future__ import annotations

import asyncio
import time

import ollama
import pytest

from engine.models.gguf import footprint
from tests.conftest import LiveServer
from tests.http import call


def _states(srv) -> dict[str, str]:
    return {m["id"]: m["state"] for m in srv.get("/v1/models")["data"] if m.get("kind") != "asr"}


def _lifecycle(srv) -> dict:
    return srv.get("/v1/stats")["lifecycle"]


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _chat(srv, model: str, **extra) -> dict:
    status, out = call(srv, "POST", "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra})
    assert status == 200, out
    return out


def _roster(assets, *entries: str) -> str:
    return "\n".join(f'[[models]]\nname = "{name}"\npath = "{assets["tiny"]}"\n{extra}\n' for name, extra in
                     (e.split("|", 1) if "|" in e else (e, "") for e in entries))


@pytest.fixture()
def two_fit_one(assets, tmp_path):
    """Two models whose memory budget holds one of them; b is loaded by the first request naming it."""
    need = footprint(assets["tiny"], 512, 2, "f16", 512).total
    budget_mib = (need * 3 // 2) >> 20
    srv = LiveServer(["--streams", "2", "--ctx", "512", "--max-memory", str(budget_mib)],
                     _roster(assets, "a|default = true", "b|preload = false"), tmp_path)
    yield srv
    srv.stop()


def test_a_request_for_another_model_evicts_the_idle_one_to_fit_and_back(two_fit_one):
    srv = two_fit_one
    assert _states(srv) == {"a": "loaded", "b": "unloaded"}
    assert _chat(srv, "b")["model"] == "b"
    assert _states(srv) == {"a": "unloaded", "b": "loaded"}
    assert _chat(srv, "a")["model"] == "a"
    assert _states(srv) == {"a": "loaded", "b": "unloaded"}
    life = _lifecycle(srv)
    assert life["evictions"] == 2 and life["on_demand_loads"] == 2
    assert life["memory_used_bytes"] <= life["memory_budget_bytes"]


def test_concurrent_requests_for_an_unloaded_model_share_one_load(two_fit_one):
    srv = two_fit_one
    before = _lifecycle(srv)["on_demand_loads"]

    async def four():
        client = srv.async_client(timeout=60)
        outs = await asyncio.gather(*(client.chat.completions.create(
            model="b", messages=[{"role": "user", "content": f"hi {i}"}], max_tokens=3,
            extra_body={"ignore_eos": True}) for i in range(4)))
        await client.close()
        return outs
    outs = asyncio.run(four())
    assert [o.model for o in outs] == ["b"] * 4 and all(o.usage.completion_tokens == 3 for o in outs)
    assert _lifecycle(srv)["on_demand_loads"] == before + 1


def test_a_model_streams_on_while_another_loads(assets, tmp_path):
    toml = _roster(assets, "c|default = true\nctx = 8192") + \
        f'[[models]]\nname = "big"\npath = "{assets["smollm2"]}"\n' \
        'preload = false\nctx = 8192\nstreams = 8\n'  # a 1.5 GB KV cache to allocate: a load long enough to watch
    srv = LiveServer(["--streams", "2", "--ctx", "512"], toml, tmp_path)
    try:
        async def scenario():
            client = srv.async_client(timeout=120)
            arrivals: list[float] = []

            async def stream_c():
                s = await client.chat.completions.create(
                    model="c", messages=[{"role": "user", "content": "go"}], max_tokens=8000, stream=True,
                    extra_body={"ignore_eos": True})
                async for _ in s:
                    arrivals.append(time.monotonic())

            task = asyncio.create_task(stream_c())
            while len(arrivals) < 5:
                await asyncio.sleep(0.01)
            t0 = time.monotonic()
            out = await client.chat.completions.create(model="big", messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=1)
            t1 = time.monotonic()
            still_streaming = not task.done()
            task.cancel()  # c's long reply is not needed past the load
            await asyncio.gather(task, return_exceptions=True)
            await client.close()
            assert still_streaming, "c finished before big loaded: the test saw nothing"
            return arrivals, t0, t1, out
        arrivals, t0, t1, out = asyncio.run(scenario())
        assert out.model == "big"
        load = next(r for r in srv.service.roster.recent_loads if r.model == "big")  # the same monotonic clock
        assert load.on_demand and t0 <= load.started < load.ended <= t1
        during = [t for t in arrivals if load.started < t < load.ended]
        assert during, (load.ended - load.started, len(arrivals))  # c kept streaming while big's weights loaded
        assert srv.get("/v1/stats")["lifecycle"]["recent_loads"][-1]["model"] == "big"
    finally:
        srv.stop()


def test_keep_alive_zero_unloads_after_the_reply_and_a_ttl_unloads_an_idle_model(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512"],
                     _roster(assets, "main|default = true", "short|ttl = 2", "busy|ttl = 1\nctx = 4096"), tmp_path)
    try:
        assert _chat(srv, "main", keep_alive=0)["model"] == "main"
        assert _wait_for(lambda: _states(srv)["main"] == "unloaded", 5)
        assert _chat(srv, "main")["model"] == "main"  # the default comes back on demand
        assert _states(srv)["main"] == "loaded"

        _chat(srv, "short")
        time.sleep(0.8)
        assert _states(srv)["short"] == "loaded"  # not before its ttl
        assert _wait_for(lambda: _states(srv)["short"] == "unloaded", 6)

        # a busy model outlives its ttl: a 3 s stream on a model with ttl 1
        out = asyncio.run(_long_stream(srv, "busy", seconds=3.0))
        assert out > 0 and _states(srv)["busy"] == "loaded"
        assert _wait_for(lambda: _states(srv)["busy"] == "unloaded", 6)
        assert _lifecycle(srv)["idle_unloads"] >= 3
    finally:
        srv.stop()


async def _long_stream(srv, model: str, seconds: float) -> int:
    """Stream from model for `seconds`; the number of chunks received."""
    client = srv.async_client(timeout=60)
    try:
        s = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "go"}],
                                                 max_tokens=4000, stream=True, extra_body={"ignore_eos": True})
        n, start = 0, time.monotonic()
        async for _ in s:
            n += 1
            if time.monotonic() - start > seconds:
                break
        await s.close()
        return n
    finally:
        await client.close()


def test_ollama_keep_alive_loads_and_unloads(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512"], _roster(assets, "m|default = true", "n|preload = false"),
                     tmp_path)
    client = ollama.Client(host=srv.url, timeout=60)
    try:
        assert client.generate(model="n", prompt="", keep_alive="10m").done_reason == "load"
        assert {m.model for m in client.ps().models} == {"m", "n"}
        assert client.chat(model="n", messages=[], keep_alive=0).done_reason == "unload"
        assert _wait_for(lambda: _states(srv)["n"] == "unloaded", 5)
        assert {m.model for m in client.ps().models} == {"m"}
        assert {m.model for m in client.list().models} >= {"m", "n"}  # installed: loaded or not
        with pytest.raises(ollama.ResponseError) as e:
            client.generate(model="n", prompt="hi", keep_alive="forever")
        assert e.value.status_code == 400 and "keep_alive" in str(e.value)
    finally:
        client.close()
        srv.stop()


def test_a_model_that_cannot_fit_alone_is_a_503_naming_the_sizes(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512", "--max-memory", "1"],
                     _roster(assets, "small|default = true\npreload = false"), tmp_path)
    try:
        status, out = call(srv, "POST", "/v1/chat/completions", {
            "model": "small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 503 and out["error"]["code"] == "insufficient_memory"
        assert "needs about" in out["error"]["message"] and "memory budget is 0.00 GiB" in out["error"]["message"]
        assert srv.get("/health")["status"] in ("ok", "setup")
        assert _lifecycle(srv)["refused_for_memory"] == 1
    finally:
        srv.stop()


def test_jit_off_names_the_unloaded_model_and_how_to_load_it(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512", "--jit", "off"],
                     _roster(assets, "on|default = true", "off|preload = false"), tmp_path)
    try:
        status, out = call(srv, "POST", "/v1/chat/completions", {
            "model": "off", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 404 and "--jit is off" in out["error"]["message"]
        status, out = call(srv, "POST", "/v1/chat/completions", {
            "model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert status == 404 and "available: off, on" in out["error"]["message"]
    finally:
        srv.stop()


def test_a_gguf_in_models_dir_is_served_by_its_name(assets, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    (models / "dropped-in.gguf").write_bytes(assets["tiny"].read_bytes())
    srv = LiveServer(["--streams", "2", "--ctx", "512", "--models-dir", str(models)],
                     _roster(assets, "main|default = true"), tmp_path)
    try:
        listed = {m["id"]: m for m in srv.get("/v1/models")["data"]}
        assert listed["dropped-in"]["state"] == "unloaded" and listed["dropped-in"]["kind"] == "llm"
        assert listed["dropped-in"]["memory_bytes"] > listed["dropped-in"]["size"]
        assert _chat(srv, "dropped-in")["model"] == "dropped-in"
        assert _states(srv)["dropped-in"] == "loaded"
    finally:
        srv.stop()


@pytest.mark.parametrize("value, message", [("soon", "not a duration"), ([1], "must be"), (True, "must be")])
def test_bad_keep_alive_is_a_400(two_fit_one, value, message):
    status, out = call(two_fit_one, "POST", "/v1/chat/completions", {
        "model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "keep_alive": value})
    assert status == 400 and out["error"]["param"] == "keep_alive" and message in out["error"]["message"]


def test_ttl_on_embeddings_and_completions(two_fit_one):
    srv = two_fit_one
    status, out = call(srv, "POST", "/v1/completions", {"model": "a", "prompt": "x", "max_tokens": 2, "ttl": 1})
    assert status == 200
    assert _wait_for(lambda: _states(srv)["a"] == "unloaded", 5)
    status, out = call(srv, "POST", "/v1/embeddings", {"model": "a", "input": "x", "ttl": -1, "keep_alive": 1})
    assert status == 400 and "not both" in out["error"]["message"]


def test_what_the_user_set_up_is_served_the_same_after_a_restart(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512"], _roster(assets, "base|default = true"), tmp_path)
    try:
        status, _ = call(srv, "POST", "/v1/models/load", {"path": str(assets["tiny"]), "name": "opened"})
        assert status == 200
        status, body = call(srv, "POST", "/v1/models/reload", {"model": "opened", "ctx": 256})
        assert status == 200 and body["ctx"] == 256
        assert call(srv, "POST", "/v1/models/activate", {"model": "opened"})[0] == 200
        assert call(srv, "POST", "/v1/models/unload", {"model": "base"})[0] == 200
    finally:
        srv.stop()
    saved = (tmp_path / "llamadesk.toml").read_text()
    again = LiveServer(["--streams", "2", "--ctx", "512"], saved, tmp_path)
    try:
        models = {m["id"]: m for m in again.get("/v1/models")["data"]}
        assert models["opened"]["state"] == "loaded" and models["opened"]["ctx"] == 256
        assert models["opened"]["default"] and models["base"]["state"] == "unloaded"
    finally:
        again.stop()


def test_max_loaded_and_idle_ttl_apply_to_models_loaded_on_demand(assets, tmp_path):
    srv = LiveServer(["--streams", "2", "--ctx", "512", "--max-loaded", "1", "--idle-ttl", "1"],
                     _roster(assets, "first|default = true", "second|preload = false"), tmp_path)
    try:
        time.sleep(1.5)
        assert _states(srv)["first"] == "loaded"  # loaded at start: --idle-ttl is for on-demand loads only
        assert _chat(srv, "second")["model"] == "second"
        assert _states(srv)["first"] == "unloaded"  # one model at a time
        assert _wait_for(lambda: _states(srv)["second"] == "unloaded", 6)  # idle past --idle-ttl
        life = _lifecycle(srv)
        assert life["evictions"] == 1 and life["idle_unloads"] == 1 and life["loaded"] == 0
    finally:
        srv.stop()
