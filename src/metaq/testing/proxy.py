"""TCP proxies on loopback for fault tests: one loses replies, one stalls its link.

:class:`StallingProxy` (below) stops a link without closing it, as a network cut does.

The classic cause of duplicates: a produce is appended, its answer is lost with the connection, the
producer sends it again. :class:`ReplyDroppingProxy` forwards every byte from the client to the broker,
and the broker's bytes back, except that every ``drop_every``-th chunk coming back from the broker is
thrown away and both connections are closed at once. Threads and blocking sockets; for tests only.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType


class ReplyDroppingProxy:
    def __init__(self, upstream: tuple[str, int], drop_every: int = 50) -> None:
        self.upstream = upstream
        self.drop_every = drop_every
        self.dropped = 0
        """Replies thrown away so far (each with its connection)."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._chunks = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="reply-dropping-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ReplyDroppingProxy:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in list(self._sockets):
                _close(s)
        self._thread.join(5)

    def __enter__(self) -> ReplyDroppingProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            broker.settimeout(None)
            for s in (client, broker):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.update((client, broker))
            threading.Thread(target=self._pipe, args=(client, broker, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(broker, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if replies:
                    with self._lock:
                        self._chunks += 1
                        drop = self._chunks % self.drop_every == 0
                        if drop:
                            self.dropped += 1
                    if drop:
                        break
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                _close(s)
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(target)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class StallingProxy:
    """A TCP proxy on loopback whose link can be stalled, as a network cut stalls it: :meth:`cut` stops moving
    bytes both ways (nothing is read, so nothing is lost: TCP's buffers hold it, as retransmissions would) and
    holds new connections unanswered; :meth:`heal` lets everything flow again. Put it between a process and
    ZooKeeper to cut that one link while every other one works. Threads and blocking sockets; tests only."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="stalling-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> StallingProxy:
        self._thread.start()
        return self

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in list(self._sockets):
                _close(s)
        self._thread.join(5)

    def __enter__(self) -> StallingProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self._flowing.wait()  # a connection made during a cut is held, unanswered, until it heals
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            if self._closed.is_set():
                _close(client)
                _close(upstream)
                return
            self._sockets.update((client, upstream))
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = source.recv(1 << 16)
                if not data:
                    break
                self._flowing.wait()  # bytes read just before a cut go on only when it heals
                target.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, target):
                _close(s)
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(target)
