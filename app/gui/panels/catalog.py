"""Catalog: curated models with fit badges, download progress (rate, ETA), cancel, serve, show in folder."""
from __future__ import annotations

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from engine.catalog.entries import KINDS

COLUMNS = ["name", "kind", "family", "size", "fit", "license", "on disk", "download"]


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
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addLayout(actions)
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.reloaded.connect(self.refresh)

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

    def show_folder(self) -> None:
        folder = self.bridge.models_dir()
        if folder is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(folder))
