"""Real-time factor of transcription and synthesis through llamadesk's server vs sherpa-onnx called
directly on the same models and audio, side by side, interleaved; medians and overhead printed.

RTF = seconds spent / seconds of audio (lower is faster). Through the server the time includes the
HTTP round trip, FFmpeg decoding or encoding, and for ASR the VAD split. Not a test: prints figures.
Run: make bench (or python tests/bench/bench_speech.py [--reps 5])
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.speech.audio import decode  # noqa: E402
from tests.assets.prepare import default_dest, prepare  # noqa: E402

PARAGRAPHS = [
    "The museum opens at nine in the morning. Visitors can see paintings from four centuries. "
    "The guided tour takes about an hour and ends in the garden.",
    "Our train leaves from platform six. It stops in two small towns before the city. "
    "Please keep your ticket until the end of the journey.",
    "The recipe needs flour, butter and two eggs. Mix them slowly and bake for twenty minutes. "
    "Let the cake cool before you cut it.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: bytes, content_type: str) -> bytes:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def multipart(data: bytes) -> tuple[bytes, str]:
    b = uuid.uuid4().hex
    body = (f'--{b}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n').encode() + data + \
        f"\r\n--{b}--\r\n".encode()
    return body, f"multipart/form-data; boundary={b}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    assets = prepare(default_dest())
    import sherpa_onnx
    from piper_phonemize import phonemize_espeak
    w = assets["whisper"]
    rec = sherpa_onnx.OfflineRecognizer.from_whisper(
        encoder=str(w / "tiny.en-encoder.onnx"), decoder=str(w / "tiny.en-decoder.onnx"),
        tokens=str(w / "tiny.en-tokens.txt"), language="en", task="transcribe", num_threads=1)
    voice = next(assets["piper"].glob("*.onnx"))
    tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(
        vits=sherpa_onnx.OfflineTtsVitsModelConfig(model=str(voice), tokens=str(assets["piper"] / "tokens.txt")),
        num_threads=1)))

    def direct_tts(text: str, speed: float) -> tuple[float, float]:
        t0 = time.perf_counter()
        g = sherpa_onnx.GenerationConfig()
        g.speed = speed
        g.phoneme_codepoints = [[ord(c) for c in p] for p in phonemize_espeak(text, "en-us")]
        a = tts.generate(text, g)
        return time.perf_counter() - t0, len(a.samples) / a.sample_rate

    def direct_asr(samples: np.ndarray) -> float:
        t0 = time.perf_counter()
        st = rec.create_stream()
        st.accept_waveform(16000, samples)
        rec.decode_streams([st])
        return time.perf_counter() - t0

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.toml"
        cfg.write_text("")
        proc = subprocess.Popen([sys.executable, "-m", "app", "--no-gui", "--config", str(cfg), "--cache-disk", "0",
                                 "--port", str(port),
                                 "--asr", str(w), "--tts", str(assets["piper"]), "--log-level", "warning"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.2)
            rows = {"tts server": [], "tts direct": [], "asr server": [], "asr direct": []}
            for rep in range(args.reps):
                for i, text in enumerate(PARAGRAPHS):
                    speed = 1.0 + 0.001 * (rep * 10 + i + 1)  # a new request each time: no recent audio reused
                    t0 = time.perf_counter()
                    wav = post(url + "/v1/audio/speech",
                               json.dumps({"input": text, "voice": "alloy", "speed": speed}).encode(), "application/json")
                    server_s = time.perf_counter() - t0
                    samples = decode(wav, 16000)
                    audio_s = len(samples) / 16000
                    rows["tts server"].append(server_s / audio_s)
                    d_s, d_audio = direct_tts(text, speed)
                    rows["tts direct"].append(d_s / d_audio)
                    body, ctype = multipart(wav)
                    order = [("asr server", lambda: post(url + "/v1/audio/transcriptions", body, ctype)),
                             ("asr direct", lambda: direct_asr(samples))]
                    for name, run in order if rep % 2 == 0 else order[::-1]:
                        t0 = time.perf_counter()
                        run()
                        rows[name].append((time.perf_counter() - t0) / audio_s)
            print(f"speech RTF (seconds spent per second of audio, lower is better), {args.reps * 3} clips "
                  f"of ~10 s, medians:")
            for name, vals in rows.items():
                print(f"  {name:11s} {statistics.median(vals):.4f}  [{min(vals):.4f}-{max(vals):.4f}]")
            for kind in ("tts", "asr"):
                ratios = [a / b for a, b in zip(rows[f"{kind} server"], rows[f"{kind} direct"])]
                print(f"  {kind} server/direct: median {statistics.median(ratios):.3f} "
                      f"[{min(ratios):.3f}-{max(ratios):.3f}] (overhead {100 * (statistics.median(ratios) - 1):+.1f}%)")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
