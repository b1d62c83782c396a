"""llama.cpp RPC: SmolLM2 served with its layers on an rpc-server (llama.cpp's own, started with `llamadesk
rpc-server`) on 127.0.0.1, against the same model served here; the rpc-server killed mid-stream."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.conftest import LiveServer
from tests.http import call

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("LLAMADESK_CACHE", Path.home() / ".cache" / "llamadesk"))
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def rpc_binary() -> Path:
    """llama.cpp's rpc-server, built once from the vendored source into the cache (`make rpc-server`)."""
    out = subprocess.run(["bash", str(ROOT / "tests/bench/build_llama_server.sh"), str(CACHE), "ggml-rpc-server"],
                         check=True, capture_output=True, text=True, timeout=3600)
    return Path(out.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rpc_server(binary: Path, port: int) -> subprocess.Popen:
    """`python -m app rpc-server` on 127.0.0.1:port (the process becomes the rpc-server), once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "app", "rpc-server", "--host", "127.0.0.1", "--port", str(port),
                             "--threads", "1"], cwd=ROOT, env={**os.environ, "LLAMADESK_RPC_SERVER": str(binary)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()  # it takes the next client after this one
            return proc
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "rpc-server did not listen"
            time.sleep(0.1)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def rpc(rpc_binary, assets, tmp_path_factory):
    """An rpc-server, and a server with SmolLM2 on it twice (smollm2-rpc, smollm2-rpc-b: one rpc-server serves
    one client, so they share the connection) and here (smollm2-local); smollm2-nowhere names an rpc-server
    that is not there (loaded on demand)."""
    port = _free_port()
    proc = start_rpc_server(rpc_binary, port)
    base = proc.pid, rss_mib(proc.pid)
    toml = f"""
[[models]]
name = "smollm2-local"
path = "{assets['smollm2']}"
default = true
ctx = 1024
streams = 2

[[models]]
name = "smollm2-rpc"
path = "{assets['smollm2']}"
ctx = 1024
streams = 2
rpc = ["127.0.0.1:{port}"]

[[models]]
name = "smollm2-rpc-b"
path = "{assets['smollm2']}"
ctx = 512
streams = 1
rpc = "127.0.0.1:{port}"

[[models]]
name = "smollm2-nowhere"
path = "{assets['smollm2']}"
ctx = 1024
streams = 1
preload = false
rpc = "127.0.0.1:{_free_port()}"
"""
    srv = LiveServer(["--threads", "1"], toml, tmp_path_factory.mktemp("rpc"))
    yield srv, proc, port, base
    srv.stop()
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    proc.stderr.close()


def _greedy(srv, model: str) -> str:
    r = srv.client().chat.completions.create(model=model, messages=MESSAGES, temperature=0, max_tokens=40)
    return r.choices[0].message.content


def _model(srv, name: str) -> dict:
    return next(m for m in srv.get("/v1/models")["data"] if m["id"] == name)


def test_greedy_text_through_the_rpc_server_equals_the_local_run(rpc):
    srv, proc, port, (pid, rss_before) = rpc
    local = _greedy(srv, "smollm2-local")
    assert len(local) > 10
    assert _greedy(srv, "smollm2-rpc") == local
    assert _greedy(srv, "smollm2-rpc-b") == local
    assert _model(srv, "smollm2-rpc")["devices"] == [f"RPC 127.0.0.1:{port}", "CPU"]
    assert _model(srv, "smollm2-local")["devices"] == ["local"]
    # what it takes here, against --max-memory: no weights nor KV cache (they are on the rpc-server)
    assert _model(srv, "smollm2-rpc")["memory_bytes"] < _model(srv, "smollm2-local")["memory_bytes"] - 80 * 2**20
    assert rss_mib(pid) - rss_before > 2 * 80  # the weights (92 MiB of Q4_1, twice) went to the rpc-server


def test_an_rpc_server_that_is_not_there_fails_the_load_and_the_server_keeps_serving(rpc):
    srv = rpc[0]
    with pytest.raises(openai.BadRequestError) as e:
        _greedy(srv, "smollm2-nowhere")
    assert "cannot connect to rpc-server 127.0.0.1:" in e.value.message
    assert _greedy(srv, "smollm2-local")


def test_the_rpc_server_killed_mid_stream_ends_the_stream_with_an_error_and_a_local_reload_answers(rpc, assets,
                                                                                                 rpc_binary):
    srv, proc, port, _ = rpc
    local = _greedy(srv, "smollm2-local")
    stream = srv.client().chat.completions.create(model="smollm2-rpc", messages=MESSAGES, temperature=0,
                                                  max_tokens=900, stream=True, extra_body={"ignore_eos": True})
    chunks = 0
    t0 = time.monotonic()
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            chunks += 1
            if chunks == 5:
                os.kill(proc.pid, signal.SIGKILL)
    assert 5 <= chunks < 900 and time.monotonic() - t0 < 60
    assert f"rpc-server at 127.0.0.1:{port} went away" in str(e.value)
    proc.wait(10)
    assert _greedy(srv, "smollm2-local") == local  # the process and its other models live on
    with pytest.raises(openai.APIError) as again:  # the broken model says so at once, not a hang
        _greedy(srv, "smollm2-rpc")
    assert "went away" in str(again.value) and "reload" in str(again.value)
    with pytest.raises(openai.APIError) as other:  # the other model on that rpc-server too
        _greedy(srv, "smollm2-rpc-b")
    assert f"rpc-server at 127.0.0.1:{port} went away" in str(other.value)

    assert call(srv, "POST", "/v1/models/unload", {"model": "smollm2-rpc"})[0] == 200
    status, body = call(srv, "POST", "/v1/models/load", {"name": "smollm2-rpc", "path": str(assets["smollm2"]),
                                                        "ctx": 1024, "streams": 2})
    assert status == 200, body
    assert body["devices"] == ["local"]
    assert _greedy(srv, "smollm2-rpc") == local

    back = start_rpc_server(rpc_binary, port)  # the rpc-server is back: a reload uses it again
    try:
        status, body = call(srv, "POST", "/v1/models/reload", {"model": "smollm2-rpc-b"})
        assert status == 200, body
        assert body["devices"] == [f"RPC 127.0.0.1:{port}", "CPU"]
        assert _greedy(srv, "smollm2-rpc-b") == local
    finally:
        back.kill()
        back.wait(10)
        back.stderr.close()


def test_rpc_addresses_are_not_changed_over_http_without_an_api_key(rpc):
    for key, value in (("rpc", "10.0.0.9:50052"), ("rpc_allow_lan", True)):
        status, body = call(rpc[0], "POST", "/config", {"values": {key: value}})
        assert status == 403 and body["error"]["param"] == key


def test_rpc_server_command_without_a_build_says_how_to_get_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LLAMADESK_RPC_SERVER"}
    env["XDG_CACHE_HOME"] = str(tmp_path)  # no cached build there
    r = subprocess.run([sys.executable, "-m", "app", "rpc-server", "--port", "50052"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "make rpc-server" in r.stderr and "LLAMADESK_RPC_SERVER" in r.stderr
    bad = subprocess.run([sys.executable, "-m", "app", "rpc-server", "--port", "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--port" in bad.stderr
