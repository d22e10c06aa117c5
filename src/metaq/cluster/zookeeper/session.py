"""Session keeping: the one kazoo client of a registry, its state, and the ephemeral nodes it keeps.

The ephemeral nodes this process owns (its broker registration, its topics, group members) are
remembered, and made again on the new session after a session expiry (kazoo's LOST then CONNECTED).
Group *owner* nodes are the exception: a claim dies with the session that made it, because the rest of
the group rebalances as soon as the session is gone and another member may already fetch the partition;
the consumer that lost it learns of the expiry (:meth:`ZooKeeperSession.add_session_listener`), stops
fetching and claims again after its own rebalance.

Threads: kazoo calls watchers and state listeners on its own threads; blocking work they trigger
(re-registration after an expiry, a delayed look at a node) runs on the one worker thread of this
session (:meth:`ZooKeeperSession.call_soon`, :meth:`ZooKeeperSession.call_later`).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry
from kazoo.security import ACL, Id

from metaq.cluster.layout import Paths
from metaq.cluster.registry import RegistryError
from metaq.cluster.zk_security import AclEntry, ZkSecurity, acl_for

log = logging.getLogger("metaq.cluster.zookeeper")


class _KazooRetryNoise(logging.Filter):
    """Keeps kazoo's connection attempts ("Connecting to ...", "Connection dropped: ... refused", every 0.1-2 s
    while ZooKeeper is away) out of the log: metaq says once what matters (waiting for ZooKeeper, connection
    lost, session expired, cannot reach it). They still show with the ``kazoo`` logger at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or logging.getLogger("kazoo").isEnabledFor(logging.DEBUG)


logging.getLogger("kazoo.client").addFilter(_KazooRetryNoise())

OWNER_POLL_S = 0.2
"""While a node held by another session is waited for (a handover), how often it is looked at again."""
PREVIOUS_SESSION_SLACK_S = 5.0
"""After a kill -9, the old session's ephemeral nodes live until its timeout: wait that long plus this."""
REPLACE_TRIES = 10
"""How often :meth:`ZooKeeperSession.replace_ephemeral` reads and tries again a node that keeps changing."""
_WAKE: Callable[[], None] = lambda: None  # noqa: E731
"""Queued to wake the worker for its delayed jobs."""
CONNECT_ANSWER_S = 3.0
"""How long a connecting client waits for ZooKeeper's answer to its session request before it asks again:
ZooKeeper answers a reconnecting session from memory, a new one after an fsync of its log (which it warns about
past 1 s)."""


class ConnectWaitHandler(SequentialThreadingHandler):
    """kazoo's threading handler, except that a client not connected waits :attr:`answer_wait_s` at most for
    ZooKeeper's answer.

    kazoo (as ZooKeeper's Java client) waits for the answer to its session request the session timeout divided by
    the servers listed. A ZooKeeper that accepts a connection while it starts up may never answer it (seen with
    3.8 after a kill -9 and a restart). A client with one server listed then sat out its whole session timeout (30
    s by default), and by the time it asked again its session had expired on the server, with its ephemeral nodes:
    a master's registration, a consumer's claims. Cut short, the server is asked again (after kazoo's retry
    back-off) on a session still alive.

    The wait cut is kazoo's only one before the session is established that reads one socket and writes none;
    once connected nothing is changed (the answers to requests, the heartbeats)."""

    def __init__(self, answer_wait_s: float = CONNECT_ANSWER_S) -> None:
        super().__init__()
        self.answer_wait_s = answer_wait_s
        self.connected: Callable[[], bool] = lambda: False
        """The client's ``connected`` (set once the client exists)."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 4 and not kwargs and len(args[0]) == 1 and not args[1] and not self.connected():
            timeout = args[3]
            if timeout is None or timeout > self.answer_wait_s:
                args = (args[0], args[1], args[2], self.answer_wait_s)
        return super().select(*args, **kwargs)


class ZooKeeperSession:
    """One kazoo client on ``connect`` and what lives as long as the registry: its lock (shared by every
    part of the registry), its worker thread, its session listeners and the ephemeral nodes it keeps."""

    def __init__(self, connect: str, paths: Paths, *, session_timeout_ms: int, connection_timeout_ms: int,
                 security: ZkSecurity | None = None, layout_owner: bool = True) -> None:
        self.connect = connect
        self.paths = paths
        self.security = security or ZkSecurity()
        self.layout_owner = layout_owner
        """A broker (or an admin tool): it may make the layout's nodes (the root, brokers/, consumers/...)."""
        self.session_timeout_s = session_timeout_ms / 1000
        self.connection_timeout_s = connection_timeout_ms / 1000
        handler = ConnectWaitHandler()
        self.client = KazooClient(
            hosts=connect, timeout=self.session_timeout_s, handler=handler,
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0, ignore_expire=False),
            command_retry=KazooRetry(max_tries=5, delay=0.1, backoff=2, max_delay=2.0),
            **kazoo_security(self.security))
        client = self.client
        handler.connected = lambda: client.connected
        self.lock = threading.RLock()
        """Guards the state of every part of the registry (one lock: watch callbacks touch several)."""
        self.closed = False
        self._owned: dict[str, bytes] = {}
        """Ephemeral nodes this process keeps registered: path -> data (made again after an expiry)."""
        self._bad_znodes: set[str] = set()
        self._session_lost = False
        self._session_listeners: list[Callable[[str], None]] = []
        self.restore_hooks: list[Callable[[dict[str, bytes]], dict[str, bytes]]] = []
        """Run before the kept nodes are made again after an expiry: each takes the nodes (path -> data) and
        returns those still to be made the plain way (a hook makes or drops the others itself)."""
        self._work: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._later: list[tuple[float, int, Callable[[], None]]] = []
        """Delayed jobs (due time.monotonic(), sequence, job), a heap the worker runs them from."""
        self._seq = 0
        self._worker = threading.Thread(target=self._run_worker, name="metaq-zk-worker", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Connect; RegistryError if ZooKeeper cannot be reached in the connection timeout."""
        log.info("connecting to ZooKeeper at %s (up to %gs)", self.connect, self.connection_timeout_s)
        try:
            self.client.start(timeout=self.connection_timeout_s)
        except (KazooTimeoutError, KazooException, OSError) as exc:
            with contextlib.suppress(Exception):
                self.client.stop()
                self.client.close()
            raise RegistryError(f"cannot reach ZooKeeper at {self.connect} within {self.connection_timeout_s:g}s "
                                f"({exc or type(exc).__name__}): is it running there? (zk.zkConnect; the wait is "
                                "zk.zkConnectionTimeoutMs)" + self._tls_hint()) from None
        if self.security.sasl_user:
            # kazoo reports a refused SASL login at the first request, not at start: make it now, so that a
            # wrong password stops a broker's start with one clear line
            try:
                self.client.exists("/")
            except (AuthFailedError, KazooException) as exc:
                with contextlib.suppress(Exception):
                    self.client.stop()
                    self.client.close()
                raise RegistryError(
                    f"ZooKeeper at {self.connect} refused SASL {self.security.sasl_mechanism} user "
                    f"{self.security.sasl_user!r} ({type(exc).__name__}): wrong password (METAQ_ZK_PASSWORD), "
                    "a user the server's JAAS Server section does not list, or a server without "
                    "authProvider.sasl") from None
        self.client.add_listener(self._on_state)
        self._worker.start()

    def _tls_hint(self) -> str:
        if self.security.tls:
            return ("; over TLS: is it ZooKeeper's secureClientPort, and is its certificate signed by the CA given "
                    "and made out to that host?")
        return ""

    def close(self) -> None:
        """Drop the session (its ephemeral nodes vanish at once) and stop the threads."""
        if self.closed:
            return
        self.closed = True
        self._work.put(None)
        with contextlib.suppress(Exception):
            self.client.stop()
            self.client.close()
        if self._worker.is_alive():
            self._worker.join(5)

    @property
    def connected(self) -> bool:
        return bool(self.client.connected)

    @property
    def session_id(self) -> int:
        client_id = self.client.client_id
        return int(client_id[0]) if client_id else 0

    @property
    def handover_wait_s(self) -> float:
        """How long a node of this broker id held by another session is waited for (see create_ephemeral)."""
        return self.session_timeout_s + PREVIOUS_SESSION_SLACK_S

    # ------------------------------------------------------------------ the worker thread

    def call_soon(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the worker thread (it may block; kazoo's threads must not)."""
        self._work.put(job)

    def call_later(self, delays_s: Iterable[float], job: Callable[[], None]) -> None:
        """Run ``job`` on the worker thread after each of ``delays_s`` (one thread for all delayed jobs: a
        broker leaving with a thousand topics must not start thousands of timers in every client)."""
        now = time.monotonic()
        with self.lock:
            for delay in delays_s:
                self._seq += 1
                heapq.heappush(self._later, (now + delay, self._seq, job))
        self._work.put(_WAKE)

    def _run_worker(self) -> None:
        """Run the queued jobs, and the delayed ones (:meth:`call_later`) when they are due."""
        while True:
            with self.lock:
                wait = max(0.0, self._later[0][0] - time.monotonic()) if self._later else None
            try:
                job = self._work.get(timeout=wait)
            except queue.Empty:
                job = _WAKE
            if job is None:
                return
            jobs = [job] if job is not _WAKE else []
            with self.lock:
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    jobs.append(heapq.heappop(self._later)[2])
            for run in jobs:
                try:
                    run()
                except Exception:
                    log.exception("ZooKeeper registry job failed")

    # ------------------------------------------------------------------ session state

    def _on_state(self, state: str) -> None:
        """kazoo's state listener (its thread; must not block)."""
        if self.closed:
            return
        if state == KazooState.LOST:
            self._session_lost = True
            with self.lock:
                # A claim dies with its session: the group has moved on (see the module docstring).
                for path in [p for p in self._owned if self._is_owner_path(p)]:
                    del self._owned[path]
            log.warning("ZooKeeper session expired: its ephemeral nodes are gone; registering again on reconnect")
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection lost: serving with what is known until it is back")
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            self._work.put(self._restore_registrations)
        name = {KazooState.LOST: "lost", KazooState.SUSPENDED: "suspended", KazooState.CONNECTED: "connected"}.get(
            state)
        with self.lock:
            listeners = list(self._session_listeners)
        for listener in listeners:
            try:
                listener(name or str(state).lower())
            except Exception:  # a listener's bug must not stop the others
                log.exception("ZooKeeper session listener failed")

    def add_session_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener("suspended" | "connected" | "lost")`` on kazoo's thread (must not block):
        "lost" means the session expired, and with it every claim made on it."""
        with self.lock:
            self._session_listeners.append(listener)

    def remove_session_listener(self, listener: Callable[[str], None]) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self._session_listeners.remove(listener)

    def _is_owner_path(self, path: str) -> bool:
        return path.startswith(self.paths.consumers + "/") and "/owners/" in path

    # ------------------------------------------------------------------ ephemeral nodes kept

    def _restore_registrations(self) -> None:
        with self.lock:
            owned = dict(self._owned)
            hooks = list(self.restore_hooks)
        for hook in hooks:
            try:
                owned = hook(owned)
            except KazooException as exc:  # the hook's nodes wait for the next expiry's restore
                log.error("cannot register this broker's nodes again after the session expiry: %s", exc)
        for path, data in owned.items():
            try:
                self.create_ephemeral(path, data)
            except KazooException as exc:
                log.error("cannot register %s again after the session expiry: %s", path, exc)
        if owned:
            log.info("registered %d ZooKeeper nodes again on the new session", len(owned))

    def create_ephemeral(self, path: str, data: bytes, *, wait_for_owner_s: float = 0.0) -> None:
        """Create (or take over, if this session already owns it) an ephemeral node holding ``data``.

        A node another session holds raises NodeExistsError, after waiting up to ``wait_for_owner_s``
        for it to go: a master handing over deletes its topic nodes a moment after its successor
        registers, and a killed broker's nodes go with its session."""
        deadline = time.monotonic() + wait_for_owner_s
        while True:
            try:
                self.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                try:
                    _, stat = self.client.get(path)
                except NoNodeError:
                    continue  # it just went: create it again
                if stat.ephemeralOwner == self.session_id:
                    self.client.set(path, data)
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                gone = threading.Event()
                if self.client.exists(path, watch=lambda _e, g=gone: g.set()) is not None:
                    # woken by the watch, and looking again every OWNER_POLL_S anyway: a handover must not
                    # hang on one watch event (a missed one cost seconds of "every partition closed")
                    gone.wait(min(remaining, OWNER_POLL_S))

    def replace_ephemeral(self, path: str, data: bytes, *, check: tuple[str, int] | None = None) -> bool:
        """Make ``path`` this session's ephemeral node holding ``data``, whoever holds it now: a node of
        another session is deleted (by its version) and made again in one transaction, so a watcher never
        sees it missing. Only for a node the caller is entitled to (a master taking over its broker id's):
        ``check`` = (path, version) is checked in the same transaction (the replica group's state still the
        one that proved the entitlement). False when that check failed (nothing was changed)."""
        client = self.client
        self.ensure(path.rsplit("/", 1)[0])
        for _ in range(REPLACE_TRIES):
            try:
                _, stat = client.get(path)
            except NoNodeError:
                stat = None
            if stat is not None and stat.ephemeralOwner == self.session_id:
                client.set(path, data)
                return True
            tx = client.transaction()
            if check is not None:
                tx.check(*check)
            if stat is not None:
                tx.delete(path, version=stat.version)
            tx.create(path, data, acl=self.acl(path), ephemeral=True)
            results = tx.commit()
            if not any(isinstance(r, Exception) for r in results):
                return True
            if check is not None and isinstance(results[0], Exception) and \
                    not isinstance(results[0], RolledBackError):
                return False
            # the node changed between the read and the transaction: look again
        raise NodeExistsError(f"{path} kept changing while it was being replaced")

    def keep(self, path: str, data: bytes, *, wait_for_owner_s: float = 0.0) -> None:
        """Create the ephemeral node (:meth:`create_ephemeral`) and keep it: made again after an expiry."""
        self.create_ephemeral(path, data, wait_for_owner_s=wait_for_owner_s)
        self.remember(path, data)

    def remember(self, path: str, data: bytes) -> None:
        """Keep ``path`` (made again after an expiry) without creating it now."""
        with self.lock:
            self._owned[path] = data

    def forget(self, path: str) -> None:
        """Stop keeping ``path`` (the node itself is left as it is)."""
        with self.lock:
            self._owned.pop(path, None)

    def owned(self, prefix: str | tuple[str, ...]) -> dict[str, bytes]:
        """The kept nodes whose path starts with ``prefix`` (path -> data)."""
        with self.lock:
            return {p: d for p, d in self._owned.items() if p.startswith(prefix)}

    def take_owned(self, prefix: str) -> list[str]:
        """Stop keeping every node whose path starts with ``prefix``; their paths."""
        with self.lock:
            mine = [p for p in self._owned if p.startswith(prefix)]
            for p in mine:
                del self._owned[p]
            return mine

    def drop(self, path: str) -> None:
        """Stop keeping ``path`` and delete the node if this session holds it."""
        self.forget(path)
        with contextlib.suppress(NoNodeError):
            _, stat = self.client.get(path)
            if stat.ephemeralOwner == self.session_id:
                self.client.delete(path)

    # ------------------------------------------------------------------ creating nodes with their ACLs

    def acl(self, path: str) -> list[ACL] | None:
        """The ACL to create ``path`` with (zk_security.acl_for), None (ZooKeeper's open ACL) without set_acl."""
        identity = self.security.identity
        if not self.security.set_acl or identity is None:
            return None
        return kazoo_acl(acl_for(path, self.paths, identity))

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, makepath: bool = False) -> str:
        """Create ``path`` with its ACL; ``makepath`` creates missing parents each with its own ACL (kazoo's
        makepath would give every parent the child's)."""
        try:
            return str(self.client.create(path, data, acl=self.acl(path), ephemeral=ephemeral))
        except NoNodeError:
            if not makepath:
                raise
        self.ensure(path.rsplit("/", 1)[0])
        return str(self.client.create(path, data, acl=self.acl(path), ephemeral=ephemeral))

    def ensure(self, path: str) -> None:
        """Create ``path`` and its missing parents (persistent, empty), each with its ACL. A client (not the
        layout's owner) with ACLs on makes nothing above its consumer groups: a root it made would be its
        own, and the brokers could not register under it."""
        if not path or path == "/" or self.client.exists(path) is not None:
            return
        if not self.layout_owner and self.security.set_acl and not path.startswith(self.paths.consumers + "/"):
            raise RegistryError(f"{path} does not exist in ZooKeeper at {self.connect}: with ZooKeeper ACLs the "
                                "brokers make the cluster's layout; start a broker of this zkRoot first")
        self.ensure(path.rsplit("/", 1)[0])
        with contextlib.suppress(NodeExistsError):
            self.client.create(path, b"", acl=self.acl(path))

    # ------------------------------------------------------------------ reading

    def children(self, path: str) -> list[str]:
        """The children of ``path``, sorted; [] when it does not exist."""
        try:
            return sorted(self.client.get_children(path))
        except NoNodeError:
            return []

    def bad(self, path: str, problem: str) -> None:
        """Log once that the node at ``path`` is not in MetaQ's layout (it is left out, never a crash)."""
        with self.lock:
            if path in self._bad_znodes:
                return
            self._bad_znodes.add(path)
        log.error("ZooKeeper node %s is not in MetaQ's layout and is ignored: %s", path, problem)


def zk_error(exc: BaseException) -> str:
    """What went wrong with a ZooKeeper call, for a RegistryError (kazoo's errors often have no message)."""
    if isinstance(exc, NoAuthError):
        return ("NoAuth: the node's ACL does not allow this ZooKeeper identity to do that (a secured cluster: "
                "log in as the brokers' ZooKeeper user, --zk-user and METAQ_ZK_PASSWORD)")
    return f"{type(exc).__name__}{': ' + str(exc) if str(exc) else ''}"


def kazoo_security(security: ZkSecurity) -> dict[str, Any]:
    """KazooClient's keyword arguments for ``security``: SASL and TLS."""
    kwargs: dict[str, Any] = {}
    if security.sasl_user:
        kwargs["sasl_options"] = {"mechanism": security.sasl_mechanism, "username": security.sasl_user,
                                  "password": security.sasl_password}
    if security.tls:
        kwargs.update(use_ssl=True, verify_certs=True, check_hostname=security.tls_check_hostname,
                      ca=security.tls_ca_file, certfile=security.tls_cert_file, keyfile=security.tls_key_file)
    return kwargs


def kazoo_acl(entries: tuple[AclEntry, ...]) -> list[ACL]:
    return [ACL(e.perms, Id(e.scheme, e.id)) for e in entries]


def entries_of(acl: list[Any]) -> tuple[AclEntry, ...]:
    """kazoo's ACL list as AclEntry (for comparing and printing)."""
    return tuple(AclEntry(int(a.perms), str(a.id.scheme), str(a.id.id)) for a in acl)

