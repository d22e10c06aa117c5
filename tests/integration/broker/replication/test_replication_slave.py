"""An async slave (MetaQ's) against a real master, real ZooKeeper and real broker processes.

What a user relies on: the slave's partitions hold exactly the master's bytes (offsets, message ids,
CRCs; checked on fetched records and on the segment files), it registers in MetaQ's layout, it refuses
writes, consumers reading from it get the master's messages, and it survives being killed -9 under
load and its master restarting. Every check is a history check: each acked batch (partition, base
offset, payloads) must be on the slave at that offset with those payloads, and nothing else is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.replication.fetcher import whole_batches
from metaq.client import Message, MessageSessionFactory
from metaq.errors import DeliveryTimeoutError, MetaqError, NotMasterError, OffsetOutOfRangeError, error_for_code
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import decode_fetched, encode_values
from metaq.testing import BrokerProcess, wait_until

TOPIC = "orders"
PARTITIONS = 3
TOPICS = f"[topic={TOPIC}]\nnumPartitions={PARTITIONS}\n"
SETTINGS = ConnectionSettings(client_id="replication-test", connect_timeout_s=5.0, request_timeout_s=30.0,
                              max_in_flight=16, max_frame_bytes=64 << 20)
SLAVE = ["--slave", "--slave-id", "0"]
CATCH_UP_S = 60.0


def open_conn(proc: BrokerProcess) -> BlockingConnection:
    return BlockingConnection.open((proc.host, proc.port), SETTINGS)


def call(conn: BlockingConnection, request: Any) -> Any:
    reply = conn.call(request)
    if reply.error_code:
        raise error_for_code(reply.error_code, reply.error_message or "", reply)
    return reply


def stats(proc: BrokerProcess) -> dict[str, Any]:
    conn = open_conn(proc)
    try:
        return json.loads(call(conn, m.StatsRequest()).stats_json)
    finally:
        conn.close()


def end_offsets(proc: BrokerProcess, partitions: int = PARTITIONS) -> list[int]:
    try:
        conn = open_conn(proc)
    except Exception:  # restarting
        return [-1] * partitions
    try:
        return [_end_offset(conn, p) for p in range(partitions)]
    except Exception:
        return [-1] * partitions
    finally:
        conn.close()


def _end_offset(conn: BlockingConnection, partition: int) -> int:
    try:
        return int(call(conn, m.FetchRequest(topic=TOPIC, partition=partition, offset=0, max_bytes=1)).log_end_offset)
    except OffsetOutOfRangeError as exc:  # retention removed offset 0: the reply still carries the range
        return int(exc.response.log_end_offset)


def log_start(proc: BrokerProcess, partition: int) -> int:
    conn = open_conn(proc)
    try:
        call(conn, m.FetchRequest(topic=TOPIC, partition=partition, offset=0, max_bytes=1))
        return 0
    except OffsetOutOfRangeError as exc:
        return int(exc.response.log_start_offset)
    finally:
        conn.close()


def stored_bytes(proc: BrokerProcess, partition: int, start: int = 0) -> bytes:
    """Every stored byte of a partition from ``start``, by fetching (whole batches, as stored)."""
    conn = open_conn(proc)
    out = bytearray()
    offset = start
    try:
        for _ in range(100_000):
            reply = call(conn, m.FetchRequest(topic=TOPIC, partition=partition, offset=offset, max_bytes=1 << 20))
            if offset >= reply.log_end_offset:
                return bytes(out)
            _found, next_offset = decode_fetched(reply.records, TOPIC, partition, offset)
            assert next_offset > offset
            out += bytes(reply.records)[:_whole(reply.records)]
            offset = next_offset
    finally:
        conn.close()
    raise AssertionError("fetching did not reach the log end")


def _whole(records: bytes | memoryview) -> int:
    return whole_batches(records).nbytes


def messages(proc: BrokerProcess, partition: int) -> list[tuple[int, int, bytes]]:
    data = stored_bytes(proc, partition)
    found, _ = decode_fetched(data, TOPIC, partition, 0)
    return [(msg.offset, msg.id, msg.data) for msg in found]


class Load:
    """Produces batches to every partition of the master from a thread, recording each ack."""

    def __init__(self, master: BrokerProcess, batch: int = 20) -> None:
        self.master = master
        self.batch = batch
        self.acked: list[tuple[int, int, list[bytes]]] = []
        """(partition, base offset, payloads) of every acknowledged batch."""
        self.errors: list[BaseException] = []
        self.unknown: list[tuple[int, list[bytes]]] = []
        """(partition, payloads) of batches sent without an answer (the master died meanwhile): stored or not."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._n = 0

    def _run(self) -> None:
        conn: BlockingConnection | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = open_conn(self.master)
                self.produce_one(conn)
            except Exception as exc:  # the master restarting: reconnect and go on
                self.errors.append(exc)
                if conn is not None:
                    conn.close()
                conn = None
                self._stop.wait(0.05)
        if conn is not None:
            conn.close()

    def produce_one(self, conn: BlockingConnection) -> None:
        partition = self._n % PARTITIONS
        values = [f"m{self._n:07d}-{i:03d}".encode() for i in range(self.batch)]
        self._n += 1
        try:
            reply = call(conn, m.ProduceRequest(topic=TOPIC, partition=partition,
                                                records=encode_values(values, 1000)))
        except Exception:
            self.unknown.append((partition, values))
            raise
        self.acked.append((partition, reply.base_offset, values))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def wait_for(self, batches: int, timeout_s: float = 60.0) -> None:
        start = len(self.acked)
        wait_until(lambda: len(self.acked) >= start + batches or not self._thread.is_alive(), timeout_s,
                   0.01, f"{batches} more acked batches")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def produce(master: BrokerProcess, batches: int) -> Load:
    load = Load(master)
    conn = open_conn(master)
    try:
        for _ in range(batches):
            load.produce_one(conn)
    finally:
        conn.close()
    return load


def wait_caught_up(master: BrokerProcess, slave: BrokerProcess) -> None:
    wait_until(lambda: (want := end_offsets(master)) == end_offsets(slave) and -1 not in want, CATCH_UP_S, 0.05,
               "the slave to catch up with the master")


def check_history(master: BrokerProcess, slave: BrokerProcess, acked: list[tuple[int, int, list[bytes]]],
                  unknown: list[tuple[int, list[bytes]]] | None = None) -> None:
    """Slave == master, byte for byte and message for message; every acked batch is there, in place;
    anything else stored is a batch sent without an answer (``unknown``), whole and in one place."""
    total = unacked_stored = 0
    for p in range(PARTITIONS):
        master_bytes, slave_bytes = stored_bytes(master, p), stored_bytes(slave, p)
        assert slave_bytes == master_bytes, f"partition {p}: the slave's bytes differ from the master's"
        on_slave = messages(slave, p)
        assert on_slave == messages(master, p)
        assert [o for o, _, _ in on_slave] == list(range(len(on_slave))), "offsets are dense from 0"
        assert all(i & ((1 << 64) - 1) == o and i >> 112 == 1 for o, i, _ in on_slave), "ids: broker 1, own offset"
        by_offset = {o: d for o, _, d in on_slave}
        mine = [(base, values) for q, base, values in acked if q == p]
        for base, values in mine:
            assert [by_offset.get(base + i) for i in range(len(values))] == values, \
                f"acked batch {p}@{base} is not on the slave as acked"
        acked_offsets = {base + i for base, values in mine for i in range(len(values))}
        extra = [(o, d) for o, _, d in on_slave if o not in acked_offsets]
        maybe = {d for q, values in (unknown or []) if q == p for d in values}
        assert all(d in maybe for _, d in extra), f"partition {p}: stored messages that were never sent"
        acked_count = len(acked_offsets)
        assert len(on_slave) == acked_count + len(extra), f"partition {p}: {len(on_slave)} stored, {acked_count} acked"
        unacked_stored += len(extra)
        total += len(on_slave)
    print(f"history: {len(acked)} acked batches, {total} messages identical on master and slave, "
          f"{unacked_stored} of them from {len(unknown or [])} sends without an answer")


def segment_files(proc: BrokerProcess, partition: int) -> dict[str, bytes]:
    directory = Path(proc.data_dir) / f"{TOPIC}-{partition}"
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}


@pytest.fixture
def master_and_slave(cluster_factory: Callable[..., BrokerProcess]) -> tuple[BrokerProcess, BrokerProcess]:
    master = cluster_factory(1, topics=TOPICS, maxSegmentSize=16 * 1024)
    slave = cluster_factory(1, topics=TOPICS, maxSegmentSize=16 * 1024, name="broker-1-slave-0", args=SLAVE)
    return master, slave


def test_slave_registers_copies_byte_for_byte_refuses_writes_and_serves_reads(
        master_and_slave: tuple[BrokerProcess, BrokerProcess], zk_client: Any, zk_root: str) -> None:
    master, slave = master_and_slave
    # registration in MetaQ's layout: the slave node and topics-sub/<topic>/<id>-s<slaveId>, ephemeral
    slave_node = f"{zk_root}/brokers/ids/1/slave0"
    wait_until(lambda: zk_client.exists(slave_node), 10, message="the slave's registration")
    data, stat = zk_client.get(slave_node)
    assert data == f"meta://127.0.0.1:{slave.port}".encode() and stat.ephemeralOwner != 0
    assert zk_client.get(f"{zk_root}/brokers/ids/1/master")[0] == f"meta://127.0.0.1:{master.port}".encode()
    sub = f"{zk_root}/brokers/topics-sub/{TOPIC}/1-s0"
    wait_until(lambda: zk_client.exists(sub), 10, message="the slave's topics-sub node")
    assert json.loads(zk_client.get(sub)[0]) == {"numParts": PARTITIONS, "broker": "1-s0"}
    assert zk_client.get(sub)[1].ephemeralOwner != 0
    assert zk_client.exists(f"{zk_root}/brokers/topics-pub/{TOPIC}/1-s0") is None, "a slave takes no producers"

    load = produce(master, 200)  # 16 KiB segments: several segments per partition
    wait_caught_up(master, slave)
    check_history(master, slave, load.acked)
    for p in range(PARTITIONS):
        files = segment_files(master, p)
        assert len(files) > 1
        assert segment_files(slave, p) == files, "the segment files are identical too"

    # a produce to the slave is refused with NOT_MASTER, and nothing is written
    conn = open_conn(slave)
    try:
        with pytest.raises(NotMasterError, match=r"slave 0.*send it to the master"):
            call(conn, m.ProduceRequest(topic=TOPIC, partition=0, records=encode_values([b"x"], 1)))
        with pytest.raises(NotMasterError):
            call(conn, m.CreateTopicRequest(topic="fresh", num_partitions=1))
        multi = conn.call(m.MultiProduceRequest(1, 5000, "", [
            m.ProducePartition(TOPIC, p, encode_values([b"x"], 1)) for p in (0, 1, m.ANY_PARTITION)]))
        assert multi.error_code == 0 and [p.error_code for p in multi.partitions] == [NotMasterError.code] * 3
    finally:
        conn.close()
    assert end_offsets(slave) == end_offsets(master)

    # replication state in the slave's stats: per partition, caught up
    replication = stats(slave)["replication"]
    assert replication["role"] == "slave" and replication["slave_id"] == 0
    assert replication["slave_group"] == "meta-slave-group"
    for p in range(PARTITIONS):
        entry = replication["partitions"][TOPIC][str(p)]
        assert entry["lag_messages"] == 0 and entry["lag_ms"] == 0
        assert entry["log_end_offset"] == entry["master_end_offset"] == end_offsets(master)[p]
    assert "replication" not in stats(master)

    # a new topic on the master is followed too
    conn = open_conn(master)
    try:
        call(conn, m.CreateTopicRequest(topic="fresh", num_partitions=2))
        reply = call(conn, m.ProduceRequest(topic="fresh", partition=1, records=encode_values([b"a", b"b"], 1)))
    finally:
        conn.close()
    wait_until(lambda: "fresh" in stats(slave)["replication"]["partitions"]
               and stats(slave)["replication"]["partitions"]["fresh"]["1"]["log_end_offset"] == 2, 20,
               message="the new topic replicated")
    conn = open_conn(slave)
    try:
        fetched = call(conn, m.FetchRequest(topic="fresh", partition=1, offset=0))
    finally:
        conn.close()
    got, _ = decode_fetched(fetched.records, "fresh", 1, 0)
    assert [(x.offset, x.id, x.data) for x in got] == [(0, reply.base_message_id, b"a"),
                                                       (1, reply.base_message_id + 1, b"b")]


def test_a_consumer_long_polling_the_slave_sees_new_messages(
        master_and_slave: tuple[BrokerProcess, BrokerProcess]) -> None:
    master, slave = master_and_slave
    produce(master, 3)
    wait_caught_up(master, slave)
    end = end_offsets(slave)[0]
    conn = open_conn(slave)
    try:
        conn.send(m.FetchRequest(topic=TOPIC, partition=0, offset=end, max_bytes=1 << 20, max_wait_ms=20_000))
        load = produce(master, 1)  # partition 0
        reply = conn.receive()
    finally:
        conn.close()
    got, _ = decode_fetched(reply.records, TOPIC, 0, end)
    assert [x.data for x in got] == load.acked[0][2]
    assert got[0].offset == load.acked[0][1] == end


@pytest.mark.slow
def test_slave_killed_under_load_catches_up_and_survives_a_master_restart(
        master_and_slave: tuple[BrokerProcess, BrokerProcess]) -> None:
    master, slave = master_and_slave
    with Load(master) as load:
        load.wait_for(100)
        slave.kill()  # -9 mid-replication
        load.wait_for(100)
        slave.start()
        load.wait_for(100)
        wait_until(lambda: stats(slave)["replication"]["max_lag_messages"] >= 0, 10, message="slave stats")
    wait_caught_up(master, slave)
    check_history(master, slave, load.acked)

    # the master restarts (clean stop) under load: the slave reconnects and follows on
    with Load(master) as load2:
        load2.wait_for(50)
        master.restart()
        load2.wait_for(100)
    wait_caught_up(master, slave)
    check_history(master, slave, load.acked + load2.acked)
    replication = stats(slave)["replication"]
    assert replication["master"] == f"127.0.0.1:{master.port}"
    assert all(e["lag_messages"] == 0 for e in replication["partitions"][TOPIC].values())


def test_slave_without_zookeeper_is_refused(broker_factory: Callable[..., BrokerProcess]) -> None:
    proc = broker_factory({"brokerId": 1}, start=False, args=["--slave"])
    proc.expect_exit_code(2)
    with pytest.raises(Exception):  # noqa: B017 - the launcher's error for a broker that exits at start
        proc.start()
    assert any("--slave needs ZooKeeper mode" in line for line in proc.log_lines)


@pytest.mark.slow
def test_metaqs_manual_failover_restart_the_slave_without_slave(
        master_and_slave: tuple[BrokerProcess, BrokerProcess], zk_client: Any, zk_root: str) -> None:
    """MetaQ's procedure for a master lost for good: restart the slave as the master, same broker id."""
    master, slave = master_and_slave
    load = produce(master, 60)
    wait_caught_up(master, slave)
    master.kill()
    master_node = f"{zk_root}/brokers/ids/1/master"
    wait_until(lambda: zk_client.exists(master_node) is None, 30, 0.05, "the dead master's session to expire")
    slave.stop()
    slave.args = []  # metaServer.sh restart, without "slave"
    slave.start()
    assert zk_client.get(master_node)[0] == f"meta://127.0.0.1:{slave.port}".encode()
    assert zk_client.exists(f"{zk_root}/brokers/ids/1/slave0") is None
    before = end_offsets(slave)
    conn = open_conn(slave)
    try:
        for _ in range(30):
            load.produce_one(conn)  # offsets and ids continue where the old master's ended
    finally:
        conn.close()
    assert all(base >= before[p] for p, base, _ in load.acked[60:])
    for p in range(PARTITIONS):
        on_new_master = messages(slave, p)
        by_offset = {o: d for o, _, d in on_new_master}
        for q, base, values in load.acked:
            if q == p:
                assert [by_offset.get(base + i) for i in range(len(values))] == values
        assert len(on_new_master) == sum(len(v) for q, _, v in load.acked if q == p)
        assert all(i >> 112 == 1 and i & ((1 << 64) - 1) == o for o, i, _ in on_new_master)


@pytest.mark.slow
def test_a_new_slave_of_a_master_with_retention_starts_at_the_masters_log_start(
        cluster_factory: Callable[..., BrokerProcess]) -> None:
    short = f"[topic={TOPIC}]\nnumPartitions={PARTITIONS}\ndeletePolicy=delete,1s\ndeleteWhen=* * * * * ?\n"
    master = cluster_factory(1, topics=short, maxSegmentSize=4096)
    load = produce(master, 90)  # ~10 segments of 4 KiB per partition, older than 1 s soon
    wait_until(lambda: all(log_start(master, p) > 0 for p in range(PARTITIONS)), 30, 0.1,
               "the master's retention to remove old segments")
    slave = cluster_factory(1, topics=TOPICS, maxSegmentSize=4096, name="broker-1-slave-0", args=SLAVE)
    wait_caught_up(master, slave)
    for p in range(PARTITIONS):
        start = log_start(slave, p)
        assert start == log_start(master, p) > 0
        assert stored_bytes(slave, p, start) == stored_bytes(master, p, start)
        found, _ = decode_fetched(stored_bytes(slave, p, start), TOPIC, p, start)
        kept = {(base + i): v for q, base, values in load.acked if q == p for i, v in enumerate(values)}
        assert [(x.offset, x.data) for x in found] == [(o, kept[o]) for o in range(start, end_offsets(master)[p])]


@pytest.mark.slow
def test_master_killed_under_load_and_restarted_the_slave_follows_on(
        master_and_slave: tuple[BrokerProcess, BrokerProcess]) -> None:
    master, slave = master_and_slave
    with Load(master) as load:
        load.wait_for(100)
        master.kill()  # -9: its registration lingers until the session expires, then it registers again
        master.start()
        load.wait_for(100)
    wait_caught_up(master, slave)
    check_history(master, slave, load.acked, load.unknown)
    assert stats(slave)["replication"]["master"] == f"127.0.0.1:{master.port}"


def test_a_master_that_lost_data_stalls_the_slave_which_keeps_its_copy(
        master_and_slave: tuple[BrokerProcess, BrokerProcess]) -> None:
    """Divergence is never resolved silently: the slave neither truncates nor appends, and says why."""
    master, slave = master_and_slave
    load = produce(master, 30)
    wait_caught_up(master, slave)
    kept = [stored_bytes(slave, p) for p in range(PARTITIONS)]
    master.stop()
    for p in range(PARTITIONS):  # the master's disk is replaced: it comes back empty
        for path in (Path(master.data_dir) / f"{TOPIC}-{p}").iterdir():
            path.unlink()
    slave.allow_log(r"replica orders-\d cannot continue: the slave holds offsets up to \d+ but the master's log "
                    r"ends at \d+")
    master.start()
    wait_until(lambda: all(e["stalled"] for e in stats(slave)["replication"]["partitions"][TOPIC].values()), 30,
               0.05, "every partition of the slave to stall")
    produce(master, 3)  # new writes on the empty master are not mixed into the slave's copy
    assert [stored_bytes(slave, p) for p in range(PARTITIONS)] == kept
    entry = stats(slave)["replication"]["partitions"][TOPIC]["0"]
    assert "nothing is truncated automatically" in entry["stalled"]
    assert entry["log_end_offset"] == sum(len(v) for q, _, v in load.acked if q == 0)


def test_auto_sync_master_config_makes_the_slave_follow_the_masters_topic_options(
        cluster_factory: Callable[..., BrokerProcess], zookeeper: Any, zk_root: str, tmp_path: Path) -> None:
    """MetaQ 1.4.2's autoSyncMasterConfig: the operator edits the master's server.ini and reloads it; the
    slave applies the master's topic options (here: a topic stops serving consumers, a new topic appears
    with its own options) without touching its own file."""
    from metaq.errors import PartitionClosedError
    from metaq.testing.zookeeper import cluster_config

    master = cluster_factory(1, topics=TOPICS)
    props = tmp_path / "async_slave.properties"
    props.write_text("slaveId=0\nautoSyncMasterConfig=true\n")
    slave = cluster_factory(1, topics=TOPICS, name="broker-1-slave-0", args=["--slave", "--slave-config", str(props)])
    produce(master, 6)
    wait_caught_up(master, slave)
    wait_until(lambda: stats(slave)["replication"]["master_config_applied"] >= 1, 30, 0.05,
               "the slave to apply the master's topic options once")
    assert master.config_path is not None
    master.config_path.write_text(cluster_config(
        1, zookeeper.connect_string, zk_root, topics=f"{TOPICS}acceptSubscribe=false\n"
                                                      "[topic=audit]\nnumPartitions=2\nunflushThreshold=1\n"))
    master.signal(signal.SIGHUP)

    def slave_refuses_consumers() -> bool:
        conn = open_conn(slave)
        try:
            call(conn, m.FetchRequest(topic=TOPIC, partition=0, offset=0, max_bytes=1024))
        except PartitionClosedError:
            return True
        finally:
            conn.close()
        return False

    wait_until(slave_refuses_consumers, 30, 0.05, "the slave to stop serving 'orders' as the master does")
    def slave_has_audit() -> bool:
        conn = open_conn(slave)
        try:
            return call(conn, m.FetchRequest(topic="audit", partition=1, offset=0, max_bytes=16)).log_end_offset == 0
        except MetaqError:
            return False
        finally:
            conn.close()

    wait_until(slave_has_audit, 30, 0.05, "the slave to create 'audit' with both partitions")
    assert stats(slave)["replication"]["master_config_error"] == ""
    assert "acceptSubscribe" not in slave.config_path.read_text()  # the slave's own file is untouched


def test_a_send_refused_by_the_named_master_fails_when_no_other_is_named_within_its_timeout(
        master_and_slave: tuple[BrokerProcess, BrokerProcess], zookeeper: Any, zk_client: Any, zk_root: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A stale registration: ZooKeeper names the slave as broker 1's master. A cluster-mode producer's batch
    is refused there (NOT_MASTER), so it waits for ZooKeeper to name another master; the node then goes and
    none is named within the send's delivery_timeout_ms: the send fails with DeliveryTimeoutError saying so, and
    nothing is written anywhere. Once the master is named again, the producer sends to it."""
    master, slave = master_and_slave
    node = f"{zk_root}/brokers/ids/1/master"
    master_url = zk_client.get(node)[0]
    before = end_offsets(master)
    caplog.set_level(logging.INFO, logger="metaq.client")

    def named_port(session: Any) -> int | None:
        address = session._core.metadata.cache.address(1)
        return None if address is None else int(address[1])

    async def named(session: Any, port: int | None) -> None:
        """Until the session's view names ``port`` (None: no one) as broker 1's master."""
        deadline = asyncio.get_running_loop().time() + 20
        while named_port(session) != port:
            assert asyncio.get_running_loop().time() < deadline, f"broker 1's master never became {port}"
            await session._core.cluster_changed(0.5)

    async def main() -> None:
        async with await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root) as session:
            producer = session.create_producer(request_timeout_s=3.0, delivery_timeout_ms=4000)
            assert (await producer.send(Message(TOPIC, b"before"))).success
            zk_client.set(node, f"meta://127.0.0.1:{slave.port}".encode())
            await named(session, slave.port)
            refused = producer.send_async(Message(TOPIC, b"refused"))
            deadline = asyncio.get_running_loop().time() + 10
            while "is no longer its master" not in caplog.text:  # NOT_MASTER came back: the batch waits
                assert asyncio.get_running_loop().time() < deadline, "the slave never refused the batch"
                await asyncio.sleep(0.01)
            zk_client.delete(node)
            await named(session, None)
            result = await asyncio.wait_for(refused, 15)
            # the send's deadline passed with no master to take it: certainly not stored (docs/producer.md)
            assert not result.success and isinstance(result.error, DeliveryTimeoutError), repr(result.error)
            assert not result.error.maybe_stored and "NOT_MASTER" in str(result.error), repr(result.error)
            assert sum(end_offsets(master)) == sum(before) + 1  # "before" only: the refused batch is nowhere
            zk_client.create(node, master_url)
            await named(session, master.port)
            assert (await producer.send(Message(TOPIC, b"after"))).success

    asyncio.run(main())
    stored = [d for p in range(PARTITIONS) for _, _, d in messages(master, p)]
    assert b"refused" not in stored and b"before" in stored and b"after" in stored
    assert sum(end_offsets(master)) == sum(before) + 2
    wait_caught_up(master, slave)
    assert b"refused" not in [d for p in range(PARTITIONS) for _, _, d in messages(slave, p)]
