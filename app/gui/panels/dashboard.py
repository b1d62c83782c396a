"""Dashboard: live charts (1 Hz) and a per-stream swimlane, from the same data as /v1/stats and /v1/streams."""
from __future__ import annotations

from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import (QGridLayout, QGroupBox, QHeaderView, QLabel, QProgressBar, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from app.gui.panels.elided import ElidedLabel

HISTORY = 120  # seconds of chart history


class Chart(pg.PlotWidget):
    """A small time-series chart with one or more named lines."""

    def __init__(self, title: str, series: list[tuple[str, str]], unit: str, counts: bool = True):
        """counts: the values are rates or counts, never below 0: the y axis starts at 0 and spans at least 1 (an
        idle server's zeros would otherwise auto-range to ±0.5, drawn as -400…400 "(x0.001)")."""
        super().__init__()
        self.setBackground(None)
        self.setTitle(title, size="10pt")
        self.setMouseEnabled(False, False)
        self.hideButtons()
        # A fixed x range and no grid: auto-ranging x and an alpha grid made each 1 Hz redraw of the
        # four charts cost ~40 ms of the shared event loop (measured offscreen); now ~2 ms.
        self.setXRange(0, HISTORY - 1, padding=0)
        self.disableAutoRange(axis="x")
        self.getPlotItem().setLabel("left", unit)
        self.getPlotItem().getAxis("left").enableAutoSIPrefix(False)  # the unit says the scale: no "(x0.001)"
        self.counts = counts
        if counts:  # ranged by push(): from 0, with a sliver below it for the "0" label
            self.disableAutoRange(axis="y")
            self.setYRange(0, 1, padding=0.03)
        self.getPlotItem().getAxis("bottom").setStyle(showValues=False)
        self.addLegend(offset=(5, 5))
        self.lines = {}
        self.data = {}
        for name, color in series:
            self.lines[name] = self.plot([], [], name=name, pen=pg.mkPen(color, width=2))
            self.data[name] = deque(maxlen=HISTORY)
        self.setMinimumHeight(120)  # two rows of charts, the summary and the swimlane fit in a 900x600 window

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self.resetCachedContent()  # pyqtgraph caches the background: drawn again in the new theme's colours

    def push(self, values: dict[str, float]) -> None:
        for name, v in values.items():
            self.data[name].append(v)
            ys = np.fromiter(self.data[name], dtype=float)
            self.lines[name].setData(np.arange(HISTORY - len(ys), HISTORY), ys)  # newest at the right edge
        if self.counts:
            top = max((max(d) for d in self.data.values() if d), default=0.0)
            self.setYRange(0, max(1.0, top * 1.05), padding=0.03)


class DashboardPanel(QWidget):
    """Throughput, streams and memory over time; what every stream is doing now."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.gen = Chart("Generated tokens/s", [("generated", "#5b6cff")], "tok/s")
        self.prefill = Chart("Prefill tokens/s", [("prefill", "#2bb3a3")], "tok/s")
        self.streams_chart = Chart("Streams", [("active", "#e07b39"), ("queued", "#9b59b6")], "streams")
        self.memory = Chart("Memory", [("rss", "#7f8c8d")], "MB", counts=False)
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        self.hardware = ElidedLabel()  # llama.cpp's CPU-feature list runs long: one line, the rest in its tooltip
        self.cache = QLabel()  # where reused prompt tokens came from
        self.cache.setWordWrap(True)
        self.speech = QLabel()  # the speech workers beside the LLM
        self.speech.setWordWrap(True)
        charts = QGridLayout()
        for i, c in enumerate((self.gen, self.prefill, self.streams_chart, self.memory)):
            charts.addWidget(c, i // 2, i % 2)
        self.table = QTableWidget(0, 7)
        self.table.setHorizontalHeaderLabels(["stream", "model", "state", "progress", "tok/s", "prompt", "tail"])
        self.table.horizontalHeader().setSectionResizeMode(6, QHeaderView.ResizeMode.Stretch)
        # every column but the tail as wide as its text (the model's whole name, the state with its finish
        # reason, the short numbers): the tail (stretched) gives way to them; a narrow window scrolls sideways
        for col in (0, 1, 2, 4, 5):
            self.table.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        self.table.setColumnWidth(3, 170)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setMinimumHeight(90)  # the header and two streams
        lanes = QGroupBox("Streams")
        QVBoxLayout(lanes).addWidget(self.table)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.hardware)
        layout.addWidget(self.cache)
        layout.addWidget(self.speech)
        layout.addLayout(charts, 3)
        layout.addWidget(lanes, 2)
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.streams_updated.connect(self.on_streams_updated)

    def on_stats_updated(self, stats: dict) -> None:
        self.gen.push({"generated": stats["gen_tok_s"]})
        self.prefill.push({"prefill": stats["prefill_tok_s"]})
        self.streams_chart.push({"active": stats["active_streams"], "queued": stats["queued_streams"]})
        self.memory.push({"rss": stats["memory"]["rss_bytes"] / 2**20})
        t = stats["ttft_ms"]
        self.summary.setText(
            f"<b>{stats['gen_tokens']}</b> tokens generated, <b>{stats['prefill_tokens']}</b> prefilled in "
            f"<b>{stats['decode_calls']}</b> decodes (up to {stats['max_streams_per_decode']} streams per decode) · "
            f"prefix cache hits <b>{stats['prefix_cache_hits']}</b> · TTFT p50 {t['p50']:.0f} ms, "
            f"p95 {t['p95']:.0f} ms")
        self.hardware.setText(stats["hardware"])
        self.cache.setText(_cache_line(stats))
        self.speech.setText(" · ".join(_speech_line(what, stats.get(kind, {}))
                                       for kind, what in (("asr", "speech to text"), ("tts", "text to speech"))))

    def on_streams_updated(self, streams: list) -> None:
        if not self.isVisible():
            return  # nothing to see: skip the table work (the charts above keep their history)
        live = [s for s in streams if s["state"] != "done"] + [s for s in streams if s["state"] == "done"][-8:]
        if self.table.rowCount() != len(live):
            self.table.setRowCount(len(live))
        for row, s in enumerate(live):
            state = s["state"] + (f" ({s['finish_reason']})" if s.get("finish_reason") else "")
            for col, text in ((0, s["id"][:10]), (1, s["model"]), (2, state), (4, f"{s['tok_s']:.1f}"),
                              (5, str(s["prompt_tokens"])), (6, s["tail"].replace("\n", " ")[-60:])):
                item = self.table.item(row, col)
                if item is None:
                    item = QTableWidgetItem(text)
                    self.table.setItem(row, col, item)
                elif item.text() != text:
                    item.setText(text)
                item.setToolTip(s["id"] if col == 0 else s["tail"][-400:] if col == 6 else text)
            bar = self.table.cellWidget(row, 3)
            if not isinstance(bar, QProgressBar):
                bar = QProgressBar()
                self.table.setCellWidget(row, 3, bar)
            if s["state"] == "prefill":
                bar.setRange(0, max(s["prompt_tokens"], 1))
                bar.setValue(s["prompt_done"])
                bar.setFormat("prefill %v/%m")
            else:
                bar.setRange(0, max(s["max_tokens"], 1))
                bar.setValue(min(s["gen_tokens"], s["max_tokens"]))
                bar.setFormat("%v/%m tokens")


def _speech_line(what: str, worker: dict) -> str:
    """One speech service as /v1/stats reports it: model, state, queue, jobs, real-time factor."""
    if "model" not in worker:
        return f"{what}: {'<i>error</i>' if worker.get('state') == 'error' else 'off'}"
    rtf = f", RTF {worker['rtf']:.3f}" if worker.get("rtf") is not None else ""
    return (f"{what}: <b>{worker['model']}</b> {worker['state']}, {worker['queued']} queued, "
            f"{worker['jobs']} jobs{rtf}")


def _cache_line(stats: dict) -> str:
    """Prompt tokens reused instead of prefilled, by source, and the host-RAM cache's size."""
    caches = [m["prompt_cache"] for m in stats.get("models", []) if m.get("prompt_cache")]
    held = sum(c["bytes"] for c in caches) / 2**20
    in_ram = sum(c["ram_entries"] for c in caches)
    on_disk = sum(c["entries"] - c["ram_entries"] for c in caches)
    return (f"prompt cache: <b>{stats.get('prefix_cache_reused_tokens', 0)}</b> tokens reused (in the sequence "
            f"{stats.get('kv_reused_tokens', 0)} · attached from another {stats.get('attached_tokens', 0)} · "
            f"from RAM {stats.get('ram_reused_tokens', 0)} · from disk {stats.get('disk_reused_tokens', 0)}) · "
            f"{in_ram} conversations in RAM ({held:.0f} MB)" + (f", {on_disk} more on disk" if on_disk else ""))
