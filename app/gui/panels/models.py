"""Models: the served slots as cards, and the models a request would load as lines with Load; open another
GGUF; unload; make default; per-model settings; remove a roster entry (asked first). Long names and paths are
elided, whole in their tooltips."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout,
                               QFrame, QGridLayout, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QMessageBox,
                               QPushButton, QScrollArea, QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout,
                               QWidget)

from app.gui.panels.elided import ElidedLabel, breakable
from app.gui.panels.settings import ERROR_STYLE, check_url
from app.gui.theme import icon
from engine import backends
from engine.config import KV_DTYPES

UPSTREAM, NAME = 0, 1  # the remote dialog's columns: the upstream's id (ticked to add), the name here


def cpu_variant() -> str | None:
    """The CPU variant the engine loaded (a build with CPU variants), None for a native build or before a load."""
    choice = backends.current()
    return choice.variant.name if choice is not None and choice.variant is not None else None


def runs_on(model: dict, variant: str | None) -> str:
    """Where a model runs, from /v1/models' devices and gpu_layers (or a benchmark record's): "CPU (zen4)",
    "Vulkan0 (…) · all 31 layers", "RPC 127.0.0.1:50052 · all 31 layers", "Vulkan0 (…) · 20/31 layers · the rest on
    CPU (zen4)"."""
    cpu = f"CPU ({variant})" if variant else "CPU"
    offloaded_to = [d for d in model.get("devices") or () if d not in ("CPU", "local")]
    if not offloaded_to:
        return cpu
    layers = model.get("gpu_layers") or {}
    done, total = layers.get("offloaded", 0), layers.get("total", 0)
    if done >= total:
        return f"{', '.join(offloaded_to)} · all {total} layers"
    return f"{', '.join(offloaded_to)} · {done}/{total} layers · the rest on {cpu}"


def removal_effect(model: dict, models_dir: str | None) -> str:
    """What Remove does to a listed model, in plain words (the confirmation says it before anything changes)."""
    if "remote_model" in model:
        urls = ", ".join(r["url"] for r in model["replicas"])
        return (f"Requests here that name it are refused as an unknown model from now on. Nothing changes "
                f"on {urls}: that server keeps serving {model['remote_model']}.")
    unloads = "It is unloaded now, and replies it is writing stop. " if model["state"] == "loaded" else ""
    path = Path(model["path"]).expanduser()
    kept = f"The GGUF file is not deleted: it stays at {path}."
    if models_dir and path.is_relative_to(Path(models_dir).expanduser()):
        kept += " It is in the models folder, so it stays listed here to load by its file's name."
    return f"{unloads}It leaves the roster: it is no longer loaded at start or by a request naming it. {kept}"


def _remove_button(name: str, on_remove: Callable[[str], None]) -> QPushButton:
    button = QPushButton(icon("chat-delete"), "Remove…")
    button.setToolTip("take this model out of the roster (asks first; no file is deleted)")
    button.clicked.connect(lambda: on_remove(name))
    return button


def _size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{max(1, round(n / 2**10))} KiB"


class ModelCard(QFrame):
    """One slot: file, size, quant, ctx, streams, state, prefix-cache hit rate, and where it runs. on_remove:
    what Remove… asks (None: not a roster entry, no Remove)."""

    def __init__(self, model: dict, stats: dict | None, bridge, on_remove: Callable[[str], None] | None = None):
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
        row = 1 + (len(facts) + 1) // 2
        grid.addWidget(QLabel("runs on"), row, 0)
        self.runs_on = ElidedLabel(runs_on(model, cpu_variant()))  # a GPU's description runs long: elided
        grid.addWidget(self.runs_on, row, 1, 1, 3)
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
        self.remove_button = _remove_button(self.name, on_remove) if on_remove else None
        if self.remove_button is not None:
            buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        buttons.addWidget(self.settings_button)
        buttons.addWidget(self.make_default)
        buttons.addWidget(self.unload)
        grid.addLayout(buttons, row + 1, 0, 1, 4)
        self.settings = self._settings_form(model, bridge)
        self.settings.setVisible(False)
        self.settings_button.toggled.connect(self.settings.setVisible)
        grid.addWidget(self.settings, row + 2, 0, 1, 4)

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
    """A model the server can load but has not (unloaded while idle, on disk, in the roster): one line and Load,
    and Remove… for a roster entry (on_remove given)."""

    def __init__(self, model: dict, bridge, on_remove: Callable[[str], None] | None = None):
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
        self.remove_button = _remove_button(self.name, on_remove) if on_remove else None
        if self.remove_button is not None:
            self.remove_button.setEnabled(model["state"] != "loading")  # the load would put it back
            row.addWidget(self.remove_button)


class RemoteCard(QFrame):
    """A model another server serves (backend = "remote"): its upstream id, its URLs and their health; Remove…
    asks on_remove."""

    def __init__(self, model: dict, on_remove: Callable[[str], None]):
        super().__init__()
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.name = model["id"]
        column = QVBoxLayout(self)
        title = _title_row(model)
        self.remove_button = _remove_button(self.name, on_remove)
        title.addWidget(self.remove_button)
        column.addLayout(title)
        urls = ", ".join(r["url"] for r in model["replicas"])
        self.where = ElidedLabel(f"remote · {model['remote_model']} at {urls}", mode=Qt.TextElideMode.ElideMiddle)
        self.health = QLabel()
        self.health.setWordWrap(True)
        self.health.setTextFormat(Qt.TextFormat.PlainText)
        column.addWidget(self.where)
        column.addWidget(self.health)
        self.update_health(model)

    def update_health(self, model: dict) -> None:
        """Say whether the upstream answers its health check, and why not when it does not."""
        if model.get("healthy") is None:
            text = "health unknown while the server is paused"
        elif model["healthy"]:
            text = "healthy: the upstream answers"
        else:
            why = "; ".join(r["last_error"] for r in model["replicas"] if r.get("last_error")) or "not answering"
            text = breakable(f"unreachable: {why}")
        self.health.setText(model.get("error") or text)
        self.health.setStyleSheet("" if model.get("healthy") is not False else ERROR_STYLE)


class RemoteDialog(QDialog):
    """Add remote server…: a base URL and its API key; List models asks it (off the UI thread, as every bridge
    call); the models ticked are added to the roster under the names given (the upstream id by default)."""

    def __init__(self, bridge, parent: QWidget | None = None):
        super().__init__(parent)
        self.bridge = bridge
        self.setWindowTitle("Add remote server")
        self.url = QLineEdit()
        self.url.setPlaceholderText("http://gpu-box:8000/v1 (a bare host:port means its /v1)")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none")
        self.list_button = QPushButton(icon("panels-search"), "List models")
        self.list_button.clicked.connect(self.list_models)
        self.url.returnPressed.connect(self.list_models)
        self.table = QTableWidget(0, 2)
        self.table.setHorizontalHeaderLabels(["Model on the server", "Name here"])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().hide()
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.itemChanged.connect(lambda _item: self._sync_add())
        self.status = QLabel("Enter the server's address (and its API key), then List models.")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.addButton("Add", QDialogButtonBox.ButtonRole.AcceptRole)
        self.add_button.setEnabled(False)
        self.add_button.setToolTip("tick one or more models first")
        self.add_button.clicked.connect(self.add)
        self.buttons.rejected.connect(self.reject)
        form = QFormLayout()
        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.list_button)
        form.addRow("Server URL", url_row)
        form.addRow("API key", self.key)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self._asked: str | None = None  # the URL whose answer this dialog waits for
        self._listed_url: str | None = None  # the URL the table's models came from
        bridge.remote_listed.connect(self.on_remote_listed)
        bridge.remote_failed.connect(self.on_remote_failed)
        bridge.remotes_added.connect(self.on_remotes_added)
        self.resize(560, 420)

    def _say(self, text: str, error: bool = False) -> None:
        self.status.setText(breakable(text))
        self.status.setStyleSheet(ERROR_STYLE if error else "")

    def list_models(self) -> None:
        url = self.url.text().strip()
        problem = check_url(url) if url else "enter the server's address first"
        if problem:
            self._say(problem, error=True)
            return
        self._asked = url
        self.list_button.setEnabled(False)
        self._say(f"asking {url} for its models…")
        self.bridge.list_remote(url, self.key.text().strip() or None)

    def on_remote_listed(self, url: str, ids: list) -> None:
        if url != self._asked:
            return  # an answer for another dialog, or for an address since changed
        self.list_button.setEnabled(True)
        self._listed_url = url
        self.table.blockSignals(True)
        self.table.setRowCount(len(ids))
        for row, upstream in enumerate(ids):
            tick = QTableWidgetItem(upstream)
            tick.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsUserCheckable)
            tick.setCheckState(Qt.CheckState.Checked if len(ids) == 1 else Qt.CheckState.Unchecked)
            tick.setToolTip(upstream)
            self.table.setItem(row, UPSTREAM, tick)
            self.table.setItem(row, NAME, QTableWidgetItem(upstream))
        self.table.blockSignals(False)
        self._say(f"{len(ids)} model(s) on {url}: tick those to add, and name them as requests here will."
                  if ids else f"{url} serves no model.")
        self._sync_add()

    def on_remote_failed(self, url: str, why: str) -> None:
        if url != self._asked:
            return
        self.list_button.setEnabled(True)
        self.add_button.setEnabled(bool(self.picked()))
        self._say(why, error=True)

    def picked(self) -> dict[str, str]:
        """{name here: upstream id} of the ticked rows."""
        return {self.table.item(r, NAME).text().strip(): self.table.item(r, UPSTREAM).text()
                for r in range(self.table.rowCount())
                if self.table.item(r, UPSTREAM).checkState() == Qt.CheckState.Checked}

    def _ticked(self) -> int:
        return sum(self.table.item(r, UPSTREAM).checkState() == Qt.CheckState.Checked
                   for r in range(self.table.rowCount()))

    def _sync_add(self) -> None:
        self.add_button.setEnabled(self._ticked() > 0)

    def add(self) -> None:
        names = [self.table.item(r, NAME).text().strip() for r in range(self.table.rowCount())
                 if self.table.item(r, UPSTREAM).checkState() == Qt.CheckState.Checked]
        if any(not n for n in names):
            self._say("every model ticked needs a name", error=True)
        elif len(set(names)) < len(names):
            self._say("two models ticked have the same name: give each its own", error=True)
        else:
            self.add_button.setEnabled(False)
            self._asked = self._listed_url
            self._say(f"adding {', '.join(names)}…")
            self.bridge.add_remotes(self._listed_url, self.key.text().strip() or None, self.picked())

    def on_remotes_added(self, names: list) -> None:
        if set(names) == set(self.picked()):
            self.accept()


class ModelsPanel(QWidget):
    """The roster as cards."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.open_button = QPushButton(icon("panels-open"), "Open GGUF…")
        self.open_button.clicked.connect(self.ask_open)
        self.remote_button = QPushButton(icon("shell-network"), "Add remote server…")
        self.remote_button.setToolTip("serve models another OpenAI-compatible server runs (vLLM, llama-server, "
                                      "Ollama, another llamadesk) under names of their own here")
        self.remote_button.clicked.connect(self.ask_remote)
        self.remote_dialog: RemoteDialog | None = None
        self.remove_dialog: QMessageBox | None = None  # the Remove confirmation open now (tests read it)
        self._listed: dict[str, dict] = {}  # each card's model, by name, as last listed
        top = QHBoxLayout()
        top.addWidget(QLabel("Models: loaded, and on disk to load"))
        top.addStretch(1)
        top.addWidget(self.remote_button)
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
        remotes = {m["id"]: m for m in self.bridge.remote_models()}
        for i in range(self.cards.count()):
            card = self.cards.itemAt(i).widget()
            if isinstance(card, ModelCard):
                card.update_stats(self._stats.get(card.name))
            elif isinstance(card, RemoteCard) and card.name in remotes:
                card.update_health(remotes[card.name])

    def refresh(self) -> None:
        while self.cards.count():
            w = self.cards.takeAt(0).widget()
            if w:
                w.deleteLater()
        if not self.bridge.running:
            return
        models = self.bridge.models()
        remotes = self.bridge.remote_models()
        self._listed = {m["id"]: m for m in models + remotes}
        if not models and not remotes:
            empty = QLabel("No model is served yet: open a GGUF, or download one in the Catalog.")
            empty.setWordWrap(True)
            self.cards.addWidget(empty)
        for m in models:
            if m.get("kind") in ("asr", "tts"):
                self.cards.addWidget(_speech_card(m))
            elif m["state"] in ("unloaded", "loading"):
                self.cards.addWidget(AvailableCard(m, self.bridge, self._removal(m["id"])))
            else:
                self.cards.addWidget(ModelCard(m, self._stats.get(m["id"]), self.bridge, self._removal(m["id"])))
        for m in remotes:
            self.cards.addWidget(RemoteCard(m, self.ask_remove))

    def _removal(self, name: str) -> Callable[[str], None] | None:
        """Remove… for a roster entry; none for a model listed from disk (forgetting it would change nothing)."""
        return self.ask_remove if self.bridge.rostered(name) else None

    def card_names(self) -> list[str]:
        return [self.cards.itemAt(i).widget().name for i in range(self.cards.count())
                if isinstance(self.cards.itemAt(i).widget(), ModelCard)]

    def remote_cards(self) -> list[RemoteCard]:
        return [self.cards.itemAt(i).widget() for i in range(self.cards.count())
                if isinstance(self.cards.itemAt(i).widget(), RemoteCard)]

    def cards_by_name(self) -> dict[str, QWidget]:
        return {w.name: w for w in (self.cards.itemAt(i).widget() for i in range(self.cards.count()))
                if isinstance(w, (ModelCard, AvailableCard, RemoteCard))}

    def ask_remove(self, name: str) -> None:
        """Say what removing name does and ask (window-modal, no nested event loop); Remove goes on."""
        box = QMessageBox(QMessageBox.Icon.Question, "Remove model", f"Remove “{name}” from the roster?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        box.setInformativeText(breakable(removal_effect(self._listed[name], self.bridge.models_dir())))
        remove = box.button(QMessageBox.StandardButton.Yes)
        remove.setText("Remove")
        remove.setIcon(icon("chat-delete"))
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda _: self.on_remove_answered(box, name))
        if self.remove_dialog is not None:
            self.remove_dialog.deleteLater()
        self.remove_dialog = box
        box.open()

    def on_remove_answered(self, box: QMessageBox, name: str) -> None:
        if box.standardButton(box.clickedButton()) == QMessageBox.StandardButton.Yes:
            self.bridge.forget(name)

    def ask_remote(self) -> None:
        """Open the Add remote server dialog (window-modal, no nested event loop)."""
        if self.remote_dialog is not None:
            self.remote_dialog.deleteLater()
        self.remote_dialog = RemoteDialog(self.bridge, self)
        self.remote_dialog.open()

    def ask_open(self) -> None:
        dlg = QFileDialog(self, "Serve a GGUF", "", "GGUF models (*.gguf)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.bridge.load_model)
        dlg.open()  # non-blocking; the load itself runs off the loop
