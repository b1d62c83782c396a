"""Text that never widens its window: a one-line label that elides its text to the width the layout gives it
(the whole text its tooltip), and breakable() for wrapped labels showing paths and URLs."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """Plain text on one line, elided ("…") when narrower than the text; the full text is the tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight):
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self.setToolTip(text)
        self._elide()
        self.updateGeometry()

    def full_text(self) -> str:
        """The text before eliding."""
        return self._full

    def is_elided(self) -> bool:
        return super().text() != self._full

    def sizeHint(self) -> QSize:  # noqa: N802
        # the whole text's width: the layout gives it that when there is room (the shown text may be elided)
        m = self.contentsMargins()
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + m.left() + m.right() + 2,
                     super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802
        return QSize(self.fontMetrics().horizontalAdvance("…") * 3, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._elide()

    def showEvent(self, event) -> None:  # noqa: N802
        super().showEvent(event)
        self._elide()

    def _elide(self) -> None:
        # a label never shown has no width of its own yet: it keeps the whole text until it is laid out
        width = self.contentsRect().width() if self.isVisible() else 0
        shown = self.fontMetrics().elidedText(self._full, self._mode, width) if width > 0 else self._full
        if super().text() != shown:
            super().setText(shown)


def breakable(text: str) -> str:
    """text with a zero-width space after each '/', so a word-wrapped label can break a long path or URL there
    instead of growing as wide as it."""
    return text.replace("/", "/\u200b")
