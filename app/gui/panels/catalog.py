"""Catalog: curated models with fit badges, download progress (rate, ETA), cancel, serve, show in folder; and any
GGUF from Hugging Face: search, a repo's files with quant, size and fit, Download (pull)."""
from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit,
                               QProgressBar, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.catalog.entries import KINDS

COLUMNS = ["name", "kind", "family", "size", "fit", "license", "on disk", "download"]
REPO_COLUMNS = ["repo", "downloads", "likes"]
FILE_COLUMNS = ["quant", "file", "size", "fit", ""]


def _size(n: int, estimated: bool) -> str:
    s = f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"
    return ("~" + s) if estimated else s


class CatalogPanel(QWidget):
    """Pick, download and serve a model without a terminal."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.entries: list[dict] = []
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("filter by name, family, license")
        self.kind = QComboBox()
        self.kind.addItems(["all kinds", *KINDS])
        self.box = QLabel()
        self.box.setWordWrap(True)  # a long models path must not widen the window past its size
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel")
        self.serve_button = QPushButton("Serve this model")
        self.folder_button = QPushButton("Show in folder")
        self.import_button = QPushButton("Import GGUF…")
        self.import_button.setToolTip("copy a GGUF from this machine into the models folder: it is then served "
                                      "by its file name, loaded by the first request that names it")
        self.import_button.clicked.connect(self.ask_import)
        self.local = QLabel()
        self.local.setWordWrap(True)
        self.download_button.clicked.connect(lambda: self._act("download"))
        self.cancel_button.clicked.connect(lambda: self._act("cancel"))
        self.serve_button.clicked.connect(lambda: self._act("serve"))
        self.folder_button.clicked.connect(self.show_folder)
        self.filter.textChanged.connect(self.render)
        self.kind.currentTextChanged.connect(self.render)
        top = QHBoxLayout()
        top.addWidget(self.filter, 1)
        top.addWidget(self.kind)
        actions = QHBoxLayout()
        actions.addWidget(self.box, 1)
        for b in (self.download_button, self.cancel_button, self.serve_button, self.folder_button):
            actions.addWidget(b)
        local_row = QHBoxLayout()
        local_row.addWidget(self.local, 1)
        local_row.addWidget(self.import_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addLayout(actions)
        layout.addLayout(local_row)
        layout.addWidget(self._hub_box(), 1)
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.reloaded.connect(self.refresh)
        bridge.hub_results.connect(self.on_hub_results)
        bridge.hub_files.connect(self.on_hub_files)
        bridge.hub_failed.connect(self.on_hub_failed)

    def _hub_box(self) -> QGroupBox:
        """Search Hugging Face, a repo's GGUFs, Download."""
        self.hub_query = QLineEdit()
        self.hub_query.setPlaceholderText("search Hugging Face for GGUF models")
        self.hub_search_button = QPushButton("Search")
        self.hub_repos = _table(REPO_COLUMNS)
        self.hub_models = _table(FILE_COLUMNS)
        self.hub_vision = QCheckBox("with its vision tower")
        self.hub_pull_button = QPushButton("Download")
        self.hub_status = QLabel()
        self.hub_status.setWordWrap(True)
        self.hub_search_button.clicked.connect(self.search_hub)
        self.hub_query.returnPressed.connect(self.search_hub)
        self.hub_repos.itemSelectionChanged.connect(self.on_repo_selected)
        self.hub_pull_button.clicked.connect(self.pull_selected)
        self.hub_repo_list: list[dict] = []
        self.hub_model_list: list[dict] = []
        self._pull_shown: tuple | None = None
        search = QHBoxLayout()
        search.addWidget(self.hub_query, 1)
        search.addWidget(self.hub_search_button)
        tables = QHBoxLayout()
        tables.addWidget(self.hub_repos, 1)
        tables.addWidget(self.hub_models, 1)
        actions = QHBoxLayout()
        actions.addWidget(self.hub_status, 1)
        actions.addWidget(self.hub_vision)
        actions.addWidget(self.hub_pull_button)
        box = QGroupBox("Hugging Face")
        inner = QVBoxLayout(box)
        inner.addLayout(search)
        inner.addLayout(tables, 1)
        inner.addLayout(actions)
        return box

    def search_hub(self) -> None:
        query = self.hub_query.text().strip()
        if query:
            self.hub_status.setText(f"searching for {query}…")
            self.bridge.search_hub(query)

    def on_hub_results(self, query: str, repos: list) -> None:
        self.hub_repos.clearSelection()  # a new list: picking its first row must read as a choice
        self.hub_repo_list = repos
        self.hub_repos.setRowCount(len(repos))
        for r, m in enumerate(repos):
            for c, text in enumerate((m["id"], f"{m['downloads']:,}", f"{m['likes']:,}")):
                self.hub_repos.setItem(r, c, QTableWidgetItem(text))
        self.hub_models.setRowCount(0)
        self.hub_status.setText(f"{len(repos)} GGUF repos for {query}" if repos else f"no GGUF repo matches {query}")

    def on_repo_selected(self) -> None:
        rows = self.hub_repos.selectionModel().selectedRows()
        row = rows[0].row() if rows else -1
        if 0 <= row < len(self.hub_repo_list):
            self.hub_status.setText(f"listing {self.hub_repo_list[row]['id']}…")
            self.bridge.hub_repo(self.hub_repo_list[row]["id"])

    def on_hub_files(self, repo: str, doc: dict) -> None:
        self.hub_model_list = doc["models"]
        self.hub_models.setRowCount(len(self.hub_model_list))
        default = None
        for r, m in enumerate(self.hub_model_list):
            parts = f" ({len(m['parts'])} parts)" if len(m["parts"]) > 1 else ""
            for c, text in enumerate((m["quant"] or "?", m["file"] + parts, _size(m["size"], False), m["fit"],
                                      "default" if m["default"] else "")):
                self.hub_models.setItem(r, c, QTableWidgetItem(text))
            if m["default"]:
                default = r
        if default is not None:
            self.hub_models.selectRow(default)
        self.hub_vision.setEnabled(bool(doc["vision"]))
        towers = f"; vision tower {doc['vision'][0]['path']}" if doc["vision"] else ""
        self.hub_status.setText(f"{repo}: {len(self.hub_model_list)} GGUF models{towers}")

    def on_hub_failed(self, message: str) -> None:
        self.hub_status.setText(message)

    def pull_selected(self) -> None:
        row = self.hub_models.currentRow()
        if 0 <= row < len(self.hub_model_list):
            model = self.hub_model_list[row]["pull"]
            self.hub_status.setText(f"pulling {model}…")
            self.bridge.pull(model, self.hub_vision.isEnabled() and self.hub_vision.isChecked())

    def show_pulls(self, pulls: list[dict]) -> None:
        """The latest pull's progress under the search (when it moved: the search's own lines stay otherwise)."""
        p = pulls[-1] if pulls else None
        if p is None or (p["spec"], p["status"], p["completed"]) == self._pull_shown:
            return
        self._pull_shown = (p["spec"], p["status"], p["completed"])
        if p["status"] == "downloading":
            self.hub_status.setText(f"pulling {p['spec']}: {_size(p['completed'], False)} of "
                                    f"{_size(p['size'], False)}")
        elif p["status"] == "done":
            self.hub_status.setText(f"pulled {p['spec']}: a request for the model '{p['model']}' serves it")
        else:
            self.hub_status.setText(f"pull of {p['spec']} {p['status']}: {p['error']}")

    def on_stats_updated(self, _stats: dict) -> None:
        if self.isVisible():
            self.refresh()

    def refresh(self) -> None:
        try:
            doc = self.bridge.catalog()
        except Exception as e:  # a broken catalog file must not take the window down
            self.box.setText(f"catalog unavailable: {e}")
            return
        if doc is None:
            return
        self.entries = doc["entries"]
        self.show_pulls(doc.get("pulls", []))
        local = [f["name"] for f in doc.get("local", [])]
        self.local.setText(f"Other GGUFs in the models folder ({len(local)}), served by name on demand: "
                           + ", ".join(local) if local else "No other GGUFs in the models folder.")
        b = doc["box"]
        self.box.setText(f"this box: {b['ram_bytes'] / 2**30:.0f} GiB RAM"
                         + (f", {b['vram_bytes'] / 2**30:.0f} GiB VRAM" if b.get("vram_bytes") else "")
                         + f" · models in {doc['models_dir']}")
        self.render()

    def visible_entries(self) -> list[dict]:
        text = self.filter.text().lower()
        kind = self.kind.currentText()
        return [e for e in self.entries
                if (kind == "all kinds" or e["kind"] == kind)
                and (not text or text in f"{e['name']} {e['family']} {e['license']}".lower())]

    def render(self) -> None:
        rows = self.visible_entries()
        selected = self.selected_name()
        self.table.setRowCount(len(rows))
        for r, e in enumerate(rows):
            local = e["local"]["state"] + (" · served" if e["served"] else "")
            for c, text in enumerate((e["name"], e["kind"], e["family"], _size(e["size"], e["size_estimated"]),
                                      e["fit"], e["license"], local)):
                self.table.setItem(r, c, QTableWidgetItem(text))
            bar = self.table.cellWidget(r, 7)
            if not isinstance(bar, QProgressBar):
                bar = QProgressBar()
                self.table.setCellWidget(r, 7, bar)
            d = e["download"]
            if d and d["total"]:
                bar.setRange(0, 1000)
                bar.setValue(int(1000 * d["bytes"] / d["total"]))
                eta = f", {d['eta_s']:.0f} s left" if d.get("eta_s") else ""
                rate = f" {d['rate'] / 1e6:.1f} MB/s" if d["rate"] else ""
                bar.setFormat(f"{d['status']}{rate}{eta}" if d["status"] != "failed" else f"failed: {d['error']}")
            else:
                bar.setRange(0, 1)
                bar.setValue(0)
                bar.setFormat(d["status"] if d else "")
            if e["name"] == selected:
                self.table.selectRow(r)

    def selected_name(self) -> str | None:
        row = self.table.currentRow()
        item = self.table.item(row, 0) if row >= 0 else None
        return item.text() if item else None

    def _act(self, action: str) -> None:
        name = self.selected_name()
        if not name:
            return
        if action == "download":
            self.bridge.download(name)
        elif action == "cancel":
            self.bridge.cancel_download(name)
        else:
            self.bridge.serve(name)
        self.refresh()

    def ask_import(self) -> None:
        dlg = QFileDialog(self, "Import a GGUF into the models folder", "", "GGUF models (*.gguf)")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.fileSelected.connect(self.bridge.import_gguf)
        dlg.open()

    def show_folder(self) -> None:
        folder = self.bridge.models_dir()
        if folder is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(folder))


def _table(columns: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(columns))
    t.setHorizontalHeaderLabels(columns)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    t.verticalHeader().setVisible(False)
    t.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
    t.setSelectionMode(QTableWidget.SelectionMode.SingleSelection)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    return t
