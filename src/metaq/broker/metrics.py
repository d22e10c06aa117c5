"""Prometheus metrics of a broker: ``GET /metrics`` over HTTP on ``dashboardHttpPort``.

Nothing is counted here. The broker keeps its numbers as it always did (:mod:`metaq.broker.stats`:
plain integer adds per batch, three latency histograms observed once per batch or fsync); at scrape
time :class:`BrokerCollector` reads them, with the partitions' offsets and sizes, the committed
offsets of the groups this broker coordinates and a slave's replication state, and turns them into
metric families. So a broker that is never scraped pays nothing for its metrics, and one that is pays
on the scrape, not on produce or fetch.

The HTTP server is aiohttp, on the broker's own event loop (the collector reads the broker's state on
the thread that changes it, so it needs no lock). It serves ``/metrics`` (the text exposition format)
and ``/`` (a line saying where the metrics are); everything else is 404. See docs/operations.md,
"Metrics", for the list.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from metaq import __version__
from metaq.broker.stats import LatencyHistogram

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.metrics")

PARTITION = ["topic", "partition"]
"""Labels of a partition's series: ``partition`` is ``brokerId-partition``, as everywhere in metaq."""


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _histogram(name: str, doc: str, hist: LatencyHistogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc)
    cumulative, _count, total = hist.cumulative()
    family.add_metric([], [(floatToGoString(bound), n) for bound, n in cumulative], total)
    return family


class BrokerCollector(Collector):
    """Every metric of one broker, read from its state when Prometheus asks (see the module doc)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        yield from self._broker_families()
        yield from self._partition_families()
        yield from self._latency_families()
        yield from self._group_families()
        yield from self._replication_families()

    def _broker_families(self) -> Iterator[Metric]:
        broker, stats = self.broker, self.broker.stats
        role = "slave" if broker.slave is not None else "master"
        info = _gauge("metaq_broker_info", "This broker: id, role and version (value 1).",
                      ["broker_id", "role", "version"])
        info.add_metric([str(broker.config.broker_id), role, __version__], 1)
        yield info
        up = _gauge("metaq_broker_uptime_seconds", "Seconds since the broker started.")
        up.add_metric([], time.monotonic() - stats.started_s)
        yield up
        conns = _gauge("metaq_connections", "Client connections open now.")
        conns.add_metric([], stats.connections)
        yield conns
        for name, doc, value in (
                ("metaq_connections_opened_total", "Client connections accepted.", stats.connections_total),
                ("metaq_connections_refused_total", "Connections refused for maxConnections.",
                 stats.connections_refused),
                ("metaq_connections_timed_out_total", "Connections closed by connectionIdleTimeoutSeconds or "
                 "connectionHandshakeTimeoutSeconds.", stats.connections_timed_out),
                ("metaq_partial_frames_refused_total", "Requests refused because maxPartialFramesSize was "
                 "reached while they arrived.", stats.partial_frames_refused)):
            counter = _counter(name, doc)
            counter.add_metric([], value)
            yield counter
        waiting = _gauge("metaq_waiting_fetches", "Long-polling fetches waiting for data now.")
        waiting.add_metric([], broker.waiters.waiting)
        yield waiting
        waiting_max = _gauge("metaq_waiting_fetches_max", "maxWaitingFetches: more long polls get TOO_MANY_REQUESTS.")
        waiting_max.add_metric([], broker.waiters.max_waiting)
        yield waiting_max
        yield from self._disk_families()

    def _disk_families(self) -> Iterator[Metric]:
        path = self.broker.config.data_path
        try:
            st = os.statvfs(path)
        except OSError:
            return
        free = _gauge("metaq_data_dir_free_bytes", "Bytes available to the broker on dataPath's filesystem.")
        free.add_metric([], st.f_bavail * st.f_frsize)
        yield free
        size = _gauge("metaq_data_dir_capacity_bytes", "Size of dataPath's filesystem in bytes.")
        size.add_metric([], st.f_blocks * st.f_frsize)
        yield size

    def _partition_families(self) -> Iterator[Metric]:
        broker = self.broker
        own = broker.config.broker_id
        families = {
            "in_messages": _counter("metaq_messages_in_total", "Messages appended by producers.", PARTITION),
            "in_bytes": _counter("metaq_bytes_in_total", "Bytes of record batches appended by producers.", PARTITION),
            "produce": _counter("metaq_produce_requests_total", "Produce requests appended.", PARTITION),
            "produce_failed": _counter("metaq_produce_failures_total", "Produce requests refused as too large or "
                                       "corrupt.", PARTITION),
            "out_messages": _counter("metaq_messages_out_total", "Messages sent in fetch replies (from the offset "
                                     "asked for; slaves' replica fetches included).", PARTITION),
            "out_bytes": _counter("metaq_bytes_out_total", "Bytes sent in fetch replies.", PARTITION),
            "fetch": _counter("metaq_fetch_requests_total", "Fetch requests answered from the log.", PARTITION),
            "fetch_empty": _counter("metaq_fetch_empty_total", "Fetches that returned nothing (after any long "
                                    "poll).", PARTITION),
            "corrupt": _counter("metaq_fetch_corrupt_total", "Fetches answered STORED_DATA_CORRUPT.", PARTITION),
        }
        for (topic, partition), c in sorted(broker.stats.counters.items()):
            labels = [topic, f"{own}-{partition}"]
            for key, value in (("in_messages", c.put_messages), ("in_bytes", c.put_bytes),
                               ("produce", c.put_requests), ("produce_failed", c.put_failures),
                               ("out_messages", c.get_messages), ("out_bytes", c.get_bytes),
                               ("fetch", c.get_requests), ("fetch_empty", c.get_misses),
                               ("corrupt", c.corrupt_reads)):
                families[key].add_metric(labels, value)
        yield from families.values()
        start = _gauge("metaq_partition_log_start_offset", "Earliest offset still stored.", PARTITION)
        end = _gauge("metaq_partition_log_end_offset", "Next offset to be written (the latest offset).", PARTITION)
        size = _gauge("metaq_partition_size_bytes", "Bytes of the partition's segment files.", PARTITION)
        segments = _gauge("metaq_partition_segments", "Segment files of the partition.", PARTITION)
        closed = _gauge("metaq_partition_closed", "1 when the partition is closed for publishing (metaq topic "
                        "close).", PARTITION)
        for plog in sorted(broker.logs.logs(), key=lambda lg: (lg.topic, lg.partition)):
            if plog.closed:
                continue
            labels = [plog.topic, f"{own}-{plog.partition}"]
            start.add_metric(labels, plog.log_start_offset)
            end.add_metric(labels, plog.log_end_offset)
            size.add_metric(labels, plog.size_bytes)
            segments.add_metric(labels, plog.segment_count)
            state = broker.topics.get(plog.topic)
            closed.add_metric(labels, 1 if state is not None and plog.partition in state.closed else 0)
        yield from (start, end, size, segments, closed)

    def _latency_families(self) -> Iterator[Metric]:
        stats = self.broker.stats
        yield _histogram("metaq_append_duration_seconds", "Time to check and write one produce batch to its log "
                         "(not the wait for its fsync).", stats.append_seconds)
        yield _histogram("metaq_fetch_duration_seconds", "Time to find a fetch reply's batches in the log (not "
                         "the long-poll wait, nor sending them).", stats.fetch_seconds)
        yield _histogram("metaq_fsync_duration_seconds", "Each fdatasync of the partition logs (data, indexes, "
                         "directories).", stats.fsync_seconds)

    def _group_families(self) -> Iterator[Metric]:
        """Groups coordinated by this broker (standalone mode). In ZooKeeper mode the offsets are in
        ZooKeeper, not here: `metaq group describe --zk-connect` shows their lag."""
        broker = self.broker
        own = broker.config.broker_id
        labels = ["group", "topic", "partition"]
        committed = _gauge("metaq_consumer_group_committed_offset", "Offset a group committed for a partition "
                           "of this broker.", labels)
        lag = _gauge("metaq_consumer_group_lag_messages", "Messages between a group's committed offset and the "
                     "partition's end.", labels)
        members = _gauge("metaq_consumer_group_members", "Members of a group coordinated by this broker.", ["group"])
        store = broker.groups.store
        for group in sorted(store.groups()):
            for (topic, pid), c in sorted(store.group_offsets(group).items()):
                if pid.broker_id != own:
                    continue
                plog = broker.logs.get(topic, pid.partition)
                if plog is None or plog.closed:
                    continue
                key = [group, topic, f"{own}-{pid.partition}"]
                committed.add_metric(key, c.offset)
                lag.add_metric(key, max(plog.log_end_offset - max(c.offset, plog.log_start_offset), 0))
        for name, group_state in sorted(broker.groups.groups.items()):
            members.add_metric([name], len(group_state.members))
        yield from (committed, lag, members)

    def _replication_families(self) -> Iterator[Metric]:
        replication = self.broker.replication
        if replication is None:
            return
        doc: dict[str, Any] = replication.describe()
        own = self.broker.config.broker_id
        lag = _gauge("metaq_replication_lag_messages", "Messages this slave is behind its master.", PARTITION)
        lag_s = _gauge("metaq_replication_lag_seconds", "How far behind its master this slave's copy is, in time.",
                       PARTITION)
        stalled = _gauge("metaq_replication_stalled", "1 when a partition cannot be replicated without the "
                         "operator (docs/replication.md).", PARTITION)
        errors = _counter("metaq_replication_errors_total", "Failed replica fetches.", PARTITION)
        for topic, partitions in sorted(doc.get("partitions", {}).items()):
            for partition, entry in sorted(partitions.items(), key=lambda kv: int(kv[0])):
                labels = [topic, f"{own}-{partition}"]
                lag.add_metric(labels, entry.get("lag_messages", 0))
                lag_s.add_metric(labels, entry.get("lag_ms", 0) / 1000)
                stalled.add_metric(labels, 1 if entry.get("stalled") else 0)
                errors.add_metric(labels, entry.get("errors", 0))
        yield from (lag, lag_s, stalled, errors)


def exposition(broker: Broker) -> bytes:
    """The metrics of ``broker`` in Prometheus's text format (what ``GET /metrics`` answers)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    return generate_latest(registry)


class MetricsServer:
    """``/metrics`` over HTTP. :meth:`bind` takes the port (before the data directory is opened, so a
    taken port leaves nothing behind); scrapes get 503 until :meth:`serve` says the broker is serving."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.serving = False
        self.host = ""
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def bind(self, host: str, port: int) -> None:
        """Listen on host:port (0: any free port); OSError as the socket raised it."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/", self._index)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=False)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        addresses = runner.addresses  # the bound port, when 0 was asked for
        self.host, self.port = addresses[0][:2] if addresses else (host, port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def serve(self) -> None:
        self.serving = True

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.serving:
            return web.Response(status=503, text="the broker is starting: no metrics yet\n")
        body = exposition(self.broker)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(text=f"metaq broker {self.broker.config.broker_id}: metrics at /metrics\n")


def bind_error(host: str, port: int, exc: OSError) -> str:
    """The one line a broker prints when it cannot listen for metrics."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        reason = "the address is already in use (another broker? choose another dashboardHttpPort, or 0)"
    return f"cannot listen for metrics on {host}:{port} (dashboardHttpPort): {reason}"
