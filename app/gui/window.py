"""The main window: a sidebar of panels and a status bar with the server URL, state and live tok/s."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QListWidget, QMainWindow, QProgressBar, QPushButton,
                               QStackedWidget, QStatusBar, QWidget)

from app.gui.panels.benchmark import BenchmarkPanel
from app.gui.panels.catalog import CatalogPanel
from app.gui.panels.chat import ChatPanel
from app.gui.panels.dashboard import DashboardPanel
from app.gui.panels.logs import LogsPanel
from app.gui.panels.models import ModelsPanel
from app.gui.panels.settings import SettingsPanel
from app.gui.panels.speech import SpeechPanel

PANELS = ("Dashboard", "Catalog", "Models", "Chat", "Speech", "Benchmark", "Settings", "Logs")


class MainWindow(QMainWindow):
    """Sidebar + stacked panels; closing hides to the tray and keeps serving."""

    def __init__(self, bridge, icon, audio_io):
        super().__init__()
        self.bridge = bridge
        self.setWindowTitle("llamadesk")
        self.setWindowIcon(icon)
        self.resize(1200, 780)
        self.panels = {"Dashboard": DashboardPanel(bridge), "Catalog": CatalogPanel(bridge),
                       "Models": ModelsPanel(bridge), "Chat": ChatPanel(bridge, audio_io),
                       "Speech": SpeechPanel(bridge, audio_io), "Benchmark": BenchmarkPanel(bridge),
                       "Settings": SettingsPanel(bridge),
                       "Logs": LogsPanel(bridge)}
        self.sidebar = QListWidget()
        self.sidebar.addItems(list(self.panels))
        self.sidebar.setFixedWidth(150)
        self.sidebar.setStyleSheet("QListWidget::item { padding: 7px 10px; }")
        self.stack = QStackedWidget()
        for p in self.panels.values():
            self.stack.addWidget(p)
        self.sidebar.currentRowChanged.connect(self.on_sidebar_row_changed)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.url_label = QLabel()
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_button = QPushButton("Copy URL")
        self.copy_button.clicked.connect(self.copy_url)
        self.state_label = QLabel()
        self.rate_label = QLabel()
        self.load_bar = QProgressBar()  # shown while a model's weights load
        self.load_bar.setRange(0, 100)
        self.load_bar.setMaximumWidth(220)
        self.load_bar.hide()
        status = QStatusBar()
        status.addWidget(self.url_label)
        status.addWidget(self.copy_button)
        status.addPermanentWidget(self.load_bar)
        status.addPermanentWidget(self.rate_label)
        status.addPermanentWidget(self.state_label)
        self.setStatusBar(status)
        self.closed_once = False
        bridge.state_changed.connect(self.on_state_changed)
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.notice.connect(lambda text: self.statusBar().showMessage(text, 8000))
        bridge.load_progress.connect(self.on_load_progress)
        self.show_panel("Dashboard")

    def show_panel(self, name: str) -> None:
        self.sidebar.setCurrentRow(list(self.panels).index(name))

    def on_sidebar_row_changed(self, row: int) -> None:
        self.stack.setCurrentIndex(row)
        panel = self.stack.currentWidget()
        if isinstance(panel, CatalogPanel):
            panel.refresh()

    def api_url(self) -> str:
        url = self.bridge.host.url
        return f"{url}/v1" if url else ""

    def copy_url(self) -> None:
        QGuiApplication.clipboard().setText(self.api_url())

    def on_state_changed(self, state: str) -> None:
        self.state_label.setText(f"● {state}")
        self.url_label.setText(self.api_url() or "not listening")

    def on_stats_updated(self, stats: dict) -> None:
        self.rate_label.setText(f"{stats['gen_tok_s']:.1f} tok/s · {stats['active_streams']} active · "
                                f"{stats['queued_streams']} queued")
        self.url_label.setText(self.api_url() or "not listening")

    def on_load_progress(self, name: str, fraction: float) -> None:
        self.load_bar.setFormat(f"loading {name} %p%")
        self.load_bar.setValue(int(fraction * 100))
        self.load_bar.setVisible(fraction < 1.0)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        """Keep serving: the window only hides (Quit lives in the tray menu)."""
        event.ignore()
        self.hide()
        if not self.closed_once:
            self.closed_once = True
            self.bridge.notice.emit("llamadesk keeps serving in the background; quit from the tray menu")
            tray = getattr(self, "tray", None)
            if tray is not None and tray.isVisible():
                tray.showMessage("llamadesk", "Still serving in the tray. Quit from the tray menu.")
