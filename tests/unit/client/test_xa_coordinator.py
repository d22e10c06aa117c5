"""XACoordinator's rules on whose branches it decides, against in-memory two-phase-commit resources: its
identity lives in its log, recover() decides only its own branches and never those of a transaction still
running in it, and a branch that vanished after the decision is reported as decided by someone else."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from metaq.client.transaction import Xid
from metaq.client.xa import XACoordinator, XAError, XAHeuristicError


class MemoryResource:
    """A DB-API TPC resource whose prepared branches live in ``prepared`` (shared, as a database's are)."""

    def __init__(self, prepared: dict[str, Xid]) -> None:
        self.prepared = prepared
        self.current: Xid | None = None
        self.committed: list[str] = []
        self.rolled_back: list[str] = []

    def tpc_begin(self, xid: Xid) -> None:
        self.current = xid

    def tpc_prepare(self) -> None:
        assert self.current is not None
        self.prepared[self.current.key] = self.current

    def tpc_commit(self, xid: Xid | None = None) -> None:
        xid = xid or self.current
        assert xid is not None
        self.current = None
        if self.prepared.pop(xid.key, None) is None:
            raise LookupError(f"no prepared transaction {xid.key}")
        self.committed.append(xid.gtrid)

    def tpc_rollback(self, xid: Xid | None = None) -> None:
        xid = xid or self.current
        assert xid is not None
        self.current = None
        self.prepared.pop(xid.key, None)
        self.rolled_back.append(xid.gtrid)

    def tpc_recover(self) -> list[Xid]:
        return list(self.prepared.values())


def test_the_identity_is_the_logs_and_survives_a_restart(tmp_path: Path) -> None:
    with XACoordinator(tmp_path / "a.log", {}) as a, XACoordinator(tmp_path / "b.log", {}) as b:
        assert a.branch_prefix != b.branch_prefix and a.branch_prefix.startswith("metaq-xa-")
        first = a.branch_prefix
    with XACoordinator(tmp_path / "a.log", {}) as again:
        assert again.branch_prefix == first
    assert (tmp_path / "a.log").read_text().splitlines()[0].startswith("COORDINATOR ")


def test_a_second_coordinator_on_one_log_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    first = XACoordinator(tmp_path / "xa.log", {})
    with pytest.raises(XAError, match="in use by another live coordinator"):
        XACoordinator(tmp_path / "xa.log", {})
    first.close()
    XACoordinator(tmp_path / "xa.log", {}).close()


def test_recover_decides_only_its_own_branches(tmp_path: Path) -> None:
    prepared: dict[str, Any] = {}
    mine, theirs = MemoryResource(prepared), MemoryResource(prepared)
    with XACoordinator(tmp_path / "mine.log", {"db": mine}) as me, \
            XACoordinator(tmp_path / "theirs.log", {"db": theirs}) as other:
        other_xid = Xid(0x6D71, f"{other.branch_prefix}0123", "db")
        my_xid = Xid(0x6D71, f"{me.branch_prefix}4567", "db")
        prepared.update({other_xid.key: other_xid, my_xid.key: my_xid})
        assert me.recover() == {"committed": [], "rolled_back": [f"db:{my_xid.gtrid}"]}
        assert list(prepared) == [other_xid.key]  # the other coordinator's branch is still prepared


def test_recover_leaves_alone_a_transaction_still_running_in_the_same_coordinator(tmp_path: Path) -> None:
    prepared: dict[str, Any] = {}
    db = MemoryResource(prepared)
    in_doubt, go = threading.Event(), threading.Event()

    def hook(step: str) -> None:
        if step == "prepared:db":
            in_doubt.set()
            assert go.wait(10)

    with XACoordinator(tmp_path / "xa.log", {"db": db}, crash_hook=hook) as coordinator:
        def run() -> None:
            with coordinator.transaction():
                pass

        worker = threading.Thread(target=run)
        worker.start()
        assert in_doubt.wait(10)
        try:
            assert coordinator.recover() == {"committed": [], "rolled_back": []}
        finally:
            go.set()
            worker.join(10)
    assert len(db.committed) == 1 and not db.rolled_back and not prepared


def test_a_branch_gone_after_the_decision_is_reported_as_decided_by_someone_else(tmp_path: Path) -> None:
    prepared: dict[str, Any] = {}
    db, mq = MemoryResource(prepared), MemoryResource({})

    def hook(step: str) -> None:
        if step == "decided":  # an administrator's ROLLBACK PREPARED, between the decision and phase two
            prepared.clear()

    with XACoordinator(tmp_path / "xa.log", {"db": db, "mq": mq}, crash_hook=hook) as coordinator:
        with pytest.raises(XAHeuristicError, match=r"branch 'db' was decided by someone else.*committed: mq"), \
                coordinator.transaction():
            pass
        assert len(mq.committed) == 1
        assert "DONE" not in (tmp_path / "xa.log").read_text()  # the outcome is not recorded as complete
