"""TCP proxies on loopback for fault tests: one loses replies, one stalls its link, one cuts it (a broker cut
from ZooKeeper).

The classic cause of duplicates: a produce is appended, its answer is lost with the connection, the
producer sends it again. :class:`ReplyDroppingProxy` forwards every byte from the client to the broker,
and the broker's bytes back, except that every ``drop_every``-th chunk coming back from the broker is
thrown away and both connections are closed at once.

:class:`StallingProxy` stops a link without closing it, as a network cut does: put it between one process
and ZooKeeper to cut that link while every other one works.

Threads and blocking sockets; for tests only.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from typing import Self


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class _Proxy:
    """A listener on a free loopback port whose every connection is joined to one to ``upstream``; what moves
    between them is the subclass's :meth:`_forward` (one call per chunk; False: stop and close both)."""

    name = "proxy"

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name=self.name, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._close_all()
        self._thread.join(5)

    def _close_all(self) -> None:
        with self._lock:
            for s in list(self._sockets):
                _close(s)
            self._sockets.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._join, args=(client,), daemon=True).start()

    def _join(self, client: socket.socket) -> None:
        self._before_connecting()
        if not self._admit():
            _close(client)
            return
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._closed.is_set():
                _close(client)
                _close(upstream)
                return
            self._sockets.update((client, upstream))
        threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _before_connecting(self) -> None:
        """Called before a new client's upstream connection is made (it may wait)."""

    def _admit(self) -> bool:
        """Whether a new connection is forwarded (else closed at once)."""
        return True

    def _before_reading(self) -> None:
        """Called before each read of either side (it may wait)."""

    def _forward(self, data: bytes, replies: bool) -> bool:
        return True

    def _pipe(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        try:
            while True:
                self._before_reading()
                data = source.recv(1 << 16)
                if not data or not self._forward(data, replies):
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


class ReplyDroppingProxy(_Proxy):
    name = "reply-dropping-proxy"

    def __init__(self, upstream: tuple[str, int], drop_every: int = 50) -> None:
        super().__init__(upstream)
        self.drop_every = drop_every
        self.dropped = 0
        """Replies thrown away so far (each with its connection)."""
        self._chunks = 0

    def _forward(self, data: bytes, replies: bool) -> bool:
        if not replies:
            return True
        with self._lock:
            self._chunks += 1
            drop = self._chunks % self.drop_every == 0
            if drop:
                self.dropped += 1
        return not drop


class StallingProxy(_Proxy):
    """A proxy whose link can be stalled, as a network cut stalls it: :meth:`cut` stops moving bytes both ways
    (nothing is read, so nothing is lost: TCP's buffers hold it, as retransmissions would) and holds new
    connections unanswered; :meth:`heal` lets everything flow again."""

    name = "stalling-proxy"

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(upstream)
        self._flowing = threading.Event()
        self._flowing.set()

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()  # let every waiting thread see the sockets close
        super().close()

    def _before_connecting(self) -> None:
        self._flowing.wait()

    def _before_reading(self) -> None:
        self._flowing.wait()

    def _forward(self, data: bytes, replies: bool) -> bool:
        self._flowing.wait()  # bytes read just before a cut go on only when it heals
        return True


class CuttableProxy(_Proxy):
    """:meth:`cut` closes every connection through the proxy now and refuses new ones until :meth:`restore`. Put
    between a broker and ZooKeeper, it cuts that broker alone from ZooKeeper while its clients still reach it
    (its session then expires, as on a network partition)."""

    name = "cuttable-proxy"

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(upstream)
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()
        self._close_all()

    def restore(self) -> None:
        self._cut.clear()

    def _admit(self) -> bool:
        return not self._cut.is_set()

    def _forward(self, data: bytes, replies: bool) -> bool:
        return not self._cut.is_set()
