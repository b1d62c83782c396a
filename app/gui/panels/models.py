"""Models: the served slots as cards, and the models a request would load as lines with Load; open another
GGUF; unload; make default; per-model settings. Long names and paths are elided, whole in their tooltips."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QFrame, QGridLayout, QHBoxLayout, QLabel,
                               QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from app.gui.panels.elided import ElidedLabel, breakable
from app.gui.theme import icon
from engine.config import KV_DTYPES


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{max(1, round(n / 2**10))} KiB"


class ModelCard(QFrame):
    """One slot: file, size, quant, ctx, streams, state, prefix-cache hit rate."""

    def __init__(self, model: dict, stats: dict | None, bridge):
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.name = model["id"]
        grid = QGridLayout(self)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        grid.addLayout(_title_row(model), 0, 0, 1, 4)
        facts = [("file", model["path"]), ("size", _size(model["file_size"])), ("quant", model["quant"]),
                 ("arch", model["arch"]), ("kind", model["kind"]), ("context", f"{model['ctx']} per stream"),
                 ("streams", str(model["streams"])), ("state", model["state"]), ("prefix cache", "")]
        self.values: dict[str, QLabel] = {}
        for i, (k, v) in enumerate(facts):
            grid.addWidget(QLabel(k), 1 + i // 2, (i % 2) * 2)
            value = ElidedLabel(v, mode=Qt.TextElideMode.ElideMiddle if k == "file" else Qt.TextElideMode.ElideRight)
            grid.addWidget(value, 1 + i // 2, (i % 2) * 2 + 1)
            self.values[k] = value
        self.update_stats(stats)
        buttons = QHBoxLayout()
        self.unload = QPushButton(icon("panels-unload"), "Unload")
        self.unload.clicked.connect(lambda: bridge.unload_model(self.name))
        self.make_default = QPushButton(icon("panels-star"), "Make default")
        self.make_default.setToolTip("requests that name no model go to this one")
        self.make_default.setEnabled(not model["default"])
        self.make_default.clicked.connect(lambda: bridge.set_default(self.name))
        self.settings_button = QPushButton(icon("panels-settings"), "Settings…")
        self.settings_button.setCheckable(True)
        buttons.addStretch(1)
        buttons.addWidget(self.settings_button)
        buttons.addWidget(self.make_default)
        buttons.addWidget(self.unload)
        grid.addLayout(buttons, 6, 0, 1, 4)
        self.settings = self._settings_form(model, bridge)
        self.settings.setVisible(False)
        self.settings_button.toggled.connect(self.settings.setVisible)
        grid.addWidget(self.settings, 7, 0, 1, 4)

    def _settings_form(self, model: dict, bridge) -> QWidget:
        """Per-model settings; Apply loads the model again with them (and saves them to the config)."""
        box = QWidget()
        form = QFormLayout(box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.FieldsStayAtSizeHint)
        self.ctx = QSpinBox(minimum=64, maximum=1 << 22, singleStep=512, value=model["ctx"])
        self.ctx.setToolTip("context per stream, in tokens" + (f" (trained: {model['n_ctx_train']})"
                                                                 if model.get("n_ctx_train") else ""))
        self.streams = QSpinBox(minimum=1, maximum=64, value=model["streams"])
        self.chunk = QSpinBox(minimum=16, maximum=1 << 16, singleStep=64, value=model.get("chunk", 512))
        self.kv_dtype = QComboBox()
        self.kv_dtype.addItems(KV_DTYPES)
        self.kv_dtype.setCurrentText(model.get("kv_dtype", "f16"))
        form.addRow("context per stream", self.ctx)
        form.addRow("concurrent streams", self.streams)
        form.addRow("prefill chunk", self.chunk)
        form.addRow("KV cache type", self.kv_dtype)
        self.apply = QPushButton("Apply (reloads the model)")
        self.apply.clicked.connect(lambda: bridge.reload_model(self.name, self.chosen_settings()))
        form.addRow("", self.apply)
        return box

    def chosen_settings(self) -> dict:
        return {"ctx": self.ctx.value(), "streams": self.streams.value(), "chunk": self.chunk.value(),
                "kv_dtype": self.kv_dtype.currentText()}

    def update_stats(self, stats: dict | None) -> None:
        """Refresh the live figures (state, prefix-cache hit rate) from /v1/stats' entry."""
        stats = stats or {}
        reqs, hits = stats.get("requests", 0), stats.get("prefix_cache_hits", 0)
        self.values["prefix cache"].setText(f"{hits}/{reqs} requests hit" +
                                            (f" ({100 * hits / reqs:.0f}%)" if reqs else ""))
        if "state" in stats:
            self.values["state"].setText(stats["state"])


def _title(text: str) -> ElidedLabel:
    """A card's first line: the model's name in bold, elided when the card is narrower."""
    title = ElidedLabel(text)
    font = title.font()
    font.setBold(True)
    title.setFont(font)
    return title


def _title_row(model: dict) -> QHBoxLayout:
    """The name, elided, and "default" beside it (never elided away)."""
    row = QHBoxLayout()
    row.addWidget(_title(model["id"]), 1)
    if model.get("default"):
        tag = QLabel("<i>default</i>")
        tag.setToolTip("requests that name no model go to this one")
        row.addWidget(tag)
    return row


def _speech_card(model: dict) -> QFrame:
    """A speech model: what it is and where it lives (started with --asr/--tts)."""
    card = QFrame()
    card.setFrameShape(QFrame.Shape.StyledPanel)
    what = "speech to text" if model["kind"] == "asr" else "text to speech"
    extra = (f"voices: {', '.join(model['voices'])}" if model["kind"] == "tts"
             else ("translates" if model.get("can_translate") else "transcribes (no translation)"))
    column = QVBoxLayout(card)
    column.addWidget(_title(model["id"]))
    column.addWidget(ElidedLabel(f"{what} ({model['type']}) · {extra}"))
    column.addWidget(ElidedLabel(model["path"], mode=Qt.TextElideMode.ElideMiddle))
    return card


class AvailableCard(QFrame):
    """A model the server can load but has not (unloaded while idle, on disk, in the roster): one line and Load."""

    def __init__(self, model: dict, bridge):
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.name = model["id"]
        row = QHBoxLayout(self)
        facts = [model["state"]] + ([_size(model["size"])] if model.get("size") else []) + \
            ([f"needs about {_size(model['memory_bytes'])}"] if model.get("memory_bytes") else [])
        text = QVBoxLayout()
        self.facts = ElidedLabel(" · ".join(facts))
        self.facts.setToolTip(model.get("path", ""))
        text.addLayout(_title_row(model))
        text.addWidget(self.facts)
        if model.get("error"):
            error = QLabel(breakable(model["error"]))
            error.setWordWrap(True)
            error.setTextFormat(Qt.TextFormat.PlainText)
            error.setStyleSheet("color: #d0453a")
            text.addWidget(error)
        self.load = QPushButton(icon("panels-serve"), "Loading…" if model["state"] == "loading" else "Load")
        self.load.setEnabled(model["state"] == "unloaded" and not model.get("error"))
        self.load.clicked.connect(lambda: bridge.load_available(self.name))
        row.addLayout(text, 1)
        row.addWidget(self.load)


class ModelsPanel(QWidget):
    """The roster as cards."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.open_button = QPushButton(icon("panels-open"), "Open GGUF…")
        self.open_button.clicked.connect(self.ask_open)
        top = QHBoxLayout()
        top.addWidget(QLabel("Models: loaded, and on disk to load"))
        top.addStretch(1)
        top.addWidget(self.open_button)
        self.cards = QVBoxLayout()
        inner = QWidget()
        inner_layout = QVBoxLayout(inner)
        inner_layout.addLayout(self.cards)
        inner_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(scroll)
        self._stats: dict = {}
        bridge.models_changed.connect(self.refresh)
        bridge.reloaded.connect(self.refresh)
        bridge.stats_updated.connect(self.on_stats_updated)
        self.refresh()

    def on_stats_updated(self, stats: dict) -> None:
        self._stats = {m["id"]: m for m in stats["models"]}
        for i in range(self.cards.count()):
            card = self.cards.itemAt(i).widget()
            if isinstance(card, ModelCard):
                card.update_stats(self._stats.get(card.name))

    def refresh(self) -> None:
        while self.cards.count():
            w = self.cards.takeAt(0).widget()
            if w:
                w.deleteLater()
        if not self.bridge.running:
            return
        models = self.bridge.models()
        if not models:
            empty = QLabel("No model is served yet: open a GGUF, or download one in the Catalog.")
            empty.setWordWrap(True)
            self.cards.addWidget(empty)
        for m in models:
            if m.get("kind") in ("asr", "tts"):
                self.cards.addWidget(_speech_card(m))
            elif m["state"] in ("unloaded", "loading"):
                self.cards.addWidget(AvailableCard(m, self.bridge))
            else:
                self.cards.addWidget(ModelCard(m, self._stats.get(m["id"]), self.bridge))

    def card_names(self) -> list[str]:
        return [self.cards.itemAt(i).widget().name for i in range(self.cards.count())
                if isinstance(self.cards.itemAt(i).widget(), ModelCard)]

    def ask_open(self) -> None:
        dlg = QFileDialog(self, "Serve a GGUF", "", "GGUF models (*.gguf)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.bridge.load_model)
        dlg.open()  # non-blocking; the load itself runs off the loop
