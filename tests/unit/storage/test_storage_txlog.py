"""The transaction log: replay gives the live transactions, a torn or bit-flipped tail is cut without losing
what came before, and a checkpoint keeps exactly the live transactions (their batches readable) in a new
generation."""

from __future__ import annotations

import os
from pathlib import Path

from storage_helpers import no_sync

from metaq.storage.txlog import TransactionLog, TxState, list_generations


def _open(path: Path) -> tuple[TransactionLog, dict[str, TxState]]:
    log = TransactionLog(path, max_checkpoints=2, sync=no_sync)
    return log, log.open()


def _fill(log: TransactionLog) -> None:
    done, prepared, committing, open_ = (TxState(t, 60_000, 1, "g") for t in ("done", "prep", "commit", "open"))
    for state in (done, prepared, committing, open_):
        log.begin(state)
        log.put(state, "t", 0, b"batch-of-" + state.txid.encode())
    log.put(open_, "u", 3, b"second")
    log.commit(done)
    log.applied("done")
    log.prepare(prepared, "xid-1")
    log.commit(committing)


def test_replay_gives_the_live_transactions_with_readable_batches(tmp_path: Path) -> None:
    log, live = _open(tmp_path)
    assert live == {}
    _fill(log)
    log.close()
    log, live = _open(tmp_path)
    assert set(live) == {"prep", "commit", "open"}
    assert live["prep"].xid == "xid-1" and not live["prep"].committed
    assert live["commit"].committed and live["open"].xid is None
    assert [log.read_batch(p) for p in live["open"].puts] == [b"batch-of-open", b"second"]
    assert [(p.topic, p.partition) for p in live["open"].puts] == [("t", 0), ("u", 3)]


def test_a_torn_or_flipped_tail_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    log, _ = _open(tmp_path)
    _fill(log)
    size = log.size_bytes
    path = log.path
    log.rollback("open", "test")  # the last record: damage it
    log.close()
    for damage in ("torn", "flipped"):
        data = bytearray(path.read_bytes())
        if damage == "torn":
            data = data[:-3]
        else:
            data[-2] ^= 0x40
        path.write_bytes(bytes(data))
        log, live = _open(tmp_path)
        assert set(live) == {"prep", "commit", "open"}  # the ROLLBACK is gone, everything before it stays
        assert log.truncated_bytes > 0 and os.path.getsize(path) == size
        log.rollback("open", "again")
        log.close()


def test_a_checkpoint_keeps_only_the_live_transactions_and_old_generations_go(tmp_path: Path) -> None:
    log, _ = _open(tmp_path)
    _fill(log)
    before = log.size_bytes
    _log2, live = _open(tmp_path)
    _log2.close()
    for _ in range(3):
        log.checkpoint(live.values())
    assert len(list_generations(tmp_path)) == 2 and log.size_bytes < before
    assert log.read_batch(live["open"].puts[1]) == b"second"
    log.rollback("open", "after the checkpoint")
    log.close()
    log, again = _open(tmp_path)
    assert set(again) == {"prep", "commit"} and again["prep"].xid == "xid-1"
    assert log.read_batch(again["commit"].puts[0]) == b"batch-of-commit"


def test_finished_transactions_are_replayed_with_how_they_ended_also_across_checkpoints(tmp_path: Path) -> None:
    log, _ = _open(tmp_path)
    _fill(log)
    log.rollback("open", "the client asked")
    again = TxState("open", 60_000, 2, "")  # a rolled-back id may be begun again
    log.begin(again)
    log.close()
    log, live = _open(tmp_path)
    assert set(live) == {"prep", "commit", "open"}
    assert log.finished == {"done": "committed"}  # "open" is live again: not finished
    log.rollback("open", "second time")
    log.close()
    log, live = _open(tmp_path)
    assert log.finished == {"done": "committed", "open": "rolled back (second time)"}
    # a checkpoint writes only what the caller still remembers, oldest first, with the live ones
    log.checkpoint(live.values(), [("open", "rolled back (second time)"), ("older", "committed")])
    log.applied("commit")
    log.close()
    log, live = _open(tmp_path)
    assert set(live) == {"prep"}
    assert list(log.finished.items()) == [("open", "rolled back (second time)"), ("older", "committed"),
                                          ("commit", "committed")]
    assert [log.read_batch(p) for p in live["prep"].puts] == [b"batch-of-prep"]
