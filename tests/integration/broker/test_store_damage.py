"""The issue's reproductions against a real broker process: one flipped byte in the committed-offsets log or in
an old transaction-log record costs the record it is in, with an ERROR naming what was lost and a count in
`metaq stats`, never the rest; `metaq admin verify` checks these stores too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from metaq.client import connect
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.protocol import messages as m
from metaq.protocol.records import ProducerStamp, encode_values, with_producer_stamp
from metaq.testing import BrokerProcess

SETTINGS = ConnectionSettings("store-damage-test", 5.0, 30.0, 16, 64 << 20)
GROUPS = [f"group-{i}" for i in range(6)]


def _call(broker: BrokerProcess, *requests: object) -> list[object]:
    conn = BlockingConnection.open(("127.0.0.1", broker.port), SETTINGS)
    try:
        return [raise_for_error(conn.call(r)) for r in requests]
    finally:
        conn.close()


def _flip(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def _fetch(broker: BrokerProcess, group: str) -> dict[tuple[str, int], int]:
    (response,) = _call(broker, m.OffsetFetchRequest(group, None))
    return {(e.topic, e.partition): e.offset for e in response.offsets}  # type: ignore[attr-defined]


def _verify(broker: BrokerProcess) -> tuple[int, str, list[dict]]:  # type: ignore[type-arg]
    text = subprocess.run([sys.executable, "-m", "metaq.cli.main", "admin", "verify", "-s", broker.servers],
                          capture_output=True, text=True, timeout=120)
    as_json = subprocess.run([sys.executable, "-m", "metaq.cli.main", "admin", "verify", "-s", broker.servers,
                              "--json"], capture_output=True, text=True, timeout=120)
    return text.returncode, text.stdout + text.stderr, json.loads(as_json.stdout)


def test_a_flipped_byte_in_the_offsets_log_costs_one_group(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 3})
    with connect(broker.servers) as session:
        session.admin().create_topic("orders", 3)
    for i, group in enumerate(GROUPS):
        _call(broker, m.OffsetCommitRequest(group, m.NO_GENERATION, "", [
            m.OffsetEntry("orders", 0, p, 10 * i + p, f"meta-{i}") for p in range(3)]))
    before = {group: _fetch(broker, group) for group in GROUPS}
    assert all(len(v) == 3 for v in before.values())
    assert broker.stop() == 0  # SIGTERM
    log_path = broker.data_dir / "consumer_offsets.log"
    _flip(log_path, 20)  # the byte: inside the first record
    broker.allow_log(r"offsets log .*consumer_offsets\.log: the record of group .* is damaged")
    broker.start()
    after = {group: _fetch(broker, group) for group in GROUPS}
    lost = [g for g in GROUPS if not after[g]]
    assert len(lost) == 1, after  # it used to be all six
    assert {g: v for g, v in after.items() if g not in lost} == {g: v for g, v in before.items() if g not in lost}
    errors = [line for line in broker.log_lines if " ERROR " in line]
    assert len(errors) == 1 and "the damaged log is kept as" in errors[0], errors
    kept = [p for p in broker.data_dir.iterdir() if ".damaged-" in p.name]
    assert len(kept) == 1
    with connect(broker.servers) as session:
        stores = session.admin().stats()["stores"]
    assert stores["damaged_records"] == {"offsets": 1}
    code, text, reports = _verify(broker)
    store = next(r for r in reports if r.get("store") == "offsets")
    assert store["ok"] and store["records"] == 5 and code == 0, text  # the compacted log holds the five left
    assert any("a damaged log was kept as" in note for note in store["notes"]), store
    # damage in the log as it is now (a bad sector under the running broker) is found by verify
    log_bytes = log_path.read_bytes()
    _flip(log_path, len(log_bytes) // 2, 0x40)
    code, text, reports = _verify(broker)
    store = next(r for r in reports if r.get("store") == "offsets")
    assert code == 1 and not store["ok"] and len(store["damaged"]) == 1, text
    assert "store offsets of broker" in text and "DAMAGED" in text


def _stamped(values: list[bytes], pid: int) -> bytes:
    return with_producer_stamp(encode_values(values, 1), ProducerStamp(pid, 0, 0))


def test_a_flipped_byte_in_an_old_transaction_log_record_costs_at_most_that_transaction(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    requests: list[object] = []
    for n in range(5):
        txid = f"tx-{n}"
        requests += [m.TransactionRequest(m.TX_BEGIN, txid),
                     m.ProduceRequest("t", 0, 1, 10_000, transaction_id=txid,
                                      records=_stamped([f"{txid} a".encode(), f"{txid} b".encode()], 100 + n)),
                     m.TransactionRequest(m.TX_PREPARE, txid, xid=f"xid-{n}")]
        if n < 3:
            requests.append(m.TransactionRequest(m.TX_COMMIT, txid))
    _call(broker, *requests)
    assert broker.stop() == 0  # SIGTERM
    (txlog,) = sorted((broker.data_dir / ".txlog").glob("*.txlog"))
    _flip(txlog, 12)  # the byte: in the first record (the BEGIN of tx-0)
    broker.allow_log(r"\.txlog: the damaged record at bytes")
    broker.start()
    (recovered,) = _call(broker, m.TransactionRequest(m.TX_RECOVER))
    assert recovered.xids == ["xid-3", "xid-4"]  # type: ignore[attr-defined]  # it used to be []
    statuses = [_call(broker, m.TransactionRequest(m.TX_STATUS, f"tx-{n}"))[0].xids[0]  # type: ignore[attr-defined]
                for n in range(5)]
    assert statuses == ["committed"] * 3 + ["prepared"] * 2  # the committed ones were "unknown"
    errors = [line for line in broker.log_lines if " ERROR " in line]
    assert len(errors) == 1 and "'tx-0'" in errors[0], errors
    _call(broker, *(m.TransactionRequest(m.TX_COMMIT, f"tx-{n}") for n in (3, 4)))
    with connect(broker.servers) as session:
        got = [bytes(msg.data) for batch in session.create_pull_consumer().iterate_batches(
            "t", 0, "earliest", stop_at_end=True) for msg in batch]
        assert session.admin().stats()["stores"]["damaged_records"] == {"txlog": 1}
    assert got == [f"tx-{n} {x}".encode() for n in range(5) for x in "ab"], "every transaction whole, once"
