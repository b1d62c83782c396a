"""Downloads against a real local HTTP server with Range support and injected faults."""
from __future__ import annotations

import asyncio
import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from engine.catalog.entries import Entry, local_state
from engine.catalog.downloads import Downloader, extract_safely, DownloadError
from tests.fileserver import Faults, FileServer

DATA = os.urandom(3 * 2**20 + 12345)


def entry(name: str, data: bytes, **kw) -> Entry:
    return Entry(name=name, kind=kw.pop("kind", "llm"), file=kw.pop("file", f"{name}.gguf"),
                 url=f"https://example.invalid/{name}", sha256=hashlib.sha256(data).hexdigest(), size=len(data), **kw)


@pytest.fixture()
def files():
    srv = FileServer()
    yield srv
    srv.close()


def download(tmp_path: Path, srv: FileServer, e: Entry, **kw) -> Downloader:
    async def main():
        dl = Downloader(tmp_path, mirror=srv.url, backoff_s=0.01, **kw)
        dl.enqueue(e)
        await dl.wait_idle()
        await dl.close()
        return dl
    return asyncio.run(main())


def test_clean_download_is_verified_and_has_a_sidecar(tmp_path, files):
    files.files["m.gguf"] = DATA
    e = entry("m", DATA)
    dl = download(tmp_path, files, e)
    assert dl.downloads["m"].status == "done"
    assert (tmp_path / "m.gguf").read_bytes() == DATA
    assert (tmp_path / "m.gguf.sha256").read_text().split()[0] == e.sha256
    assert local_state(e, tmp_path)["state"] == "verified"
    assert not (tmp_path / "m.gguf.part").exists()


def test_cut_at_40_percent_resumes_with_range(tmp_path, files):
    files.files["m.gguf"] = DATA
    files.faults["m.gguf"] = Faults(cut_at=int(len(DATA) * 0.4))
    dl = download(tmp_path, files, entry("m", DATA))
    assert dl.downloads["m"].status == "done", dl.downloads["m"].error
    assert hashlib.sha256((tmp_path / "m.gguf").read_bytes()).hexdigest() == hashlib.sha256(DATA).hexdigest()
    ranges = [r for name, r, status in files.requests if name == "m.gguf"]
    assert len(ranges) == 2 and ranges[0] is None
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= int(len(DATA) * 0.4)  # what reached the disk before the cut, not byte 0


def test_wrong_bytes_are_deleted_and_both_hashes_named(tmp_path, files):
    files.files["m.gguf"] = DATA
    e = entry("m", b"something else")
    dl = download(tmp_path, files, e)
    d = dl.downloads["m"]
    assert d.status == "failed"
    assert e.sha256 in d.error and hashlib.sha256(DATA).hexdigest() in d.error
    assert list(tmp_path.iterdir()) == []


def test_server_error_then_success_is_retried(tmp_path, files):
    files.files["m.gguf"] = DATA
    files.faults["m.gguf"] = Faults(fail_first=2)
    dl = download(tmp_path, files, entry("m", DATA))
    assert dl.downloads["m"].status == "done"
    assert [s for n, r, s in files.requests] == [500, 500, 200]


def test_http_404_fails_clearly(tmp_path, files):
    dl = download(tmp_path, files, entry("gone", DATA))
    assert dl.downloads["gone"].status == "failed" and "404" in dl.downloads["gone"].error


def test_not_enough_space_fails_before_writing(tmp_path, files):
    files.files["huge.gguf"] = DATA
    files.faults["huge.gguf"] = Faults(fake_length=10**15)  # a petabyte: more than any test disk
    dl = download(tmp_path, files, entry("huge", DATA))
    d = dl.downloads["huge"]
    assert d.status == "failed" and "not enough free space" in d.error and "free" in d.error
    assert not any(tmp_path.iterdir())


def test_cancel_leaves_nothing_to_serve(tmp_path, files):
    files.files["m.gguf"] = DATA
    files.faults["m.gguf"] = Faults(throttle_bps=2**20)
    e = entry("m", DATA)

    async def main():
        dl = Downloader(tmp_path, mirror=files.url)
        d = dl.enqueue(e)
        while d.bytes < 256 * 1024:
            await asyncio.sleep(0.01)
        assert dl.cancel("m")
        await dl.wait_idle()
        await dl.close()
        return d
    d = asyncio.run(main())
    assert d.status == "cancelled"
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.gguf.part").exists()
    assert local_state(e, tmp_path)["state"] == "absent"


def test_queue_runs_one_at_a_time(tmp_path, files):
    files.files["a.gguf"] = DATA
    files.files["b.gguf"] = DATA[:1000]
    files.faults["a.gguf"] = Faults(throttle_bps=8 * 2**20)

    async def main():
        dl = Downloader(tmp_path, mirror=files.url)
        a = dl.enqueue(entry("a", DATA))
        b = dl.enqueue(entry("b", DATA[:1000]))
        seen = set()
        while a.status != "done":
            seen.add((a.status, b.status))
            await asyncio.sleep(0.005)
        await dl.wait_idle()
        await dl.close()
        return seen, b
    seen, b = asyncio.run(main())
    assert ("downloading", "queued") in seen
    assert not any(sa == "downloading" and sb == "downloading" for sa, sb in seen)
    assert b.status == "done"


RESTART_SCRIPT = """
import asyncio, sys
from engine.catalog.entries import Entry
from engine.catalog.downloads import Downloader
e = Entry(name="m", kind="llm", file="m.gguf", url="https://example.invalid/m", sha256=sys.argv[3], size=int(sys.argv[4]))
async def main():
    dl = Downloader(sys.argv[1], mirror=sys.argv[2])
    dl.enqueue(e)
    await dl.wait_idle()
asyncio.run(main())
"""


def test_download_resumes_after_the_process_is_killed(tmp_path, files):
    files.files["m.gguf"] = DATA
    files.faults["m.gguf"] = Faults(throttle_bps=2 * 2**20)
    e = entry("m", DATA)
    proc = subprocess.Popen([sys.executable, "-c", RESTART_SCRIPT, str(tmp_path), files.url, e.sha256, str(e.size)])
    part = tmp_path / "m.gguf.part"
    deadline = time.monotonic() + 30
    while not (part.exists() and part.stat().st_size >= 0.4 * len(DATA)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    have = part.stat().st_size
    assert 0 < have < len(DATA)
    files.faults["m.gguf"] = Faults()
    dl = download(tmp_path, files, e)
    assert dl.downloads["m"].status == "done"
    assert (tmp_path / "m.gguf").read_bytes() == DATA
    assert files.requests[-1][1] == f"bytes={have}-"


def make_tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_archive_is_verified_and_unpacked_into_its_folder(tmp_path, files):
    data = make_tar({"sherpa-onnx-voice/model.onnx": b"onnx", "sherpa-onnx-voice/tokens.txt": b"a 1\n"})
    files.files["voice.tar.bz2"] = data
    e = entry("voice", data, kind="tts", file="voice.tar.bz2", archive="tar.bz2")
    dl = download(tmp_path, files, e)
    assert dl.downloads["voice"].status == "done", dl.downloads["voice"].error
    assert (tmp_path / "voice" / "model.onnx").read_bytes() == b"onnx"
    assert (tmp_path / "voice.sha256").exists() and not (tmp_path / "voice.tar.bz2.part").exists()
    assert local_state(e, tmp_path)["state"] == "verified"


@pytest.mark.parametrize("bad", ["../evil", "/tmp/llamadesk-abs-evil", "ok/../../evil"])
def test_archive_escaping_its_folder_is_rejected(tmp_path, files, bad):
    models = tmp_path / "models"
    data = make_tar({"voice/model.onnx": b"x", bad: b"pwned"})
    files.files["voice.tar.bz2"] = data
    e = entry("voice", data, kind="tts", file="voice.tar.bz2", archive="tar.bz2")
    dl = download(models, files, e)
    d = dl.downloads["voice"]
    assert d.status == "failed" and "refusing archive" in d.error and bad in d.error
    assert not (tmp_path / "evil").exists() and not Path("/tmp/llamadesk-abs-evil").exists()
    assert not (models / "voice").exists()


def test_archive_with_a_link_is_rejected(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:bz2") as tar:
        link = tarfile.TarInfo("voice/passwd")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    archive = tmp_path / "a.tar.bz2"
    archive.write_bytes(buf.getvalue())
    with pytest.raises(DownloadError, match="link"):
        extract_safely(archive, tmp_path / "voice")
    assert not (tmp_path / "voice").exists()
