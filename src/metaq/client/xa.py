"""A small two-phase-commit coordinator: metaq producers and databases in one atomic transaction.

Every participant is a DB-API two-phase-commit resource: a :class:`~metaq.client.sync.SyncProducer`
(``tpc_begin``, ``tpc_prepare``, ``tpc_commit``, ``tpc_rollback``, ``tpc_recover``) or a psycopg
``Connection`` (PostgreSQL with ``max_prepared_transactions`` > 0), which has the same methods::

    with XACoordinator("/var/lib/app/xa.log", {"db": pg_conn, "mq": producer}) as coordinator:
        coordinator.recover()   # at start-up: finish what this coordinator left in doubt (a crash)
        with coordinator.transaction() as tx:
            pg_conn.execute("INSERT INTO orders ...")
            producer.send(Message("orders", ...))
        # both committed, or both rolled back

The protocol (presumed abort):

1. ``tpc_begin`` on every resource, each with its own branch of one global id (gtrid).
2. The application's work.
3. ``tpc_prepare`` on every resource. If one fails, everything is rolled back.
4. The decision ``COMMIT gtrid`` is appended to the coordinator's log and fsynced: **the commit point**.
5. ``tpc_commit`` on every resource, then ``DONE gtrid`` is logged.

Whose branches a recovery may decide
------------------------------------
A prepared branch may be decided only by the coordinator that prepared it: any other might roll back
a branch whose coordinator is about to log COMMIT. So every coordinator has an identity of its own,
kept in its log (``COORDINATOR <16 hex>``, the log's first record, written when the log is created),
and every gtrid it makes is ``<name>-<identity>-<32 hex>`` (:attr:`XACoordinator.branch_prefix`).
:meth:`XACoordinator.recover` decides only branches with its own prefix: those of other coordinators
— another log, whatever its ``name`` — are left alone (and logged once at INFO). The identity is the
log's, so a coordinator restarted on the same log after a crash is the same coordinator and finishes
what it left.

**One live coordinator per log.** A coordinator holds an exclusive lock (``flock``) on its log from
construction until :meth:`XACoordinator.close` (or process exit, kill -9 included: the kernel drops
it). A second coordinator on the same log, in this process or another, is refused with an
:class:`XAError` naming the lock; so two live coordinators never share an identity. Give each process
its own log (keep it on a local disk: the lock is the lease). Within one coordinator, a ``recover()``
called while another thread is inside :meth:`XACoordinator.transaction` leaves that transaction's
branches alone.

**Someone else decided a branch.** Only an outside hand can still do it — an administrator's
``ROLLBACK PREPARED``, or the broker's ``maxTxTimeoutInSeconds`` rolling back a metaq branch whose
coordinator stayed away. When a commit after the decision fails, the coordinator asks the resource
whether the branch is still prepared: if it is, the error says recover() will commit it; if it is
gone, :class:`XAHeuristicError` names the branch "decided by someone else" and lists the branches
that were committed (the outcome is mixed: the decision log still says COMMIT).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

from metaq.client.transaction import Xid
from metaq.errors import MetaqError

log = logging.getLogger("metaq.client.xa")

FORMAT_ID = 0x6D71  # "mq"
UNDEFINED_OBJECT = "42704"
"""PostgreSQL's SQLSTATE for COMMIT PREPARED of a transaction id it does not hold (psycopg's UndefinedObject)."""

CrashHook = Callable[[str], None]
"""Called with the step just done (``prepared:<name>``, ``decided``, ``committed:<name>``): for fault tests."""


class XAError(MetaqError):
    """The global transaction was rolled back (a resource failed before the commit point), or the
    coordinator cannot run (its log is in use by another live coordinator)."""


class XAHeuristicError(XAError):
    """After the COMMIT decision a branch turned out decided by someone else (rolled back by an
    administrator or a broker's timeout): the global transaction's outcome is mixed."""


class XACoordinator:
    """See the module docstring. ``name`` is a readable prefix of every gtrid (no ':'); the identity that
    keeps coordinators apart is the log's, whatever the name."""

    def __init__(self, log_path: str | os.PathLike[str], resources: Mapping[str, Any], *, name: str = "metaq-xa",
                 crash_hook: CrashHook | None = None) -> None:
        if ":" in name or not name:
            raise ValueError("the coordinator name must be non-empty and may not contain ':'")
        self.log_path = Path(log_path)
        self.resources = dict(resources)
        self.name = name
        self._hook = crash_hook or (lambda step: None)
        self._in_flight: set[str] = set()
        """gtrids of transactions running in this coordinator now (a concurrent recover() leaves them alone)."""
        self._mutex = threading.Lock()
        self._lock_fd = self._lease()
        try:
            self.identity = self._identity()
        except BaseException:
            self.close()
            raise
        self.branch_prefix = f"{self.name}-{self.identity}-"
        """What every gtrid of this coordinator starts with: what recover() may decide."""

    # -- the log, its lock and its identity --------------------------------------------------------

    def _lease(self) -> int:
        """Open the log and lock it for this coordinator's lifetime (the kernel releases it at exit)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise XAError(f"the XA log {self.log_path} is in use by another live coordinator (it holds the log's "
                          "lock): one coordinator per log; give each process its own log") from None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _identity(self) -> str:
        """This log's coordinator id: its first record, written when the log is new."""
        for line in self._records():
            kind, _, value = line.partition(" ")
            if kind == "COORDINATOR" and value:
                return value
        if self.log_path.stat().st_size:
            # a log written before identities: its branches carry no identity and stay this log's
            log.warning("XA log %s has no coordinator identity record; adding one", self.log_path)
        identity = secrets.token_hex(8)
        self._append(f"COORDINATOR {identity}")
        return identity

    def close(self) -> None:
        """Release the log's lock (another coordinator may then use the log). Idempotent."""
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:  # an unclosed coordinator lets its log go when it is collected
        self.close()

    def __enter__(self) -> XACoordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, record: str) -> None:
        if self._lock_fd < 0:
            raise XAError(f"the XA coordinator of {self.log_path} is closed")
        os.write(self._lock_fd, (record + "\n").encode())
        os.fsync(self._lock_fd)

    def _records(self) -> list[str]:
        try:
            return self.log_path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def _decisions(self) -> tuple[set[str], set[str]]:
        """(gtrids decided COMMIT, gtrids DONE). A torn last line (a crash while writing) is ignored."""
        committed: set[str] = set()
        done: set[str] = set()
        for line in self._records():
            kind, _, gtrid = line.partition(" ")
            if kind == "COMMIT" and gtrid:
                committed.add(gtrid)
            elif kind == "DONE" and gtrid:
                done.add(gtrid)
        return committed, done

    # -- a global transaction ----------------------------------------------------------------------

    def _xid(self, resource: Any, gtrid: str, branch: str) -> Any:
        make = getattr(resource, "xid", None)  # psycopg: Connection.xid(format_id, gtrid, bqual)
        return make(FORMAT_ID, gtrid, branch) if make is not None else Xid(FORMAT_ID, gtrid, branch)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[str]:
        """Begin a branch on every resource; on exit prepare all, decide, commit all (or roll back all
        when the body or a prepare fails). Yields the gtrid."""
        gtrid = f"{self.branch_prefix}{uuid.uuid4().hex}"
        with self._mutex:
            self._in_flight.add(gtrid)
        try:
            begun = yield from self._prepare_all(gtrid)
            self._append(f"COMMIT {gtrid}")  # the commit point
            self._hook("decided")
            self._commit_all(gtrid, begun)
        finally:
            with self._mutex:
                self._in_flight.discard(gtrid)

    def _prepare_all(self, gtrid: str) -> Generator[str, None, list[str]]:
        """Begin every branch, yield to the application's work, prepare every branch; roll all back on a
        failure (the XAError names it). Returns the resources begun."""
        begun: list[str] = []
        try:
            for name, resource in self.resources.items():
                resource.tpc_begin(self._xid(resource, gtrid, name))
                begun.append(name)
            yield gtrid
            for name in begun:
                self.resources[name].tpc_prepare()
                self._hook(f"prepared:{name}")
        except BaseException as exc:
            for name in begun:
                with contextlib.suppress(Exception):
                    self.resources[name].tpc_rollback()
            if isinstance(exc, Exception):
                raise XAError(f"global transaction {gtrid} rolled back: {exc}") from exc
            raise
        return begun

    def _commit_all(self, gtrid: str, begun: list[str]) -> None:
        """Phase two after the decision: commit every branch; a branch that fails does not stop the
        others (the decision is COMMIT). DONE is logged only when all committed."""
        committed: list[str] = []
        lost: dict[str, BaseException] = {}
        pending: dict[str, BaseException] = {}
        for name in begun:
            resource = self.resources[name]
            try:
                resource.tpc_commit()
            except Exception as exc:
                if self._still_prepared(resource, gtrid, exc):
                    pending[name] = exc
                else:
                    lost[name] = exc
                continue
            committed.append(name)
            self._hook(f"committed:{name}")
        if lost:
            raise XAHeuristicError(
                f"global transaction {gtrid} was decided COMMIT, but "
                + "; ".join(f"branch {name!r} was decided by someone else (no longer prepared: rolled back by an "
                            f"administrator or the resource's timeout?): {type(exc).__name__}: {exc}"
                            for name, exc in lost.items())
                + f"; committed: {', '.join(committed) or 'none'}"
                + (f"; still prepared (recover() commits them): {', '.join(pending)}" if pending else "")
                + ". The outcome is mixed: reconcile by hand") from next(iter(lost.values()))
        if pending:
            failures = ", ".join(f"{n} ({type(e).__name__}: {e})" for n, e in pending.items())
            raise XAError(f"global transaction {gtrid} was decided COMMIT; committed: {', '.join(committed) or 'none'}"
                          f"; not yet: {failures}. They stay prepared and recover() commits them"
                          ) from next(iter(pending.values()))
        self._append(f"DONE {gtrid}")

    @staticmethod
    def _still_prepared(resource: Any, gtrid: str, exc: BaseException) -> bool:
        """Whether the resource still holds the prepared branch of ``gtrid`` after its commit failed with
        ``exc`` (True when it cannot tell: recover() will try again)."""
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate is not None:  # PostgreSQL says it: 42704, no prepared transaction of that id
            return bool(sqlstate != UNDEFINED_OBJECT)
        try:
            return any(str(getattr(xid, "gtrid", "")) == gtrid for xid in resource.tpc_recover())
        except Exception:  # the resource cannot be asked now (its connection is gone)
            return True

    def recover(self) -> dict[str, list[str]]:
        """Finish every in-doubt branch of this coordinator: commit the decided, roll back the rest.
        Branches of other coordinators (another log) and of transactions running in this one are left
        alone. Returns {"committed": [...], "rolled_back": [...]} (branch descriptions)."""
        decided, done = self._decisions()
        out: dict[str, list[str]] = {"committed": [], "rolled_back": []}
        finished: set[str] = set()
        others: set[str] = set()
        for name, resource in self.resources.items():
            for xid in resource.tpc_recover():
                gtrid = str(getattr(xid, "gtrid", ""))
                if not gtrid.startswith(self.branch_prefix):
                    if gtrid.startswith(self.name + "-"):
                        others.add(gtrid)
                    continue  # another coordinator's (or a plain PREPARE TRANSACTION's) business
                with self._mutex:
                    running = gtrid in self._in_flight
                if running:
                    continue  # prepared by a transaction() of this coordinator that is still deciding
                if gtrid in decided:
                    resource.tpc_commit(xid)
                    out["committed"].append(f"{name}:{gtrid}")
                else:
                    resource.tpc_rollback(xid)
                    out["rolled_back"].append(f"{name}:{gtrid}")
                finished.add(gtrid)
        for gtrid in sorted((decided - done) | (finished & decided)):
            self._append(f"DONE {gtrid}")
        if others:
            log.info("XA recovery: %d prepared branches belong to other coordinators (not %s...): left alone",
                     len(others), self.branch_prefix)
        if out["committed"] or out["rolled_back"]:
            log.info("XA recovery: committed %s, rolled back %s", out["committed"], out["rolled_back"])
        return out
