"""Benchmark: llama-bench's rows on a served model, filled in as each test ends, a bar chart, and the runs so far."""
from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QListWidget, QProgressBar, QPushButton,
                               QSplitter, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.gui import theme
from app.gui.panels.elided import ElidedLabel
from app.gui.panels.models import runs_on

INTRO = ("Measures this machine with llama-bench's tests on the chosen model. While it runs the engine is the "
         "benchmark's alone: other requests wait (503). t/s is tokens per second, the mean of three timed runs.")


def explain(test: str) -> str:
    """One line saying what a llama-bench test name measures."""
    name, _, streams = test.partition("@")
    if name.startswith("pp"):
        return f"prompt processing: reading a {name[2:]}-token prompt; how fast a long prompt is taken in"
    if streams:
        return f"text generation, {streams} streams at once: their summed speed with {streams} requests running"
    return f"text generation: {name[2:]} tokens for one stream; how fast a single reply streams"


class BenchmarkPanel(QWidget):
    """Run pp512 / tg128 / tg128@N on the engine, step by step, and compare with earlier runs."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.model = QComboBox()
        self.run_button = QPushButton("Run benchmark")
        self.run_button.clicked.connect(self.run)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        intro = QLabel(INTRO)
        intro.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("not run yet")
        self.status = ElidedLabel()  # errors and the hardware line run long: one line, the rest in the tooltip
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["test", "t/s", "± std", "what it measures"])
        header = self.table.horizontalHeader()
        for col in (0, 1, 2):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.chart = pg.PlotWidget()
        self.chart.setBackground(None)
        self.chart.setMouseEnabled(False, False)
        self.chart.hideButtons()
        self.chart.getPlotItem().setLabel("left", "tokens/s")
        self.history = QListWidget()
        # a run's line is long (model, quant, threads, rates): elided to the list, whole in its tooltip
        self.history.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.history.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model, 1)
        top.addWidget(self.run_button)
        top.addWidget(self.cancel_button)
        self.table.setMinimumHeight(120)
        split = QSplitter()  # the table spans the width (its explanations read whole); runs and chart below
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(QLabel("Earlier runs"))
        left_layout.addWidget(self.history, 1)
        split.addWidget(left)
        split.addWidget(self.chart)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(intro)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 2)
        layout.addWidget(split, 3)
        bridge.bench_progress.connect(self.on_bench_progress)
        bridge.bench_done.connect(self.on_bench_done)
        bridge.models_changed.connect(self.refresh)
        self.apply_icons()
        self.refresh()

    def apply_icons(self) -> None:
        self.run_button.setIcon(theme.icon("shell-run"))
        self.cancel_button.setIcon(theme.icon("shell-stop"))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "cancel_button"):
            self.apply_icons()
            self.chart.resetCachedContent()  # pyqtgraph caches the background: drawn again in the new colours

    def refresh(self) -> None:
        chosen = self.model.currentText()
        self.model.clear()
        for m in self.bridge.models():
            if m.get("kind") == "llm" and m["state"] == "loaded":
                self.model.addItem(m["id"])
        if chosen:
            self.model.setCurrentText(chosen)
        self.run_button.setEnabled(bool(self.model.count()) and not self.cancel_button.isEnabled())
        self.run_button.setToolTip("" if self.model.count() else "load a text model first (Models or Catalog)")

    def run(self) -> None:
        if not self.model.currentText():
            return
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.table.setRowCount(0)
        self.progress.setRange(0, 0)  # busy until the first step says how many there are
        self.status.setText(f"starting the benchmark of {self.model.currentText()}…")
        self.bridge.run_bench(self.model.currentText())

    def cancel(self) -> None:
        if self.bridge.cancel_bench():
            self.cancel_button.setEnabled(False)
            self.status.setText("cancelling at the next decode…")

    def on_bench_progress(self, p: dict) -> None:
        """A test begins (or the last one ended): the step, and the rows of the tests done so far."""
        self.progress.setRange(0, p["steps"])
        self.progress.setValue(len(p["rows"]))
        if p["current"]:
            self.progress.setFormat(f"step {p['step']} of {p['steps']}: {p['current']}")
            self.status.setText(f"running {p['current']}: {explain(p['current'])}")
        else:
            self.progress.setFormat(f"{p['steps']} of {p['steps']} done")
        self.show_rows(p["rows"])

    def show_rows(self, rows: list[dict]) -> None:
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            cells = (row["test"], f"{row['t_s']:.1f}", f"{row['t_s_std']:.1f}", explain(row["test"]))
            for c, text in enumerate(cells):
                item = self.table.item(r, c)
                if item is None:
                    item = QTableWidgetItem()
                    self.table.setItem(r, c, item)
                item.setText(text)
                item.setToolTip(cells[3])

    def on_bench_done(self, record: dict) -> None:
        self.cancel_button.setEnabled(False)
        self.run_button.setEnabled(bool(self.model.count()))
        state = record.get("state")
        if state == "cancelled":
            done, steps = len(record["rows"]), record.get("steps", len(record["rows"]))
            self.show_rows(record["rows"])
            self.progress.setRange(0, max(steps, 1))
            self.progress.setValue(done)
            self.progress.setFormat(f"cancelled after {done} of {steps}")
            self.status.setText(f"cancelled after {done} of {steps} tests; serving again")
            return
        if state != "done":
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("failed")
            self.status.setText(f"benchmark failed: {record.get('error')}")
            return
        rows = record["rows"]
        self.show_rows(rows)
        self.progress.setRange(0, len(rows))
        self.progress.setValue(len(rows))
        self.progress.setFormat(f"{len(rows)} of {len(rows)} done")
        self.chart.clear()
        x = np.arange(len(rows))
        self.chart.addItem(pg.BarGraphItem(x=x, height=[r["t_s"] for r in rows], width=0.6, brush="#5b6cff"))
        self.chart.getPlotItem().getAxis("bottom").setTicks([[(i, r["test"]) for i, r in enumerate(rows)]])
        when = time.strftime("%H:%M:%S", time.localtime(record["started"]))
        summary = ", ".join(f"{r['test']} {r['t_s']:.0f}" for r in rows)
        where = runs_on(record, record.get("cpu_variant"))
        self.history.insertItem(0, f"{when} {record['model']} ({record['quant']}, {record['threads']} threads, "
                                   f"{where}): {summary} t/s")
        self.history.item(0).setToolTip(f"{self.history.item(0).text()}\n{record['hardware']}")
        self.status.setText(f"done in {record['seconds']:.1f} s on {where} · {record['hardware']}")
