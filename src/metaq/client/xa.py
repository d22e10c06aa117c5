"""A small two-phase-commit coordinator: metaq producers and databases in one atomic transaction.

Every participant is a DB-API two-phase-commit resource: a :class:`~metaq.client.sync.SyncProducer`
(``tpc_begin``, ``tpc_prepare``, ``tpc_commit``, ``tpc_rollback``, ``tpc_recover``) or a psycopg
``Connection`` (PostgreSQL with ``max_prepared_transactions`` > 0), which has the same methods::

    coordinator = XACoordinator("/var/lib/app/xa.log", {"db": pg_conn, "mq": producer})
    with coordinator.transaction() as tx:
        pg_conn.execute("INSERT INTO orders ...")
        producer.send(Message("orders", ...))
    # both committed, or both rolled back

    coordinator.recover()   # after a crash (of this process, a broker, or the database): finish what was decided

The protocol (presumed abort):

1. ``tpc_begin`` on every resource, each with its own branch of one global id (gtrid).
2. The application's work.
3. ``tpc_prepare`` on every resource. If one fails, everything is rolled back.
4. The decision ``COMMIT gtrid`` is appended to the coordinator's log and fsynced: **the commit point**.
5. ``tpc_commit`` on every resource, then ``DONE gtrid`` is logged.

:meth:`XACoordinator.recover` asks every resource for its prepared branches of this coordinator
(gtrids starting with its ``name``). A branch whose gtrid has a ``COMMIT`` in the log is committed;
any other is rolled back, because no decision means no commit was promised. Then ``DONE`` is logged.
A crash at any point therefore ends with all branches committed or all rolled back, once recover has
run. The log is a text file, one fsynced line per record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from metaq.client.transaction import Xid
from metaq.errors import MetaqError

log = logging.getLogger("metaq.client.xa")

FORMAT_ID = 0x6D71  # "mq"

CrashHook = Callable[[str], None]
"""Called with the step just done (``prepared:<name>``, ``decided``, ``committed:<name>``): for fault tests."""


class XAError(MetaqError):
    """The global transaction was rolled back (a resource failed before the commit point)."""


class XACoordinator:
    def __init__(self, log_path: str | os.PathLike[str], resources: Mapping[str, Any], *, name: str = "metaq-xa",
                 crash_hook: CrashHook | None = None) -> None:
        if ":" in name:
            raise ValueError("the coordinator name may not contain ':'")
        self.log_path = Path(log_path)
        self.resources = dict(resources)
        self.name = name
        self._hook = crash_hook or (lambda step: None)

    # -- the decision log --------------------------------------------------------------------------

    def _append(self, record: str) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (record + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _decisions(self) -> tuple[set[str], set[str]]:
        """(gtrids decided COMMIT, gtrids DONE). A torn last line (a crash while writing) is ignored."""
        committed: set[str] = set()
        done: set[str] = set()
        try:
            text = self.log_path.read_text()
        except FileNotFoundError:
            return committed, done
        for line in text.splitlines():
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
        gtrid = f"{self.name}-{uuid.uuid4().hex}"
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
        self._append(f"COMMIT {gtrid}")  # the commit point
        self._hook("decided")
        for name in begun:
            self.resources[name].tpc_commit()
            self._hook(f"committed:{name}")
        self._append(f"DONE {gtrid}")

    def recover(self) -> dict[str, list[str]]:
        """Finish every in-doubt branch of this coordinator: commit the decided, roll back the rest.
        Returns {"committed": [...], "rolled_back": [...]} (branch descriptions)."""
        decided, done = self._decisions()
        out: dict[str, list[str]] = {"committed": [], "rolled_back": []}
        finished: set[str] = set()
        for name, resource in self.resources.items():
            for xid in resource.tpc_recover():
                gtrid = str(getattr(xid, "gtrid", ""))
                if not gtrid.startswith(self.name + "-"):
                    continue  # another coordinator's (or a plain PREPARE TRANSACTION's) business
                if gtrid in decided:
                    resource.tpc_commit(xid)
                    out["committed"].append(f"{name}:{gtrid}")
                else:
                    resource.tpc_rollback(xid)
                    out["rolled_back"].append(f"{name}:{gtrid}")
                finished.add(gtrid)
        for gtrid in sorted((decided - done) | (finished & decided)):
            self._append(f"DONE {gtrid}")
        if out["committed"] or out["rolled_back"]:
            log.info("XA recovery: committed %s, rolled back %s", out["committed"], out["rolled_back"])
        return out
