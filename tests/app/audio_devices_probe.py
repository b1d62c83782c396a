"""Run in its own process by test_audio_devices.py, against a private PulseAudio with a virtual
speaker (a null sink) and a virtual microphone (that sink's monitor, remapped as a source):

1. start with no microphone, then plug one in (load the remap source) and see AudioIO notice it;
2. record from the default microphone with the app's AudioIO while `paplay` speaks into the speaker;
3. play a clip with AudioIO while `parecord` listens to the speaker.

Writes recorded.wav, played.wav and result.json into the folder given on the command line.
Usage: python -m tests.app.audio_devices_probe SPEECH_WAV OUT_DIR
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> None:
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    speech, out = Path(sys.argv[1]), Path(sys.argv[2])
    app = QApplication([])
    from app.gui.audio_io import AudioIO
    audio_io = AudioIO()
    result: dict = {"problems": []}
    audio_io.problem.connect(result["problems"].append)
    takes: list[bytes] = []
    audio_io.recorded.connect(takes.append)
    changes: list[int] = []
    audio_io.devices_changed.connect(lambda: changes.append(1))

    def spin(seconds: float) -> None:  # keep the event loop running, as the app does
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    def wait_for(proc: subprocess.Popen) -> None:
        while proc.poll() is None:
            spin(0.05)

    result["before_plug"] = {"can_record": audio_io.can_record, "why": audio_io.why_not("record")}
    subprocess.run(["pactl", "load-module", "module-remap-source", "master=speaker.monitor", "source_name=mic",
                    "source_properties=device.description=Mic"], check=True, capture_output=True)
    subprocess.run(["pactl", "set-default-source", "mic"], check=True)
    deadline = time.monotonic() + 10
    while not changes and time.monotonic() < deadline:
        spin(0.05)
    result["devices_changed"] = len(changes)
    result["can_record"], result["can_play"] = audio_io.can_record, audio_io.can_play
    result["started"] = audio_io.start_recording()
    spin(0.3)
    wait_for(subprocess.Popen(["paplay", str(speech)]))
    spin(0.5)
    audio_io.stop_recording()
    if takes:
        (out / "recorded.wav").write_bytes(takes[0])

    listener = subprocess.Popen(["parecord", "--device=speaker.monitor", "--rate=16000", "--channels=1",
                                 "--format=s16le", "--file-format=wav", str(out / "played.wav")])
    spin(0.3)
    audio_io.play(speech.read_bytes())
    spin(0.2)
    deadline = time.monotonic() + 30
    from PySide6.QtMultimedia import QMediaPlayer
    while audio_io._player.playbackState() == QMediaPlayer.PlaybackState.PlayingState and time.monotonic() < deadline:
        spin(0.05)
    spin(0.5)
    listener.terminate()
    listener.wait()

    (out / "result.json").write_text(json.dumps(result))
    app.quit()


if __name__ == "__main__":
    main()
