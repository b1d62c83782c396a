"""Chat: threads kept in the data dir, a streaming transcript (Markdown, code blocks with Copy), per-message copy,
regenerate and edit-and-resend, system prompt presets, every sampling knob, voice in and out, images for a model
with vision (attached from a file, dropped onto the chat or pasted; kept in the thread as data: URLs)."""
from __future__ import annotations

import base64
import json
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QImage, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QFrame,
                               QGroupBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QMessageBox,
                               QPlainTextEdit, QPushButton, QScrollArea, QSpinBox, QSplitter, QToolButton,
                               QVBoxLayout, QWidget)

from app.gui.audio_io import RecordButton
from app.gui.chatview import ChatView, Thumbnails, icon, split_reasoning
from app.gui.panels.elided import ElidedLabel
from app.gui.threads import Thread, ThreadStore
from engine.requests import SamplingParams

CUSTOM = "Custom"
PRESETS = {
    "None": "",
    "Helpful assistant": "You are a helpful assistant. Answer clearly and accurately.",
    "Concise": "Answer as briefly as possible: a sentence or a short list, no preamble.",
    "Programmer": "You are an expert programmer. Answer with working code in fenced code blocks and explain it "
                  "briefly.",
    "Translator": "Translate each of the user's messages into English. Reply with the translation only.",
}
NO_VISION = "the model has no vision"
IMAGE_FILES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
PANE_WIDTH = 860  # the panel's width from which the settings pane shows beside the transcript


def image_files(mime: QMimeData) -> list[str]:
    """The local image files mime names (files dragged from a file manager, or copied in one)."""
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile().lower().endswith(IMAGE_FILES)]


def carries_images(mime: QMimeData) -> bool:
    """Whether mime holds an image: image files, or image data (copied from an image viewer or a browser)."""
    return bool(image_files(mime)) or mime.hasImage()


def file_data_url(path: str) -> str:
    mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def png_data_url(image: QImage) -> str:
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(bytes(data)).decode()


class MessageInput(QPlainTextEdit):
    """The message box: text pastes and drops as usual; an image pasted or dropped onto it goes to the chat."""

    images_offered = Signal(QMimeData)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 (Qt's name)
        return carries_images(source) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802
        if carries_images(source):
            self.images_offered.emit(source)
        else:
            super().insertFromMimeData(source)


@dataclass
class _Reply:
    """The reply being generated: it is written into its own thread, also while another one is shown."""

    cid: str
    thread: int
    messages: list[dict]
    message: dict


class ChatPanel(QWidget):
    """Talk to a served model through the same facade the HTTP routes use."""

    def __init__(self, bridge, audio_io=None, store: ThreadStore | None = None):
        super().__init__()
        self.bridge = bridge
        self.audio_io = audio_io
        self.store = store if store is not None else ThreadStore()
        self.thread: Thread | None = None
        self.messages: list[dict] = []  # the shown thread's: {"role", "content", "meta"[, "images"]}
        self.reply: _Reply | None = None
        self.pending_images: list[str] = []  # data URLs for the next message
        self.last_speech: dict | None = None
        self._speech_ids: set[str] = set()
        self._applying_preset = False
        self._attached_names: list[str] = []
        self._pane_chosen = False  # the user showed or hid the settings pane (else it follows the width)

        self.transcript = ChatView()
        self.transcript.resend.connect(self.resend_edited)
        self.transcript.regenerate.connect(self.regenerate)
        self.status = ElidedLabel()
        self._render_timer = QTimer(self, singleShot=True, interval=40)  # a streamed reply redraws at most 25/s
        self._render_timer.timeout.connect(self.on_render_due)
        self._custom_timer = QTimer(self, singleShot=True, interval=500)
        self._custom_timer.timeout.connect(self.save_custom_prompt)

        self.settings_pane = self._build_settings()
        split = QSplitter()
        split.addWidget(self._build_threads())
        split.addWidget(self._build_conversation())
        split.addWidget(self.settings_pane)
        split.setChildrenCollapsible(False)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 3)
        split.setStretchFactor(2, 1)
        split.setSizes([190, 700, 260])
        QVBoxLayout(self).addWidget(split)

        QShortcut(QKeySequence("Ctrl+Return"), self, activated=self.send)
        QShortcut(QKeySequence("Ctrl+Enter"), self, activated=self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop)

        bridge.chat_delta.connect(self.on_chat_delta)
        bridge.chat_done.connect(self.on_chat_done)
        bridge.chat_error.connect(self.on_chat_error)
        bridge.models_changed.connect(self.on_models_changed)
        bridge.speech_ready.connect(self.on_speech_ready)
        bridge.speech_error.connect(self.on_speech_error)
        bridge.transcript_ready.connect(self.on_transcript_ready)
        bridge.quitting.connect(self.on_quitting)
        if audio_io is not None:
            audio_io.recorded.connect(self.on_recorded)
        self.on_models_changed()
        self.reopen_last_thread()
        if self.store.problem:
            self.status.setText(self.store.problem)

    # ---- building the panel ------------------------------------------------------------------

    def _build_threads(self) -> QWidget:
        self.new_button = QPushButton(icon("new"), "New chat")
        self.new_button.clicked.connect(self.new_chat)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(lambda _: self.refresh_threads())
        self.thread_list = QListWidget()
        self.thread_list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.thread_list.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                         | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.thread_list.currentItemChanged.connect(self.on_thread_selected)
        self.thread_list.itemChanged.connect(self.on_thread_renamed)
        self.no_match = QLabel("No chat matches")
        self.no_match.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.no_match.hide()
        self.rename_button = _tool("rename", "Rename the chat (or double-click it, or F2)")
        self.rename_button.clicked.connect(self.rename_current)
        self.delete_button = _tool("delete", "Delete the chat")
        self.delete_button.clicked.connect(self.ask_delete)
        for text, slot in (("Rename", self.rename_current), ("Delete", self.ask_delete)):
            action = QAction(text, self.thread_list)
            action.triggered.connect(slot)
            self.thread_list.addAction(action)
        self.thread_list.setContextMenuPolicy(Qt.ContextMenuPolicy.ActionsContextMenu)
        row = QHBoxLayout()
        row.addWidget(self.rename_button)
        row.addWidget(self.delete_button)
        row.addStretch(1)
        box = QWidget()
        box.setMinimumWidth(130)
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 4, 0)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.thread_list, 1)
        layout.addWidget(self.no_match)
        layout.addLayout(row)
        return box

    def _build_conversation(self) -> QWidget:
        copy = QPushButton(icon("copy"), "Copy all")
        copy.setToolTip("Copy the whole conversation")
        save = QPushButton("Export…")
        load = QPushButton("Import…")
        copy.clicked.connect(self.copy_transcript)
        save.clicked.connect(self.ask_save)
        load.clicked.connect(self.ask_load)
        self.settings_toggle = QToolButton()
        self.settings_toggle.setText("Parameters")
        self.settings_toggle.setCheckable(True)
        self.settings_toggle.setChecked(True)
        self.settings_toggle.setToolTip("Show or hide the model, system prompt and sampling settings")
        self.settings_toggle.clicked.connect(self.on_settings_toggle_clicked)
        top = QHBoxLayout()
        for b in (copy, save, load):
            top.addWidget(b)
        top.addStretch(1)
        top.addWidget(self.settings_toggle)

        self.input = MessageInput()
        self.input.setPlaceholderText("Message (Ctrl+Enter to send, Esc to stop)")
        self.input.images_offered.connect(self.offer_images)
        self.setAcceptDrops(True)  # an image dropped anywhere on the chat
        self.input.setMaximumHeight(110)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.attach_button = _icon_button("attach", NO_VISION)
        self.attach_button.clicked.connect(self.ask_attach)
        self.mic_button = self._mic_button()
        self.speaker_button = _icon_button("speak", "Read the last reply aloud (text-to-speech model)")
        self.speaker_button.clicked.connect(self.read_aloud)
        self.pending_view = Thumbnails(64)  # the images the next message takes: small, the transcript keeps room
        self.attachments = ElidedLabel()
        self.clear_attachments = QPushButton("Remove")
        self.clear_attachments.setToolTip("Send the next message without these images")
        self.clear_attachments.clicked.connect(self.on_clear_attachments)
        attach_row = QHBoxLayout()
        attach_row.addWidget(self.attachments, 1)
        attach_row.addWidget(self.clear_attachments)
        self.attach_box = QWidget()
        attach_col = QVBoxLayout(self.attach_box)
        attach_col.setContentsMargins(0, 0, 0, 0)
        attach_col.addWidget(self.pending_view)
        attach_col.addLayout(attach_row)
        self.attach_box.hide()

        icons = QHBoxLayout()
        for b in (self.attach_button, self.mic_button, self.speaker_button):
            icons.addWidget(b)
        col = QVBoxLayout()
        col.addWidget(self.send_button)
        col.addWidget(self.stop_button)
        col.addLayout(icons)
        send_row = QHBoxLayout()
        send_row.addWidget(self.input, 1)
        send_row.addLayout(col)
        box = QWidget()
        box.setMinimumWidth(260)
        layout = QVBoxLayout(box)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addLayout(top)
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self.status)  # the reply's stats or what went wrong: elided, the whole line its tooltip
        layout.addWidget(self.attach_box)
        layout.addLayout(send_row)
        return box

    def _mic_button(self) -> QPushButton:
        if self.audio_io is None:
            b = _icon_button("mic", "audio input is unavailable")
            b.setEnabled(False)
            return b
        b = RecordButton(self.audio_io, "", "", "Record a message (transcribed with the speech-to-text model)")
        b.setIcon(icon("mic"))
        b.clicked.connect(lambda: b.setIcon(icon("mic-stop" if self.audio_io.recording else "mic")))
        return b

    def _build_settings(self) -> QWidget:
        self.model = QComboBox()
        self.model.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.model.setMinimumContentsLength(12)  # a long model name does not widen the column; its tooltip has it
        self.model.currentIndexChanged.connect(lambda _: self.on_model_chosen())
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, CUSTOM])
        self.preset.setToolTip("System prompt presets; what you type becomes the Custom one (kept)")
        self.preset.currentTextChanged.connect(self.on_preset_chosen)
        self.system = QPlainTextEdit()
        self.system.setPlaceholderText("System prompt (optional)")
        self.system.setMaximumHeight(90)
        self.system.textChanged.connect(self.on_system_edited)

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
        self.stop_strings.setPlaceholderText("separated by |")
        knobs = QGroupBox("Sampling")
        form = QFormLayout(knobs)
        for label, w in (("temperature", self.temperature), ("top_p", self.top_p), ("top_k", self.top_k),
                         ("min_p", self.min_p), ("repeat penalty", self.repeat_penalty),
                         ("presence pen.", self.presence_penalty), ("frequency pen.", self.frequency_penalty),
                         ("seed", self.seed), ("max tokens", self.max_tokens), ("stop", self.stop_strings)):
            form.addRow(label, w)
        form.labelForField(self.presence_penalty).setToolTip("presence penalty")
        form.labelForField(self.frequency_penalty).setToolTip("frequency penalty")

        side = QWidget()
        layout = QVBoxLayout(side)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.addWidget(QLabel("Model"))
        layout.addWidget(self.model)
        layout.addWidget(QLabel("System prompt"))
        layout.addWidget(self.preset)
        layout.addWidget(self.system)
        layout.addWidget(knobs)
        layout.addStretch(1)
        scroll = QScrollArea()  # at 900x600 the knobs scroll rather than push the window taller
        scroll.setWidget(side)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(side.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        return scroll

    def on_settings_toggle_clicked(self, shown: bool) -> None:
        self._pane_chosen = True
        self.settings_pane.setVisible(shown)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        """Below PANE_WIDTH the settings pane folds away (Parameters brings it back), leaving the transcript
        room, unless the user chose."""
        super().resizeEvent(event)
        if not self._pane_chosen:
            wide = self.width() >= PANE_WIDTH
            self.settings_pane.setVisible(wide)
            self.settings_toggle.setChecked(wide)

    # ---- building a request ----------------------------------------------------------------

    def sampling(self) -> SamplingParams:
        stops = [s for s in self.stop_strings.text().split("|") if s]
        return SamplingParams(
            max_tokens=self.max_tokens.value(), temperature=self.temperature.value(), top_p=self.top_p.value(),
            top_k=self.top_k.value(), min_p=self.min_p.value(), repeat_penalty=self.repeat_penalty.value(),
            presence_penalty=self.presence_penalty.value(), frequency_penalty=self.frequency_penalty.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(), stop=stops)

    def request_messages(self) -> list[dict]:
        """The conversation as OpenAI messages (system prompt first; attached images as image_url parts)."""
        out = []
        if self.system.toPlainText().strip():
            out.append({"role": "system", "content": self.system.toPlainText()})
        for m in self.messages:
            if not m["content"] and not m.get("images"):
                continue
            content = m["content"]
            if m.get("images"):
                content = [{"type": "text", "text": m["content"]},
                           *({"type": "image_url", "image_url": {"url": url}} for url in m["images"])]
            out.append({"role": m["role"], "content": content})
        return out

    def send(self) -> None:
        """Send the input box as a user message and stream the reply."""
        text = self.input.toPlainText().strip()
        if not text or self.reply is not None:
            return
        self.input.clear()
        message = {"role": "user", "content": text, "meta": ""}
        if self.pending_images:
            message["images"] = self.pending_images
            self.on_clear_attachments()
        self.messages.append(message)
        self.start_reply()

    def regenerate(self) -> None:
        """Generate the last reply again, in its place."""
        if self.reply is not None:
            return
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if self.messages and self.messages[-1]["role"] == "user":
            self.start_reply()

    def resend_edited(self, index: int, text: str) -> None:
        """Replace user message `index` with text, drop everything after it, and send again."""
        if self.reply is not None or not 0 <= index < len(self.messages):
            return
        edited = {**self.messages[index], "content": text, "meta": ""}
        del self.messages[index:]
        self.messages.append(edited)
        self.start_reply()

    def start_reply(self) -> None:
        """Stream a reply to the conversation as it stands (its last message is the user's)."""
        messages = self.request_messages()
        message = {"role": "assistant", "content": "", "meta": "…"}
        self.messages.append(message)
        cid = self.bridge.chat(self.model.currentData(), messages, self.sampling())
        self.reply = _Reply(cid, self.thread.id, self.messages, message)
        self.status.setText("generating…")  # not the previous reply's stats
        self._save(self.thread.id, self.messages)
        self._set_busy(True)
        self.transcript.show_messages(self.messages, busy=True)
        self.transcript.scroll_to_end()

    @property
    def current(self) -> str | None:
        """The running reply's chat id."""
        return self.reply.cid if self.reply is not None else None

    def stop(self) -> None:
        """Abort the running reply in the engine."""
        if self.reply is not None:
            self.bridge.stop_chat(self.reply.cid)

    # ---- signals ---------------------------------------------------------------------------

    def on_chat_delta(self, cid: str, text: str) -> None:
        if cid == self.current:
            self.reply.message["content"] += text
            if self.reply.messages is self.messages and not self._render_timer.isActive():
                self._render_timer.start()

    def on_render_due(self) -> None:
        if self.reply is not None and self.reply.messages is self.messages:
            self.transcript.update_last(self.reply.message)

    def on_chat_done(self, cid: str, info: dict) -> None:
        if cid == self.current:
            usage = info.get("usage") or {}
            self._finish(f"{info['tok_s']} tok/s · {usage.get('completion_tokens', 0)} tokens · "
                         f"{info['finish_reason']}")

    def on_chat_error(self, cid: str, message: str) -> None:
        if cid == self.current:
            self._finish(f"error: {message}")

    def _finish(self, meta: str) -> None:
        reply, self.reply = self.reply, None
        self._render_timer.stop()
        reply.message["meta"] = meta
        self._save(reply.thread, reply.messages)
        self.status.setText(meta)
        self._set_busy(False)
        if reply.messages is self.messages:
            self.transcript.update_last(reply.message)
            self.transcript.set_busy(False)
        self.refresh_threads()

    def _set_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def on_models_changed(self) -> None:
        current = self.model.currentData() or (self.thread.model if self.thread is not None else None)
        self.model.blockSignals(True)
        self.model.clear()
        for m in self.bridge.models():
            if m.get("kind") == "llm":  # speech and embedding models do not chat; an unloaded one loads on send
                note = " (default)" if m["default"] else (" (not loaded)" if m["state"] != "loaded" else "")
                self.model.addItem(m["id"] + note, m["id"])
        idx = self.model.findData(current)
        if idx >= 0:
            self.model.setCurrentIndex(idx)
        self.model.blockSignals(False)
        self.on_model_chosen()

    def on_quitting(self) -> None:
        """Keep what a running reply wrote so far, then close the store."""
        if self.reply is not None:
            self.reply.message["meta"] = "stopped: the app quit"
            self._save(self.reply.thread, self.reply.messages)
        self.store.close()

    # ---- threads ----------------------------------------------------------------------------------

    def reopen_last_thread(self) -> None:
        """The thread open when the app last ran, else the most recent one, else a new one."""
        last = self.store.state("last_thread")
        thread = self.store.get(int(last)) if last and last.isdigit() else None
        if thread is None:
            threads = self.store.threads()
            thread = threads[0] if threads else self.store.create(self.system.toPlainText(), self.model.currentData())
        self.refresh_threads()
        self.open_thread(thread.id)

    def open_thread(self, tid: int) -> None:
        """Show thread tid (its messages, system prompt and model)."""
        thread = self.store.get(tid)
        if thread is None:
            return
        self.thread = thread
        replying_here = self.reply is not None and self.reply.thread == tid
        self.messages = self.reply.messages if replying_here else self.store.messages(tid)
        self.show_system_prompt(thread.system)
        idx = self.model.findData(thread.model) if thread.model else -1
        if idx >= 0:
            self.model.setCurrentIndex(idx)
        if self.store.is_open:
            self.store.set_state("last_thread", str(tid))
        self.transcript.show_messages(self.messages, busy=self.reply is not None)
        self.transcript.scroll_to_end()
        self._select_in_list(tid)
        last = self.messages[-1] if self.messages else {}
        self.status.setText("generating…" if replying_here else
                            last.get("meta", "") if last.get("role") == "assistant" else "")

    def _select_in_list(self, tid: int) -> None:
        for i in range(self.thread_list.count()):
            item = self.thread_list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == tid and item is not self.thread_list.currentItem():
                self.thread_list.blockSignals(True)
                self.thread_list.setCurrentItem(item)
                self.thread_list.blockSignals(False)

    def new_chat(self) -> None:
        """Open a new thread (the current one stays saved; an empty current one is reused)."""
        self.on_clear_attachments()
        if self.thread is not None and not self.messages and self.store.get(self.thread.id) is not None:
            self.input.setFocus()
            return
        thread = self.store.create(self.system.toPlainText(), self.model.currentData())
        self.search.clear()
        self.refresh_threads()
        self.open_thread(thread.id)
        self.input.setFocus()

    def refresh_threads(self) -> None:
        """List the threads matching the search box, the current one selected."""
        if self.thread_list.state() == QAbstractItemView.State.EditingState:
            return  # a rename is being typed: the next refresh shows the new order
        threads = self.store.threads(self.search.text()) if self.store.is_open else []
        self.thread_list.blockSignals(True)
        self.thread_list.clear()
        for t in threads:
            item = QListWidgetItem(t.title)
            item.setData(Qt.ItemDataRole.UserRole, t.id)
            item.setToolTip(t.title)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.thread_list.addItem(item)
            if self.thread is not None and t.id == self.thread.id:
                self.thread_list.setCurrentItem(item)
        self.thread_list.blockSignals(False)
        self.no_match.setVisible(not threads and bool(self.search.text().strip()))

    def thread_titles(self) -> list[str]:
        """The titles the sidebar lists, top to bottom."""
        return [self.thread_list.item(i).text() for i in range(self.thread_list.count())]

    def on_thread_selected(self, item: QListWidgetItem | None, _previous=None) -> None:
        if item is not None and (self.thread is None or item.data(Qt.ItemDataRole.UserRole) != self.thread.id):
            self.open_thread(item.data(Qt.ItemDataRole.UserRole))

    def rename_current(self) -> None:
        item = self.thread_list.currentItem()
        if item is not None:
            self.thread_list.editItem(item)

    def on_thread_renamed(self, item: QListWidgetItem) -> None:
        tid = item.data(Qt.ItemDataRole.UserRole)
        self.store.rename(tid, item.text())
        thread = self.store.get(tid)
        if thread is None:
            return
        if self.thread is not None and self.thread.id == tid:
            self.thread = thread
        self.thread_list.blockSignals(True)
        item.setText(thread.title)  # as kept (an empty name keeps the old one)
        item.setToolTip(thread.title)
        self.thread_list.blockSignals(False)

    def ask_delete(self) -> None:
        item = self.thread_list.currentItem()
        if item is None:
            return
        tid = item.data(Qt.ItemDataRole.UserRole)
        self.confirm = QMessageBox(QMessageBox.Icon.Question, "Delete chat",
                                   f"Delete “{item.text()}” and all its messages? This cannot be undone.",
                                   QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        self.confirm.setDefaultButton(QMessageBox.StandardButton.Cancel)
        self.confirm.finished.connect(lambda _: self.on_delete_answered(tid))
        self.confirm.open()  # never exec(): the qasync loop cannot re-enter

    def on_delete_answered(self, tid: int) -> None:
        if self.confirm.standardButton(self.confirm.clickedButton()) == QMessageBox.StandardButton.Yes:
            self.delete_thread(tid)

    def delete_thread(self, tid: int) -> None:
        """Forget thread tid (a reply running in it is stopped); another one opens in its place."""
        if self.reply is not None and self.reply.thread == tid:
            self.stop()
        self.store.delete(tid)
        if self.thread is not None and self.thread.id == tid:
            self.thread = None
            self.messages = []
            remaining = self.store.threads()
            if remaining:
                self.open_thread(remaining[0].id)
            else:
                self.new_chat()
        self.refresh_threads()

    def _save(self, tid: int, messages: list[dict]) -> None:
        if not self.store.is_open:
            return
        shown = self.thread is not None and self.thread.id == tid
        self.store.save(tid, messages, system=self.system.toPlainText() if shown else None,
                        model=self.model.currentData() if shown else None)
        if shown:
            self.thread = self.store.get(tid)  # its title may come from the first message now

    # ---- system prompt presets ----------------------------------------------------------------------

    def show_system_prompt(self, text: str) -> None:
        """Put text in the system prompt box, with the preset it is (Custom when it is none of them)."""
        self._applying_preset = True
        self.system.setPlainText(text)
        self.preset.setCurrentText(next((name for name, t in PRESETS.items() if t == text), CUSTOM))
        self._applying_preset = False

    def on_preset_chosen(self, name: str) -> None:
        if self._applying_preset:
            return
        text = self.store.state("custom_system_prompt", "") if name == CUSTOM and self.store.is_open else \
            PRESETS.get(name, "")
        self._applying_preset = True
        self.system.setPlainText(text)
        self._applying_preset = False

    def on_system_edited(self) -> None:
        if self._applying_preset:
            return
        text = self.system.toPlainText()
        name = next((name for name, t in PRESETS.items() if t == text), CUSTOM)
        self._applying_preset = True
        self.preset.setCurrentText(name)
        self._applying_preset = False
        if name == CUSTOM:
            self._custom_timer.start()

    def save_custom_prompt(self) -> None:
        if self.store.is_open and self.preset.currentText() == CUSTOM:
            self.store.set_state("custom_system_prompt", self.system.toPlainText())

    # ---- images (the vision issue sends them; here they become image_url parts) ---------------------------

    def model_info(self) -> dict:
        """The chosen model as /v1/models lists it ({} when it is not listed)."""
        chosen = self.model.currentData()
        return next((m for m in self.bridge.models() if m["id"] == chosen or (chosen is None and m["default"])), {})

    def on_model_chosen(self) -> None:
        self.model.setToolTip(self.model.currentText())
        self.update_attach()

    def has_vision(self) -> bool:
        """Whether the chosen model takes images (loaded with a vision projector, or an entry that loads with one)."""
        info = self.model_info()
        return "vision" in (info.get("capabilities") or ()) or info.get("vision") is True

    def update_attach(self) -> None:
        vision = self.has_vision()
        self.attach_button.setEnabled(vision)
        self.attach_button.setToolTip("Attach an image (or drop one onto the chat, or paste one)" if vision
                                      else NO_VISION)

    def ask_attach(self) -> None:
        dlg = QFileDialog(self, "Attach an image", "", "Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.attach_image)
        dlg.open()

    def attach_image(self, path: str) -> None:
        """Send the image at path with the next message (as a data URL)."""
        try:
            url = file_data_url(path)
        except OSError as e:
            self.status.setText(f"image not attached: {path} cannot be read ({e.strerror})")
            return
        self._attach(Path(path).name, url)

    def offer_images(self, mime: QMimeData) -> bool:
        """Attach the images mime carries (dropped or pasted); refused, saying why, when the model has no
        vision."""
        if not self.has_vision():
            self.status.setText(f"image not attached: {NO_VISION} (choose a model served with its vision "
                                "projector)")
            return False
        files = image_files(mime)
        for path in files:
            self.attach_image(path)
        image = QImage(mime.imageData()) if not files and mime.hasImage() else QImage()
        if not image.isNull():
            self._attach("pasted image", png_data_url(image))
        return True

    def _attach(self, name: str, url: str) -> None:
        self.pending_images.append(url)
        self._attached_names.append(name)
        self.pending_view.set_images(self.pending_images)
        self.attachments.setText("attached: " + ", ".join(self._attached_names))
        self.attach_box.show()

    def on_clear_attachments(self) -> None:
        self.pending_images = []
        self._attached_names = []
        self.pending_view.set_images([])
        self.attachments.setText("")
        self.attach_box.hide()

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if carries_images(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802
        self.offer_images(event.mimeData())
        event.acceptProposedAction()

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
        """Speak the last reply (its answer, not its reasoning); says so at once when it cannot be heard."""
        text = split_reasoning(self.reply_text())[1].strip()
        if not text:
            self.status.setText("nothing to read aloud yet")
            return None
        why = self._why_not_played()
        self.status.setText(f"reading aloud… (it will not play: {why})" if why else "reading aloud…")
        rid = self.bridge.synthesize(text[:4000])
        self._speech_ids.add(rid)
        return rid

    def _why_not_played(self) -> str | None:
        if self.audio_io is None:
            return "audio playback is unavailable"
        return self.audio_io.why_not("play")

    def on_speech_ready(self, rid: str, result: dict) -> None:
        if rid in self._speech_ids:
            self._speech_ids.discard(rid)
            self.last_speech = result
            why = self._why_not_played()
            if why is None:
                self.audio_io.play(result["wav"])
                self.status.setText("playing the reply")
            else:
                self.status.setText(f"not played: {why}")

    def on_speech_error(self, rid: str, message: str) -> None:
        if rid in self._speech_ids:
            self._speech_ids.discard(rid)
            self.status.setText(f"not spoken: {message}")

    # ---- reading and copying ---------------------------------------------------------------------

    def reply_text(self) -> str:
        """The last assistant message as generated."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def copy_transcript(self) -> None:
        QGuiApplication.clipboard().setText("\n\n".join(f"{m['role']}: {m['content']}" for m in self.messages))

    # ---- conversation files -------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps({"system": self.system.toPlainText(), "model": self.model.currentData(),
                           "messages": [{"role": m["role"], "content": m["content"],
                                         **({"images": m["images"]} if m.get("images") else {})}
                                        for m in self.messages]},
                          indent=2, ensure_ascii=False)

    def from_json(self, text: str) -> None:
        """Import a conversation as a new thread."""
        doc = json.loads(text)
        messages = [{"role": m["role"], "content": m["content"], "meta": "",
                     **({"images": list(m["images"])} if m.get("images") else {})} for m in doc.get("messages", [])]
        empty = self.thread is not None and not self.messages and self.reply is None
        thread = self.thread if empty else self.store.create(doc.get("system", ""), doc.get("model"))
        self.store.save(thread.id, messages, system=doc.get("system", ""), model=doc.get("model"))
        self.refresh_threads()
        self.open_thread(thread.id)

    def ask_save(self) -> None:
        dlg = QFileDialog(self, "Export conversation", "", "Conversations (*.json)")
        dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dlg.setDefaultSuffix("json")
        dlg.fileSelected.connect(lambda path: Path(path).write_text(self.to_json(), encoding="utf-8"))
        dlg.open()  # never exec(): the qasync loop cannot re-enter

    def ask_load(self) -> None:
        dlg = QFileDialog(self, "Import conversation", "", "Conversations (*.json)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(lambda path: self.from_json(Path(path).read_text(encoding="utf-8")))
        dlg.open()


def _tool(name: str, tip: str) -> QToolButton:
    b = QToolButton()
    b.setIcon(icon(name))
    b.setToolTip(tip)
    return b


def _icon_button(name: str, tip: str) -> QPushButton:
    b = QPushButton(icon(name), "")
    b.setToolTip(tip)
    return b


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
