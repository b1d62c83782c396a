"""The benchmark route and CLI on the tiny model: llama-bench's rows, and the engine refusing other work."""
from __future__ import annotations

import subprocess
import sys
import time
from tests.http import call


def test_bench_rows_and_exclusive_engine(tiny_server):
    model = next(m for m in tiny_server.get("/v1/models")["data"] if m["default"])
    status, body = call(tiny_server, "POST", "/bench", {})
    assert status == 202 and body["state"] == "running"
    assert body["devices"] == model["devices"] and body["gpu_layers"] == model["gpu_layers"]
    status, busy = call(tiny_server, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 503 and busy["error"]["code"] == "benchmark_running"
    assert call(tiny_server, "POST", "/bench", {})[0] == 409
    deadline = time.monotonic() + 120
    while (state := tiny_server.get("/bench"))["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert state["state"] == "done", state
    tests = [r["test"] for r in state["rows"]]
    assert tests == ["pp512", "tg128", "tg128@2", "tg128@3", "tg128@4"]
    assert all(r["t_s"] > 0 and r["t_s_std"] >= 0 for r in state["rows"])
    assert state["quant"] == "F32" and state["threads"] >= 1 and state["hardware"]
    assert state["history"][-1]["rows"] == state["rows"]
    # what it ran on: the model's devices and layers as /v1/models says, and the CPU variant the hardware line names
    assert state["devices"] == model["devices"] and state["gpu_layers"] == model["gpu_layers"]
    assert state["history"][-1]["devices"] == model["devices"]
    variant = state["cpu_variant"]
    assert f"; CPU variant {variant}" in state["hardware"] if variant else "CPU variant" not in state["hardware"]
    r = tiny_server.client().chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2)
    assert r.choices  # serving again


def test_bench_cli(assets, tmp_path):
    out = subprocess.run([sys.executable, "-m", "app", "bench", "-m", str(assets["tiny"]), "--streams", "2"],
                         capture_output=True, text=True, timeout=300, env={"XDG_CONFIG_HOME": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "pp512" in out.stdout and "tg128@2" in out.stdout and "t/s" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "app", "bench", "-m", str(assets["tiny"]), "--ref", "/nonexistent"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "llama-bench" in bad.stderr and "Traceback" not in bad.stderr
