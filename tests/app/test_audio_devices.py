"""The app's microphone and speaker path (QtMultimedia) against a real sound server: a private PulseAudio
with a virtual speaker and microphone. Spoken Piper audio goes in through the microphone and comes out of
the speaker, and whisper must read back the same words both ways.

This needs PulseAudio itself on the machine (Debian: `pulseaudio`, `pulseaudio-utils`, `libpulse0`), which
the package registries `make test` installs from cannot provide; without it the test says so and skips.
"""
from __future__ import annotations

import asyncio
import ctypes.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.speech.audio import decode, encode
from engine.speech.asr import AsrService
from engine.speech.tts import TtsService
from tests.server.test_speech import wer

TEXT = "Please open the window and close the door."
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not (shutil.which("pulseaudio") and shutil.which("pactl") and shutil.which("paplay")
         and ctypes.util.find_library("pulse")),
    reason="needs a PulseAudio server and libpulse (Debian: pulseaudio pulseaudio-utils libpulse0)")


@pytest.fixture
def sound_server(tmp_path):
    """A private PulseAudio with one sink, `speaker` (null), and no microphone yet (the probe plugs one in)."""
    runtime = tmp_path / "pulse"
    runtime.mkdir()
    env = {**os.environ, "PULSE_RUNTIME_PATH": str(runtime), "HOME": str(tmp_path),
           "PULSE_SERVER": f"unix:{runtime}/native"}
    log = open(tmp_path / "pulse.log", "wb")
    daemon = subprocess.Popen(
        ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no", "--log-target=stderr",
         "-L", "module-native-protocol-unix auth-anonymous=1",
         "-L", "module-null-sink sink_name=speaker sink_properties=device.description=Speaker"],
        env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 20
    while subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode != 0:
        assert daemon.poll() is None and time.monotonic() < deadline, (tmp_path / "pulse.log").read_text()
        time.sleep(0.1)
    subprocess.run(["pactl", "set-default-sink", "speaker"], env=env, check=True)
    yield env
    daemon.terminate()
    daemon.wait(10)
    log.close()


def test_microphone_and_speaker_carry_speech_both_ways(assets, sound_server, tmp_path):
    async def speak():
        tts = TtsService(assets["piper"])
        try:
            return await tts.synthesize(TEXT)
        finally:
            tts.pool.close()
    samples, rate = asyncio.run(speak())
    speech = tmp_path / "speech.wav"
    speech.write_bytes(encode(samples, rate, "wav")[0])

    probe = subprocess.run([sys.executable, "-m", "tests.app.audio_devices_probe", str(speech), str(tmp_path)],
                           cwd=ROOT, env=sound_server, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert not result["before_plug"]["can_record"] and "no microphone" in result["before_plug"]["why"], result
    assert result["devices_changed"] >= 1, result  # a microphone plugged in while running is noticed
    assert result["can_record"] and result["can_play"] and result["started"], result
    assert result["problems"] == [], result

    async def transcribe(path: Path) -> str:
        asr = AsrService(assets["whisper"], 1, None)
        try:
            return (await asr.transcribe(decode(path.read_bytes(), 16000), segments=False)).text
        finally:
            asr.pool.close()
    heard_by_mic = asyncio.run(transcribe(tmp_path / "recorded.wav"))
    heard_from_speaker = asyncio.run(transcribe(tmp_path / "played.wav"))
    assert wer(TEXT, heard_by_mic) <= 0.1, heard_by_mic
    assert wer(TEXT, heard_from_speaker) <= 0.1, heard_from_speaker

