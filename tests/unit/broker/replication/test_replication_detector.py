"""A slave's evidence that its master is dead (metaq.broker.replication.detector): what counts, for whom, and
when silence may lead to a takeover (docs/replication.md#detecting-a-dead-master)."""

from __future__ import annotations

from metaq.broker.replication.detector import REFUSED, SILENT, MasterWatch
from metaq.cluster.registry import Address

M = Address("10.0.0.1", 8123)
OTHER = Address("10.0.0.2", 8123)


def test_a_refused_connection_is_evidence_until_the_next_reply() -> None:
    watch = MasterWatch(1.5)
    watch.follow(M, 3, now=100.0)
    assert watch.evidence(100.1) is None
    watch.reply(M, 100.2)
    watch.refused(M, "connection refused", 100.3)
    assert watch.evidence(100.3) == REFUSED  # no lease to wait out: nothing listens there any more
    watch.reply(M, 100.4)  # it answered after all (restarted on the same port): no evidence
    assert watch.evidence(100.4) is None


def test_silence_counts_from_the_last_reply_and_from_when_following_began() -> None:
    watch = MasterWatch(1.5)
    watch.follow(M, 3, now=100.0)
    assert watch.evidence(101.49) is None and watch.evidence(101.5) == SILENT  # no reply at all since following
    watch.reply(M, 101.0)
    assert watch.evidence(102.49) is None and watch.evidence(102.5) == SILENT
    assert watch.last_contact() == 101.0  # a takeover on silence comes at least a lease after it (the promise)


def test_evidence_is_about_one_master_in_one_epoch() -> None:
    watch = MasterWatch(1.5)
    watch.follow(M, 3, now=100.0)
    watch.refused(OTHER, "connection refused", 100.1)  # another address: says nothing of this master
    assert watch.evidence(100.1) is None
    watch.refused(M, "connection refused", 100.2)
    assert watch.follow(M, 4, now=100.3)  # a new epoch (a takeover happened): the evidence is forgotten
    assert watch.evidence(100.3) is None and watch.since == 100.3
    assert not watch.follow(M, 4, now=100.4)  # the same master again: nothing changes
    assert watch.follow(None, 4, now=100.5) and watch.evidence(200.0) is None  # nobody to follow: no evidence


def test_what_another_slave_reads_when_it_asks_for_a_vote() -> None:
    watch = MasterWatch(1.5)
    watch.follow(M, 3, now=100.0)
    watch.reply(M, 100.5)
    assert watch.describe(101.0) == {"watching": "10.0.0.1:8123", "watching_epoch": 3, "master_silent_ms": 500,
                                     "master_evidence": None}
