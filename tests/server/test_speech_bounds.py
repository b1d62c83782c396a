"""Upload and speech input that once cost gigabytes, a minute or a 500: audio far longer than it is large
(silence compresses to almost nothing), a declared body of a terabyte, multipart bodies that are not, text
that is not Unicode. Each is a quick 4xx in the OpenAI error shape, memory stays bounded by the declared
limits (--max-upload-mb, --max-audio-s, /vad's 120 s), and the server keeps serving."""
from __future__ import annotations

import http.client
import io
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import av
import numpy as np
import openai
import pytest

from engine.speech.audio import encode
from tests.conftest import LiveServer
from tests.http import call

MAX_AUDIO_S = 600
MAX_UPLOAD_MB = 16
BOUNDARY = "llamadesk-bounds"
UPLOADS = ["/v1/audio/transcriptions", "/v1/audio/translations", "/vad"]


@pytest.fixture(scope="module")
def server(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--asr", str(assets["whisper"]), "--tts", str(assets["piper"]),
                      "--max-audio-s", str(MAX_AUDIO_S), "--max-upload-mb", str(MAX_UPLOAD_MB)], "",
                     tmp_path_factory.mktemp("speech-bounds"))
    yield srv
    srv.stop()


def silent_flac(seconds: float, rate: int = 16000) -> bytes:
    """Mono FLAC of digital silence: about 190 bytes a second, whatever it lasts."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=rate, layout="mono")
        block = 1 << 16
        zeros = np.zeros((1, block), np.int16)
        total = int(seconds * rate)
        for pts in range(0, total, block):
            frame = av.AudioFrame.from_ndarray(zeros[:, :min(block, total - pts)], format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, pts
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def twelve_hours() -> bytes:
    """12 h of silence in about 8 MB: under the upload limit, 2.8 GB as float32 at 16 kHz."""
    data = silent_flac(12 * 3600)
    assert len(data) < MAX_UPLOAD_MB * 2**20
    return data


def multipart(data: bytes, **fields: str) -> bytes:
    """A well-formed multipart/form-data body (with BOUNDARY): text fields, then `file`."""
    body = b""
    for k, v in fields.items():
        body += f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.flac"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return body + head + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def post(server, path: str, body, content_type: str | None = f"multipart/form-data; boundary={BOUNDARY}",
         timeout: float = 60) -> tuple[int, dict | str]:
    """(status, parsed JSON or text) of a POST with exactly this body; an iterable body goes chunked."""
    u = urlsplit(server.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    headers = {"Content-Type": content_type} if content_type else {}
    try:
        conn.request("POST", path, body=body, headers=headers, encode_chunked=not isinstance(body, bytes))
        r = conn.getresponse()
        text = r.read().decode("utf-8", "replace")
    finally:
        conn.close()
    return r.status, json.loads(text) if r.getheader("Content-Type", "").startswith("application/json") else text


def assert_error(status: int, body, expected: int, *words: str, param: str | None = None) -> None:
    """An OpenAI-shaped error with this status whose message holds every word."""
    assert status == expected, (status, body)
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", body
    assert all(w in error["message"] for w in words), body
    if param is not None:
        assert error["param"] == param, body


def still_serves(server, path: str) -> None:
    """A normal request on the same route gets its normal answer."""
    if path == "/v1/audio/speech":
        audio = server.client().audio.speech.create(model="tts-1", voice="alloy", input="Hi.").read()
        assert audio[:4] == b"RIFF"
        return
    clip = encode(np.zeros(16000, np.float32), 16000, "wav")[0]
    status, body = post(server, path, multipart(clip))
    if path == "/v1/audio/translations":  # whisper tiny.en cannot translate: a 400 from the model, after decoding
        assert_error(status, body, 400, "cannot translate")
    else:
        assert status == 200 and (body["spans"] == [] if path == "/vad" else "text" in body), body


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class PeakRss:
    """The highest resident size of this process (the server runs in it, on a thread) while the block runs."""

    def __enter__(self) -> PeakRss:
        self.base = self.peak = _rss()
        self._done = threading.Event()
        self._watch = threading.Thread(target=self._sample, daemon=True)
        self._watch.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._watch.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base


@pytest.mark.parametrize("path, limit, flag", [("/vad", "120 s", None),
                                               ("/v1/audio/transcriptions", f"{MAX_AUDIO_S} s", "--max-audio-s"),
                                               ("/v1/audio/translations", f"{MAX_AUDIO_S} s", "--max-audio-s")])
def test_twelve_hours_of_silence_are_refused_while_decoding(server, twelve_hours, path, limit, flag):
    """Was: RSS 4 GB, then a 500 (numpy out of memory); decoding stops at the limit, not at the file's end."""
    body = multipart(twelve_hours)
    t0 = time.monotonic()
    with PeakRss() as rss:
        status, out = post(server, path, body)
    assert_error(status, out, 413, limit, *([flag] if flag else []), param="file")
    assert out["error"]["code"] == "request_too_large"
    assert time.monotonic() - t0 < 5
    assert rss.growth < 300 * 2**20, f"RSS grew by {rss.growth / 2**20:.0f} MB"
    still_serves(server, path)


def test_a_clip_just_over_the_limits_is_refused_and_one_within_is_served(server):
    over = silent_flac(MAX_AUDIO_S + 5)
    status, out = post(server, "/v1/audio/transcriptions", multipart(over, response_format="verbose_json"))
    assert_error(status, out, 413, f"{MAX_AUDIO_S} s", "--max-audio-s", param="file")
    status, out = post(server, "/v1/audio/transcriptions", multipart(over, stream="true"))  # before any event
    assert_error(status, out, 413, "--max-audio-s")
    status, out = post(server, "/vad", multipart(silent_flac(121)))
    assert_error(status, out, 413, "120 s", param="file")
    status, out = post(server, "/vad", multipart(silent_flac(119)))
    assert status == 200 and out["duration"] == pytest.approx(119, abs=0.01) and out["spans"] == [], out


@pytest.mark.parametrize("path", UPLOADS)
def test_a_terabyte_content_length_is_refused_at_once(server, path):
    """Was: no answer for 65 s while the reader waited for the body; now 413 before a byte of it is read."""
    u = urlsplit(server.url)
    t0 = time.monotonic()
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: 1000000000000\r\n"
                  f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n--{BOUNDARY}\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < _length(reply):
            chunk = s.recv(65536)
            assert chunk, reply
            reply += chunk
    assert time.monotonic() - t0 < 3
    head, raw = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert_error(413, json.loads(raw[:_length(reply)]), 413, f"{MAX_UPLOAD_MB} MB", "--max-upload-mb")
    still_serves(server, path)


def _length(reply: bytes) -> int:
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    return next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")),
                1 << 30)


def test_an_upload_without_content_length_is_counted(server):
    """Chunked bodies declare no size: the parts are counted as they arrive, a text field as much as the file."""
    mb = b"x" * 2**20
    field = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n'.encode(),
             *[mb] * (MAX_UPLOAD_MB + 1), f"\r\n--{BOUNDARY}--\r\n".encode())
    for body in (iter(field), iter([multipart(b"\0" * (MAX_UPLOAD_MB + 1) * 2**20)])):
        with PeakRss() as rss:
            status, out = post(server, "/v1/audio/transcriptions", body)
        assert_error(status, out, 413, f"{MAX_UPLOAD_MB} MB", "--max-upload-mb")
        assert rss.growth < 4 * MAX_UPLOAD_MB * 2**20
    still_serves(server, "/v1/audio/transcriptions")


@pytest.mark.parametrize("path", UPLOADS)
@pytest.mark.parametrize("content_type", [None, "application/json", "application/x-www-form-urlencoded",
                                          "multipart/mixed; boundary=" + BOUNDARY])
def test_an_upload_that_is_not_multipart_form_data_is_415(server, path, content_type):
    status, out = post(server, path, multipart(b"\0" * 100), content_type)
    assert_error(status, out, 415, "multipart/form-data")
    assert out["error"]["code"] == "unsupported_media_type"


_PART = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
# (what is wrong, Content-Type, body, words the message holds)
BROKEN = [
    ("no boundary", "multipart/form-data", multipart(b"\0" * 100), "boundary"),
    ("long boundary", "multipart/form-data; boundary=" + "b" * 71, multipart(b"\0" * 100), "boundary"),
    ("empty", None, b"", "multipart"),
    ("garbage", None, b"\x13\x37" * 500, "multipart"),
    ("truncated in headers", None, f'--{BOUNDARY}\r\nContent-Disposition: form-da'.encode(), "multipart"),
    ("truncated in the file", None, _PART.encode() + b"\0" * 5000, "multipart"),
    ("no closing boundary", None, _PART.encode() + b"\0" * 100 + b"\r\n", "multipart"),
    ("a wrong boundary after a part", None, _PART.encode() + b"\0" * 100 + f"\r\n--{BOUNDARY}xyz\r\n".encode(),
     "multipart"),
    ("a header without a colon", None, f"--{BOUNDARY}\r\nContent-Disposition form-data\r\n\r\nx\r\n"
                                       f"--{BOUNDARY}--\r\n".encode(), "multipart"),
    ("a header line of 10 kB", None, f'--{BOUNDARY}\r\nX-Pad: {"p" * 10000}\r\n\r\nx\r\n--{BOUNDARY}--\r\n'.encode(),
     "multipart"),
    ("200 headers", None, f"--{BOUNDARY}\r\n".encode() + b"X-Pad: p\r\n" * 200
     + f"\r\nx\r\n--{BOUNDARY}--\r\n".encode(), "multipart"),
    ("a long _charset_", None, f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="_charset_"\r\n\r\n'
                               f'{"u" * 40}\r\n--{BOUNDARY}--\r\n'.encode(), "multipart"),
    ("a bad Content-Disposition", None, f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=a b c\r\n\r\n"
                                        f"x\r\n--{BOUNDARY}--\r\n".encode(), "Content-Disposition"),
    ("a nested multipart", None, f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"\r\n"
                                 f"Content-Type: multipart/mixed; boundary=inner\r\n\r\n--inner\r\n\r\nx\r\n"
                                 f"--inner--\r\n\r\n--{BOUNDARY}--\r\n".encode(), "multipart"),
    ("a field that is not UTF-8", None, f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="language"\r\n\r\n'
                                        .encode() + b"\xffen\r\n" + multipart(b"\0" * 100), "language"),
    ("a field in an unknown charset", None, f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="language"\r\n'
                                            f"Content-Type: text/plain; charset=nope\r\n\r\nen\r\n"
                                            f"--{BOUNDARY}--\r\n".encode(), "language"),
]


@pytest.mark.parametrize("path", UPLOADS)
@pytest.mark.parametrize("case", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_multipart_body_is_a_clear_400(server, path, case):
    """Was: 500 for every one of these."""
    _, content_type, body, word = case
    status, out = post(server, path, body, content_type or f"multipart/form-data; boundary={BOUNDARY}")
    assert_error(status, out, 400, word)
    still_serves(server, path)


@pytest.mark.parametrize("body, param", [
    ({"input": "\ud800"}, "input"),
    ({"input": "Hello \udc00 there."}, "input"),
    ({"input": "Hi.", "voice": "²"}, "voice"),
    ({"input": "Hi.", "voice": "٣"}, "voice"),  # a decimal digit, but not ASCII: no speaker id
    ({"input": "Hi.", "voice": "9" * 5000}, "voice"),  # more digits than int() reads
    ({"input": "Hi.", "voice": "\ud800"}, "voice"),
    ({"input": "Hi.", "voice": "jo\0e"}, "voice"),
])
def test_speech_input_that_is_no_text_is_a_400_naming_the_field(server, body, param):
    """Was: 500 for a lone surrogate in 'input' (no UTF-8 for the phonemizer) and for voice '²' (int('²'))."""
    status, out = call(server, "POST", "/v1/audio/speech", body)
    assert_error(status, out, 400, param=param)
    still_serves(server, "/v1/audio/speech")


def test_the_speech_checks_refuse_what_no_http_check_saw():
    """The desktop app synthesizes without the HTTP layer's checks: the engine's own refuse the same."""
    from engine.errors import InvalidRequest
    from engine.speech.tts import check_tts_input
    with pytest.raises(InvalidRequest) as e:
        check_tts_input("Hello \udc00 there.", 1.0)
    assert e.value.param == "input" and "U+DC00 at character 6" in e.value.message


def test_speech_with_odd_but_valid_text_is_served(server):
    """Text the phonemizer may turn into nothing still answers: audio (possibly silence) or a 400, never a 500."""
    for text in ("...", "\u200b", "\U0001f600", "日本語", "a\0b."):
        try:
            audio = server.client().audio.speech.create(model="tts-1", voice="alloy", input=text).read()
        except openai.BadRequestError as e:
            assert e.body["param"] == "input", (text, e.body)
        else:
            assert audio[:4] == b"RIFF", text
    still_serves(server, "/v1/audio/speech")
