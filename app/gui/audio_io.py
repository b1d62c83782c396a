"""Playing and recording audio in the app (QtMultimedia), when the platform has it.

QtMultimedia comes with PySide6-Addons and needs the system's audio stack (PulseAudio/PipeWire on
Linux); without them the Speech studio still synthesizes, saves, opens and transcribes files, and its
Play/Record buttons say why they are off.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
from PySide6.QtCore import QBuffer, QIODevice, QObject, QUrl, Signal
from PySide6.QtWidgets import QPushButton

from engine.speech.audio import encode

log = logging.getLogger("llamadesk.gui")

try:
    from PySide6.QtMultimedia import QAudioFormat, QAudioOutput, QAudioSource, QMediaDevices, QMediaPlayer
    UNAVAILABLE: str | None = None
except ImportError as e:  # no QtMultimedia, or no system audio library
    UNAVAILABLE = f"audio playback and recording are off: {e}"


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A 16-bit WAV file of samples."""
    return encode(samples, rate, "wav")[0]


class AudioIO(QObject):
    """One player and one microphone recorder for the whole app."""

    recorded = Signal(bytes)  # a WAV file of what was recorded
    problem = Signal(str)
    devices_changed = Signal()  # a microphone or speaker came or went (the buttons follow)

    def __init__(self) -> None:
        super().__init__()
        self._player = None
        self._source = None
        self._buffer: QBuffer | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="llamadesk-audio-"))
        self._devices = None
        if UNAVAILABLE is None:
            self._devices = QMediaDevices(self)
            self._devices.audioInputsChanged.connect(self.devices_changed)
            self._devices.audioOutputsChanged.connect(self.devices_changed)

    def why_not(self, what: str) -> str | None:
        """Why `what` ("play" or "record") cannot happen now, or None when it can."""
        if UNAVAILABLE:
            return UNAVAILABLE
        if what == "record" and QMediaDevices.defaultAudioInput().isNull():
            return "no microphone found (is a sound server such as PipeWire or PulseAudio running?)"
        if what == "play" and QMediaDevices.defaultAudioOutput().isNull():
            return "no audio output device found (is a sound server such as PipeWire or PulseAudio running?)"
        return None

    @property
    def can_play(self) -> bool:
        return self.why_not("play") is None

    @property
    def can_record(self) -> bool:
        return self.why_not("record") is None

    def play(self, wav: bytes) -> None:
        """Play a WAV file (replacing whatever plays)."""
        if (why := self.why_not("play")) is not None:
            self.problem.emit(why)
            return
        if self._player is None:
            self._player = QMediaPlayer(self)
            self._output = QAudioOutput(self)
            self._player.setAudioOutput(self._output)
        path = self._tmp / "playback.wav"
        path.write_bytes(wav)
        self._player.stop()
        self._player.setSource(QUrl.fromLocalFile(str(path)))
        self._player.play()

    def start_recording(self) -> bool:
        """Record 16 kHz mono from the default microphone until stop_recording()."""
        if (why := self.why_not("record")) is not None:
            self.problem.emit(why)
            return False
        device = QMediaDevices.defaultAudioInput()
        fmt = QAudioFormat()
        fmt.setSampleRate(16000)
        fmt.setChannelCount(1)
        fmt.setSampleFormat(QAudioFormat.SampleFormat.Int16)
        self._buffer = QBuffer(self)  # owns its bytes (a QByteArray passed in would have to outlive it)
        self._buffer.open(QIODevice.OpenModeFlag.WriteOnly)
        self._source = QAudioSource(device, fmt, self)
        self._source.start(self._buffer)
        return True

    def stop_recording(self) -> None:
        """Stop and emit `recorded` with the take as a WAV file."""
        if self._source is None:
            return
        self._source.stop()
        pcm = bytes(self._buffer.data())
        self._source = None
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768
        self.recorded.emit(wav_bytes(samples, 16000))

    @property
    def recording(self) -> bool:
        return self._source is not None


class RecordButton(QPushButton):
    """Starts and stops a recording from the default microphone (AudioIO.recorded follows); off, with the
    reason as its tooltip, while there is no microphone, and on again when one appears."""

    def __init__(self, audio_io: AudioIO, idle: str, busy: str, tooltip: str):
        super().__init__(idle)
        self.audio_io, self.idle, self.busy, self.tooltip = audio_io, idle, busy, tooltip
        self.clicked.connect(self.toggle)
        audio_io.devices_changed.connect(self.follow_devices)
        self.follow_devices()

    def follow_devices(self) -> None:
        why = self.audio_io.why_not("record")
        self.setEnabled(why is None or self.audio_io.recording)
        self.setToolTip(why or self.tooltip)

    def toggle(self) -> None:
        if self.audio_io.recording:
            self.audio_io.stop_recording()
            self.setText(self.idle)
        elif self.audio_io.start_recording():
            self.setText(self.busy)
