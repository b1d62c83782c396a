"""Speech through the openai client: whisper tiny.en (converted by the project's pipeline), the Piper voice,
Silero VAD — all real sherpa-onnx models, audio encoded and decoded by FFmpeg (PyAV)."""
from __future__ import annotations

import concurrent.futures
import io
import json
import math
import re
import time
import urllib.error
import urllib.request
import wave

import numpy as np
import openai
import pytest

from engine.speech.audio import decode, encode
from tests.conftest import LiveServer
from tests.http import call

SENTENCES = ["The weather is nice today.", "I would like a cup of coffee.", "Please open the window."]


@pytest.fixture(scope="module")
def speech_server(assets, tmp_path_factory):
    srv = LiveServer(["--model", str(assets["tiny"]), "--asr", str(assets["whisper"]), "--tts", str(assets["piper"]),
                      "--ctx", "4096"], "", tmp_path_factory.mktemp("speech"))
    yield srv
    srv.stop()


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference length."""
    r, h = words(reference), words(hypothesis)
    d = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, d[0] = d[0], i
        for j, hw in enumerate(h, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (rw != hw))
    return d[len(h)] / max(len(r), 1)


def speak(server, text: str, fmt: str = "wav", **kw) -> bytes:
    return server.client().audio.speech.create(model="tts-1", voice="alloy", input=text, response_format=fmt,
                                               **kw).read()


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    return encode(np.asarray(samples, np.float32), rate, "wav")[0]


def upload(server, path: str, data: bytes, **fields) -> tuple[int, dict | str]:
    """A raw multipart POST (for inputs the SDK would refuse to send)."""
    boundary = "llamadesk-test-boundary"
    body = b""
    for k, v in fields.items():
        body += f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
    body += (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
             f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(server.url + path, data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read().decode()
            return r.status, json.loads(raw) if raw.startswith("{") else raw
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def test_speech_then_transcription_round_trip(speech_server):
    text = " ".join(SENTENCES)
    audio = speak(speech_server, text)
    out = speech_server.client().audio.transcriptions.create(model="whisper-1", file=("speech.wav", audio))
    assert wer(text, out.text) <= 0.10, out.text
    assert out.usage.type == "duration" and out.usage.seconds == math.ceil(len(decode(audio, 16000)) / 16000)


def test_three_utterances_give_three_timed_segments(speech_server):
    rate = 16000
    pieces, spans, t = [], [], 0.0
    silence = np.zeros(int(1.5 * rate), np.float32)
    for i, s in enumerate(SENTENCES):
        x = decode(speak(speech_server, s), rate)
        loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())  # where the voice really is
        spans.append((t + loud[0] / rate, t + loud[-1] / rate))
        pieces += [x, silence] if i < 2 else [x]
        t += len(x) / rate + (1.5 if i < 2 else 0)
    clip = wav_bytes(np.concatenate(pieces), rate)
    client = speech_server.client()
    verbose = client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", clip),
                                                 response_format="verbose_json", timestamp_granularities=["segment"])
    assert len(verbose.segments) == 3, verbose
    for seg, (start, end), sentence in zip(verbose.segments, spans, SENTENCES):
        assert abs(seg.start - start) <= 0.3 and abs(seg.end - end) <= 0.3, (seg, start, end)
        assert wer(sentence, seg.text) <= 0.2
    assert verbose.duration == pytest.approx(t, abs=0.05)
    srt = client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", clip), response_format="srt")
    vtt = client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", clip), response_format="vtt")
    stamp = r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)"
    to_s = lambda g: int(g[0]) * 3600 + int(g[1]) * 60 + int(g[2]) + int(g[3]) / 1000  # noqa: E731
    srt_times = [(to_s(m[:4]), to_s(m[4:])) for m in re.findall(stamp, srt)]
    vtt_times = [(to_s(m[:4]), to_s(m[4:])) for m in re.findall(stamp, vtt)]
    assert vtt.startswith("WEBVTT") and re.match(r"1\n\d\d:", srt)
    assert srt_times == vtt_times == [(pytest.approx(s.start, abs=0.001), pytest.approx(s.end, abs=0.001))
                                      for s in verbose.segments]
    status, body = upload(speech_server, "/vad", clip)
    assert status == 200 and len(body["spans"]) == 3
    # stream=true: one delta per utterance, decoded and sent one by one, then the whole text
    events = list(client.audio.transcriptions.create(model="gpt-4o-transcribe", file=("clip.wav", clip), stream=True))
    assert [e.type for e in events] == ["transcript.text.delta"] * 3 + ["transcript.text.done"], events
    assert "".join(e.delta for e in events[:3]) == events[3].text == " ".join(s.text for s in verbose.segments)
    assert speech_server.get("/v1/stats")["asr"]["jobs"] >= 3


@pytest.mark.parametrize("fmt", ["pcm", "flac", "mp3", "opus", "aac"])
def test_every_speech_format_decodes_to_the_same_duration(speech_server, fmt):
    text = "Formats should all last as long as each other."
    reference = len(decode(speak(speech_server, text, "wav"), 16000)) / 16000
    data = speak(speech_server, text, fmt)
    seconds = len(data) / 2 / 22050 if fmt == "pcm" else len(decode(data, 16000)) / 16000
    assert seconds == pytest.approx(reference, rel=0.05), (fmt, seconds, reference)


def test_long_input_streams_sentence_by_sentence(speech_server):
    sentences = 12
    text = " ".join(["This is sentence number %d of a long reading." % i for i in range(1, sentences + 1)])
    jobs_before = speech_server.get("/v1/stats")["tts"]["jobs"]
    req = urllib.request.Request(speech_server.url + "/v1/audio/speech", method="POST",
                                 data=json.dumps({"input": text, "response_format": "pcm"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        first = r.read1(4096)
        made = speech_server.get("/v1/stats")["tts"]["jobs"] - jobs_before  # sentences synthesized so far
        rest = r.read()
    assert first and len(rest) > 4 * len(first)
    assert made < sentences  # the first sentence's audio arrived before the last sentence was made
    assert speech_server.get("/v1/stats")["tts"]["jobs"] - jobs_before == sentences


def _speech_events(server, **body) -> list[dict]:
    req = urllib.request.Request(server.url + "/v1/audio/speech", method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        return [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]


def test_speech_as_server_sent_events(speech_server):
    """OpenAI's stream_format "sse": base64 deltas (a sentence each for pcm), then speech.audio.done."""
    import base64
    text = " ".join(SENTENCES)
    events = _speech_events(speech_server, input=text, response_format="pcm", stream_format="sse")
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert events[-1]["usage"]["input_tokens"] == len(text)
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    plain = speak(speech_server, text, "pcm")  # the same request (reused result): the same samples
    assert pcm == plain
    wav_events = _speech_events(speech_server, input=text, stream_format="sse")  # wav: one whole file
    assert [e["type"] for e in wav_events] == ["speech.audio.delta", "speech.audio.done"]
    assert len(decode(base64.b64decode(wav_events[0]["audio"]), 16000)) == pytest.approx(len(pcm) / 2 / 22050 * 16000,
                                                                                         rel=0.01)
    status, body = call(speech_server, "POST", "/v1/audio/speech", {"input": "Hi.", "stream_format": "websocket"})
    assert status == 400 and body["error"]["param"] == "stream_format"


def test_chat_and_transcription_overlap(speech_server):
    clip = speak(speech_server, SENTENCES[0])
    client = speech_server.client()

    def chat() -> str:
        s = client.chat.completions.create(model="", messages=[{"role": "user", "content": "go"}], stream=True,
                                           max_tokens=3000, temperature=0, extra_body={"ignore_eos": True})
        return [c.choices[0].finish_reason for c in s if c.choices and c.choices[0].finish_reason][0]

    before = speech_server.get("/v1/stats")["gen_tokens"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        chatting = pool.submit(chat)
        deadline = time.monotonic() + 30
        while speech_server.get("/v1/stats")["gen_tokens"] < before + 50:  # decoding is under way
            assert time.monotonic() < deadline
            time.sleep(0.01)
        heard = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", clip)).text
        assert chatting.result(120) == "length"
    assert wer(SENTENCES[0], heard) <= 0.2
    stats = speech_server.get("/v1/stats")
    assert stats["asr"]["jobs_overlapping_generation"] >= 1 and stats["asr"]["jobs"] >= 1
    assert stats["asr"]["rtf"] > 0 and stats["tts"]["jobs"] >= 1


def test_models_and_voices_are_listed(speech_server):
    kinds = {m.id: m.model_extra.get("kind") for m in speech_server.client().models.list().data}
    assert kinds["whisper-tiny.en"] == "asr" and kinds["piper-en_US-joe-medium"] == "tts"
    voices = speech_server.get("/v1/audio/voices")
    assert voices["voices"] == ["joe"] and "alloy" in voices["openai_voices"]


def test_bad_speech_input_is_a_clear_4xx(speech_server):
    client = speech_server.client()
    cases = [(b"\x13\x37" * 4000, {}, "decode"), (b"", {}, "empty"), (wav_bytes(np.zeros(0), 16000), {}, "no samples"),
             (wav_bytes(np.zeros(1600), 16000), {"response_format": "xml"}, "response_format"),
             (wav_bytes(np.zeros(1600), 16000), {"stream": "maybe"}, "'stream' must be true or false")]
    for data, fields, words_ in cases:
        status, body = upload(speech_server, "/v1/audio/transcriptions", data, **fields)
        assert status == 400 and words_ in body["error"]["message"], body
    for streamed in ({}, {"stream": "true"}):  # refused before any event is sent
        status, body = upload(speech_server, "/v1/audio/translations", speak(speech_server, "Hello there."), **streamed)
        assert status == 400 and "cannot translate" in body["error"]["message"]
    for kw, param in (({"speed": 5.0}, "speed"), ({"input": "word " * 1000}, "input"),
                      ({"response_format": "ogg"}, "response_format"), ({"voice": "nobody"}, "voice")):
        args = {"model": "tts-1", "voice": "alloy", "input": "Hi.", **kw}
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.speech.create(**args)
        assert e.value.body["param"] == param
    with pytest.raises(openai.NotFoundError):
        client.audio.speech.create(model="no-such-voice-model", voice="alloy", input="Hi.")
    long_clip = wav_bytes(np.zeros(121 * 16000, np.float32), 16000)
    status, body = upload(speech_server, "/vad", long_clip)
    assert status == 413 and "120" in body["error"]["message"]  # refused while decoding (test_speech_bounds.py)
    assert client.chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=2).choices  # still serving


def test_a_broken_speech_model_degrades_instead_of_failing(assets, tmp_path):
    broken = tmp_path / "broken-asr"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not onnx")
    (broken / "tokens.txt").write_text("a 0\n")
    srv = LiveServer(["--model", str(assets["tiny"]), "--asr", str(broken)], "", tmp_path)
    try:
        status, body = upload(srv, "/v1/audio/transcriptions", wav_bytes(np.zeros(16000), 16000))
        assert status == 503 and "no speech-to-text model loaded" in body["error"]["message"], body
        assert srv.get("/v1/stats")["asr"]["state"] == "error"
        status, body = upload(srv, "/vad", wav_bytes(np.zeros(16000), 16000))  # the shipped VAD still works
        assert status == 200 and body["spans"] == [], body
        assert srv.client().chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2).choices
    finally:
        srv.stop()


def test_a_kokoro_model_serves_its_voices_through_the_openai_client(assets, tts_standins, tmp_path):
    """Kokoro (the stand-in with Kokoro's interface: a tone per voice) served like any TTS model."""
    from tests.assets import tts_standins as st
    srv = LiveServer(["--model", str(assets["tiny"]), "--tts", str(tts_standins["kokoro"])], "", tmp_path)
    try:
        listed = srv.get("/v1/audio/voices")
        assert listed["model"] == "kokoro-multi-lang-v1_0" and listed["voices"] == list(st.KOKORO_VOICES)
        assert "kokoro-multi-lang-v1_0" in [m["id"] for m in srv.get("/v1/models")["data"]]
        client = srv.client()
        for k, voice in enumerate(st.KOKORO_VOICES):
            audio = client.audio.speech.create(model="tts-1", voice=voice, input="Hello there.").read()
            samples = decode(audio, st.RATE)
            assert abs(np.argmax(np.abs(np.fft.rfft(samples))) * st.RATE / len(samples) - st.VOICE_HZ[k]) < 5, voice
        for voice in ("1", {"id": "bf_emma"}):  # a speaker id; OpenAI's custom-voice object
            chosen = decode(client.audio.speech.create(model="tts-1", voice=voice, input="Hello there.").read(), st.RATE)
            assert abs(np.argmax(np.abs(np.fft.rfft(chosen))) * st.RATE / len(chosen) - st.VOICE_HZ[1]) < 5, voice
        status, body = call(srv, "POST", "/v1/audio/speech", {"input": "Hi.", "voice": 7})
        assert status == 400 and body["error"]["param"] == "voice" and "out of range" in body["error"]["message"]
        status, body = call(srv, "POST", "/v1/audio/speech", {"input": "Hi.", "voice": {"name": "x"}})
        assert status == 400 and body["error"]["param"] == "voice" and "'id'" in body["error"]["message"]
        wav = client.audio.speech.create(model="kokoro-multi-lang-v1_0", voice="alloy", input=SENTENCES[0]).read()
        mp3 = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCES[0], response_format="mp3").read()
        with wave.open(io.BytesIO(wav)) as w:
            assert w.getframerate() == st.RATE  # served at the model's own rate
        a, b = decode(wav, st.RATE), decode(mp3, st.RATE)
        assert len(a) > 20 * st.HOP and abs(len(b) - len(a)) < 0.05 * len(a)
    finally:
        srv.stop()


def test_a_kokoro_model_with_a_short_voices_file_degrades(assets, tts_standins, tmp_path):
    """sherpa-onnx would end the process over it; llamadesk refuses it, says why, and keeps serving."""
    import shutil
    broken = tmp_path / "kokoro"
    shutil.copytree(tts_standins["kokoro"], broken)
    (broken / "voices.bin").write_bytes((broken / "voices.bin").read_bytes()[:1000])
    srv = LiveServer(["--model", str(assets["tiny"]), "--tts", str(broken)], "", tmp_path)
    try:
        with pytest.raises(openai.APIStatusError) as err:
            srv.client().audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
        assert err.value.status_code == 503
        message = err.value.body["message"] if isinstance(err.value.body, dict) else str(err.value)
        assert "no text-to-speech model loaded" in message and "voices.bin" in message, message
        assert srv.client().chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2).choices
    finally:
        srv.stop()


def test_a_sense_voice_model_transcribes_through_the_openai_client(assets, asr_standins, tmp_path):
    """SenseVoice (the stand-in with its interface, which spells 'hello world' whatever it hears) served like
    whisper: aliases, formats, /v1/models, and a clear 400 for translation, which only whisper can do."""
    from tests.assets.asr_standins import PHRASE
    srv = LiveServer(["--model", str(assets["tiny"]), "--asr", str(asr_standins["sense_voice"]),
                      "--tts", str(assets["piper"])], "", tmp_path)
    try:
        clip = speak(srv, SENTENCES[0])  # real speech, so that the VAD finds a span for the subtitles
        client = srv.client()
        assert client.audio.transcriptions.create(model="whisper-1", file=("a.wav", clip)).text == PHRASE
        srt = client.audio.transcriptions.create(model="sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17",
                                                 file=("a.wav", clip), response_format="srt")
        assert PHRASE in srt and "-->" in srt
        assert "sherpa-onnx-sense-voice-zh-en-ja-ko-yue-2024-07-17" in [m["id"] for m in srv.get("/v1/models")["data"]]
        status, body = upload(srv, "/v1/audio/translations", clip, model="whisper-1")
        assert status == 400 and "cannot translate" in body["error"]["message"], body
    finally:
        srv.stop()


def test_the_transcription_forms_fields_are_read_and_checked(speech_server):
    """language, prompt, temperature and timestamp_granularities through the SDK; their bad values are 400s
    naming them (a form's values are text: temperature is parsed, NaN refused as anywhere)."""
    client = speech_server.client()
    clip = speak(speech_server, SENTENCES[1])
    heard = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", clip), language="en",
                                               prompt="A coffee order.", temperature=0.2,
                                               response_format="verbose_json", timestamp_granularities=["segment"])
    assert wer(SENTENCES[1], heard.text) <= 0.2 and heard.segments
    # (this English-only model cannot translate: the same fields read on /translations reach that refusal)
    status, body = upload(speech_server, "/v1/audio/translations", clip, prompt="x", temperature="0.2")
    assert status == 400 and "cannot translate" in body["error"]["message"]
    for fields, param in (({"temperature": "warm"}, "temperature"), ({"temperature": "nan"}, "temperature"),
                          ({"temperature": "3"}, "temperature"), ({"timestamp_granularities[]": "minute"},
                                                                  "timestamp_granularities"),
                          ({"response_format": "xml"}, "response_format")):
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            status, body = upload(speech_server, path, clip, **fields)
            assert status == 400 and body["error"]["param"] == param, (fields, body)
    status, body = upload(speech_server, "/vad", clip, extra="ignored")
    assert status == 200 and body["spans"]
