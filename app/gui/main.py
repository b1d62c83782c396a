"""The desktop app: QApplication + a qasync loop hosting the same server as --no-gui."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from pathlib import Path

import platformdirs
import qasync
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.gui import theme
from app.gui.audio_io import AudioIO
from app.gui.bridge import Bridge
from app.gui.single import InstanceGuard
from app.gui.tray import Tray
from app.gui.window import MainWindow, tray_available
from app.host import Host
from engine.config import APP_NAME, Config
from engine.errors import EngineError

log = logging.getLogger("llamadesk.gui")
ICON = Path(__file__).resolve().parents[2] / "resources" / "icons" / "llamadesk.svg"


def ui_state(config: Config) -> QSettings:
    """The window's remembered state (notices seen), beside the config file."""
    folder = config.path.parent if config.path else Path(platformdirs.user_config_dir(APP_NAME))
    return QSettings(str(folder / "llamadesk-window.ini"), QSettings.Format.IniFormat)


class Desktop:
    """Everything the desktop app is made of, built and started in a fixed order."""

    def __init__(self, config: Config, argv: list[str] | None = None):
        self.host = Host(config, argv, on_shutdown=self.request_quit)
        state = ui_state(config)
        self.bridge = Bridge(self.host, state)
        logging.getLogger().addHandler(self.bridge.log_handler)
        theme.apply(QApplication.instance(), theme.remembered(state, config))
        self.icon = QIcon(str(ICON))
        QApplication.setWindowIcon(self.icon)
        self.audio_io = AudioIO()
        self.window = MainWindow(self.bridge, self.icon, self.audio_io, self.request_quit, state)
        self.tray = Tray(self.bridge, self.window, self.icon, self.request_quit)
        self.window.tray = self.tray
        self._done: asyncio.Future | None = None
        self._quitting: asyncio.Task | None = None

    async def start(self) -> None:
        """Show the window at once with its loading page, then serve (falling back to setup mode when the
        configured model cannot load) and show the panels."""
        log.info("starting the window")
        self.window.show_loading([m.name for m in self.host.config.models if m.preload is not False])
        self.bridge.show_state("loading")
        self.window.show()
        if tray_available():
            self.tray.show()
        log.info("starting the server")
        try:
            taken = await self.host.start(paused_if_taken=True)
        except EngineError as e:
            log.error("%s; starting in setup mode instead", e.message)
            self.host.config = dataclasses.replace(self.host.config, models=[])
            taken = await self.host.start(paused_if_taken=True)
            self.bridge.notice.emit(e.message)
        if taken:  # the window stays, not serving: another port in Settings, then Serving
            self.bridge.notice.emit(f"not serving: {taken.replace('with --port', 'in Settings')}, then press "
                                    "Serving")
        if self._quitting is not None:  # Quit came while the models loaded: stop what has just started
            await self.host.stop()
            return
        self.bridge.start()
        self.bridge.models_changed.emit()
        self.window.end_loading("Catalog" if self.bridge.setup_mode else "Dashboard")

    async def run(self) -> int:
        """Start, then wait until Quit (tray menu, SIGINT, SIGTERM)."""
        self._done = asyncio.get_running_loop().create_future()
        await self.start()
        return await self._done

    def request_quit(self) -> None:
        """Quit once (Ctrl+Q, the menus, closing the window without a tray, SIGINT, SIGTERM, POST /shutdown)."""
        if self._quitting is None:
            self._quitting = self.bridge.spawn(self.quit())

    async def quit(self) -> None:
        """Drain streams, stop the server, free models; then let run() return 0."""
        log.info("quitting")
        self.tray.hide()
        self.window.hide()
        await self.bridge.shutdown()
        logging.getLogger().removeHandler(self.bridge.log_handler)
        if self._done is not None and not self._done.done():
            self._done.set_result(0)


def run_gui(config: Config, argv: list[str] | None = None) -> int:
    """Run the desktop app until Quit; the process exit code."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("llamadesk")
    app.setStyle("Fusion")  # follows the system light/dark palette, looks the same on every OS
    app.setQuitOnLastWindowClosed(False)  # closing the window keeps serving from the tray, or quits by our path
    guard = InstanceGuard()
    if guard.other_running():
        log.info("llamadesk is already running: asked it to show its window")
        return 0
    guard.listen()
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    desktop = Desktop(config, argv)
    guard.activate_requested.connect(desktop.tray.on_open)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: loop.call_soon_threadsafe(desktop.request_quit))
    wake = QTimer()  # lets Python run its signal handlers while Qt waits in C++
    wake.start(200)
    wake.timeout.connect(lambda: None)
    with loop:
        return loop.run_until_complete(desktop.run())
