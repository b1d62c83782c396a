"""The main window: the application menu, a sidebar of panels, and a status bar with the server URL, a Serve
toggle, the state and live tok/s. It appears at once with a loading page while the models load behind it."""
from __future__ import annotations

from pathlib import Path

import platformdirs
from PySide6.QtCore import QEvent, QSettings, QSize, Qt, QUrl
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QDesktopServices, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (QApplication, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QMainWindow,
                               QMessageBox, QProgressBar, QPushButton, QStackedWidget, QStatusBar,
                               QSystemTrayIcon, QVBoxLayout, QWidget)

from app.gui import theme
from app.gui.panels.benchmark import BenchmarkPanel
from app.gui.panels.catalog import CatalogPanel
from app.gui.panels.chat import ChatPanel
from app.gui.panels.dashboard import DashboardPanel
from app.gui.panels.elided import ElidedLabel
from app.gui.panels.logs import LogsPanel
from app.gui.panels.models import ModelsPanel
from app.gui.panels.settings import SettingsPanel
from app.gui.panels.speech import SpeechPanel
from engine.config import APP_NAME
from engine.system import VERSION
from server.access import InsecureBind, is_loopback_bind

PANELS = ("Dashboard", "Catalog", "Models", "Chat", "Speech", "Benchmark", "Settings", "Logs")
CLOSE_QUITS_SHOWN = "notices/close_quits_shown"  # the no-tray notice was seen and accepted once


def tray_available() -> bool:
    """Whether this desktop shows tray icons (a window closed to the tray can be found again)."""
    return QSystemTrayIcon.isSystemTrayAvailable()


class LoadingPage(QWidget):
    """What the window shows while the models load: what is loading and a busy bar."""

    def __init__(self):
        super().__init__()
        self.title = QLabel("<h2>Starting llamadesk</h2>")
        self.what = QLabel()
        self.what.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy: a load reports no progress until its model is known
        self.bar.setTextVisible(False)
        self.bar.setMaximumWidth(420)
        layout = QVBoxLayout(self)
        layout.addStretch(1)
        for w in (self.title, self.what, self.bar):
            layout.addWidget(w, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addStretch(2)

    def show_models(self, names: list[str]) -> None:
        self.what.setText(f"Loading {', '.join(names)}…" if names else "Starting the server…")


class MainWindow(QMainWindow):
    """Menus, sidebar + stacked panels, status bar. Closing hides to the tray where there is one; without a
    tray it quits (the first time after saying so)."""

    def __init__(self, bridge, icon, audio_io, quit_app=None, ui_state: QSettings | None = None):
        super().__init__()
        self.bridge = bridge
        self.quit_app = quit_app  # the app's drain-and-quit path (Desktop.request_quit)
        self.ui_state = ui_state
        self.tray = None
        self.setWindowTitle("llamadesk")
        self.setWindowIcon(icon)
        self.resize(1200, 780)
        self.panels = {"Dashboard": DashboardPanel(bridge), "Catalog": CatalogPanel(bridge),
                       "Models": ModelsPanel(bridge), "Chat": ChatPanel(bridge, audio_io),
                       "Speech": SpeechPanel(bridge, audio_io), "Benchmark": BenchmarkPanel(bridge),
                       "Settings": SettingsPanel(bridge),
                       "Logs": LogsPanel(bridge)}
        self.loading_page = LoadingPage()
        self.sidebar = QListWidget()
        for name in self.panels:
            item = QListWidgetItem(name)
            item.setSizeHint(QSize(0, 34))  # roomy rows without a style sheet, which would stop theme switches
            self.sidebar.addItem(item)
        self.sidebar.setFixedWidth(160)
        self.sidebar.setIconSize(QSize(18, 18))
        self.stack = QStackedWidget()
        for p in self.panels.values():
            self.stack.addWidget(p)
        self.stack.addWidget(self.loading_page)
        self.sidebar.currentRowChanged.connect(self.on_sidebar_row_changed)
        central = QWidget()
        layout = QHBoxLayout(central)
        layout.addWidget(self.sidebar)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(central)
        self._build_status_bar()
        self._build_menus()
        self.dialog: QMessageBox | None = None  # the message box open now (tests read it)
        self.closed_once = False
        bridge.state_changed.connect(self.on_state_changed)
        bridge.stats_updated.connect(self.on_stats_updated)
        bridge.notice.connect(lambda text: self.statusBar().showMessage(text, 8000))
        bridge.load_progress.connect(self.on_load_progress)
        bridge.reloaded.connect(self.sync_serving)
        self.apply_icons()
        self.show_panel("Dashboard")

    # ---- building ---------------------------------------------------------------------------------------

    def _build_status_bar(self) -> None:
        self.url_label = ElidedLabel()
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_button = QPushButton("Copy URL")
        self.copy_button.setToolTip("Copy the OpenAI base URL (…/v1) to the clipboard")
        self.copy_button.clicked.connect(self.copy_url)
        self.serve_button = QPushButton("Serving")
        self.serve_button.setCheckable(True)
        self.serve_button.setToolTip("Serve the API (off: stop listening; the models stay loaded)")
        self.serve_button.clicked.connect(self.set_serving)
        self.state_label = QLabel()
        self.rate_label = QLabel()
        self.load_bar = QProgressBar()  # shown while a model's weights load
        self.load_bar.setRange(0, 100)
        self.load_bar.setMaximumWidth(240)
        self.load_bar.hide()
        status = QStatusBar()
        status.addWidget(self.url_label)
        status.addWidget(self.copy_button)
        status.addWidget(self.serve_button)
        status.addPermanentWidget(self.load_bar)
        status.addPermanentWidget(self.rate_label)
        status.addPermanentWidget(self.state_label)
        self.setStatusBar(status)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self.data_action = file.addAction("Open data folder")
        self.data_action.triggered.connect(self.open_data_folder)
        file.addSeparator()
        self.quit_action = file.addAction("Quit")
        self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        self.quit_action.triggered.connect(self.quit)

        server = bar.addMenu("&Server")
        self.serve_action = server.addAction("Serve")
        self.serve_action.setCheckable(True)
        self.serve_action.triggered.connect(self.set_serving)
        self.network_action = server.addAction("Serve on local network")
        self.network_action.setCheckable(True)
        self.network_action.setToolTip("Listen on every network interface; needs an API key")
        self.network_action.triggered.connect(self.set_network)
        server.addSeparator()
        self.copy_action = server.addAction("Copy API URL")
        self.copy_action.triggered.connect(self.copy_url)

        view = bar.addMenu("&View")
        themes = view.addMenu("Theme")
        self.theme_group = QActionGroup(self)
        self.theme_actions: dict[str, QAction] = {}
        for name in theme.THEMES:
            action = themes.addAction(name.capitalize())
            action.setCheckable(True)
            action.triggered.connect(lambda _=False, n=name: self.choose_theme(n))
            self.theme_group.addAction(action)
            self.theme_actions[name] = action
        view.addSeparator()
        for i, name in enumerate(self.panels, 1):
            action = view.addAction(name)
            action.setShortcut(QKeySequence(f"Ctrl+{i}"))
            action.triggered.connect(lambda _=False, n=name: self.show_panel(n))

        help_ = bar.addMenu("&Help")
        self.about_action = help_.addAction("About llamadesk")
        self.about_action.triggered.connect(self.show_about)
        self.sync_theme()

    def apply_icons(self) -> None:
        """(Re)draw the SVG icons in the palette's text colour."""
        for i, name in enumerate(self.panels):
            self.sidebar.item(i).setIcon(theme.icon(f"shell-{name.lower()}"))
        self.copy_button.setIcon(theme.icon("shell-copy"))
        self.serve_button.setIcon(theme.icon("shell-serve"))
        self.data_action.setIcon(theme.icon("shell-folder"))
        self.quit_action.setIcon(theme.icon("shell-quit"))
        self.serve_action.setIcon(theme.icon("shell-serve"))
        self.network_action.setIcon(theme.icon("shell-network"))
        self.copy_action.setIcon(theme.icon("shell-copy"))
        self.about_action.setIcon(theme.icon("shell-about"))

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) and \
                hasattr(self, "about_action"):
            self.apply_icons()  # a theme switch (View menu or Settings)
            self.sync_theme()

    # ---- panels and the loading page ---------------------------------------------------------------------

    def show_panel(self, name: str) -> None:
        self.sidebar.setCurrentRow(list(self.panels).index(name))
        self.stack.setCurrentWidget(self.panels[name])  # also when it was current already (after loading)

    def on_sidebar_row_changed(self, row: int) -> None:
        if self.sidebar.isEnabled():
            self.stack.setCurrentWidget(list(self.panels.values())[row])
        panel = self.stack.currentWidget()
        if isinstance(panel, CatalogPanel):
            panel.refresh()

    def show_loading(self, models: list[str]) -> None:
        """The loading page instead of the panels until end_loading()."""
        self.loading_page.show_models(models)
        self.sidebar.setEnabled(False)
        self.stack.setCurrentWidget(self.loading_page)
        self.url_label.setText("starting…")

    def end_loading(self, panel: str) -> None:
        self.sidebar.setEnabled(True)
        self.show_panel(panel)

    @property
    def loading(self) -> bool:
        return self.stack.currentWidget() is self.loading_page

    # ---- status bar ---------------------------------------------------------------------------------------

    def api_url(self) -> str:
        url = self.bridge.host.url
        return f"{url}/v1" if url else ""

    def copy_url(self) -> None:
        QGuiApplication.clipboard().setText(self.api_url())

    def on_state_changed(self, state: str) -> None:
        self.state_label.setText(f"● {state}")
        self.sync_serving()

    def sync_serving(self) -> None:
        """The URL, the Serve toggles and the network switch say what the host does now."""
        host = self.bridge.host
        if not self.loading:
            self.url_label.setText(self.api_url() or "not listening")
        serving = host.serving
        running = self.bridge.running
        for w in (self.serve_action, self.serve_button):
            w.setChecked(serving)
            w.setEnabled(running)
        self.serve_button.setText("Serving" if serving else "Paused")
        self.network_action.setChecked(not is_loopback_bind(host.config.host))
        self.network_action.setEnabled(running)

    def on_stats_updated(self, stats: dict) -> None:
        self.rate_label.setText(f"{stats['gen_tok_s']:.1f} tok/s · {stats['active_streams']} active · "
                                f"{stats['queued_streams']} queued")
        self.url_label.setText(self.api_url() or "not listening")

    def on_load_progress(self, name: str, fraction: float) -> None:
        self.load_bar.setFormat(f"loading {name} %p%" if fraction < 0.99 else f"loading {name}: setting up")
        self.load_bar.setToolTip(f"loading {name}")
        self.load_bar.setValue(int(fraction * 100))
        self.load_bar.setVisible(fraction < 1.0)

    # ---- actions --------------------------------------------------------------------------------------

    def set_serving(self, on: bool) -> None:
        """Serve (listen) or pause; the models stay loaded."""
        if self.bridge.running and on != self.bridge.host.serving:
            # the toggles follow what the host does then: a port still taken leaves them off
            self.bridge.toggle_serving().add_done_callback(lambda _: self.sync_serving())
        else:
            self.sync_serving()

    def set_network(self, on: bool) -> None:
        """Listen on every interface, or on loopback only; without an API key, say why not instead."""
        try:
            self.bridge.serve_on_network(on)
        except InsecureBind as e:
            self.network_action.setChecked(False)
            self.show_message(
                QMessageBox.Icon.Warning, "An API key is needed",
                "Serving on the local network needs an API key.",
                "Without one, anyone on your network could use this server and change its settings. "
                "Set an API key in Settings (its “Serve on the local network” switch makes one), or start "
                f"llamadesk with --api-key.\n\n{e.message}")

    def choose_theme(self, name: str) -> None:
        """Switch the theme now and remember it for the next start."""
        theme.apply(QApplication.instance(), name)
        self.bridge.save_theme(name)

    def sync_theme(self) -> None:
        action = self.theme_actions.get(theme.current())
        if action is not None and not action.isChecked():
            action.setChecked(True)

    def data_folder(self) -> Path:
        """Where llamadesk keeps its data (models, stored responses)."""
        return Path(platformdirs.user_data_dir(APP_NAME))

    def open_data_folder(self) -> None:
        folder = self.data_folder()
        folder.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def show_about(self) -> None:
        from engine import llama
        try:
            from importlib.metadata import version
            binding = f"llama-cpp-python {version('llama-cpp-python')}"
        except Exception:  # noqa: BLE001 (a frozen build may carry no metadata)
            binding = "llama-cpp-python"
        self.show_message(QMessageBox.Icon.Information, "About llamadesk", f"<b>llamadesk {VERSION}</b>",
                          f"A local AI server with an OpenAI-compatible API.\n\nllama.cpp through {binding}; "
                          f"its CPU build:\n{llama.system_info()}")

    def show_message(self, icon: QMessageBox.Icon, title: str, text: str, info: str = "",
                     buttons=QMessageBox.StandardButton.Ok) -> QMessageBox:
        """A window-modal message box, opened without a nested event loop (qasync cannot re-enter one)."""
        box = QMessageBox(icon, title, text, buttons, self)
        box.setInformativeText(info)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.open()
        self.dialog = box
        return box

    def quit(self) -> None:
        if self.quit_app is not None:
            self.quit_app()

    # ---- closing ----------------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        """With a tray: hide and keep serving. Without one nothing could bring the window back, so closing
        quits: the first time after saying so (remembered once accepted)."""
        event.ignore()
        if tray_available():
            self.hide_to_tray()
        elif self.ui_state is not None and self.ui_state.value(CLOSE_QUITS_SHOWN, False, type=bool):
            self.quit()
        else:
            self.ask_close_quits()

    def hide_to_tray(self) -> None:
        self.hide()
        if not self.closed_once:
            self.closed_once = True
            self.bridge.notice.emit("llamadesk keeps serving in the background; quit from the tray menu")
            if self.tray is not None and self.tray.isVisible():
                self.tray.showMessage("llamadesk", "Still serving in the tray. Quit from the tray menu.")

    def ask_close_quits(self) -> None:
        box = self.show_message(
            QMessageBox.Icon.Information, "Closing quits llamadesk",
            "This desktop has no system tray, so closing the window quits llamadesk.",
            "Running replies finish first (up to 5 s), then the server stops. To keep serving without a "
            "window, run llamadesk --no-gui.", QMessageBox.StandardButton.Ok | QMessageBox.StandardButton.Cancel)
        quit_button = box.button(QMessageBox.StandardButton.Ok)
        quit_button.setText("Quit")
        box.finished.connect(lambda _result: self.on_close_notice_finished(box.clickedButton() is quit_button))

    def on_close_notice_finished(self, quit_now: bool) -> None:
        if not quit_now:
            return
        if self.ui_state is not None:
            self.ui_state.setValue(CLOSE_QUITS_SHOWN, True)
            self.ui_state.sync()
        self.quit()
