"""`llamadesk --no-gui` as a user runs it: a real process, a real port, real models."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from tests.http import request


def launch(tmp_path, *args: str) -> subprocess.Popen:
    cfg = tmp_path / "empty.toml"
    cfg.write_text("")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.Popen([sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "--port", "0", *args],
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_for_url(proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    for line in proc.stderr:
        m = re.search(r"serving the OpenAI API on (http://\S+)/v1", line)
        if m:
            return m.group(1)
        assert time.monotonic() < deadline
    raise AssertionError(f"the server exited with {proc.wait()} before serving")


def test_no_gui_serves_a_model_and_stops_on_sigterm(tmp_path, assets):
    with launch(tmp_path, "--model", str(assets["tiny"])) as proc:
        try:
            url = wait_for_url(proc)
            assert request(url + "/health") == (200, {"status": "ok", "version": "0.1.0"})
            status, models = request(url + "/v1/models")
            assert models["data"][0]["id"] == "tiny-random-llama"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            proc.kill()


def test_a_sigterm_while_the_models_load_is_a_clean_stop(tmp_path, assets):
    """systemd stopping a slow start: the process exited -15 when the signal came before serving."""
    with launch(tmp_path, "--model", str(assets["smollm2"])) as proc:
        try:
            for line in proc.stderr:
                if "loading 1 model(s)" in line:
                    proc.send_signal(signal.SIGTERM)
                    break
            rest = proc.stderr.read()
            assert proc.wait(60) == 0, rest
            assert "asked to while the models loaded" in rest and "bye" in rest
        finally:
            proc.kill()


@pytest.mark.parametrize("make, words", [
    (lambda tmp, assets: tmp / "missing.gguf", ["not found", "missing.gguf"]),
    (lambda tmp, assets: (tmp / "text.gguf").write_text("hello") and tmp / "text.gguf", ["not a GGUF file"]),
    (lambda tmp, assets: (tmp / "cut.gguf").write_bytes(assets["tiny"].read_bytes()[:200_000]) and tmp / "cut.gguf",
     ["cannot load model", "cut.gguf"]),
])
def test_bad_model_path_exits_2_without_traceback(tmp_path, assets, make, words):
    path = make(tmp_path, assets)
    with launch(tmp_path, "--model", str(path)) as proc:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in err
    for w in words:
        assert w in err


def test_no_model_starts_in_setup_mode(tmp_path):
    with launch(tmp_path) as proc:
        url = wait_for_url(proc)
        assert request(url + "/health")[1]["status"] == "setup"
        req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                     data=json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        body = json.loads(e.value.read())
        e.value.close()
        assert e.value.code == 503 and "no model loaded" in body["error"]["message"]
        assert request(url + "/v1/stats")[1]["setup"] is True
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_desktop_app_serves_refuses_a_second_copy_and_quits_on_sigterm(tmp_path, assets):
    """No --no-gui: the window (offscreen here) and the server share one qasync loop."""
    cfg = tmp_path / "empty.toml"
    cfg.write_text("")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "TMPDIR": str(tmp_path),  # the instance socket lives there
           "XDG_STATE_HOME": str(tmp_path / "state")}
    cmd = [sys.executable, "-m", "app", "--config", str(cfg), "--port", "0", "--model", str(assets["tiny"])]
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            url = wait_for_url(proc)
            assert request(url + "/health")[1]["status"] == "ok"
            second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert second.returncode == 0 and "already running" in second.stderr
            assert request(url + "/health")[1]["status"] == "ok"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            assert "quitting" in proc.stderr.read()
        finally:
            proc.kill()


def test_restart_applies_the_saved_config_in_process_and_shutdown_exits(tmp_path, assets):
    with launch(tmp_path, "--model", str(assets["tiny"])) as proc:
        try:
            url = wait_for_url(proc)

            def post(path: str, body: dict | None = None) -> tuple[int, dict]:
                req = urllib.request.Request(url + path, method="POST", data=json.dumps(body or {}).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, json.loads(r.read())
            assert request(url + "/v1/models")[1]["data"][0]["streams"] == 4
            assert post("/config", {"values": {"streams": 2}, "save": True})[1]["saved"]
            assert post("/restart") == (202, {"restarting": True})
            deadline = time.monotonic() + 60
            while True:  # same port after the restart; the new roster serves 2 streams
                try:
                    if request(url + "/v1/models")[1]["data"][0]["streams"] == 2:
                        break
                except (urllib.error.URLError, ConnectionError):
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert post("/shutdown") == (202, {"shutting_down": True})
            assert proc.wait(30) == 0
        finally:
            proc.kill()


def test_serving_beyond_loopback_without_a_key_exits_2_before_loading(tmp_path, assets):
    with launch(tmp_path, "--model", str(assets["tiny"]), "--host", "0.0.0.0") as proc:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "without an API key" in err and "--insecure-no-key" in err and "--api-key" in err
    assert "Traceback" not in err and "loading" not in err


@pytest.mark.parametrize("flags", [["--insecure-no-key"], ["--api-key", "k"]])
def test_serving_beyond_loopback_with_a_key_or_the_opt_out(tmp_path, assets, flags):
    with launch(tmp_path, "--model", str(assets["tiny"]), "--host", "0.0.0.0", *flags) as proc:
        try:
            seen = []
            for line in proc.stderr:
                seen.append(line)
                if m := re.search(r"serving the OpenAI API on (http://\S+)/v1", line):
                    break
            url = m.group(1).replace("0.0.0.0", "127.0.0.1")
            assert request(url + "/health")[1]["status"] == "ok"  # open without the key
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            warned = [ln for ln in seen if "WITHOUT an API key" in ln]
            assert len(warned) == (flags == ["--insecure-no-key"]), seen
        finally:
            proc.kill()


def test_restart_then_shutdown_back_to_back_exits_cleanly(tmp_path, assets):
    with launch(tmp_path, "--model", str(assets["tiny"])) as proc:
        try:
            url = wait_for_url(proc)
            assert request(url + "/restart", "POST", {})[0] == 202
            assert request(url + "/shutdown", "POST", {})[0] == 202
            assert proc.wait(60) == 0
            assert "Traceback" not in proc.stderr.read()
        finally:
            proc.kill()
