"""Chat: a streaming transcript rendered as Markdown, every sampling knob, Stop, save/load."""
from __future__ import annotations

import json
import re

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPlainTextEdit, QPushButton, QSpinBox, QSplitter, QTextBrowser,
                               QVBoxLayout, QWidget)

from app.gui.audio_io import RecordButton
from engine.requests import SamplingParams

THINK = re.compile(r"<think>(.*?)(</think>|$)", re.S)


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply whose thinking is wrapped in <think>...</think>."""
    m = THINK.search(text)
    if not m:
        return "", text
    return m.group(1).strip(), (text[:m.start()] + text[m.end():]).strip()


class ChatPanel(QWidget):
    """Talk to a served model through the same facade the HTTP routes use."""

    def __init__(self, bridge, audio_io=None):
        super().__init__()
        self.bridge = bridge
        self.audio_io = audio_io
        self._speech_ids: set[str] = set()
        self.messages: list[dict] = []  # {"role", "content", "meta"}
        self.current: str | None = None  # the running chat id
        self.expanded: set[int] = set()

        self.model = QComboBox()
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional)")
        self.system.setMaximumHeight(70)
        self.transcript = QTextBrowser()
        self.transcript.setOpenLinks(False)
        self.transcript.anchorClicked.connect(self.on_anchor_clicked)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText("Message (Ctrl+Enter to send, Esc to stop)")
        self.input.setMaximumHeight(110)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        mic_tip = "Record a message (transcribed with the speech-to-text model)"
        self.mic_button = RecordButton(audio_io, "🎤", "■", mic_tip) if audio_io else QPushButton("🎤", enabled=False)
        self.speaker_button = QPushButton("🔊")
        self.speaker_button.setToolTip("Read the last reply aloud (text-to-speech model)")
        self.speaker_button.clicked.connect(self.read_aloud)
        self.status = QLabel()
        new = QPushButton("New chat")
        copy = QPushButton("Copy")
        save = QPushButton("Save…")
        load = QPushButton("Load…")
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        new.clicked.connect(self.new_chat)
        copy.clicked.connect(self.copy_transcript)
        save.clicked.connect(self.ask_save)
        load.clicked.connect(self.ask_load)
        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence("Ctrl+Enter"), self, activated=self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop)

        # every sampling knob the server takes
        self.temperature = _dspin(0, 2, 0.05, 0.7)
        self.top_p = _dspin(0, 1, 0.05, 1.0)
        self.top_k = _spin(0, 1000, 0)
        self.min_p = _dspin(0, 1, 0.01, 0.0)
        self.repeat_penalty = _dspin(0.01, 10, 0.05, 1.0)
        self.presence_penalty = _dspin(-2, 2, 0.1, 0.0)
        self.frequency_penalty = _dspin(-2, 2, 0.1, 0.0)
        self.seed = _spin(-1, 2**31 - 1, -1)
        self.seed.setSpecialValueText("random")
        self.max_tokens = _spin(1, 1_000_000, 512)
        self.stop_strings = QLineEdit()
        self.stop_strings.setPlaceholderText("stop strings, separated by |")
        knobs = QGroupBox("Sampling")
        form = QFormLayout(knobs)
        for label, w in (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k),
                         ("min_p", self.min_p), ("repeat penalty", self.repeat_penalty),
                         ("presence penalty", self.presence_penalty), ("frequency penalty", self.frequency_penalty),
                         ("seed", self.seed), ("max tokens", self.max_tokens), ("stop", self.stop_strings)):
            form.addRow(label, w)

        side = QWidget()
        side_layout = QVBoxLayout(side)
        side_layout.addWidget(QLabel("Model"))
        side_layout.addWidget(self.model)
        side_layout.addWidget(QLabel("System prompt"))
        side_layout.addWidget(self.system)
        side_layout.addWidget(knobs)
        side_layout.addStretch(1)

        buttons = QHBoxLayout()
        for b in (new, copy, save, load):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.status)
        send_row = QHBoxLayout()
        send_row.addWidget(self.input, 1)
        col = QVBoxLayout()
        col.addWidget(self.send_button)
        col.addWidget(self.stop_button)
        audio_row = QHBoxLayout()
        audio_row.addWidget(self.mic_button)
        audio_row.addWidget(self.speaker_button)
        col.addLayout(audio_row)
        send_row.addLayout(col)
        main = QWidget()
        main_layout = QVBoxLayout(main)
        main_layout.addLayout(buttons)
        main_layout.addWidget(self.transcript, 1)
        main_layout.addLayout(send_row)
        split = QSplitter()
        split.addWidget(main)
        split.addWidget(side)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        QVBoxLayout(self).addWidget(split)

        bridge.chat_delta.connect(self.on_chat_delta)
        bridge.chat_done.connect(self.on_chat_done)
        bridge.chat_error.connect(self.on_chat_error)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.speech_ready.connect(self.on_speech_ready)
        bridge.transcript_ready.connect(self.on_transcript_ready)
        if audio_io is not None:
            audio_io.recorded.connect(self.on_recorded)
        self.on_models_changed()

    # ---- building a request ----------------------------------------------------------------

    def sampling(self) -> SamplingParams:
        stops = [s for s in self.stop_strings.text().split("|") if s]
        return SamplingParams(
            max_tokens=self.max_tokens.value(), temperature=self.temperature.value(), top_p=self.top_p.value(),
            top_k=self.top_k.value(), min_p=self.min_p.value(), repeat_penalty=self.repeat_penalty.value(),
            presence_penalty=self.presence_penalty.value(), frequency_penalty=self.frequency_penalty.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(), stop=stops)

    def request_messages(self) -> list[dict]:
        """The conversation as OpenAI messages (system prompt first)."""
        out = []
        if self.system.toPlainText().strip():
            out.append({"role": "system", "content": self.system.toPlainText()})
        out += [{"role": m["role"], "content": m["content"]} for m in self.messages if m["content"]]
        return out

    def send(self) -> None:
        """Send the input box as a user message and stream the reply."""
        text = self.input.toPlainText().strip()
        if not text or self.current is not None:
            return
        self.input.clear()
        self.messages.append({"role": "user", "content": text, "meta": ""})
        messages = self.request_messages()
        self.messages.append({"role": "assistant", "content": "", "meta": "…"})
        self.current = self.bridge.chat(self.model.currentData(), messages, self.sampling())
        self.send_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.render()

    def stop(self) -> None:
        """Abort the running reply in the engine."""
        if self.current is not None:
            self.bridge.stop_chat(self.current)

    # ---- signals ---------------------------------------------------------------------------

    def on_chat_delta(self, cid: str, text: str) -> None:
        if cid == self.current:
            self.messages[-1]["content"] += text
            self.render()

    def on_chat_done(self, cid: str, info: dict) -> None:
        if cid != self.current:
            return
        usage = info.get("usage") or {}
        self.messages[-1]["meta"] = (f"{info['tok_s']} tok/s · {usage.get('completion_tokens', 0)} tokens · "
                                     f"{info['finish_reason']}")
        self._finish()

    def on_chat_error(self, cid: str, message: str) -> None:
        if cid == self.current:
            self.messages[-1]["meta"] = f"error: {message}"
            self._finish()

    def _finish(self) -> None:
        self.current = None
        self.send_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.status.setText(self.messages[-1]["meta"])
        self.render()

    def on_models_changed(self) -> None:
        current = self.model.currentData()
        self.model.clear()
        for m in self.bridge.models():
            if m.get("kind") == "llm":  # speech and embedding models do not chat; an unloaded one loads on send
                note = " (default)" if m["default"] else (" (not loaded)" if m["state"] != "loaded" else "")
                self.model.addItem(m["id"] + note, m["id"])
        idx = self.model.findData(current)
        if idx >= 0:
            self.model.setCurrentIndex(idx)

    # ---- voice ---------------------------------------------------------------------------------

    def on_recorded(self, wav: bytes) -> None:
        if self.isVisible():
            self.transcribe_into_input(wav)

    def transcribe_into_input(self, wav: bytes) -> str:
        """Speech to text into the input box (the mic button's second half)."""
        rid = self.bridge.transcribe(wav)
        self._speech_ids.add(rid)
        return rid

    def on_transcript_ready(self, rid: str, result: dict) -> None:
        if rid in self._speech_ids:
            self._speech_ids.discard(rid)
            self.input.setPlainText(result["text"])

    def read_aloud(self) -> str | None:
        """Speak the last reply (its answer, not its reasoning)."""
        text = split_reasoning(self.reply_text())[1].strip()
        if not text:
            return None
        rid = self.bridge.synthesize(text[:4000])
        self._speech_ids.add(rid)
        return rid

    def on_speech_ready(self, rid: str, result: dict) -> None:
        if rid in self._speech_ids:
            self._speech_ids.discard(rid)
            self.last_speech = result
            if self.audio_io is not None and self.audio_io.can_play:
                self.audio_io.play(result["wav"])
            elif self.audio_io is not None:
                self.status.setText(f"not played: {self.audio_io.why_not('play')}")

    def on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == "think":
            i = int(url.path())
            self.expanded ^= {i}
            self.render()

    # ---- rendering -------------------------------------------------------------------------

    def reply_text(self) -> str:
        """The last assistant message as generated."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def render(self) -> None:
        parts = []
        for i, m in enumerate(self.messages):
            who = "You" if m["role"] == "user" else "Assistant"
            meta = f" · <small>{m['meta']}</small>" if m.get("meta") else ""
            body = m["content"]
            if m["role"] == "assistant":
                reasoning, answer = split_reasoning(body)
                if reasoning:
                    if i in self.expanded:
                        quoted = "\n".join("> " + ln for ln in reasoning.splitlines())
                        body = f"[▾ hide thinking](think:{i})\n\n{quoted}\n\n{answer}"
                    else:
                        body = f"[▸ thinking ({len(reasoning.split())} words)](think:{i})\n\n{answer}"
            parts.append(f"**{who}**{meta}\n\n{body}\n")
        bar = self.transcript.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        self.transcript.setMarkdown("\n---\n\n".join(parts))
        if at_end:
            bar.setValue(bar.maximum())

    # ---- conversation files -------------------------------------------------------------------

    def new_chat(self) -> None:
        self.stop()
        self.messages.clear()
        self.expanded.clear()
        self.render()

    def copy_transcript(self) -> None:
        QGuiApplication.clipboard().setText("\n\n".join(f"{m['role']}: {m['content']}" for m in self.messages))

    def to_json(self) -> str:
        return json.dumps({"system": self.system.toPlainText(), "model": self.model.currentData(),
                           "messages": [{"role": m["role"], "content": m["content"]} for m in self.messages]},
                          indent=2, ensure_ascii=False)

    def from_json(self, text: str) -> None:
        doc = json.loads(text)
        self.system.setPlainText(doc.get("system", ""))
        self.messages = [{"role": m["role"], "content": m["content"], "meta": ""} for m in doc.get("messages", [])]
        self.render()

    def ask_save(self) -> None:
        dlg = QFileDialog(self, "Save conversation", "", "Conversations (*.json)")
        dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dlg.setDefaultSuffix("json")
        dlg.fileSelected.connect(lambda path: open(path, "w", encoding="utf-8").write(self.to_json()))
        dlg.open()  # never exec(): the qasync loop cannot re-enter

    def ask_load(self) -> None:
        dlg = QFileDialog(self, "Load conversation", "", "Conversations (*.json)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(lambda path: self.from_json(open(path, encoding="utf-8").read()))
        dlg.open()


def _dspin(lo: float, hi: float, step: float, value: float) -> QDoubleSpinBox:
    w = QDoubleSpinBox()
    w.setRange(lo, hi)
    w.setSingleStep(step)
    w.setDecimals(2)
    w.setValue(value)
    return w


def _spin(lo: int, hi: int, value: int) -> QSpinBox:
    w = QSpinBox()
    w.setRange(lo, hi)
    w.setValue(value)
    return w
