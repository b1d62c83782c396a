"""One llamadesk per user: a second launch asks the first to show its window, then exits."""
from __future__ import annotations

import getpass

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket


def instance_key() -> str:
    return f"llamadesk-{getpass.getuser()}"


class InstanceGuard(QObject):
    """Listens on a local socket; `activate_requested` fires when another launch knocks."""

    activate_requested = Signal()

    def __init__(self, key: str | None = None):
        super().__init__()
        self.key = key or instance_key()
        self.server: QLocalServer | None = None

    def other_running(self) -> bool:
        """If another instance listens, ask it to show itself and return True."""
        sock = QLocalSocket()
        sock.connectToServer(self.key)
        if not sock.waitForConnected(300):
            return False
        sock.write(b"show\n")
        sock.waitForBytesWritten(300)
        sock.disconnectFromServer()
        return True

    def listen(self) -> bool:
        """Become the running instance."""
        QLocalServer.removeServer(self.key)  # a stale socket left by a crash
        self.server = QLocalServer(self)
        self.server.newConnection.connect(self.on_new_connection)
        return self.server.listen(self.key)

    def on_new_connection(self) -> None:
        conn = self.server.nextPendingConnection()
        if conn is not None:
            conn.disconnected.connect(conn.deleteLater)
            self.activate_requested.emit()
