"""Speech studio: text to speech (voice, speed, play, save) and speech to text (open a file or record,
waveform with the VAD's speech spans, transcript with timestamps, export srt/vtt)."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFileDialog, QGroupBox, QHBoxLayout, QHeaderView, QLabel,
                               QPlainTextEdit, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.gui.audio_io import RecordButton
from app.gui.panels.elided import breakable
from app.gui.theme import icon
from engine.speech import audio
from engine.speech.tts import OPENAI_VOICES
from engine.speech.subtitles import subtitles


class SpeechPanel(QWidget):
    """Both directions of speech, through the same facade as /v1/audio/*."""

    def __init__(self, bridge, audio_io):
        super().__init__()
        self.bridge = bridge
        self.audio_io = audio_io
        self.last_speech: dict | None = None
        self.transcript: dict | None = None
        self._pending: set[str] = set()

        # text to speech
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("Text to speak")
        self.voice = QComboBox()
        self.speed = QDoubleSpinBox()
        self.speed.setRange(0.25, 4.0)
        self.speed.setSingleStep(0.05)
        self.speed.setValue(1.0)
        self.format = QComboBox()
        self.format.addItems(list(audio.FORMATS))
        self.speak_button = QPushButton(icon("panels-speak"), "Speak")
        self.save_button = QPushButton(icon("panels-save"), "Save…")
        self.speak_button.clicked.connect(self.speak)
        self.save_button.clicked.connect(self.ask_save)
        tts_row = QHBoxLayout()
        for label, w in (("voice", self.voice), ("speed", self.speed), ("format", self.format)):
            tts_row.addWidget(QLabel(label))
            tts_row.addWidget(w)
        tts_row.addStretch(1)
        tts_row.addWidget(self.speak_button)
        tts_row.addWidget(self.save_button)
        tts_box = QGroupBox("Text to speech")
        tts_layout = QVBoxLayout(tts_box)
        tts_layout.addWidget(self.text)
        tts_layout.addLayout(tts_row)

        # speech to text
        self.open_button = QPushButton(icon("panels-open"), "Open audio…")
        self.record_button = RecordButton(audio_io, "Record", "Stop recording",
                                          "Record from the default microphone; press again to stop and transcribe")
        self.use_speech_button = QPushButton("Transcribe what was spoken above")
        self.export_srt = QPushButton(icon("panels-save"), "Export .srt…")
        self.export_vtt = QPushButton(icon("panels-save"), "Export .vtt…")
        self.open_button.clicked.connect(self.ask_open)
        self.use_speech_button.clicked.connect(self.transcribe_last_speech)
        self.export_srt.clicked.connect(lambda: self.ask_export("srt"))
        self.export_vtt.clicked.connect(lambda: self.ask_export("vtt"))
        audio_io.problem.connect(self.status_problem)
        self.wave = pg.PlotWidget()
        self.wave.setBackground(None)
        self.wave.setMouseEnabled(False, False)
        self.wave.hideButtons()
        self.wave.setMinimumHeight(140)
        self.wave.getPlotItem().setLabel("bottom", "seconds")
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["start", "end", "text"])
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.status = QLabel()
        self.status.setWordWrap(True)
        asr_row = QHBoxLayout()
        for b in (self.open_button, self.record_button, self.use_speech_button):
            asr_row.addWidget(b)
        asr_row.addStretch(1)
        asr_row.addWidget(self.export_srt)
        asr_row.addWidget(self.export_vtt)
        asr_box = QGroupBox("Speech to text")
        asr_layout = QVBoxLayout(asr_box)
        asr_layout.addLayout(asr_row)
        asr_layout.addWidget(self.wave)
        asr_layout.addWidget(self.table, 1)

        layout = QVBoxLayout(self)
        layout.addWidget(tts_box)
        layout.addWidget(asr_box, 1)
        layout.addWidget(self.status)
        bridge.speech_ready.connect(self.on_speech_ready)
        bridge.transcript_started.connect(self.on_transcript_started)
        bridge.transcript_segment.connect(self.on_transcript_segment)
        bridge.transcript_ready.connect(self.on_transcript_ready)
        bridge.speech_error.connect(self.on_speech_error)
        bridge.models_changed.connect(self.refresh)
        bridge.reloaded.connect(self.refresh)
        audio_io.recorded.connect(self.on_recorded)
        audio_io.problem.connect(self.status.setText)
        self.refresh()

    def refresh(self) -> None:
        served = self.bridge.speech_models()
        tts, asr = served["tts"], served["asr"]
        self.voice.clear()
        if tts is not None:
            self.voice.addItems(tts + [v for v in OPENAI_VOICES])
        for w in (self.speak_button, self.save_button, self.voice):
            w.setEnabled(tts is not None)
        for w in (self.open_button, self.use_speech_button):
            w.setEnabled(asr is not None)
        missing = [k for k, s in (("text-to-speech", tts), ("speech-to-text", asr)) if s is None]
        self.status.setText(f"no {' or '.join(missing)} model loaded: start with --tts / --asr or use the Catalog"
                            if missing else "")

    # ---- text to speech ----------------------------------------------------------------------

    def speak(self, then_save: str | None = None) -> str | None:
        text = self.text.toPlainText().strip()
        if not text:
            return None
        rid = self.bridge.synthesize(text, self.voice.currentText() or None, self.speed.value())
        self._pending.add(rid)
        self._save_to = then_save
        self.status.setText("synthesizing…")
        return rid

    def on_speech_ready(self, rid: str, result: dict) -> None:
        if rid not in self._pending:
            return
        self._pending.discard(rid)
        self.last_speech = result
        seconds = len(result["samples"]) / result["rate"]
        self.status.setText(f"{seconds:.1f} s of speech")
        if self._save_to:
            data, _ = audio.encode(result["samples"], result["rate"], self.format.currentText())
            with open(self._save_to, "wb") as f:
                f.write(data)
            self.status.setText(breakable(f"saved {seconds:.1f} s to {self._save_to}"))
        elif self.audio_io.can_play:
            self.audio_io.play(result["wav"])
        else:
            self.status.setText(f"{seconds:.1f} s of speech (not played: {self.audio_io.why_not('play')}; Save… keeps it)")

    def ask_save(self) -> None:
        fmt = self.format.currentText()
        dlg = QFileDialog(self, "Save speech", f"speech.{fmt}")
        dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dlg.fileSelected.connect(lambda path: self.speak(then_save=path))
        dlg.open()

    # ---- speech to text ----------------------------------------------------------------------

    def transcribe_bytes(self, data: bytes) -> str:
        rid = self.bridge.transcribe(data)
        self._pending.add(rid)
        self.status.setText("transcribing…")
        return rid

    def transcribe_last_speech(self) -> None:
        if self.last_speech is not None:
            self.transcribe_bytes(self.last_speech["wav"])

    def ask_open(self) -> None:
        dlg = QFileDialog(self, "Open audio", "", "Audio (*.wav *.mp3 *.m4a *.mp4 *.ogg *.opus *.flac *.webm);;All (*)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(lambda path: self.transcribe_bytes(open(path, "rb").read()))
        dlg.open()

    def status_problem(self, message: str) -> None:
        if self.isVisible():
            self.status.setText(message)

    def on_recorded(self, wav: bytes) -> None:
        if self.isVisible():
            self.transcribe_bytes(wav)

    def on_transcript_started(self, rid: str, found: dict) -> None:
        """The waveform and its speech spans at once; the transcript fills in span by span."""
        if rid not in self._pending:
            return
        samples = found["samples"]
        step = max(1, len(samples) // 4000)  # enough points for the width of a window
        self.wave.clear()
        self.wave.plot(np.arange(0, len(samples), step) / 16000, samples[::step], pen=pg.mkPen("#5b6cff"))
        for start, end in found["spans"]:
            region = pg.LinearRegionItem((start, end), movable=False, brush=pg.mkBrush(46, 204, 113, 60))
            self.wave.addItem(region)
        self.table.setRowCount(0)
        self.status.setText(f"{found['duration']:.1f} s, {_count(len(found['spans']), 'speech span')}: transcribing…")

    def on_transcript_segment(self, rid: str, segment: dict) -> None:
        if rid not in self._pending:
            return
        r = self.table.rowCount()
        self.table.setRowCount(r + 1)
        for c, text in enumerate((f"{segment['start']:.2f}", f"{segment['end']:.2f}", segment["text"])):
            self.table.setItem(r, c, QTableWidgetItem(text))
        self.table.scrollToBottom()

    def on_transcript_ready(self, rid: str, result: dict) -> None:
        if rid not in self._pending:
            return
        self._pending.discard(rid)
        self.transcript = result
        segs = result["segments"]
        self.status.setText(f"{result['duration']:.1f} s, {_count(len(result['spans']), 'speech span')}, "
                            f"{_count(len(segs), 'segment')}")

    def on_speech_error(self, rid: str, message: str) -> None:
        if rid in self._pending:
            self._pending.discard(rid)
            self.status.setText(message)

    def subtitles(self, fmt: str) -> str:
        return subtitles(self.transcript["segments"], fmt) if self.transcript else ""

    def ask_export(self, fmt: str) -> None:
        if not self.transcript:
            return
        dlg = QFileDialog(self, f"Export .{fmt}", f"transcript.{fmt}")
        dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dlg.fileSelected.connect(lambda path: open(path, "w", encoding="utf-8").write(self.subtitles(fmt)))
        dlg.open()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
