"""The transaction log, damaged: every byte of a small log flipped in turn costs at most the transaction whose
record holds it. The other transactions replay exactly as before; the damaged one is never applied in
part (a lost record that may have been one of its batches marks it damaged: the coordinator rolls it
back); what was lost is one message naming the transaction whenever its key can be read; a damaged last
record is a torn tail, cut as before. The issue's case: 3 committed + 2 prepared XA transactions, byte 12
flipped: recover() still gives the 2 prepared, the 3 committed are still committed."""

from __future__ import annotations

from pathlib import Path

import pytest
from storage_helpers import no_sync

from metaq import framing
from metaq.broker.transactions import TransactionCoordinator
from metaq.storage.txlog import TransactionLog, TxState


def _build(directory: Path) -> bytes:
    log = TransactionLog(directory, sync=no_sync)
    log.open()
    states = {t: TxState(t, 60_000, 1000 + i, "pg" if t.startswith("p") else "")
              for i, t in enumerate(["c1", "c2", "c3", "p1", "p2", "open", "rb", "committing"])}
    for txid, state in states.items():
        log.begin(state)
        log.put(state, "t", 0, b"batch-1-of-" + txid.encode())
        if txid in ("c1", "p1", "committing"):
            log.put(state, "u", 1, b"batch-2-of-" + txid.encode())
    for txid in ("c1", "c2", "c3"):
        log.commit(states[txid])
        log.applied(txid)
    log.prepare(states["p1"], "xid-1")
    log.prepare(states["p2"], "xid-2")
    log.rollback("rb", "asked")
    log.prepare(states["committing"], "xid-3")
    log.commit(states["committing"])
    log.begin(TxState("last", 60_000, 5, ""))  # the last record: damage there is a torn tail
    log.close()
    return log.path.read_bytes()


def _state(directory: Path) -> tuple[dict[str, tuple], dict[str, str], list[str], int]:
    log = TransactionLog(directory, sync=no_sync)
    live = log.open()
    out = {t: (s.xid, s.committed, [(p.topic, p.partition, log.read_batch(p)) for p in s.puts], s.damaged is not None,
               s.timeout_ms)
           for t, s in live.items()}
    log.close()
    return out, dict(log.finished), log.damage, log.truncated_bytes


def _acceptable(now: tuple | None, was: tuple | None, was_how: str | None, how: str | None, puts: int) -> bool:
    """What the transaction whose record was lost may have become: never applied in part, never committed by
    the damage."""
    if now is None:  # finished: as before, or with how it ended lost (status unknown), or its reason lost
        return was is None and (how in (was_how, None) or "lost to damage" in (how or ""))
    damaged, committed, prepared = now[3], now[1], now[0] is not None
    if damaged:  # rolled back at start, whatever it was
        return True
    if now[:3] == (was or (None,))[:3]:
        return True
    # changed but not marked damaged: its lost record was its last one, and it is now
    if not committed and not prepared:  # open: rolled back at start like any open one, nothing applied
        return was is None or not was[1]
    if prepared and not committed:  # prepared again (its COMMIT lost): its coordinator decides, as after a crash
        return was is not None and was[0] == now[0] and was[2] == now[2]
    # committed when it was committed and applied (its APPLIED lost): applied again, and the batches'
    # producer sequences keep what is stored once
    return committed and was_how == "committed" and len(now[2]) == puts


def _owner(data: bytes, i: int) -> tuple[str, str, int, int]:
    """(txid, record type, start, end) of the record holding byte ``i``."""
    from metaq.storage.txlog.format import NAMES, parse_key

    for r in framing.scan(data):
        if r.position <= i < r.end:
            kind, _number, txid = parse_key(r.key)  # type: ignore[misc]
            return txid, NAMES[kind], r.position, r.end
    raise AssertionError(i)


def test_every_flipped_byte_costs_at_most_the_transaction_whose_record_holds_it(tmp_path: Path) -> None:
    clean = _build(tmp_path / "clean")
    full_live, full_finished, damage, _ = _state(tmp_path / "clean")
    assert not damage
    assert set(full_live) == {"p1", "p2", "open", "committing", "last"}
    assert full_finished == {"c1": "committed", "c2": "committed", "c3": "committed", "rb": "rolled back (asked)"}
    directory = tmp_path / "d"
    directory.mkdir()
    named = 0
    for i in range(len(clean)):
        for f in directory.iterdir():
            f.unlink()
        damaged = bytearray(clean)
        damaged[i] ^= 0xFF
        (directory / "00000000000000000001.txlog").write_bytes(bytes(damaged))
        live, finished, damage, truncated = _state(directory)
        txid, kind, start, end = _owner(clean, i)
        if i - start < 4:  # the magic alone
            assert (live, finished, damage) == (full_live, full_finished, []), i
            continue
        if txid == "last":
            assert truncated == end - start and not damage and "last" not in live, i
            continue
        for other in set(full_live) | set(live) | set(full_finished) | set(finished):
            if other != txid:
                assert live.get(other) == full_live.get(other), (i, other)
                assert finished.get(other) == full_finished.get(other), (i, other)
        assert len(damage) == 1, (i, damage)
        named += f"{txid!r}" in damage[0]
        assert _acceptable(live.get(txid), full_live.get(txid), full_finished.get(txid), finished.get(txid),
                           2 if txid == "c1" else 1), (i, kind, live.get(txid), finished.get(txid))
    assert named > len(clean) // 2


def _coordinator(directory: Path) -> TransactionCoordinator:
    coordinator = TransactionCoordinator(TransactionLog(directory, sync=no_sync), max_timeout_s=60, capacity=100,
                                         flush_at_commit=1, checkpoint_interval_ms=60_000)
    return coordinator


def test_the_issue_s_flip_of_byte_12_keeps_recover_and_the_committed_statuses(tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    assert coordinator.open() == []
    for n in range(5):
        txid = f"tx{n}"
        coordinator.begin(txid, 0, "")
        coordinator.txlog.put(coordinator.get(txid).state, "t", 0, b"batch %d" % n)
        coordinator.prepare(txid, f"xid-{n}")
        if n < 3:
            coordinator.finish_commit(coordinator.start_commit(txid))
    coordinator.txlog.close()
    path = coordinator.txlog.path
    data = bytearray(path.read_bytes())
    data[12] ^= 0x01
    path.write_bytes(bytes(data))
    again = _coordinator(tmp_path)
    assert again.open() == []
    assert again.recover() == ["xid-3", "xid-4"]
    assert [again.status(f"tx{n}") for n in range(3)] == ["committed"] * 3
    assert len(again.txlog.damage) == 1 and "'tx0'" in again.txlog.damage[0]
    again.txlog.close()


@pytest.mark.parametrize("lost", ["PUT", "PREPARE"])
def test_a_transaction_that_lost_a_batch_or_its_prepare_is_rolled_back_not_applied_in_part(
        tmp_path: Path, lost: str, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = _coordinator(tmp_path)
    coordinator.open()
    coordinator.begin("t1", 0, "")
    state = coordinator.get("t1").state
    coordinator.txlog.put(state, "t", 0, b"first")
    coordinator.txlog.put(state, "t", 0, b"second")
    coordinator.prepare("t1", "x")
    coordinator.start_commit("t1")  # committed, not applied: the restart would apply it
    coordinator.begin("later", 0, "")
    coordinator.txlog.close()
    path = coordinator.txlog.path
    data = bytearray(path.read_bytes())
    records = [r for r in framing.scan(bytes(data)) if isinstance(r, framing.Record)]
    target = records[2] if lost == "PUT" else records[3]
    data[target.end - 1] ^= 0x20  # in the body: the key (which record of which transaction) is intact
    path.write_bytes(bytes(data))
    again = _coordinator(tmp_path)
    assert again.open() == [], "nothing to apply"
    assert again.status("t1").startswith("rolled back (damaged in the transaction log")
    assert any("committed transaction t1" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    assert again.status("later") == "rolled back (the broker restarted before it was prepared or committed)"
    again.txlog.close()


def test_verify_reports_a_damaged_record_of_the_open_log(tmp_path: Path) -> None:
    _build(tmp_path)
    log = TransactionLog(tmp_path, sync=no_sync)
    log.open()
    assert log.verify().ok
    data = bytearray(log.path.read_bytes())
    second = [r for r in framing.scan(bytes(data)) if isinstance(r, framing.Record)][1]
    data[second.body_at] ^= 0x01
    log.path.write_bytes(bytes(data))
    report = log.verify()
    assert not report.ok and "PUT record (number 1) of transaction 'c1'" in report.damaged[0]
    log.close()


def test_a_generation_of_the_earlier_form_is_replayed_appended_to_and_checkpointed_framed(tmp_path: Path) -> None:
    from metaq.storage.txlog.format import BEGIN, I32, I64, PREPARE, PUT, encode_string, encode_v1

    pieces = [*encode_v1(BEGIN, "old", I64.pack(60_000), I64.pack(7), encode_string("")),
              *encode_v1(PUT, "old", encode_string("t") + I32.pack(2), b"the batch"),
              *encode_v1(PREPARE, "old", encode_string("xid-old"))]
    (tmp_path / "00000000000000000001.txlog").write_bytes(b"".join(bytes(p) for p in pieces))
    log = TransactionLog(tmp_path, sync=no_sync)
    live = log.open()
    assert live["old"].xid == "xid-old" and [log.read_batch(p) for p in live["old"].puts] == [b"the batch"]
    log.commit(live["old"])  # appended in the generation's own form
    log.close()
    log = TransactionLog(tmp_path, sync=no_sync)
    live = log.open()
    assert live["old"].committed
    log.checkpoint(live.values())
    assert log.path.read_bytes()[:4] == framing.MAGIC
    log.applied("old")
    log.close()
    log = TransactionLog(tmp_path, sync=no_sync)
    assert log.open() == {} and log.finished == {"old": "committed"} and log.verify().ok
    log.close()
