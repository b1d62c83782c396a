"""Benchmark: llama-bench's rows on a served model, a bar chart, and the runs so far."""
from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QListWidget, QPushButton, QSplitter,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)


class BenchmarkPanel(QWidget):
    """Run pp512 / tg128 / tg128@N on the engine and compare with earlier runs."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.model = QComboBox()
        self.run_button = QPushButton("Run benchmark")
        self.run_button.clicked.connect(self.run)
        self.status = QLabel("The benchmark has the engine to itself for a few seconds: requests wait (503).")
        self.status.setWordWrap(True)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["test", "t/s", "± std"])
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.verticalHeader().setVisible(False)
        self.chart = pg.PlotWidget()
        self.chart.setBackground(None)
        self.chart.setMouseEnabled(False, False)
        self.chart.hideButtons()
        self.chart.getPlotItem().setLabel("left", "tokens/s")
        self.history = QListWidget()
        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model, 1)
        top.addWidget(self.run_button)
        split = QSplitter()
        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.addWidget(self.table)
        left_layout.addWidget(QLabel("Earlier runs"))
        left_layout.addWidget(self.history)
        split.addWidget(left)
        split.addWidget(self.chart)
        split.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.status)
        layout.addWidget(split, 1)
        bridge.bench_done.connect(self.on_bench_done)
        bridge.models_changed.connect(self.refresh)
        bridge.stats_updated.connect(self.on_stats_updated)
        self.refresh()

    def refresh(self) -> None:
        self.model.clear()
        for m in self.bridge.models():
            if m.get("kind") == "llm" and m["state"] == "loaded":
                self.model.addItem(m["id"])

    def run(self) -> None:
        if self.model.currentText():
            self.run_button.setEnabled(False)
            self.status.setText("running…")
            self.bridge.run_bench(self.model.currentText())

    def on_stats_updated(self, stats: dict) -> None:
        bench = stats.get("bench") or {}
        if bench.get("state") == "running":
            self.status.setText(f"running {bench.get('current') or ''}…")

    def on_bench_done(self, record: dict) -> None:
        self.run_button.setEnabled(True)
        if record.get("state") != "done":
            self.status.setText(f"benchmark failed: {record.get('error')}")
            return
        rows = record["rows"]
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, text in enumerate((row["test"], f"{row['t_s']:.1f}", f"{row['t_s_std']:.1f}")):
                self.table.setItem(r, c, QTableWidgetItem(text))
        self.chart.clear()
        x = np.arange(len(rows))
        self.chart.addItem(pg.BarGraphItem(x=x, height=[r["t_s"] for r in rows], width=0.6, brush="#5b6cff"))
        self.chart.getPlotItem().getAxis("bottom").setTicks([[(i, r["test"]) for i, r in enumerate(rows)]])
        when = time.strftime("%H:%M:%S", time.localtime(record["started"]))
        summary = ", ".join(f"{r['test']} {r['t_s']:.0f}" for r in rows)
        self.history.insertItem(0, f"{when} {record['model']} ({record['quant']}, {record['threads']} threads): "
                                   f"{summary} t/s")
        self.status.setText(f"done in {record['seconds']:.1f} s · {record['hardware']}")
