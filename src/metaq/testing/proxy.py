"""TCP proxies on loopback for fault tests: one loses replies (the broker did the work, the client never hears
of it), one cuts a connection path on demand (a broker cut from ZooKeeper).

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


class CuttableProxy:
    """A TCP proxy on loopback that can cut its traffic: :meth:`cut` closes every connection through it and
    refuses new ones until :meth:`restore`. Put between a broker and ZooKeeper, it cuts that broker alone from
    ZooKeeper while its clients still reach it (its session then expires, as on a network partition)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._cut = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="cuttable-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> CuttableProxy:
        self._thread.start()
        return self

    def cut(self) -> None:
        """Close every connection through the proxy now, and refuse new ones."""
        self._cut.set()
        with self._lock:
            for s in list(self._sockets):
                _close(s)
            self._sockets.clear()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._listener.close()
        self._thread.join(5)

    def __enter__(self) -> CuttableProxy:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, target), daemon=True).start()

    def _pipe(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                data = source.recv(1 << 16)
                if not data or self._cut.is_set():
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
