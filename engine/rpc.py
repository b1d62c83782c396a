"""llama.cpp RPC: rpc-server addresses, and the relay that stands between ggml and each rpc-server.

ggml's RPC client ends the whole process (GGML_ABORT) when it cannot connect to a server ("Failed to
connect") and when a server's socket fails ("Remote RPC server crashed"), and it has no timeout: one
rpc-server that is not there or goes away would take every model and request down. So
ggml never talks to an rpc-server directly. It talks to a Link on 127.0.0.1, which relays the protocol
(| cmd: 1 byte | size: u64 | payload | one way, | size: u64 | payload | back) to the server. When the server
goes, the link answers every pending and later command itself with zeros of the size ggml waits for, so the
decode in flight returns (with garbage the caller discards: `lost` is set) and freeing the model works.
The protocol is llama.cpp's v7 (ggml/src/ggml-rpc/ggml-rpc.cpp of llama-cpp-python 0.3.36's vendored source).
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import threading
from collections import deque
from urllib.parse import urlsplit

log = logging.getLogger("llamadesk.rpc")

PROTO_MAJOR, PROTO_MINOR = 7, 0  # RPC_PROTO_*_VERSION of the vendored ggml-rpc.h (ggml aborts on others)
_HELLO = 14
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport upgrades (RDMA) a relay cannot pass on; llamadesk advertises none
_GET_TENSOR = 8
# The fixed size of each command's answer (ggml-rpc.cpp's rpc_msg_*_rsp); absent: the command has none.
# GET_TENSOR answers with the bytes its request asks for (its last u64).
_ANSWER = {0: 16, 1: 8, 2: 8, 3: 8, 7: 1, 9: 1, 11: 16, 13: 8, _HELLO: 4 + _CAPS, 15: 4}
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 1 << 20


class RpcAddressError(ValueError):
    """An rpc-server address is not host:port."""


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) of "host:port" ("[v6]:port" for IPv6); RpcAddressError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise RpcAddressError(f"{text!r} is not an rpc-server address (host:port, e.g. 192.168.1.20:50052)")
    try:
        u = urlsplit("//" + text.strip())
        host, port = u.hostname, u.port
    except ValueError as e:
        raise RpcAddressError(f"{text!r} is not host:port: {e}") from None
    if not host or port is None or u.path or u.query or u.fragment or u.username is not None:
        raise RpcAddressError(f"{text!r} is not host:port (e.g. 192.168.1.20:50052)")
    if port == 0:
        raise RpcAddressError(f"{text!r}: port 0 is not an rpc-server's port")
    return host, port


def split_addresses(value: str | list | tuple | None) -> tuple[str, ...]:
    """The addresses of a comma-separated string or a list of strings, each checked and normalised ("" and
    []: none)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = value.split(",") if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise RpcAddressError(f"{value!r} is not rpc-server addresses (\"host:port,…\" or a list of them)")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise RpcAddressError(f"{item!r} is not an rpc-server address (a \"host:port\" string)")
        host, port = parse_address(item)
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return tuple(out)


def is_loopback(address: str) -> bool:
    """Whether an address is this machine's own (127.0.0.0/8, ::1, localhost)."""
    host, _ = parse_address(address)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


class RpcUnreachable(ConnectionError):
    """An rpc-server did not answer the handshake (gone, refused, busy with another client, another version)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), _CHUNK))
        if not part:
            raise ConnectionError("connection closed")
        buf += part
    return bytes(buf)


def _handshake(address: str, timeout: float) -> tuple[socket.socket, bytes]:
    """A connection to the rpc-server at address that has said HELLO, and its answer (RpcUnreachable)."""
    host, port = parse_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise RpcUnreachable(f"cannot connect to rpc-server {address}: {e.strerror or e}") from None
    try:
        sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
        size, = struct.unpack("<Q", _recv_exact(sock, 8))
        answer = _recv_exact(sock, size) if size == _ANSWER[_HELLO] else b""
    except TimeoutError:  # a server busy with another client answers nothing
        sock.close()
        raise RpcUnreachable(f"rpc-server {address} did not answer its handshake within {timeout:g} s; it serves "
                             "one client at a time: is another process using it?") from None
    except (OSError, ConnectionError) as e:
        sock.close()
        raise RpcUnreachable(f"rpc-server {address} closed the connection in its handshake "
                             f"({getattr(e, 'strerror', None) or e})") from None
    if not answer or answer[0] != PROTO_MAJOR or answer[1] > PROTO_MINOR:
        sock.close()
        raise RpcUnreachable(f"rpc-server {address} speaks RPC protocol {answer[:3].hex('.') or '?'}, llamadesk "
                             f"{PROTO_MAJOR}.{PROTO_MINOR}: run the rpc-server of this llamadesk (`llamadesk "
                             "rpc-server`)")
    sock.settimeout(None)
    return sock, struct.pack("<Q", size) + answer[:4] + bytes(_CAPS)


def _shut(sock: socket.socket) -> None:
    """Close a socket another thread may be blocked on: shut down first, or no FIN goes out and the rpc-server,
    serving one client at a time, would never take the next."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected (a listener), or closed already
    sock.close()


_links: dict[str, Link] = {}
_links_lock = threading.Lock()


def acquire(address: str) -> Link:
    """The link to the rpc-server at address, shared by every model that uses it: the server serves one client
    at a time, and ggml gives all the models on one endpoint one connection. A new link when there is none or
    the last one lost its server (RpcUnreachable when it does not answer)."""
    with _links_lock:
        link = _links.get(address)
        if link is None or link.lost is not None:
            link = _links[address] = Link(address)
        link.users += 1
        return link


def release(link: Link) -> None:
    """A model that used link is gone; the last one closes it."""
    with _links_lock:
        link.users -= 1
        if link.users == 0:
            if _links.get(link.address) is link:
                del _links[link.address]
            link.close()


class Link:
    """A relay on 127.0.0.1 to one rpc-server (see acquire); `endpoint` is what ggml is given. ggml connects
    again whenever its last buffer on the server is gone (after counting devices, for one): each of its
    connections gets one to the server of its own (the server's buffers live and die with it)."""

    def __init__(self, address: str, timeout: float = CONNECT_TIMEOUT_S):
        self.address = address
        self.timeout = timeout
        self.users = 0  # models holding it (acquire / release)
        self._next, self._hello = _handshake(address, timeout)  # reachable before any load starts
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.lost: str | None = None  # why the server is gone, once it is
        self._closed = False
        threading.Thread(target=self._serve, name=f"rpc-link {address}", daemon=True).start()

    def _serve(self) -> None:
        """ggml's connections, one after another, each relayed until ggml closes it."""
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed: the model was freed
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = self._upstream()
            _Session(self, client, server).run()

    def _upstream(self) -> socket.socket | None:
        """A fresh connection to the server for the next session; None once it is gone."""
        server, self._next = self._next, None
        if server is None and self.lost is None:
            try:
                server, _ = _handshake(self.address, self.timeout)
            except RpcUnreachable as e:
                self.on_lost(str(e))
        if server is not None:
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return server

    def on_lost(self, why: str) -> None:
        """The server is gone: every session from now on is answered here."""
        if self.lost is None and not self._closed:
            self.lost = why
            log.error("rpc-server %s went away (%s); the models using it fail until reloaded", self.address, why)

    def close(self) -> None:
        """Stop relaying (the model was freed)."""
        self._closed = True
        for s in (self._listener, self._next):
            if s is not None:
                _shut(s)


class _Session:
    """One ggml connection relayed to one server connection; answered with zeros once the server is gone."""

    def __init__(self, link: Link, client: socket.socket, server: socket.socket | None):
        self.link = link
        self.client = client
        self.server = server
        self.gone = server is None
        self._lock = threading.Lock()  # the answers to ggml: relayed or made up, never interleaved
        self._pending: deque[int] = deque()  # sizes of the answers ggml waits for, oldest first
        self._owed = 0  # bytes of the answer being relayed that ggml has not had yet

    def run(self) -> None:
        if self.server is not None:
            threading.Thread(target=self._answers, name=f"rpc-link {self.link.address} answers", daemon=True).start()
        try:
            self._commands()
        except (OSError, ConnectionError):
            pass  # ggml closed the connection
        finally:
            with self._lock:
                self.gone = True  # from here on, a failing server connection is no loss
            for s in (self.client, self.server):
                if s is not None:
                    _shut(s)

    def _commands(self) -> None:
        """ggml's commands, passed to the server (or answered here once it is gone)."""
        while True:
            head = _recv_exact(self.client, 9)
            cmd, size = struct.unpack("<BQ", head)
            payload = _recv_exact(self.client, size) if size <= _CHUNK else None
            if cmd == _HELLO:  # said already, by _handshake: its answer was kept
                with self._lock:
                    self.client.sendall(self.link._hello)
                continue
            answers = cmd in _ANSWER or cmd == _GET_TENSOR
            with self._lock:
                if answers:
                    self._pending.append(struct.unpack("<Q", payload[-8:])[0] if cmd == _GET_TENSOR else _ANSWER[cmd])
            self._forward(head, payload, size)
            if self.gone and answers:
                self._make_up_pending()

    def _forward(self, head: bytes, payload: bytes | None, size: int) -> None:
        """Pass one command on (a large payload streamed through, read to its end even when the server is
        gone, so that the next command is found)."""
        alive = not self.gone and self._send(head + (payload or b""))
        left = size if payload is None else 0
        while left:
            part = self.client.recv(min(left, _CHUNK))
            if not part:
                raise ConnectionError("ggml closed the connection")
            alive = alive and self._send(part)
            left -= len(part)

    def _send(self, data: bytes) -> bool:
        try:
            self.server.sendall(data)
            return True
        except OSError as e:
            self._on_lost(f"sending to it failed: {e.strerror or e}")
            return False

    def _answers(self) -> None:
        """The server's answers, passed back to ggml."""
        server = self.server
        try:
            while True:
                head = _recv_exact(server, 8)
                size, = struct.unpack("<Q", head)
                with self._lock:
                    if self.gone:  # answered already, made up
                        return
                    self._pending.popleft()
                    self._owed = size + 8
                    self.client.sendall(head)
                    self._owed -= 8
                while self._owed:
                    part = server.recv(min(self._owed, _CHUNK))
                    if not part:
                        raise ConnectionError("connection closed")
                    with self._lock:
                        if self.gone:
                            return
                        self.client.sendall(part)
                        self._owed -= len(part)
        except (OSError, ConnectionError, IndexError) as e:
            self._on_lost(str(getattr(e, "strerror", None) or e))

    def _on_lost(self, why: str) -> None:
        """The server connection failed: unless ggml had closed this session, the server is gone; answer
        everything ggml waits for."""
        with self._lock:
            if self.gone:
                return
            self.gone = True
        self.link.on_lost(why)
        self._make_up_pending()

    def _make_up_pending(self) -> None:
        """Answer ggml's waiting commands with zeros of the sizes it expects (the rest of a half-relayed one
        first)."""
        with self._lock:
            try:
                if self._owed:
                    self.client.sendall(bytes(self._owed))
                    self._owed = 0
                while self._pending:
                    size = self._pending.popleft()
                    self.client.sendall(struct.pack("<Q", size) + bytes(size))
            except OSError:
                pass  # ggml has gone too
