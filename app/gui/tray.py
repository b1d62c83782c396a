"""The tray icon: state, open the window, copy the API URL, pause/resume serving, quit."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QColor, QGuiApplication, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

STATE_COLORS = {"serving": "#2ecc71", "busy": "#f39c12", "loading": "#3498db", "setup": "#9b59b6",
                "benchmarking": "#e67e22", "paused": "#95a5a6", "stopped": "#e74c3c"}


def state_icon(base: QIcon, state: str) -> QIcon:
    """The app icon with a dot in the corner whose colour says the state."""
    pix = base.pixmap(64, 64)
    if pix.isNull():
        pix = QPixmap(64, 64)
        pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setPen(QColor("#ffffff"))
    p.setBrush(QColor(STATE_COLORS.get(state, "#95a5a6")))
    p.drawEllipse(38, 38, 24, 24)
    p.end()
    return QIcon(pix)


class Tray(QSystemTrayIcon):
    """Menu actions are attributes, so tests (and shortcuts) can trigger them."""

    def __init__(self, bridge, window, icon, quit_app):
        super().__init__(icon)
        self.base_icon = icon
        self.state = "starting"
        self.bridge = bridge
        self.window = window
        menu = QMenu()
        self.open_action = QAction("Open window", menu)
        self.copy_action = QAction("Copy API URL", menu)
        self.pause_action = QAction("Pause serving", menu)
        self.quit_action = QAction("Quit", menu)
        self.open_action.triggered.connect(self.on_open)
        self.copy_action.triggered.connect(lambda: QGuiApplication.clipboard().setText(window.api_url()))
        self.pause_action.triggered.connect(bridge.toggle_serving)
        self.quit_action.triggered.connect(quit_app)
        for a in (self.open_action, self.copy_action, self.pause_action):
            menu.addAction(a)
        menu.addSeparator()
        menu.addAction(self.quit_action)
        self.menu = menu
        self.setContextMenu(menu)
        self.activated.connect(lambda reason: self.on_open() if reason == QSystemTrayIcon.ActivationReason.Trigger
                               else None)
        bridge.state_changed.connect(self.on_state_changed)
        self.on_state_changed("starting")

    def on_open(self) -> None:
        self.window.showNormal()
        self.window.raise_()
        self.window.activateWindow()

    def on_state_changed(self, state: str) -> None:
        self.state = state
        self.setIcon(state_icon(self.base_icon, state))
        self.setToolTip(f"llamadesk: {state}" + (f" on {self.window.api_url()}" if self.window.api_url() else ""))
        self.pause_action.setText("Resume serving" if state == "paused" else "Pause serving")
