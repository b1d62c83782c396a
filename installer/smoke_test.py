#!/usr/bin/env python3
"""Start a built llamadesk headless on a free port and check over HTTP that it serves, then that SIGTERM stops it.

Without --models it runs in setup mode: /health says so, /catalog lists entries, chat answers 503. With --models DIR
(a folder holding the starter set's files, which the test assets share: SmolLM2 Q4_1, MiniLM, whisper tiny.en and
the Piper voice joe) it serves them and checks a greedy chat answer, embeddings, speech synthesis and the
transcription of that speech, and prints /v1/stats' hardware line, which must name the CPU variant in use when
the bundle carries CPU variants, and where the chat model runs (/v1/models' devices and layers offloaded), which
--expect-device NAME requires to be a device whose name starts with NAME (Vulkan, CUDA, Metal);
--expect-variant NAME requires the hardware line's CPU variant to be NAME (installer/linux/oldcpu_smoke.sh),
--expect-excluded "NAME: WHY" that variant passed over for that reason (installer/linux/faulty_variant_smoke.sh).
Standard library only: it runs beside a bundle, with whatever python the build machine has.

Usage: installer/smoke_test.py PATH/TO/llamadesk [--models DIR] [--expect-device NAME] [--expect-variant NAME]
                               [--expect-excluded "NAME: WHY"] [-- MORE LLAMADESK FLAGS]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

# the file names app/pypi_models.py gives the starter set (and tests/assets/prepare.py the test assets)
CHAT_FILE, EMBED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf", "all-MiniLM-L6-v2-f16.gguf"
ASR_DIR, TTS_DIR = "whisper-tiny.en", "piper-en_US-joe-medium"
READY_S = 180  # a cold start on a slow CI runner: Qt-free import, model loads, speech workers
STOP_S = 60


class SmokeFailure(Exception):
    """A check that the running bundle did not pass."""


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(url: str, body: bytes | None = None, content_type: str = "application/json") -> tuple[int, bytes]:
    """(status, body) of a GET, or of a POST when body is given; an HTTP error status is returned, not raised."""
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_json(url: str, payload: dict) -> dict:
    """The JSON answer of a POST that must succeed."""
    status, body = request(url, json.dumps(payload).encode())
    if status != 200:
        raise SmokeFailure(f"POST {url}: {status} {body[:500]!r}")
    return json.loads(body)


def get_json(url: str) -> dict:
    """The JSON answer of a GET that must succeed."""
    status, body = request(url)
    if status != 200:
        raise SmokeFailure(f"GET {url}: {status} {body[:500]!r}")
    return json.loads(body)


def roster(models: Path) -> str:
    """The config file serving the starter set's files in models (JSON strings are TOML basic strings)."""
    def path(name: str) -> str:
        found = models / name
        if not found.exists():
            raise SmokeFailure(f"{found} is missing: --models needs the starter set's files")
        return json.dumps(str(found))
    return (f"asr = {path(ASR_DIR)}\ntts = {path(TTS_DIR)}\n\n"
            f'[[models]]\nname = "smollm2"\npath = {path(CHAT_FILE)}\ndefault = true\n\n'
            f'[[models]]\nname = "minilm"\npath = {path(EMBED_FILE)}\n')


# platformdirs reads the XDG variables on Linux (and, in its recent versions, on macOS) and the WIN_PD_OVERRIDE_
# ones on Windows, where it otherwise asks the shell for the folders
DIR_VARIABLES = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME",
                 "WIN_PD_OVERRIDE_APPDATA", "WIN_PD_OVERRIDE_LOCAL_APPDATA")


def private_dirs(base: Path) -> dict[str, str]:
    """Environment that points the bundle's settings, data and caches (platformdirs) at base, not the user's."""
    env = dict(os.environ)
    for name in DIR_VARIABLES:
        (base / name).mkdir()
        env[name] = str(base / name)
    return env


def wait_ready(proc: subprocess.Popen, base: str, expected: str) -> float:
    """Seconds until /health answers with status expected; fails when the process exits or time runs out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < READY_S:
        if proc.poll() is not None:
            raise SmokeFailure(f"llamadesk exited with {proc.returncode} before serving")
        try:
            status, body = request(f"{base}/health")
        except OSError:  # not listening yet
            time.sleep(0.25)
            continue
        state = json.loads(body).get("status") if status == 200 else None
        if state == expected:
            return time.monotonic() - t0
        time.sleep(0.25)  # "loading" until the roster is up
    raise SmokeFailure(f"/health did not say {expected!r} within {READY_S} s")


def check_setup_mode(base: str) -> None:
    """Nothing configured: the catalog is there to pick from and chat says 503 until a model is."""
    if "entries" not in get_json(f"{base}/catalog"):
        raise SmokeFailure("/catalog has no 'entries'")
    status, body = request(f"{base}/v1/chat/completions", json.dumps({"messages": [{"role": "user",
                                                                                    "content": "hi"}]}).encode())
    if status != 503:
        raise SmokeFailure(f"chat in setup mode answered {status}, not 503: {body[:300]!r}")


def check_chat(base: str) -> str:
    """SmolLM2's greedy answer, which names the capital."""
    reply = post_json(f"{base}/v1/chat/completions", {
        "model": "smollm2", "temperature": 0, "max_tokens": 32,
        "messages": [{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "What is the capital of France?"}]})
    text = reply["choices"][0]["message"]["content"]
    if "paris" not in text.lower():
        raise SmokeFailure(f"chat answered {text!r}, which does not name Paris")
    return text


def check_embeddings(base: str) -> int:
    """Two finite, non-zero MiniLM vectors of one dimension; returns it."""
    data = post_json(f"{base}/v1/embeddings", {"model": "minilm", "input": ["hello", "world"]})["data"]
    vectors = [item["embedding"] for item in data]
    if len(vectors) != 2 or len({len(v) for v in vectors}) != 1:
        raise SmokeFailure(f"embeddings: {len(vectors)} vectors of lengths {[len(v) for v in vectors]}")
    if not all(math.isfinite(x) for v in vectors for x in v) or not all(any(v) for v in vectors):
        raise SmokeFailure("embeddings hold non-finite or all-zero vectors")
    return len(vectors[0])


def multipart(field: str, filename: str, data: bytes, mime: str) -> tuple[bytes, str]:
    """A multipart/form-data body with one file part, and its content type."""
    boundary = uuid.uuid4().hex
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
            f"Content-Type: {mime}\r\n\r\n").encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def check_speech(base: str) -> str:
    """Synthesize a phrase and transcribe it back: what whisper heard."""
    status, wav = request(f"{base}/v1/audio/speech", json.dumps({"input": "Hello world.",
                                                                  "response_format": "wav"}).encode())
    if status != 200 or not wav.startswith(b"RIFF"):
        raise SmokeFailure(f"speech: {status}, {len(wav)} bytes starting {wav[:16]!r}")
    body, content_type = multipart("file", "speech.wav", wav, "audio/wav")
    status, answer = request(f"{base}/v1/audio/transcriptions", body, content_type)
    if status != 200:
        raise SmokeFailure(f"transcription: {status} {answer[:300]!r}")
    heard = json.loads(answer)["text"]
    # Piper's voice varies from one synthesis to the next, and whisper tiny has heard "of the world.": a word of it
    if not {"hello", "world"} & set(heard.lower().replace(".", " ").replace(",", " ").split()):
        raise SmokeFailure(f"the transcription of 'Hello world.' is {heard!r}")
    return heard


def check_served(base: str) -> None:
    """Every model of the starter set answers."""
    print(f"  chat: {check_chat(base)!r}")
    print(f"  embeddings: 2 vectors of {check_embeddings(base)}")
    print(f"  speech round trip: {check_speech(base)!r}")


def check_hardware(base: str, exe: Path, expect_variant: str | None = None, expect_excluded: str | None = None) -> str:
    """/v1/stats' hardware line; a bundle that carries CPU variants must name the one it chose (expect_variant:
    that one; expect_excluded: "name: why" of a variant it passed over)."""
    line = get_json(f"{base}/v1/stats").get("hardware") or ""
    # a macOS .app keeps its executable in Contents/MacOS and the libraries in Contents/Frameworks
    root = exe.parent.parent if exe.parent.name == "MacOS" else exe.parent
    carried = sorted(p.name for p in root.rglob("*ggml-cpu-*"))
    if carried and "CPU variant " not in line:
        raise SmokeFailure(f"the bundle carries {len(carried)} CPU variants, and /v1/stats names none: {line!r}")
    # "…; CPU variant sse42; …" or, with a note or exclusions, "…; CPU variant zen4 (excluded: …); …"
    if expect_variant and not re.search(rf"; CPU variant {re.escape(expect_variant)}[ ;]", line):
        raise SmokeFailure(f"the CPU variant in use is not {expect_variant}: {line!r}")
    if expect_excluded and not ("(excluded: " in line and expect_excluded in line.split("(excluded: ", 1)[1]):
        raise SmokeFailure(f"no CPU variant was excluded as {expect_excluded!r}: {line!r}")
    return line


def check_placement(base: str, expect: str | None) -> str:
    """Where the chat model runs, as /v1/models says; with expect, every layer must be on a device named so
    (the devices list ends with "CPU", which holds the token embeddings and the layers left)."""
    card = get_json(f"{base}/v1/models/smollm2")
    devices, layers = card.get("devices", []), card.get("gpu_layers", {})
    where = f"{', '.join(devices)} ({layers.get('offloaded')}/{layers.get('total')} layers offloaded)"
    if expect and not (devices and devices[0].startswith(expect) and layers.get("offloaded") == layers.get("total")):
        raise SmokeFailure(f"the chat model runs on {where}, not all on a {expect} device")
    return where


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM is a clean shutdown that exits 0 on POSIX; Windows has no such signal, only termination."""
    if sys.platform == "win32":
        proc.terminate()
        proc.wait(STOP_S)
        return
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SmokeFailure(f"llamadesk did not exit within {STOP_S} s of SIGTERM") from None
    if code != 0:
        raise SmokeFailure(f"llamadesk exited with {code} after SIGTERM")


def run(exe: Path, models: Path | None, extra: list[str], work: Path, expect_device: str | None = None,
        expect_variant: str | None = None, expect_excluded: str | None = None) -> None:
    """Start exe, check it, stop it; raises SmokeFailure."""
    config = work / "llamadesk.toml"
    config.write_text(roster(models) if models else "")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (work / "llamadesk.log").open("wb")
    proc = subprocess.Popen([str(exe), "--no-gui", "--config", str(config), "--port", str(port), *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=private_dirs(work))
    try:
        ready_s = wait_ready(proc, base, "ok" if models else "setup")
        print(f"  ready in {ready_s:.1f} s")
        if models:
            check_served(base)
            print(f"  chat model on: {check_placement(base, expect_device)}")
        else:
            check_setup_mode(base)
        print(f"  hardware: {check_hardware(base, exe, expect_variant, expect_excluded)}")
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def main(argv: list[str] | None = None) -> int:
    """Run the smoke test; 0 when every check passed, 1 (with the server's log) when one did not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="flags after -- go to llamadesk")
    parser.add_argument("exe", type=Path, help="the built llamadesk executable")
    parser.add_argument("--models", type=Path, help="a folder with the starter set's files (SmolLM2, MiniLM, ...)")
    parser.add_argument("--expect-device", metavar="NAME",
                        help="fail unless every layer of the chat model runs on a device whose name starts with NAME")
    parser.add_argument("--expect-variant", metavar="NAME", help="fail unless llama.cpp runs the CPU variant NAME")
    parser.add_argument("--expect-excluded", metavar="NAME: WHY",
                        help="fail unless the CPU variant NAME was passed over, for the reason WHY")
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    print(f"smoke test of {args.exe}" + (f" serving {args.models}" if args.models else " in setup mode"))
    with tempfile.TemporaryDirectory(prefix="llamadesk-smoke-") as tmp:
        try:
            if args.expect_device and not args.models:
                raise SmokeFailure("--expect-device needs --models: setup mode serves no model")
            run(args.exe.resolve(), args.models and args.models.resolve(), extra, Path(tmp), args.expect_device,
                args.expect_variant, args.expect_excluded)
        except (SmokeFailure, OSError, KeyError, ValueError, subprocess.SubprocessError) as e:
            print(f"smoke test FAILED: {e}\n--- llamadesk log ---", file=sys.stderr)
            log = Path(tmp) / "llamadesk.log"
            print(log.read_text(errors="replace")[-8000:] if log.exists() else "(none)", file=sys.stderr)
            return 1
    print(f"smoke test passed ({args.exe})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
