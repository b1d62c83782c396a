"""Replicas that are real llamadesk processes: A (serving nothing itself) has one remote entry over B (the tiny
model, in process) and C (the tiny model in a `python -m app --no-gui` process of its own, so that it can be
killed with SIGKILL and started again on its port). What B and C count in their own /v1/stats is the reference
for where A sent each request."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.conftest import LiveServer
from tests.http import request
from tests.server.test_remote import Outcome, _closed_port, _remote, _stats

MODEL = "tiny-random-llama"  # the tiny model's id on B and C alike
# long enough that C is still streaming when it is killed (ignore_eos: llama-server's, llamadesk takes it too)
ASK = {"messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 64, "temperature": 0,
       "extra_body": {"ignore_eos": True}}


class Process:
    """C: llamadesk serving the tiny model on a fixed loopback port (so that it comes back where A looks for
    it). A llamadesk sends a stream's first event when it takes the request, so of the requests C holds when it
    dies most have begun; those that had not (still being sent) are retried, and the accounting below holds
    either way."""

    def __init__(self, tiny: Path, tmp: Path):
        self.port, self.tmp, self.tiny = _closed_port(), tmp, tiny
        (tmp / "empty.toml").write_text("")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "XDG_STATE_HOME": str(self.tmp / "state")}
        with open(self.tmp / "c.log", "a") as log:  # a file, not a pipe nobody drains
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app", "--no-gui", "--config", str(self.tmp / "empty.toml"), "--port",
                 str(self.port), "--model", str(self.tiny), "--streams", "1", "--cache-disk", "0"],
                stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, (self.tmp / "c.log").read_text()[-2000:]
            try:
                if request(self.url + "/health")[1].get("status") == "ok":
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, "C did not start serving"
            time.sleep(0.1)

    def requests(self) -> int:
        return next(m for m in request(self.url + "/v1/stats")[1]["models"] if m["id"] == MODEL)["requests"]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture(scope="module")
def c(assets, tmp_path_factory):
    p = Process(assets["tiny"], tmp_path_factory.mktemp("replica-c"))
    p.start()
    yield p
    p.kill()


@pytest.fixture(scope="module")
def a(tiny_server, c, tmp_path_factory):
    srv = LiveServer([], _remote("pair", urls=[tiny_server.url + "/v1", c.url + "/v1"], remote_model=MODEL),
                     tmp_path_factory.mktemp("front-replicas"))
    yield srv
    srv.stop()


def _on_b(b: LiveServer) -> int:
    return next(m for m in b.get("/v1/stats")["models"] if m["id"] == MODEL)["requests"]


async def _stream(client: openai.AsyncOpenAI) -> Outcome:
    out = Outcome()
    try:
        async for chunk in await client.chat.completions.create(model="pair", stream=True, **ASK):
            out.chunks += 1
    except openai.APIError as e:  # an error event after the stream began, or a failed request
        out.error = e
    return out


def _burst(a: LiveServer, n: int, meanwhile=None) -> list[Outcome]:
    async def run() -> list[Outcome]:
        async with a.async_client(timeout=120) as client:
            tasks = [asyncio.ensure_future(_stream(client)) for _ in range(n)]
            if meanwhile is not None:
                await meanwhile()
            return list(await asyncio.gather(*tasks))
    return asyncio.run(run())


def _replica_c(a: LiveServer) -> dict:
    return _stats(a)["pair"]["replicas"][1]


def test_real_replicas_share_the_load_survive_a_sigkill_and_take_the_replica_back(a, tiny_server, c):
    b0, c0 = _on_b(tiny_server), c.requests()
    outcomes = _burst(a, 8)
    assert all(o.error is None and o.chunks > 0 for o in outcomes), [o.error for o in outcomes]
    assert _on_b(tiny_server) - b0 > 0 and c.requests() - c0 > 0
    assert _on_b(tiny_server) - b0 + c.requests() - c0 == 8

    # SIGKILL C while it holds requests: those it had begun to stream end with an error event, every other one
    # is answered (those C held unstarted are retried on B)
    held = []

    async def kill_c_while_it_holds_requests() -> None:
        deadline = time.monotonic() + 20
        while (outstanding := (await asyncio.to_thread(_replica_c, a))["outstanding"]) < 2:
            assert time.monotonic() < deadline, "C never held two requests"
            await asyncio.sleep(0.01)
        held.append(outstanding)
        await asyncio.to_thread(c.kill)

    b0, before = _on_b(tiny_server), _replica_c(a)
    outcomes = _burst(a, 8, kill_c_while_it_holds_requests)
    failed = [o for o in outcomes if o.error]
    assert all(o.chunks > 0 for o in failed), [o.error for o in failed]  # only streams already begun fail
    assert all("mid-stream" in str(o.error) for o in failed)
    after = _replica_c(a)
    attempts, errors = after["requests"] - before["requests"], after["errors"] - before["errors"]
    assert held[0] >= 2 and errors >= 1 and after["healthy"] is False
    retried = errors - len(failed)  # attempts on C that failed before their first event
    assert _on_b(tiny_server) - b0 == 8 - attempts + retried  # every one of those reached B

    # C comes back on its port: A's health checks put it back in service, and requests reach it again
    c.start()
    deadline = time.monotonic() + 40
    while not _replica_c(a)["healthy"]:
        assert time.monotonic() < deadline, _replica_c(a)
        time.sleep(0.1)
    outcomes = _burst(a, 6)
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    assert c.requests() > 0  # a fresh process: every request it counts came after its return
