"""The desktop app: QApplication + a qasync loop hosting the same server as --no-gui."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
from pathlib import Path

import qasync
from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.gui.audio_io import AudioIO
from app.gui.bridge import Bridge
from app.gui.single import InstanceGuard
from app.gui.tray import Tray
from app.gui.window import MainWindow
from app.host import Host
from engine.config import Config
from engine.errors import EngineError

log = logging.getLogger("llamadesk.gui")
ICON = Path(__file__).resolve().parents[2] / "resources" / "icons" / "llamadesk.svg"


class Desktop:
    """Everything the desktop app is made of, built and started in a fixed order."""

    def __init__(self, config: Config, argv: list[str] | None = None):
        self.host = Host(config, argv, on_shutdown=self.request_quit)
        self.bridge = Bridge(self.host)
        logging.getLogger().addHandler(self.bridge.log_handler)
        self.icon = QIcon(str(ICON))
        QApplication.setWindowIcon(self.icon)
        self.audio_io = AudioIO()
        self.window = MainWindow(self.bridge, self.icon, self.audio_io)
        self.tray = Tray(self.bridge, self.window, self.icon, self.request_quit)
        self.window.tray = self.tray
        self._done: asyncio.Future | None = None

    async def start(self) -> None:
        """Serve (falling back to setup mode when the configured model cannot load), then show."""
        log.info("starting the server")
        try:
            await self.host.start()
        except EngineError as e:
            log.error("%s; starting in setup mode instead", e.message)
            self.host.config = dataclasses.replace(self.host.config, models=[])
            await self.host.start()
            self.bridge.notice.emit(e.message)
        log.info("starting the window")
        self.bridge.start()
        self.bridge.models_changed.emit()
        self.window.show_panel("Catalog" if self.bridge.setup_mode else "Dashboard")
        self.window.show()
        if QSystemTrayIcon.isSystemTrayAvailable():
            self.tray.show()

    async def run(self) -> int:
        """Start, then wait until Quit (tray menu, SIGINT, SIGTERM)."""
        self._done = asyncio.get_running_loop().create_future()
        await self.start()
        return await self._done

    def request_quit(self) -> None:
        self.bridge.spawn(self.quit())

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
    app.setQuitOnLastWindowClosed(False)  # closing the window keeps serving from the tray
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
