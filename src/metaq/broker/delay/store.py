"""The delay store: delayed batches kept durably until due, then delivered to their partitions.

Layout, guarantees and recovery are in docs/delayed.md. In short:

* ``produce`` (event loop): checks the due times, appends the batch as sent to the target partition's
  delay log (a :class:`~metaq.storage.PartitionLog`: CRCs, torn-tail recovery and the flush policy come
  from storage), then writes one bucket row per record to the bucket file of its due time.
* ``run`` (a task on the event loop): a loader reads bucket files into a heap shortly before they are
  due; the deliverer pops due rows, appends them to their partitions as ordinary batches (one per
  partition per round) and advances ``horizon_ms`` (every row due at or before it is delivered). A
  checkpoint (horizon, the target partitions' log ends) is written once those appends are durable.
* ``open`` (blocking): after a clean stop the bucket files are used; otherwise they are rebuilt from the
  delay logs. Refs (``metaq.delay-ref``) found in the target partitions after the checkpoint's ends are
  delivered already and are skipped: exactly once across kill -9.

The target partitions are numbered (bucket rows name a target by its number): :mod:`.targets`. The
bytes (a delay log read back, the records and batches a delivery appends) are :mod:`.batches`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from metaq.broker.delay.batches import assemble_delivery, delivery_chunks, delivery_record, scan_log
from metaq.broker.delay.buckets import (
    BucketFiles,
    Row,
    encode_row,
    parse_rows,
    read_checkpoint,
    write_checkpoint,
)
from metaq.broker.delay.targets import Targets
from metaq.broker.stats import LatencyHistogram
from metaq.errors import CorruptMessageError, DelayTooLongError, InvalidArgument, StorageError
from metaq.fsutil import atomic_write, fsync_directory
from metaq.protocol.delayed import DELAY_REF_HEADER, DELIVER_AT_HEADER, header_ms
from metaq.protocol.records import BatchHeader, decode_batch, validate_batch
from metaq.storage import AppendResult, Flusher, LogConfig, PartitionLog
from metaq.storage.checkpoint import StoreReport
from metaq.storage.errors import DiskFull, is_disk_full
from metaq.storage.files import FileCache
from metaq.storage.manager import parse_partition_dir_name

log = logging.getLogger("metaq.broker.delay")

DELAY_DIR = ".delay"
"""Under dataPath; the log manager skips dot directories, so the store is in no topic listing."""
BUCKET_WIDTH_MS = 5_000
LOAD_AHEAD_MS = 1_000
"""A bucket is read into memory this long before its first due time."""
CHECKPOINT_INTERVAL_S = 0.2
ROUND_RECORDS_MAX = 20_000
"""Rows one deliverer round takes (a backlog after a restart is delivered in several rounds)."""
DELAY_SEGMENT_BYTES_MAX = 64 << 20
RETENTION_MARGIN_MS = 60_000
FAILURE_BACKOFF_S = 1.0
LATENESS_BUCKETS_S: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
                                         60.0)
_UNLIMITED = (1 << 31) - 1
_CLEAN_FILE = "clean"

TargetLookup = Callable[[str, int], PartitionLog | None]
"""(topic, partition) -> the partition's log on this broker, None when it is gone."""
DeliveredHook = Callable[[str, int, int], None]
"""Called after records were appended to (topic, partition): the count (wake long polls, count them)."""


def _ms_text(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


class DelayStore:
    """One broker's delayed messages. Thread use: ``produce``/``run`` on the event loop; ``open`` and
    ``close`` blocking, before serving and after it."""

    def __init__(self, data_path: Path, broker_id: int, log_config: LogConfig, *, max_delay_ms: int,
                 flusher: Flusher | None = None, files: FileCache | None = None,
                 sync: Callable[[int], None] = os.fdatasync, clock: Callable[[], float] = time.time,
                 bucket_width_ms: int = BUCKET_WIDTH_MS) -> None:
        self.root = Path(data_path) / DELAY_DIR
        self.broker_id = broker_id
        self.max_delay_ms = max_delay_ms
        self._base_config = log_config
        self._flusher = flusher
        self._files = files
        self._sync = sync
        self._clock = clock
        self.buckets = BucketFiles(self.root / "buckets", bucket_width_ms)
        self.horizon_ms = 0
        """Every pending row with an effective due time <= this has been delivered."""
        self._heap: list[Row] = []
        self._loaded_until = 0
        """Buckets starting below this are in the heap (or were delivered)."""
        self._unloaded: list[int] = []
        """Starts of bucket files not read yet, sorted."""
        self._loaded: list[int] = []
        """Starts of bucket files read into the heap whose files are not deleted yet."""
        self._loading: dict[int, list[Row]] = {}
        """Buckets being read: rows that arrived for them meanwhile."""
        self.targets = Targets(self.root)
        """Target number <-> (topic, partition): what bucket rows name."""
        self._buckets_incomplete = False
        """A bucket row could not be written (a full disk): the next start rebuilds the buckets."""
        self._logs: dict[int, PartitionLog] = {}
        self._refs: set[tuple[int, int]] = set()
        """(target, delay-log offset) found delivered after the last checkpoint at open."""
        self._max_delay_ever_ms = max_delay_ms
        self._lookup: TargetLookup = lambda topic, partition: None
        self._on_delivered: DeliveredHook = lambda topic, partition, count: None
        self._durable: list[Future[None]] = []
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_seq = 0
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._checkpointed_horizon = -1
        self._checkpointed_at = 0.0
        self._wake: asyncio.Event | None = None
        self._backoff_until = 0.0
        self._opened = False
        self._created = False
        """The store's directory exists (made by the first delayed message)."""
        self._closed = False
        self.pending = 0
        self.delivered = 0
        self.dropped = 0
        self.lateness = LatencyHistogram(LATENESS_BUCKETS_S)

    # -- lifecycle -------------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _log_config(self) -> LogConfig:
        keep_s = (self._max_delay_ever_ms + RETENTION_MARGIN_MS) // 1000 + 1
        return LogConfig(segment_bytes_max=min(self._base_config.segment_bytes_max, DELAY_SEGMENT_BYTES_MAX),
                         unflush_threshold=self._base_config.unflush_threshold,
                         unflush_interval_ms=self._base_config.unflush_interval_ms,
                         delete_policy=f"delete,{keep_s}s",
                         max_message_bytes=self._base_config.max_message_bytes,
                         max_batch_bytes=self._base_config.max_batch_bytes)

    def open(self, lookup: TargetLookup, on_delivered: DeliveredHook | None = None) -> None:
        """Load (blocking): targets, delay logs, the checkpoint; the buckets as they are after a clean stop,
        rebuilt from the delay logs otherwise."""
        self._lookup = lookup
        if on_delivered is not None:
            self._on_delivered = on_delivered
        self._opened = True
        if not self.root.is_dir():  # created by the first delayed message: nothing on disk until then
            return
        self._created = True
        clean_path = self.root / _CLEAN_FILE
        clean: dict[str, Any] | None = None
        if clean_path.exists():
            with contextlib.suppress(OSError, ValueError):
                clean = json.loads(clean_path.read_bytes())
            clean_path.unlink()
            fsync_directory(str(self.root))
        self.targets.load()
        checkpoint = read_checkpoint(self.root) or {}
        self.horizon_ms = int(checkpoint.get("horizon_ms", 0))
        self._checkpointed_horizon = self.horizon_ms
        self._checkpoint_seq = int(checkpoint.get("seq", -1)) + 1
        self._max_delay_ever_ms = max(int(checkpoint.get("max_delay_ms", 0)), self.max_delay_ms)
        ends = checkpoint.get("ends", {}) if isinstance(checkpoint.get("ends"), dict) else {}
        logs_dir = self.root / "logs"
        logs_dir.mkdir(exist_ok=True)
        for entry in sorted(os.listdir(logs_dir)):
            parsed = parse_partition_dir_name(entry)
            if parsed is None or not (logs_dir / entry).is_dir():
                continue
            self._open_log(self.targets.number(*parsed), create=False)
        self._find_refs(ends)
        starts = self.buckets.open()
        if isinstance(clean, dict) and isinstance(clean.get("pending"), int) and checkpoint \
                and not self.targets.damaged:
            self.pending = clean["pending"]
            self._unloaded = starts
        else:
            if starts or self._logs:
                log.info("delay store: rebuilding the timer index from the delay logs (no clean stop)")
            self.buckets.remove_all()
            rows = self._scan(None)
            for start, bucket_rows in rows.items():
                self.buckets.replace(start, b"".join(encode_row(*r) for r in bucket_rows))
            self.pending = sum(len(r) for r in rows.values())
            self._unloaded = sorted(rows)
        self._loaded_until = self.buckets.start_of(self.horizon_ms + 1)
        for start in [s for s in self._unloaded if s < self._loaded_until]:  # delivered: the delete was cut short
            self._unloaded.remove(start)
            self.buckets.remove(start)
        log.info("delay store open: %d pending, horizon %s", self.pending, _ms_text(self.horizon_ms))

    def _create(self) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.buckets.open()
        fsync_directory(str(self.root.parent))
        self._created = True

    def _open_log(self, tid: int, *, create: bool = True) -> PartitionLog:
        plog = self._logs.get(tid)
        if plog is None:
            topic, partition = self.targets[tid]
            plog = PartitionLog.open(self.root / "logs" / f"{topic}-{partition}", topic, partition, self._log_config(),
                                     self.broker_id, clock=self._clock, flusher=self._flusher, files=self._files,
                                     sync=self._sync)
            self._logs[tid] = plog
        return plog

    def _find_refs(self, ends: dict[str, Any]) -> None:
        """Refs delivered after the checkpoint: the target partitions from the ends it recorded."""
        for tid, (topic, partition) in self.targets.items():
            plog = self._lookup(topic, partition)
            if plog is None:
                continue
            start = ends.get(f"{topic}-{partition}", plog.log_start_offset)
            for _header, messages in scan_log(plog, int(start)):
                for m in messages:
                    ref = header_ms(m.headers, DELAY_REF_HEADER) if m.headers else None
                    if ref is not None:
                        self._refs.add((tid, ref))

    def _scan(self, only_start: int | None) -> dict[int, list[Row]]:
        """Pending rows per bucket from the delay logs (all buckets, or the one starting at ``only_start``)."""
        out: dict[int, list[Row]] = {}
        horizon, refs, start_of = self.horizon_ms, self._refs, self.buckets.start_of
        for tid, plog in list(self._logs.items()):
            for header, messages in scan_log(plog, plog.log_start_offset):
                floor = header.append_time_ms + 1
                for m in messages:
                    try:
                        due = header_ms(m.headers, DELIVER_AT_HEADER)
                    except InvalidArgument:
                        due = None
                    if due is None:
                        continue
                    due = max(due, floor)
                    if due <= horizon or (tid, m.offset) in refs:
                        continue
                    start = start_of(due)
                    if only_start is not None and start != only_start:
                        continue
                    out.setdefault(start, []).append(Row(due, tid, m.offset, delivery_record(m, m.offset)))
        return out

    def close(self) -> None:
        """A clean stop (blocking): the final checkpoint, the delay logs and buckets synced, the marker."""
        if not self._opened or self._closed:
            return
        self._closed = True
        if not self._created:
            return
        try:
            self._save_checkpoint(self._checkpoint_document())
            for plog in self._logs.values():
                plog.close()
            self.buckets.sync()
            self.buckets.close()
            if not self._buckets_incomplete:
                atomic_write(self.root / _CLEAN_FILE, json.dumps({"pending": self.pending}).encode())
        except (OSError, StorageError) as exc:
            level = logging.WARNING if is_disk_full(exc) or isinstance(exc, DiskFull) else logging.ERROR
            log.log(level, "delay store: unclean close (%s); the next start rebuilds its index", exc)
            for plog in self._logs.values():
                with contextlib.suppress(Exception):
                    plog.abandon()
            self.buckets.close()

    # -- produce ---------------------------------------------------------------------------------

    def produce(self, topic: str, partition: int, batch: bytes | memoryview, header: BatchHeader) -> AppendResult:
        """Store a validated delayed batch for (topic, partition); the result of its delay-log append.

        DelayTooLongError / CorruptMessageError (nothing stored) for a due time too far away or missing."""
        now = max(self._now_ms(), self.horizon_ms)
        messages = decode_batch(batch, topic, partition, header, verify=False)
        dues = []
        limit = now + self.max_delay_ms
        for i, m in enumerate(messages):
            try:
                due = header_ms(m.headers, DELIVER_AT_HEADER)
            except InvalidArgument as exc:
                raise CorruptMessageError(f"delayed record {i}: {exc}") from None
            if due is None:
                raise CorruptMessageError(f"record {i} of a delayed batch (attribute bit 7) has no {DELIVER_AT_HEADER} "
                                          "header; nothing of the batch was stored")
            if due > limit:
                raise DelayTooLongError(
                    f"message {i} is due at {_ms_text(due)}, {(due - now) / 1000:.0f} s from now; this broker's "
                    f"maxDelayInSeconds is {self.max_delay_ms // 1000} s: send it with a shorter delay or raise "
                    f"maxDelayInSeconds; nothing of the batch was stored")
            dues.append(due)
        try:
            if not self._created:
                self._create()
            tid = self.targets.number(topic, partition)
            plog = self._open_log(tid)
        except OSError as exc:  # nothing of the batch is stored yet
            if is_disk_full(exc):
                raise DiskFull(f"cannot store delayed messages for {topic}-{partition}: the disk is full") from exc
            raise StorageError(f"cannot store delayed messages for {topic}-{partition}: {exc}") from exc
        result = plog.append(batch, header, now_ms=now)
        floor = result.append_time_ms + 1
        base = result.base_offset
        rows = [Row(max(due, floor), tid, base + i, delivery_record(m, base + i))
                for i, (due, m) in enumerate(zip(dues, messages, strict=True))]
        self._add(rows)
        return result

    def _add(self, rows: list[Row]) -> None:
        start_of = self.buckets.start_of
        grouped: dict[int, list[bytes]] = {}
        for row in rows:
            grouped.setdefault(start_of(row.due_ms), []).append(encode_row(*row))
        for start, encoded in grouped.items():
            try:
                self.buckets.append(start, b"".join(encoded))
            except OSError as exc:  # the rows are in the delay log and go on the heap: only the index lacks them
                if not self._buckets_incomplete:
                    log.warning("delay store: cannot write to bucket %s (%s); the next start rebuilds the buckets "
                                "from the delay logs", self.buckets.path(start), exc)
                self._buckets_incomplete = True
        wake = False
        for row in rows:
            start = start_of(row.due_ms)
            if start < self._loaded_until:
                if not self._heap or row < self._heap[0]:
                    wake = True
                heapq.heappush(self._heap, row)
            elif start in self._loading:
                self._loading[start].append(row)
            else:
                i = bisect.bisect_left(self._unloaded, start)
                if i == len(self._unloaded) or self._unloaded[i] != start:
                    self._unloaded.insert(i, start)
        self.pending += len(rows)
        if wake and self._wake is not None:
            self._wake.set()

    # -- delivery --------------------------------------------------------------------------------

    async def run(self) -> None:
        """The loader and the deliverer, until cancelled."""
        self._wake = asyncio.Event()
        loader = asyncio.get_running_loop().create_task(self._load_ahead(), name="metaq-delay-loader")
        try:
            while True:
                now_s = self._clock()
                now = int(now_s * 1000)
                heap = self._heap
                if heap and heap[0].due_ms <= now and now_s >= self._backoff_until:
                    self._deliver_round(now)
                    self._maybe_checkpoint()  # also during a long backlog: it bounds the scan after a crash
                    await asyncio.sleep(0)
                    continue
                self._advance_horizon(now)
                self._maybe_checkpoint()
                timeout = 0.25
                if heap:
                    timeout = min(timeout, max(heap[0].due_ms - now, 0) / 1000)
                if now_s < self._backoff_until:
                    timeout = max(timeout, self._backoff_until - now_s)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            loader.cancel()
            if self._checkpoint_task is not None:
                self._checkpoint_task.cancel()

    def _advance_horizon(self, now: int) -> None:
        horizon = min(now, self._loaded_until - 1)
        if self._heap:
            horizon = min(horizon, self._heap[0].due_ms - 1)
        if horizon > self.horizon_ms:
            self.horizon_ms = horizon

    def _deliver_round(self, now: int) -> None:
        heap = self._heap
        taken: list[Row] = []
        while heap and heap[0].due_ms <= now and len(taken) < ROUND_RECORDS_MAX:
            taken.append(heapq.heappop(heap))
        per_target: dict[int, list[Row]] = {}
        for row in taken:
            per_target.setdefault(row.target, []).append(row)
        observe = self.lateness.observe
        for tid, rows in per_target.items():
            topic, partition = self.targets[tid]
            plog = self._lookup(topic, partition)
            if plog is None:
                log.warning("dropping %d delayed messages due for %s-%d: the partition is gone", len(rows), topic,
                            partition)
                self.dropped += len(rows)
                self.pending -= len(rows)
                continue
            for chunk in delivery_chunks(rows):
                try:
                    batch = assemble_delivery(chunk)
                    # checked as a produce is, without the size limits: the producer's message was within
                    # maxMessageSize, and metaq.delay-ref adds 29 bytes to it
                    result = plog.append(batch, validate_batch(batch, _UNLIMITED, _UNLIMITED))
                except (StorageError, InvalidArgument, OSError) as exc:
                    log.error("cannot deliver %d delayed messages to %s-%d (retried in %.0f s): %s", len(rows),
                              topic, partition, FAILURE_BACKOFF_S, exc)
                    undelivered = rows[rows.index(chunk[0]):]
                    for row in undelivered:
                        heapq.heappush(heap, row)
                    self._backoff_until = self._clock() + FAILURE_BACKOFF_S
                    break
                self._durable.append(result.durable)
                self.delivered += len(chunk)
                self.pending -= len(chunk)
                for row in chunk:
                    observe((now - row.due_ms) / 1000)
                self._on_delivered(topic, partition, len(chunk))
        self._advance_horizon(now)

    async def _load_ahead(self) -> None:
        """Read each bucket into the heap LOAD_AHEAD_MS before it starts."""
        width = self.buckets.width_ms
        while True:
            now = self._now_ms()
            target = self.buckets.start_of(now + LOAD_AHEAD_MS) + width
            if self._loaded_until < target:
                while self._unloaded and self._unloaded[0] < target:
                    await self._load(self._unloaded.pop(0))
                self._loaded_until = target
                if self._wake is not None:
                    self._wake.set()
            await asyncio.sleep(max(target - (now + LOAD_AHEAD_MS), 1) / 1000)

    async def _load(self, start: int) -> None:
        loop = asyncio.get_running_loop()
        size = self.buckets.size(start)
        self._loading[start] = []
        try:
            data = await loop.run_in_executor(None, self.buckets.read, start, size)
            rows, damaged = await loop.run_in_executor(None, parse_rows, data)
            if damaged:
                log.warning("delay store: bucket %s is damaged (torn or failing its CRC); rebuilding it from the "
                            "delay logs", self.buckets.path(start))
                rebuilt = await loop.run_in_executor(None, self._scan, start)
                rows = rebuilt.get(start, [])
        finally:
            side = self._loading.pop(start, [])
        if damaged:
            seen = {(r.target, r.offset) for r in side}
            rows = [r for r in rows if (r.target, r.offset) not in seen]
            await loop.run_in_executor(None, self.buckets.replace, start,
                                       b"".join(encode_row(*r) for r in [*rows, *side]))
        horizon, refs = self.horizon_ms, self._refs
        fresh = [r for r in rows if r.due_ms > horizon and (r.target, r.offset) not in refs]
        fresh.extend(side)
        if fresh:
            self._heap.extend(fresh)
            heapq.heapify(self._heap)
        self._loaded.append(start)

    # -- checkpoint ------------------------------------------------------------------------------

    def _checkpoint_document(self) -> dict[str, Any]:
        ends = {}
        for _tid, (topic, partition) in self.targets.items():
            plog = self._lookup(topic, partition)
            if plog is not None:
                ends[f"{topic}-{partition}"] = plog.log_end_offset
        return {"horizon_ms": self.horizon_ms, "ends": ends, "max_delay_ms": self._max_delay_ever_ms}

    def _maybe_checkpoint(self) -> None:
        if not self._created:
            return
        task = self._checkpoint_task
        if task is not None and not task.done():
            return
        if self.horizon_ms == self._checkpointed_horizon and not self._durable:
            return
        if time.monotonic() - self._checkpointed_at < CHECKPOINT_INTERVAL_S:
            return
        self._checkpointed_at = time.monotonic()
        document = self._checkpoint_document()
        futures, self._durable = self._durable, []
        self._checkpoint_task = asyncio.get_running_loop().create_task(self._checkpoint(document, futures))

    async def _checkpoint(self, document: dict[str, Any], futures: list[Future[None]]) -> None:
        try:
            for future in futures:
                await asyncio.wrap_future(future)
        except Exception as exc:
            log.warning("delay store: deliveries not durable (%s); the checkpoint waits", exc)
            return
        loop = asyncio.get_running_loop()
        horizon = int(document["horizon_ms"])
        width = self.buckets.width_ms
        done = [s for s in self._loaded if s + width - 1 <= horizon]
        self._loaded = [s for s in self._loaded if s + width - 1 > horizon]
        try:
            await loop.run_in_executor(None, self._save_and_clean, document, done)
        except (OSError, StorageError) as exc:
            # A full disk is an operating condition the produces already answer (DISK_FULL), as close() says
            level = logging.WARNING if is_disk_full(exc) or isinstance(exc, DiskFull) else logging.ERROR
            log.log(level, "delay store: cannot write its checkpoint: %s", exc)
            return
        self._checkpointed_horizon = horizon

    def _save_and_clean(self, document: dict[str, Any], done_buckets: list[int]) -> None:
        self._save_checkpoint(document)
        for start in done_buckets:
            self.buckets.remove(start)
        horizon = int(document["horizon_ms"])
        for plog in list(self._logs.values()):
            with contextlib.suppress(StorageError):
                plog.apply_retention(now_ms=horizon)

    def _save_checkpoint(self, document: dict[str, Any]) -> None:
        with self._checkpoint_lock:
            write_checkpoint(self.root, self._checkpoint_seq, document)
            self._checkpoint_seq += 1

    def verify(self) -> StoreReport:
        """Check targets.json as it is on disk (blocking); modifies nothing. (The buckets are derived data, checked
        and rebuilt as they are loaded; the delay logs are partition logs.)"""
        return self.targets.verify()

    # -- stats -----------------------------------------------------------------------------------

    def next_due_ms(self) -> int:
        if self._heap:
            return self._heap[0].due_ms
        for start in (*self._loading, *self._unloaded[:1]):
            return start
        return -1

    def describe(self) -> dict[str, Any]:
        bounds, count, total = self.lateness.cumulative()
        return {"pending": self.pending, "next_due_ms": self.next_due_ms(), "delivered": self.delivered,
                "dropped": self.dropped, "horizon_ms": self.horizon_ms, "in_memory": len(self._heap),
                "max_delay_s": self.max_delay_ms // 1000,
                "lateness": {"count": count, "sum_s": round(total, 6),
                             "buckets": [[b if b != float("inf") else "+Inf", n] for b, n in bounds]}}
