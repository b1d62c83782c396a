"""The chat transcript as widgets: one MessageView per message, whose text is Markdown prose, fenced code blocks
(a background, the language, Copy, long lines scrolling inside the block) and a reply's collapsible thinking.

Markdown is split at its top-level code blocks by markdown-it-py (CommonMark: ``` and ~~~ fences, an unclosed
fence while a reply streams); the prose between them is drawn by Qt's own Markdown reader. The transcript only
ever scrolls vertically: nothing in it may ask for more width than it is given.
"""
from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from PySide6.QtCore import QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (QColor, QDesktopServices, QFontDatabase, QGuiApplication, QIcon, QImage, QPalette, QPixmap,
                           QTextDocument, QTextOption)
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QScrollArea, QSizePolicy,
                               QTextBrowser, QToolButton, QVBoxLayout, QWidget)

from app.gui.panels.elided import ElidedLabel

ICONS = Path(__file__).resolve().parents[2] / "resources" / "icons"
THINK = re.compile(r"<think>(.*?)(</think>|$)", re.S)
_MARKDOWN = MarkdownIt("commonmark")
# model output is shown as text: a "<div>" in a reply is not markup
_QT_MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML


def icon(name: str) -> QIcon:
    """resources/icons/chat-<name>.svg."""
    return QIcon(str(ICONS / f"chat-{name}.svg"))


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a reply whose thinking is wrapped in <think>...</think>."""
    m = THINK.search(text)
    if not m:
        return "", text
    return m.group(1).strip(), (text[:m.start()] + text[m.end():]).strip()


# ---- splitting Markdown into prose and code --------------------------------------------------------------

@dataclass(frozen=True)
class Prose:
    markdown: str


@dataclass(frozen=True)
class Code:
    language: str
    code: str


def segments(markdown: str) -> list[Prose | Code]:
    """markdown as prose and code blocks, in order (code blocks inside lists or quotes stay in their prose)."""
    text = markdown.replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    out: list[Prose | Code] = []
    at = 0
    for tok in _MARKDOWN.parse(text):
        if tok.type not in ("fence", "code_block") or tok.level != 0 or tok.map is None:
            continue
        start, end = tok.map
        _add_prose(out, lines[at:start])
        info = tok.info.strip().split()
        out.append(Code(info[0] if info else "", tok.content.removesuffix("\n")))
        at = end
    _add_prose(out, lines[at:])
    return out


def _add_prose(out: list, lines: list[str]) -> None:
    text = "\n".join(lines).strip("\n")
    if text.strip():
        out.append(Prose(text))


# ---- small widgets ---------------------------------------------------------------------------------------

class _PassWheel:
    """Vertical wheel turns go to the transcript (these widgets never scroll vertically themselves); the height
    follows the text at the given width."""

    def wheelEvent(self, event) -> None:  # noqa: N802
        if abs(event.angleDelta().y()) >= abs(event.angleDelta().x()):
            event.ignore()
        else:
            super().wheelEvent(event)

    # As tall as the text (each class's _fit sets the height), as narrow as the column allows.
    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(40, self.height())

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(200, self.height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit()


class ProseView(_PassWheel, QTextBrowser):
    """Markdown prose as tall as its text at the width it is given: wraps (long words too), never scrolls."""

    def __init__(self, markdown: str = ""):
        super().__init__()
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # Tab goes from the input to Send, not through the transcript
        self.setOpenLinks(False)
        self.anchorClicked.connect(self.on_anchor_clicked)
        self.viewport().setAutoFillBackground(False)  # the message's background shows through
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self.markdown = None
        self.set_markdown(markdown)

    def set_markdown(self, markdown: str) -> None:
        if markdown != self.markdown:
            self.markdown = markdown
            self.document().setMarkdown(markdown, _QT_MARKDOWN)
            self._fit()

    def set_plain(self, text: str) -> None:
        """Text shown as it is (an error message), wrapped the same way."""
        self.markdown = None
        self.setPlainText(text)
        self._fit()

    def _fit(self, *_) -> None:
        self.document().setTextWidth(self.viewport().width())
        self.setFixedHeight(int(self.document().size().height()) + 2 * self.frameWidth() + 2)

    def on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() in ("http", "https"):
            QDesktopServices.openUrl(url)


class CodeText(_PassWheel, QPlainTextEdit):
    """A code block's text: never wrapped; a line wider than the block scrolls inside it."""

    def __init__(self, code: str):
        super().__init__()
        self.setReadOnly(True)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        # the block's background shows through; a style sheet here would restyle the scroll bar too
        self.viewport().setAutoFillBackground(False)
        self.code = None
        self.set_code(code)

    def set_code(self, code: str) -> None:
        if code != self.code:
            self.code = code
            self.setPlainText(code)
            self._fit()

    def _fit(self) -> None:
        """As tall as its lines, plus the horizontal scroll bar when the widest line does not fit."""
        fm = self.fontMetrics()
        lines = self.code.split("\n")
        margin = 2 * self.document().documentMargin()
        wide = max(fm.horizontalAdvance(line) for line in lines) + margin + fm.averageCharWidth()
        bar = self.horizontalScrollBar().sizeHint().height() if wide > self.viewport().width() else 0
        self.setFixedHeight(int(len(lines) * fm.lineSpacing() + margin + 2 * self.frameWidth() + bar + 2))


class CodeBlock(QFrame):
    """A fenced code block: its language, a Copy button that puts the code alone on the clipboard, the code."""

    def __init__(self, block: Code):
        super().__init__()
        self.setObjectName("codeblock")
        self.setStyleSheet("QFrame#codeblock { background: palette(alternate-base); border: 1px solid palette(mid);"
                           " border-radius: 5px; }")
        self.language = QLabel()
        self.language.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.copy_button = QToolButton()
        self.copy_button.setIcon(icon("copy"))
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the code")
        self.copy_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.copy_button.setAutoRaise(True)
        self.copy_button.clicked.connect(self.copy)
        self._copied = QTimer(self, singleShot=True, interval=1500)
        self._copied.timeout.connect(lambda: self.copy_button.setText("Copy"))
        self.text = CodeText(block.code)
        header = QHBoxLayout()
        header.setContentsMargins(8, 2, 2, 0)
        header.addWidget(self.language)
        header.addStretch(1)
        header.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(1, 1, 1, 4)
        layout.setSpacing(0)
        layout.addLayout(header)
        layout.addWidget(self.text)
        self.show_block(block)

    def show_block(self, block: Code) -> None:
        self.language.setText(block.language or "code")
        self.text.set_code(block.code)

    @property
    def code(self) -> str:
        return self.text.code

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.code)
        self.copy_button.setText("Copied")
        self._copied.start()


class MarkdownView(QWidget):
    """Markdown as a column of ProseView and CodeBlock widgets, updated in place as a reply streams."""

    def __init__(self):
        super().__init__()
        self.column = QVBoxLayout(self)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.setSpacing(6)
        self.parts: list[ProseView | CodeBlock] = []

    def set_markdown(self, markdown: str) -> None:
        wanted = segments(markdown)
        for i, seg in enumerate(wanted):
            if i < len(self.parts) and isinstance(self.parts[i], ProseView) == isinstance(seg, Prose):
                self._update(self.parts[i], seg)
                continue
            for stale in self.parts[i:]:
                self._drop(stale)
            del self.parts[i:]
            widget = ProseView(seg.markdown) if isinstance(seg, Prose) else CodeBlock(seg)
            self.parts.append(widget)
            self.column.addWidget(widget)
        for stale in self.parts[len(wanted):]:
            self._drop(stale)
        del self.parts[len(wanted):]

    def code_blocks(self) -> list[CodeBlock]:
        return [p for p in self.parts if isinstance(p, CodeBlock)]

    @staticmethod
    def _update(widget, seg) -> None:
        if isinstance(seg, Prose):
            widget.set_markdown(seg.markdown)
        else:
            widget.show_block(seg)

    def _drop(self, widget: QWidget) -> None:
        self.column.removeWidget(widget)
        widget.deleteLater()


class Thumbnails(QWidget):
    """Small previews of images given as data: URLs, in a row; each one's pixel size is its tooltip. Never asks
    for width: a row longer than its column is cut at the column's edge."""

    def __init__(self, height: int = 96):
        super().__init__()
        self.height_px = height
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.labels: list[QLabel] = []
        self.urls: list[str] = []
        self.hide()

    def set_images(self, urls: list[str]) -> None:
        if urls == self.urls:
            return
        for label in self.labels:
            self.row.removeWidget(label)
            label.deleteLater()
        self.urls = list(urls)
        self.labels = [_thumbnail(url, self.height_px) for url in self.urls]
        for label in self.labels:
            self.row.insertWidget(self.row.count() - 1, label)
        self.setVisible(bool(self.urls))

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(0, super().minimumSizeHint().height())


def image_of(url: str) -> QImage:
    """The image a data: URL holds (a null QImage when it holds none Qt reads)."""
    try:
        return QImage.fromData(base64.b64decode(url.partition(",")[2]))
    except (binascii.Error, ValueError):
        return QImage()


def _thumbnail(url: str, height: int) -> QLabel:
    image = image_of(url)
    label = QLabel()
    if image.isNull():
        label.setText("(unreadable image)")
        return label
    box = QSize(2 * height, height)
    shown = image if image.width() <= box.width() and image.height() <= box.height() else \
        image.scaled(box, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
    label.setPixmap(QPixmap.fromImage(shown))
    label.setToolTip(f"{image.width()} × {image.height()} image")
    label.setStyleSheet("QLabel { border: 1px solid palette(mid); }")
    return label


# ---- one message --------------------------------------------------------------------------------------------

class MessageView(QFrame):
    """One message: who, its stats, its actions (copy; edit-and-resend for the user's, regenerate for the last
    reply), its text (a reply's thinking folded away), and an editor while it is being edited."""

    resend = Signal(int, str)  # the message's index, its edited text
    regenerate = Signal()

    def __init__(self, index: int, message: dict):
        super().__init__()
        self.index = index
        self.role = message["role"]
        self.setObjectName("message")
        if self.role == "user":
            self.setStyleSheet("QFrame#message { background: palette(alternate-base); border-radius: 6px; }")
        self.who = QLabel("<b>You</b>" if self.role == "user" else "<b>Assistant</b>")
        self.meta = ElidedLabel()
        self.meta.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.copy_button = _action("copy", "Copy this message")
        self.copy_button.clicked.connect(self.copy)
        self.edit_button = _action("edit", "Edit this message and send it again (the replies after it are dropped)")
        self.edit_button.clicked.connect(self.start_edit)
        self.regenerate_button = _action("regenerate", "Generate this reply again (replaces it)")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button.setVisible(self.role == "user")
        self.regenerate_button.setVisible(False)
        header = QHBoxLayout()
        header.setSpacing(6)
        header.addWidget(self.who)
        header.addWidget(self.meta, 1)
        for b in (self.copy_button, self.edit_button, self.regenerate_button):
            header.addWidget(b)

        self.thinking = QToolButton()  # a reply's reasoning, folded until asked for
        self.thinking.setCheckable(True)
        self.thinking.setAutoRaise(True)
        self.thinking.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.thinking.setArrowType(Qt.ArrowType.RightArrow)
        self.thinking.toggled.connect(self.on_thinking_toggled)
        self.reasoning = ProseView()
        italic = self.reasoning.font()
        italic.setItalic(True)
        self.reasoning.setFont(italic)
        self.reasoning.hide()
        self.thinking.hide()
        self.images = Thumbnails()  # the images a user's message was sent with
        self.body = MarkdownView()
        self.error = ProseView()  # wraps anywhere: a long model name in it cannot widen the window
        red = self.error.palette()
        red.setColor(QPalette.ColorRole.Text, QColor("#d9463b"))
        self.error.setPalette(red)
        self.error.hide()

        self.editor = QPlainTextEdit()
        self.editor.setMaximumHeight(120)
        self.resend_button = QPushButton("Send again")
        self.resend_button.clicked.connect(self.on_resend_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.stop_edit)
        edit_row = QHBoxLayout()
        edit_row.addStretch(1)
        edit_row.addWidget(self.cancel_button)
        edit_row.addWidget(self.resend_button)
        self.edit_box = QWidget()
        edit_layout = QVBoxLayout(self.edit_box)
        edit_layout.setContentsMargins(0, 0, 0, 0)
        edit_layout.addWidget(self.editor)
        edit_layout.addLayout(edit_row)
        self.edit_box.hide()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 8)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addWidget(self.thinking, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.reasoning)
        layout.addWidget(self.images)
        layout.addWidget(self.body)
        layout.addWidget(self.error)
        layout.addWidget(self.edit_box)
        self.content = ""
        self.show_message(message)

    def show_message(self, message: dict) -> None:
        """Show message's text and stats (only what changed is redrawn)."""
        self.content = message["content"]
        self.images.set_images(message.get("images") or [])
        meta = message.get("meta") or ""
        is_error = meta.startswith("error: ")
        self.meta.setText("" if is_error else meta)
        if is_error:
            self.error.set_plain(meta.removeprefix("error: "))
        self.error.setVisible(is_error)
        reasoning, answer = split_reasoning(self.content) if self.role == "assistant" else ("", self.content)
        self.thinking.setVisible(bool(reasoning))
        self.thinking.setText(f"thinking ({len(reasoning.split())} words)")
        if self.reasoning.isVisibleTo(self) or not reasoning:
            self.reasoning.set_markdown(reasoning)
        self._reasoning = reasoning
        self.body.set_markdown(answer)
        self.copy_button.setEnabled(bool(answer.strip()))

    def set_actions(self, last_reply: bool, busy: bool) -> None:
        """Regenerate shows on the last reply; editing and regenerating wait while a reply streams."""
        self.regenerate_button.setVisible(last_reply)
        self.regenerate_button.setEnabled(not busy)
        self.edit_button.setEnabled(not busy)
        self.resend_button.setEnabled(not busy)

    def answer(self) -> str:
        return split_reasoning(self.content)[1] if self.role == "assistant" else self.content

    def copy(self) -> None:
        """The message's text (a reply's answer, without its thinking) to the clipboard."""
        QGuiApplication.clipboard().setText(self.answer())

    def start_edit(self) -> None:
        self.editor.setPlainText(self.content)
        self.body.hide()
        self.edit_box.show()
        self.editor.setFocus()

    def stop_edit(self) -> None:
        self.edit_box.hide()
        self.body.show()

    def on_resend_clicked(self) -> None:
        text = self.editor.toPlainText().strip()
        if text:
            self.stop_edit()
            self.resend.emit(self.index, text)

    def on_thinking_toggled(self, shown: bool) -> None:
        self.thinking.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        if shown:
            self.reasoning.set_markdown(self._reasoning)
        self.reasoning.setVisible(shown)


def _action(name: str, tip: str) -> QToolButton:
    b = QToolButton()
    b.setIcon(icon(name))
    b.setToolTip(tip)
    b.setAutoRaise(True)
    return b


# ---- the transcript -------------------------------------------------------------------------------------------

class ChatView(QScrollArea):
    """The messages of one thread, stacked; follows a streaming reply while scrolled to the end."""

    resend = Signal(int, str)
    regenerate = Signal()

    def __init__(self):
        super().__init__()
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        inner = QWidget()
        inner.setBackgroundRole(QPalette.ColorRole.Base)
        inner.setAutoFillBackground(True)
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(8, 8, 8, 8)
        self.column.setSpacing(10)
        self.column.addStretch(1)
        self.setWidget(inner)
        self.views: list[MessageView] = []
        self._follow = True
        self.verticalScrollBar().rangeChanged.connect(self.on_range_changed)
        self.verticalScrollBar().valueChanged.connect(self.on_scrolled)

    def show_messages(self, messages: list[dict], busy: bool) -> None:
        """Draw a thread's messages (reusing the views of those still the same)."""
        keep = 0
        while (keep < min(len(self.views), len(messages)) and self.views[keep].role == messages[keep]["role"]
               and self.views[keep].content == messages[keep]["content"]
               and self.views[keep].images.urls == (messages[keep].get("images") or [])):
            keep += 1
        for view in self.views[keep:]:
            self.column.removeWidget(view)
            view.deleteLater()
        del self.views[keep:]
        for i, m in enumerate(messages):
            if i < keep:
                self.views[i].show_message(m)
                continue
            view = MessageView(i, m)
            view.resend.connect(self.resend)
            view.regenerate.connect(self.regenerate)
            self.views.append(view)
            self.column.insertWidget(self.column.count() - 1, view)
        self.set_busy(busy)

    def update_last(self, message: dict) -> None:
        """Redraw the last message (a streaming reply)."""
        if self.views:
            self.views[-1].show_message(message)

    def set_busy(self, busy: bool) -> None:
        last_reply = len(self.views) - 1 if self.views and self.views[-1].role == "assistant" else -1
        for i, view in enumerate(self.views):
            view.set_actions(i == last_reply, busy)

    def scroll_to_end(self) -> None:
        self._follow = True
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def on_range_changed(self, _lo: int, hi: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(hi)

    def on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 4
