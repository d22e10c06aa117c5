"""What a `metaq bench produce|consume|e2e` run is asked to do (:class:`BenchSpec`) and what it measured
(:class:`BenchResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FLUSH_MODES = {"group": 0, "sync": 1}


@dataclass
class BenchSpec:
    mode: str = "produce"
    servers: str | None = None
    """None: start an embedded broker for the run (in a temporary directory) and stop it after."""
    topic: str = ""
    size: int = 100
    count: int = 1_000_000
    duration_s: float = 60.0
    """Upper bound on the measured phase, whichever of count and duration comes first."""
    batch: int = 1000
    """Messages per send_batch call (api=batch), per send_async_many call (api=many), per transaction."""
    api: str = "batch"
    """produce: batch, async, async-yield (send_async, each in its own event-loop iteration), sync, oneway or
    transaction; consume: fetch (``Fetcher.fetch``, a list of Messages
    per fetch), iterate (``PullConsumer.iterate``, one Message at a time) or columns (``iterate_columns``)."""
    linger_ms: float = 5.0
    batch_bytes: int = 256 * 1024
    partitions: int = 4
    flush: str = "group"
    """Embedded broker's unflushThreshold: group (0), sync (1) or a number."""
    processes: int = 1
    concurrency: int = 8
    """Calls in flight per process (api=batch) — pipelining."""
    rate: int = 20_000
    """e2e: messages per second the producer offers."""
    pacing: str = "tick"
    """e2e: ``tick``, every millisecond the messages due since the last tick, sent together (a burst of about
    rate/1000: the loop's timers have millisecond resolution), or ``even``, each message at its own time
    (start + i/rate, woken by a pacing thread), so that a message usually leaves alone."""
    consumer: str = "partition"
    """e2e: ``partition``, one ``iterate_batches`` per partition (a connection and a long poll each), or ``multi``,
    one ``PullConsumer.get_many`` loop over every partition (one connection, one MultiFetch long poll)."""
    gc_freeze: bool = True
    """e2e: the producer and consumer processes call ``gc.freeze()`` once connected, before the measured phase (as
    the broker does after start-up; what a latency-sensitive application does): a full collection then walks only
    what was made since, not the ~26,000 objects of the imported client (10-30 ms with the loop stopped)."""
    tune_allocator: bool = False
    """consume: the consumer processes call :func:`metaq.allocator.tune_allocator` first (glibc's trim and mmap
    thresholds fixed; what an application reading ~1 MB messages may do), not by default."""
    compression: str = "none"
    cpus: tuple[int | None, int | None, int | None] | None = None
    """e2e: the CPU the embedded broker, the producer and the consumer each run on (``os.sched_setaffinity``, every
    thread), None for one the scheduler places: where the kernel's scheduler puts them (docs/benchmarks.md)."""
    selector: str = "roundrobin"
    """produce: the producer's partition selector, ``roundrobin`` (RoundRobinSelector, the default) or ``sticky``
    (StickyRoundRobinSelector: one partition until its batch is full or sent)."""
    multi_produce: bool = True
    """produce, e2e: the producer's ``multi_produce`` (a broker's batches that leave together in one MultiProduce)."""
    idempotent: bool = False
    """produce: an idempotent producer (every batch stamped, duplicates dropped by the broker)."""
    event_loop: str = "uvloop"
    brokers: int = 0
    """> 0: start a local cluster of this many brokers in ZooKeeper mode for the run (servers unset)."""
    zk: str | None = None
    """A running cluster's ZooKeeper (``host:port``): its registered brokers are measured."""
    zk_root: str = "/meta"
    tls: dict[str, Any] = field(default_factory=dict)
    """ClientConfig TLS and SASL options (``tls``, ``tls_ca_file``, ``sasl_username``...) for every session of
    the run; empty: plain TCP, no authentication."""

    def flush_threshold(self) -> int:
        if self.flush in FLUSH_MODES:
            return FLUSH_MODES[self.flush]
        return int(self.flush)


@dataclass
class BenchResult:
    mode: str
    api: str
    messages: int
    bytes: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    """p50/p99/p999/max of what the mode measures (produce: ack latency; e2e: append to delivery)."""
    failures: int = 0
    spec: dict[str, Any] = field(default_factory=dict)
    broker: str = ""
    fdatasync_ms: dict[str, float] = field(default_factory=dict)
    """e2e with an embedded broker and unflushThreshold=1: the disk's own fdatasync latency (p50/p99/p999/max)
    of a small write in the broker's data directory, measured in the same run (half just before the
    measured phase, half just after), the floor under every acknowledgement and what the e2e latency is
    compared with."""
    loopback_rtt_ms: dict[str, float] = field(default_factory=dict)
    """e2e with an embedded broker: the machine's round trip of a message-sized write between two Python
    processes over TCP on 127.0.0.1 (p50/p99/p999/max; blocking sockets, nothing else done), measured in the
    same run: the floor under a delivery, which crosses two such hops (producer to broker, broker to
    consumer). It moves between machines by tens of percent (how fast a process is woken), and so do the
    e2e figures with it."""
    client_msgs_per_cpu_s: float = 0.0
    """consume: messages per second of the client processes' own CPU time (summed over them): the client's
    cost per message, steadier than ``msgs_per_s`` when other work shares the machine."""
    cpu_us_per_msg: dict[str, float] = field(default_factory=dict)
    """produce: CPU time per message of the client processes (their measured phase) and, for an embedded broker,
    of the broker process (over the workers' run): on a shared machine a steadier figure than msg/s, and it
    says which side is the floor."""
    placement: dict[str, list[int]] = field(default_factory=dict)
    """e2e with an embedded broker: the CPUs the broker, the producer and the consumer were allowed to run on
    (``--cpus``; all of them when not pinned)."""
    latency_by_place_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """e2e with ``--pacing tick``: the append-to-delivery latency of the messages by their place in their
    millisecond's burst ("1" the first sent, "2" the second...; p50/p99/p999/max and ``count``). Round robin puts
    the places of a burst in different partitions, so it says what each further batch of a burst adds (it
    appends, wakes and answers after the ones before it). Needs ``--size`` ≥ 9 (the place is the payload's
    ninth byte)."""
