"""The tray icon: state, open the window, copy the API URL, pause/resume serving, quit."""
from __future__ import annotations

from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QMenu, QSystemTrayIcon


class Tray(QSystemTrayIcon):
    """Menu actions are attributes, so tests (and shortcuts) can trigger them."""

    def __init__(self, bridge, window, icon, quit_app):
        super().__init__(icon)
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
        self.setToolTip(f"llamadesk: {state}" + (f" on {self.window.api_url()}" if self.window.api_url() else ""))
        self.pause_action.setText("Resume serving" if state == "paused" else "Pause serving")
