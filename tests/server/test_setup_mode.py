"""From nothing to a served model without a restart: setup mode, catalog download, serve."""
from __future__ import annotations

import hashlib
import shutil
import time

import openai
import pytest

from engine.config import load
from tests.conftest import LiveServer
from tests.fileserver import FileServer, Faults
from tests.http import call


@pytest.fixture()
def setup_server(assets, tmp_path):
    data = assets["tiny"].read_bytes()
    files = FileServer(files={"tiny.gguf": data})
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f'''
[[model]]
name = "tiny"
kind = "llm"
family = "test"
file = "tiny.gguf"
url = "https://example.invalid/tiny.gguf"
sha256 = "{hashlib.sha256(data).hexdigest()}"
size = {len(data)}
ctx = 8192
tool_format = "generic"
kv_bytes_per_token = 1024
towers = ["voice"]

[[model]]
name = "voice"
kind = "tts"
family = "piper"
file = "voice.tar.bz2"
archive = "tar.bz2"
url = "https://example.invalid/voice.tar.bz2"
sha256 = "{"0" * 64}"
size = 1000
''')
    srv = LiveServer(["--catalog-path", str(catalog), "--catalog-mirror", files.url,
                      "--models-dir", str(tmp_path / "models")], "# my settings\nport = 9\n", tmp_path)
    srv.files = files
    yield srv
    srv.stop()
    files.close()


def test_download_then_serve_in_process(setup_server, tmp_path, assets):
    srv = setup_server
    assert srv.get("/health")["status"] == "setup"
    with pytest.raises(openai.InternalServerError) as e:
        srv.client().chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}])
    assert "no model loaded" in e.value.body["message"]

    status, body = call(srv, "POST", "/catalog/serve", {"name": "tiny"})
    assert status == 409 and "not downloaded" in body["error"]["message"]

    status, body = call(srv, "POST", "/catalog/download", {"name": "tiny"})
    assert status == 202 and body["status"] in ("queued", "downloading")
    deadline = time.monotonic() + 60
    while True:
        entry = srv.get("/catalog")["entries"][0]
        if entry["download"]["status"] in ("done", "failed"):
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert entry["download"]["status"] == "done", entry["download"]
    assert entry["local"]["state"] == "verified" and entry["fit"] == "fits"

    # the TTS tower is already on disk (as an earlier download would have left it): serving wires it in
    shutil.copytree(assets["piper"], tmp_path / "models" / "voice")
    assert srv.get("/v1/stats")["tts"]["state"] == "off"
    status, body = call(srv, "POST", "/catalog/serve", {"name": "tiny"})
    assert status == 200, body
    assert body["towers"] == [{"name": "voice", "kind": "tts", "local": "present", "wired": True}]
    assert srv.get("/health")["status"] == "ok"
    assert srv.get("/v1/audio/voices")["voices"] == ["joe"]
    speech = srv.client().audio.speech.create(model="tts-1", voice="alloy", input="Hello there.").read()
    assert speech[:4] == b"RIFF"
    status, body = call(srv, "POST", "/catalog/serve", {"name": "voice"})  # a speech entry on its own
    assert status == 200 and body["kind"] == "tts" and not body["default"]
    # ignore_eos: the random tiny model may otherwise end its reply at the very first token
    r = srv.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, extra_body={"ignore_eos": True})
    assert r.model == "tiny" and r.usage.completion_tokens == 4

    # The roster was saved as the authoritative config, keeping the user's own lines.
    saved = (tmp_path / "llamadesk.toml").read_text()
    assert "# my settings" in saved and "authoritative = true" in saved
    cfg = load(["--config", str(tmp_path / "llamadesk.toml"), "--port", "1234"])
    assert [m.name for m in cfg.models] == ["tiny"] and cfg.models[0].default
    assert (cfg.tts, cfg.sources["tts"]) == (str(tmp_path / "models" / "voice"), "toml")
    assert (cfg.port, cfg.sources["port"]) == (9, "toml")  # authoritative: the file wins over the flag


def test_catalog_errors(setup_server):
    srv = setup_server
    assert call(srv, "POST", "/catalog/download", {"name": "nope"})[0] == 404
    assert call(srv, "POST", "/catalog/download", {})[0] == 400
    status, body = call(srv, "POST", "/catalog/download", {"name": "tiny", "tower": "vision"})
    assert status == 400 and body["error"]["param"] == "tower"
    assert call(srv, "POST", "/catalog/cancel", {"name": "tiny"})[1]["cancelled"] is False
    cat = srv.get("/catalog")
    assert cat["box"]["ram_bytes"] > 0 and cat["entries"][0]["local"]["state"] == "absent"


def test_a_second_download_of_the_same_entry_is_a_409(setup_server):
    srv = setup_server
    srv.files.faults["tiny.gguf"] = Faults(throttle_bps=100_000)  # the first is still running
    assert call(srv, "POST", "/catalog/download", {"name": "tiny"})[0] == 202
    status, body = call(srv, "POST", "/catalog/download", {"name": "tiny"})
    assert status == 409 and body["error"]["code"] == "conflict" and "tiny" in body["error"]["message"]
    assert call(srv, "POST", "/catalog/cancel", {"name": "tiny"})[1]["cancelled"]


def test_import_a_gguf_from_disk(setup_server, assets, tmp_path):
    srv = setup_server
    status, body = call(srv, "POST", "/catalog/import", {"path": str(assets["minilm"])})
    assert status == 201 and body["name"] == "all-MiniLM-L6-v2-f16"
    assert [m["file"] for m in srv.get("/catalog")["local"]] == ["all-MiniLM-L6-v2-f16.gguf"]
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hello")
    status, body = call(srv, "POST", "/catalog/import", {"path": str(not_gguf)})
    assert status == 400 and "not a GGUF" in body["error"]["message"]


def _tarball(folder) -> bytes:
    """A sherpa-onnx style release archive: one top folder holding the model's files."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as tar:
        tar.add(folder, arcname=folder.name)
    return buf.getvalue()


def test_a_kokoro_archive_from_the_catalog_speaks_after_serve(tts_standins, tmp_path):
    """The whole user path for a Kokoro voice: download the archive (from a local mirror), unpack, serve,
    speak with one of its voices; an archive with a damaged voices.bin is refused with the reason."""
    import numpy as np

    from engine.speech.audio import decode
    from tests.assets import tts_standins as st
    good = _tarball(tts_standins["kokoro"])
    broken_dir = tmp_path / "broken" / "kokoro-multi-lang-v1_0"
    shutil.copytree(tts_standins["kokoro"], broken_dir)
    (broken_dir / "voices.bin").write_bytes((broken_dir / "voices.bin").read_bytes()[:-64])
    broken = _tarball(broken_dir)
    files = FileServer(files={"kokoro.tar.bz2": good, "kokoro-broken.tar.bz2": broken})
    catalog = tmp_path / "catalog.toml"
    catalog.write_text("".join(f'''
[[model]]
name = "{name}"
kind = "tts"
family = "kokoro"
file = "{name}.tar.bz2"
archive = "tar.bz2"
url = "https://example.invalid/{name}.tar.bz2"
sha256 = "{hashlib.sha256(data).hexdigest()}"
size = {len(data)}
''' for name, data in (("kokoro", good), ("kokoro-broken", broken))))
    srv = LiveServer(["--catalog-path", str(catalog), "--catalog-mirror", files.url,
                      "--models-dir", str(tmp_path / "models")], "", tmp_path)
    try:
        for name in ("kokoro", "kokoro-broken"):
            assert call(srv, "POST", "/catalog/download", {"name": name})[0] == 202
            deadline = time.monotonic() + 60
            while (entry := next(e for e in srv.get("/catalog")["entries"] if e["name"] == name))["download"][
                    "status"] not in ("done", "failed"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert entry["download"]["status"] == "done", entry["download"]

        status, body = call(srv, "POST", "/catalog/serve", {"name": "kokoro-broken"})
        assert status == 400 and body["error"]["code"] == "model_load_failed", body
        assert "voices.bin" in body["error"]["message"]
        assert srv.get("/v1/stats")["tts"]["state"] == "off"  # nothing half-loaded, still serving
        status, body = call(srv, "POST", "/catalog/serve", {"name": "kokoro"})
        assert status == 200 and body["kind"] == "tts", body
        assert srv.get("/v1/audio/voices")["voices"] == list(st.KOKORO_VOICES)
        audio = srv.client().audio.speech.create(model="tts-1", voice="bf_emma", input="Hello there.").read()
        samples = decode(audio, st.RATE)
        assert abs(np.argmax(np.abs(np.fft.rfft(samples))) * st.RATE / len(samples) - st.VOICE_HZ[1]) < 5
    finally:
        srv.stop()
        files.close()
