"""Prometheus metrics of a broker: ``GET /metrics`` over HTTP on ``dashboardHttpPort``.

Nothing is counted here. The broker keeps its numbers as it always did (:mod:`metaq.broker.stats`:
plain integer adds per batch, three latency histograms observed once per batch or fsync); at scrape
time :func:`take_snapshot` copies them, with the partitions' offsets and sizes, the committed offsets
of the groups this broker coordinates and a slave's replication state, and :func:`render` turns the
copy into the text format. So a broker that is never scraped pays nothing for its metrics, and one
that is pays on the scrape, not on produce or fetch.

The HTTP server is :mod:`metaq.broker.dashboard.server` (aiohttp, on the broker's own event loop),
which serves ``/metrics`` beside the web dashboard. The snapshot is taken on the loop (the thread that
changes the state, so no lock is needed); the formatting, which for thousands of partitions takes tens
of milliseconds, runs in a worker thread so that it does not stall requests. The dashboard reads the
same snapshots. See docs/operations.md, "Metrics", for the list.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from metaq import __version__, framing

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.metrics")

PARTITION = ["topic", "partition"]
"""Labels of a partition's series: ``partition`` is ``brokerId-partition``, as everywhere in metaq."""


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _histogram(name: str, doc: str, hist: Cumulative) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    buckets, _count, total = hist
    family.add_metric([], [(floatToGoString(bound), n) for bound, n in buckets], total)
    return family


Cumulative = tuple[list[tuple[float, int]], int, float]


@dataclass
class Snapshot:
    """The numbers of one scrape, copied on the event loop (cheap: plain tuples); turned into text
    elsewhere (:func:`render`), so that formatting thousands of series never stalls the broker."""

    broker_id: int
    role: str
    data_path: str
    uptime_s: float
    connections: int
    connections_total: int
    connections_refused: int
    connections_timed_out: int
    partial_frames_refused: int
    waiting_fetches: int
    waiting_fetches_max: int
    counters: list[tuple[str, str, tuple[int, ...]]]
    """(topic, partition label, the counters in COUNTER_FIELDS order)."""
    logs: list[tuple[str, str, int, int, int, int, int]]
    """(topic, partition label, log start, log end, size bytes, segments, closed 0/1)."""
    append: Cumulative
    fetch: Cumulative
    fsync: Cumulative
    group_offsets: list[tuple[str, str, str, int, int]]
    """(group, topic, partition label, committed offset, lag)."""
    group_members: list[tuple[str, int]]
    replication: list[tuple[str, str, int, float, int, int]]
    """(topic, partition label, lag messages, lag seconds, stalled 0/1, errors)."""
    replica_group: dict[str, Any] | None = None
    """The replica group's state (sync replication, failover: ``metaq stats`` ``replica_group``)."""
    delayed: tuple[int, Cumulative] | None = None
    """Delayed messages pending, and their lateness at delivery (docs/delayed.md)."""
    quotas: dict[str, Any] | None = None
    """Per principal: connections, bytes and throttles (metaq.broker.quotas.Quotas.describe)."""
    open_files: tuple[int, int, int] = (0, 0, 0)
    """The storage's descriptor pool: open now, the budget in force, shortages (metaq.storage.files)."""
    syncfs: tuple[str, int] = ("unknown", 0)
    """The data directory's filesystem, and whether flush rounds may use syncfs there (1) or not (0)."""
    filesystem_syncs: tuple[int, int, int] = (0, 0, 0)
    """Flush rounds made durable by one syncfs, syncfs calls that failed, and rounds of syncfsQuietMinPartitions
    that fdatasynced each partition because the machine had dirty pages to write back."""
    store_damage: dict[str, Any] | None = None
    """Per store beside the segments: damaged records skipped and torn tails cut (metaq.framing.DAMAGE)."""
    transactions: dict[str, Any] | None = None
    """The transaction coordinator's counts (None: no transaction log on this broker yet)."""


COUNTER_FIELDS = ("put_messages", "put_bytes", "put_requests", "put_failures", "get_messages", "get_bytes",
                  "get_requests", "get_misses", "corrupt_reads")
COUNTERS = (
    ("metaq_messages_in_total", "Messages appended by producers."),
    ("metaq_bytes_in_total", "Bytes of record batches appended by producers."),
    ("metaq_produce_requests_total", "Batches appended: one per Produce request, one per batch of a MultiProduce."),
    ("metaq_produce_failures_total", "Produce requests refused as too large or corrupt."),
    ("metaq_messages_out_total", "Messages sent in fetch replies (from the offset asked for; slaves' replica "
     "fetches included)."),
    ("metaq_bytes_out_total", "Bytes sent in fetch replies."),
    ("metaq_fetch_requests_total", "Fetch requests answered from the log."),
    ("metaq_fetch_empty_total", "Fetches that returned nothing (after any long poll)."),
    ("metaq_fetch_corrupt_total", "Fetches answered STORED_DATA_CORRUPT."),
)


def take_snapshot(broker: Broker) -> Snapshot:
    """Copy what a scrape reports; on the event loop (the thread that changes it), so no lock is needed."""
    stats = broker.stats
    files = broker.logs.files
    own = broker.config.broker_id
    counters = [(topic, f"{own}-{partition}", tuple(getattr(c, f) for f in COUNTER_FIELDS))
                for (topic, partition), c in sorted(stats.counters.items())]
    logs = []
    for plog in sorted(broker.logs.logs(), key=lambda lg: (lg.topic, lg.partition)):
        if plog.closed:
            continue
        state = broker.topics.get(plog.topic)
        closed = 1 if state is not None and plog.partition in state.closed else 0
        logs.append((plog.topic, f"{own}-{plog.partition}", plog.log_start_offset, plog.log_end_offset,
                     plog.size_bytes, plog.segment_count, closed))
    group_offsets = []
    store = broker.groups.store
    for group in sorted(store.groups()):
        for (topic, pid), c in sorted(store.group_offsets(group).items()):
            held = broker.logs.get(topic, pid.partition) if pid.broker_id == own else None
            if held is None or held.closed:
                continue  # another broker's partition: its broker reports it
            lag = max(held.log_end_offset - max(c.offset, held.log_start_offset), 0)
            group_offsets.append((group, topic, f"{own}-{pid.partition}", c.offset, lag))
    members = [(name, len(g.members)) for name, g in sorted(broker.groups.groups.items())]
    replica_group = broker.ha.describe() if broker.ha is not None else None
    role = "slave" if broker.slave is not None else "master"
    if replica_group is not None:
        role = str(replica_group.get("role", role))
    replication = []
    if broker.replication is not None and broker.slave is not None:
        doc: dict[str, Any] = broker.replication.describe()
        for topic, partitions in sorted(doc.get("partitions", {}).items()):
            for partition, e in sorted(partitions.items(), key=lambda kv: int(kv[0])):
                replication.append((topic, f"{own}-{partition}", int(e.get("lag_messages", 0)),
                                    e.get("lag_ms", 0) / 1000, 1 if e.get("stalled") else 0, int(e.get("errors", 0))))
    return Snapshot(
        broker_id=own, role=role, data_path=str(broker.config.data_path),
        uptime_s=time.monotonic() - stats.started_s, connections=stats.connections,
        connections_total=stats.connections_total, connections_refused=stats.connections_refused,
        connections_timed_out=stats.connections_timed_out, partial_frames_refused=stats.partial_frames_refused,
        waiting_fetches=broker.waiters.waiting, waiting_fetches_max=broker.waiters.max_waiting,
        counters=counters, logs=logs, append=stats.append_seconds.cumulative(),
        fetch=stats.fetch_seconds.cumulative(), fsync=stats.fsync_seconds.cumulative(),
        group_offsets=group_offsets, group_members=members, replication=replication, replica_group=replica_group,
        delayed=(broker.delay.pending, broker.delay.lateness.cumulative()), quotas=broker.quotas.describe(),
        open_files=(files.open_count, files.max_open_files, files.shortages),
        syncfs=((decision.filesystem, int(decision.used)) if (decision := broker.logs.syncfs_decision)
                else ("unknown", 0)),
        filesystem_syncs=((whole.syncs, whole.failures, whole.busy_skips)
                          if (whole := broker.logs.flusher.filesystem_sync) else (0, 0, 0)),
        store_damage=framing.DAMAGE.snapshot(),
        transactions=broker.transactions.describe() if broker.transactions is not None else None)


class SnapshotCollector(Collector):
    """The metric families of one :class:`Snapshot` (see the module doc for what each means)."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[Metric]:
        yield from self._broker_families()
        yield from self._partition_families()
        yield from self._latency_families()
        yield from self._group_families()
        yield from self._replication_families()
        yield from self._replica_group_families()
        yield from self._quota_families()
        yield from self._transaction_families()

    def _transaction_families(self) -> Iterator[Metric]:
        """docs/transactions.md: what is open, and what the broker decided by itself."""
        tx = self.snap.transactions
        if tx is None:
            return
        for name, doc, key in (
                ("metaq_transactions_open", "Transactions begun and not prepared, committed or rolled back.", "open"),
                ("metaq_transactions_prepared", "Transactions prepared (XA branches and half messages), undecided.",
                 "prepared"),
                ("metaq_transactions_half_prepared", "Half messages prepared and undecided: their producer or their "
                 "group's checker decides them.", "half_prepared")):
            gauge = _gauge(name, doc)
            gauge.add_metric([], tx[key])
            yield gauge
        for name, doc, key in (
                ("metaq_transactions_committed_total", "Transactions committed.", "committed"),
                ("metaq_transactions_rolled_back_total", "Transactions rolled back (by a client, a checker, a "
                 "restart or the broker).", "rolled_back"),
                ("metaq_transactions_timed_out_total", "Transactions the broker rolled back by itself: past "
                 "maxTxTimeoutInSeconds, or half messages after transactionCheckMax checks (each logged at ERROR).",
                 "timed_out"),
                ("metaq_transaction_checks_total", "Half transactions handed to a producer group's checker.",
                 "checks")):
            counter = _counter(name, doc)
            counter.add_metric([], tx[key])
            yield counter

    def _quota_families(self) -> Iterator[Metric]:
        """Per principal (docs/security.md#quotas): what it moved, and how long it was throttled."""
        labels = ["principal", "direction"]
        moved = _counter("metaq_quota_bytes_total", "Bytes produced or fetched per principal (replica fetches "
                         "excluded).", labels)
        throttle = _counter("metaq_quota_throttle_seconds_total", "Throttle time given to a principal over its "
                            "byte rate (quotaProducerByteRate, quotaConsumerByteRate, quotaOverrides).", labels)
        throttled = _counter("metaq_quota_throttled_total", "Replies that carried a throttle.", labels)
        conns = _gauge("metaq_quota_connections", "Connections open per principal (quotaMaxConnections).",
                       ["principal"])
        refused = _counter("metaq_quota_connections_refused_total", "Connections refused for a principal's "
                           "quotaMaxConnections.", ["principal"])
        for principal, usage in (self.snap.quotas or {}).items():
            for direction in ("produce", "fetch"):
                moved.add_metric([principal, direction], usage["bytes"].get(direction, 0))
                throttle.add_metric([principal, direction], usage["throttle_ms"].get(direction, 0) / 1000)
                throttled.add_metric([principal, direction], usage["throttled"].get(direction, 0))
            conns.add_metric([principal], usage["connections"])
            refused.add_metric([principal], usage["connections_refused"])
        yield from (moved, throttle, throttled, conns, refused)

    def _broker_families(self) -> Iterator[Metric]:
        snap = self.snap
        info = _gauge("metaq_broker_info", "This broker: id, role and version (value 1).",
                      ["broker_id", "role", "version"])
        info.add_metric([str(snap.broker_id), snap.role, __version__], 1)
        yield info
        open_files, budget, shortages = snap.open_files
        for name, doc, value in (
                ("metaq_broker_uptime_seconds", "Seconds since the broker started.", snap.uptime_s),
                ("metaq_storage_open_files", "Segment, index and directory descriptors the storage holds open now.",
                 open_files),
                ("metaq_storage_open_files_budget", "The storage's descriptor budget in force: maxOpenFiles, or less "
                 "after a descriptor shortage until the next idle sweep.", budget),
                ("metaq_connections", "Client connections open now.", snap.connections),
                ("metaq_waiting_fetches", "Long-polling fetches waiting for data now.", snap.waiting_fetches),
                ("metaq_waiting_fetches_max", "maxWaitingFetches: more long polls get TOO_MANY_REQUESTS.",
                 snap.waiting_fetches_max)):
            gauge = _gauge(name, doc)
            gauge.add_metric([], value)
            yield gauge
        for name, doc, value in (
                ("metaq_connections_opened_total", "Client connections accepted.", snap.connections_total),
                ("metaq_connections_refused_total", "Connections refused for maxConnections.",
                 snap.connections_refused),
                ("metaq_connections_timed_out_total", "Connections closed by connectionIdleTimeoutSeconds or "
                 "connectionHandshakeTimeoutSeconds.", snap.connections_timed_out),
                ("metaq_partial_frames_refused_total", "Requests refused because maxPartialFramesSize was "
                 "reached while they arrived.", snap.partial_frames_refused),
                ("metaq_storage_descriptor_shortages_total", "Opens of a storage file that found the process out of "
                 "descriptors (EMFILE) and closed idle ones to go on.", shortages),
                ("metaq_storage_filesystem_syncs_total", "Flush rounds made durable by one syncfs of the data "
                 "directory's filesystem (syncfsMinPartitions or more partitions, or syncfsQuietMinPartitions or more "
                 "while the machine had little to write back).", snap.filesystem_syncs[0]),
                ("metaq_storage_filesystem_sync_busy_skips_total", "Flush rounds of syncfsQuietMinPartitions or more "
                 "partitions (fewer than syncfsMinPartitions) that fdatasynced each partition because the machine had "
                 "more than 512 KiB of dirty pages to write back (more than 4 MiB, or a syncfs in the last second).",
                 snap.filesystem_syncs[2]),
                ("metaq_storage_filesystem_sync_failures_total", "Those syncfs calls that failed (each partition of "
                 "the round then fdatasynced its own files, and every flush since).", snap.filesystem_syncs[1])):
            counter = _counter(name, doc)
            counter.add_metric([], value)
            yield counter
        damage = snap.store_damage or {}
        skipped = _counter("metaq_store_damaged_records_total", "Records of a store beside the segments (offsets, "
                           "txlog, delay, producers, epochs, clean-shutdown, users, acls) found damaged and skipped "
                           "since the broker started (each an ERROR naming what was lost).", ["store"])
        tails = _counter("metaq_store_torn_tails_total", "Torn tails (a record cut short by a crash while it was "
                         "written) cut from a store's log since the broker started.", ["store"])
        for store in framing.STORES:
            skipped.add_metric([store], damage.get("damaged_records", {}).get(store, 0))
            tails.add_metric([store], damage.get("torn_tails", {}).get(store, 0))
        yield from (skipped, tails)
        syncfs = _gauge("metaq_storage_syncfs_used", "1 where flush rounds may be made durable by one syncfs of "
                        "the data directory's filesystem (named by the label: syncfs=auto and a filesystem known to "
                        "honour it), 0 where every partition syncs its own files.", ["filesystem"])
        syncfs.add_metric([self.snap.syncfs[0]], self.snap.syncfs[1])
        yield syncfs
        try:
            st = os.statvfs(snap.data_path)
        except OSError:
            return
        free = _gauge("metaq_data_dir_free_bytes", "Bytes available to the broker on dataPath's filesystem.")
        free.add_metric([], st.f_bavail * st.f_frsize)
        size = _gauge("metaq_data_dir_capacity_bytes", "Size of dataPath's filesystem in bytes.")
        size.add_metric([], st.f_blocks * st.f_frsize)
        yield from (free, size)

    def _partition_families(self) -> Iterator[Metric]:
        families = [_counter(name, doc, PARTITION) for name, doc in COUNTERS]
        for topic, label, values in self.snap.counters:
            for family, value in zip(families, values, strict=True):
                family.add_metric([topic, label], value)
        yield from families
        gauges = [_gauge("metaq_partition_log_start_offset", "Earliest offset still stored.", PARTITION),
                  _gauge("metaq_partition_log_end_offset", "Next offset to be written (the latest offset).", PARTITION),
                  _gauge("metaq_partition_size_bytes", "Bytes of the partition's segment files.", PARTITION),
                  _gauge("metaq_partition_segments", "Segment files of the partition.", PARTITION),
                  _gauge("metaq_partition_closed", "1 when the partition is closed for publishing (metaq topic "
                         "close).", PARTITION)]
        for topic, label, *numbers in self.snap.logs:
            for gauge, number in zip(gauges, numbers, strict=True):
                gauge.add_metric([topic, label], number)
        yield from gauges

    def _latency_families(self) -> Iterator[Metric]:
        snap = self.snap
        yield _histogram("metaq_append_duration_seconds", "Time to check and write one produce batch to its log "
                         "(not the wait for its fsync).", snap.append)
        yield _histogram("metaq_fetch_duration_seconds", "Time to find a fetch reply's batches in the log (not "
                         "the long-poll wait, nor sending them).", snap.fetch)
        yield _histogram("metaq_fsync_duration_seconds", "Each fdatasync of the partition logs (data, indexes, "
                         "directories).", snap.fsync)
        if snap.delayed is not None:
            pending = _gauge("metaq_delayed_pending", "Delayed messages stored, not yet delivered (docs/delayed.md).")
            pending.add_metric([], snap.delayed[0])
            yield pending
            yield _histogram("metaq_delayed_lateness_duration_seconds", "How late each delayed message was "
                             "appended to its partition after its due time.", snap.delayed[1])

    def _group_families(self) -> Iterator[Metric]:
        """Groups coordinated by this broker (standalone mode). In ZooKeeper mode the offsets are in
        ZooKeeper, not here: `metaq group describe --zk-connect` shows their lag."""
        labels = ["group", "topic", "partition"]
        committed = _gauge("metaq_consumer_group_committed_offset", "Offset a group committed for a partition "
                           "of this broker.", labels)
        lag = _gauge("metaq_consumer_group_lag_messages", "Messages between a group's committed offset and the "
                     "partition's end.", labels)
        for group, topic, label, offset, behind in self.snap.group_offsets:
            committed.add_metric([group, topic, label], offset)
            lag.add_metric([group, topic, label], behind)
        members = _gauge("metaq_consumer_group_members", "Members of a group coordinated by this broker.", ["group"])
        for name, count in self.snap.group_members:
            members.add_metric([name], count)
        yield from (committed, lag, members)

    def _replica_group_families(self) -> Iterator[Metric]:
        """Sync replication and failover (a replica group): the epoch everywhere; on the master, each
        slave as the master sees it (the in-sync set, how far behind)."""
        doc = self.snap.replica_group
        if doc is None:
            return
        epoch = _gauge("metaq_replica_group_epoch", "Epoch of this broker id's replica group (grows at each "
                       "failover).")
        epoch.add_metric([], doc.get("epoch", 0))
        yield epoch
        slaves = doc.get("slaves")
        if not isinstance(slaves, dict):
            return  # a slave: the master reports the group
        in_sync_count = _gauge("metaq_replica_group_in_sync_slaves", "Slaves in the in-sync set (a sync ack waits "
                               "for them).")
        in_sync_count.add_metric([], len(doc.get("isr", ())))
        wanted = _gauge("metaq_replica_group_min_in_sync_slaves", "minInSyncSlaves: with fewer in-sync slaves "
                        "writes get NOT_ENOUGH_REPLICAS.")
        wanted.add_metric([], doc.get("min_in_sync_slaves", 0))
        in_sync = _gauge("metaq_replica_slave_in_sync", "1 when the slave is in the in-sync set.", ["slave"])
        behind = _gauge("metaq_replica_slave_lag_messages", "Messages the slave has not fetched yet, all "
                        "partitions.", ["slave"])
        last_fetch = _gauge("metaq_replica_slave_last_fetch_age_seconds", "Time since the slave last fetched.",
                            ["slave"])
        for slave, entry in sorted(slaves.items()):
            in_sync.add_metric([slave], 1 if entry.get("in_sync") else 0)
            behind.add_metric([slave], entry.get("messages_behind", 0))
            last_fetch.add_metric([slave], entry.get("last_fetch_ms_ago", 0) / 1000)
        yield from (in_sync_count, wanted, in_sync, behind, last_fetch)

    def _replication_families(self) -> Iterator[Metric]:
        if not self.snap.replication:
            return
        lag = _gauge("metaq_replication_lag_messages", "Messages this slave is behind its master.", PARTITION)
        lag_s = _gauge("metaq_replication_lag_seconds", "How far behind its master this slave's copy is, in time.",
                       PARTITION)
        stalled = _gauge("metaq_replication_stalled", "1 when a partition cannot be replicated without the "
                         "operator (docs/replication.md).", PARTITION)
        errors = _counter("metaq_replication_errors_total", "Failed replica fetches.", PARTITION)
        for topic, label, behind, behind_s, is_stalled, failed in self.snap.replication:
            lag.add_metric([topic, label], behind)
            lag_s.add_metric([topic, label], behind_s)
            stalled.add_metric([topic, label], is_stalled)
            errors.add_metric([topic, label], failed)
        yield from (lag, lag_s, stalled, errors)


def render(snap: Snapshot) -> bytes:
    """A snapshot in Prometheus's text format (blocking: a statvfs; CPU for large brokers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snap))
    return generate_latest(registry)


def exposition(broker: Broker) -> bytes:
    """The metrics of ``broker`` in Prometheus's text format, all at once (on the broker's loop)."""
    return render(take_snapshot(broker))
