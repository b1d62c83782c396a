"""Logs: live log lines with a level filter and search; copy diagnostics."""
from __future__ import annotations

import json
import logging
import platform

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLineEdit, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from engine import llama
from engine.config import SECRET_KEYS
from engine.system import VERSION, hardware_line

LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


class LogsPanel(QWidget):
    """Every log record since start, filtered on demand."""

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.records: list[tuple[str, str]] = []
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(5000)
        self.level = QComboBox()
        self.level.addItems(LEVELS)
        self.level.setCurrentText("INFO")
        self.search = QLineEdit()
        self.search.setPlaceholderText("search")
        copy = QPushButton("Copy diagnostics")
        copy.clicked.connect(self.copy_diagnostics)
        self.level.currentTextChanged.connect(self.refilter)
        self.search.textChanged.connect(self.refilter)
        top = QHBoxLayout()
        top.addWidget(self.level)
        top.addWidget(self.search, 1)
        top.addWidget(copy)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.view)
        bridge.log_record.connect(self.on_log_record)

    def _shown(self, level: str, line: str) -> bool:
        return logging.getLevelName(level) >= logging.getLevelName(self.level.currentText()) and \
            self.search.text().lower() in line.lower()

    def on_log_record(self, level: str, line: str) -> None:
        self.records.append((level, line))
        del self.records[:-20000]
        if self._shown(level, line):
            self.view.appendPlainText(line)

    def refilter(self) -> None:
        self.view.setPlainText("\n".join(line for level, line in self.records if self._shown(level, line)))

    def diagnostics(self) -> str:
        cfg = self.bridge.host.config
        return "\n".join([
            f"llamadesk {VERSION}", f"OS: {platform.platform()}", f"Python: {platform.python_version()}",
            f"hardware: {hardware_line()}", f"llama.cpp: {llama.system_info()}",
            "config: " + json.dumps({k: v["value"] for k, v in cfg.report().items() if k not in SECRET_KEYS}),
            "models: " + json.dumps([m.path for m in cfg.models])])

    def copy_diagnostics(self) -> None:
        QGuiApplication.clipboard().setText(self.diagnostics())
