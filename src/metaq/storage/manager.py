"""LogManager: every partition log of one broker under one data directory.

It owns what the logs share: the descriptor budget (FileCache), the flusher thread, per-topic
configuration, the partition-tag table that turns a message id back into (topic, partition, offset),
and the clean-shutdown checkpoint written once for all partitions at close.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from metaq.errors import InvalidArgument, StorageError
from metaq.fsutil import datasync, syncfs
from metaq.protocol.records import MAGIC
from metaq.storage.checkpoint import (
    CleanState,
    fsync_directory,
    read_clean_states,
    read_json,
    remove_file,
    write_clean_states,
    write_json,
)
from metaq.storage.config import LogConfig
from metaq.storage.errors import LogClosedError, MessageNotFound, is_disk_full
from metaq.storage.files import FileCache
from metaq.storage.flush import FilesystemSync, Flusher, SyncfsDecision, decide_syncfs
from metaq.storage.log import PartitionLog
from metaq.storage.retention import RetentionOutcome
from metaq.types import (
    BROKER_ID_MAX,
    MessageId,
    partition_tag,
    split_message_id,
    validate_partition,
    validate_topic,
)

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "clean-shutdown.json"
FORMAT_FILE = "format.json"
"""Which record batch format the data directory holds: ``{"record_batch_format": 2}``."""
LOCK_FILE = ".lock"
_DELETING_SUFFIX = ".deleting"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``my-topic-3`` -> (``my-topic``, 3): topics may contain '-', so split on the last one."""
    topic, sep, number = name.rpartition("-")
    if not sep or not number.isdigit() or not number.isascii():
        return None
    try:
        validate_topic(topic)
    except InvalidArgument:
        return None
    return topic, int(number)


class LogManager:
    """Opens, creates, finds, flushes, expires and closes the partition logs of one broker."""

    def __init__(self, data_dir: Path, broker_id: int, default_config: LogConfig,
                 topic_configs: dict[str, LogConfig] | None = None, *, load_in_parallel: bool = False,
                 max_open_files: int = 1024, clock: Callable[[], float] = time.time,
                 sync: Callable[[int], None] = datasync, idle_close_seconds: float = 60.0,
                 load_workers: int = 8, syncfs_min_logs: int = 0,
                 sync_filesystem: Callable[[int], None] | None = None, sync_inline_max_logs: int = 2,
                 syncfs_quiet_min_logs: int = 0, use_syncfs: bool = True) -> None:
        """``sync`` syncs a file's data or a directory's entries (:func:`~metaq.fsutil.datasync`; inject one
        to time, count, hold or fail them). ``syncfs_min_logs`` > 0: a flush round of at least that many
        partitions syncs the data directory's filesystem once instead of each partition (storage/flush.py),
        where that is known to make the data durable (:func:`~metaq.storage.flush.decide_syncfs`: the
        filesystem, Linux 5.8+; ``use_syncfs=False`` never); ``sync_filesystem`` wraps or replaces syncfs(2)
        there (to time, count or fail it); ``syncfs_quiet_min_logs`` > 0: a round of at least that many does
        too while the machine has little else to write back (``FilesystemSync``). ``sync_inline_max_logs``: the
        flusher's ``inline_max_logs`` (a round of at most that many partitions is synced in the flusher's own
        thread, a larger one on its pool)."""
        if not isinstance(broker_id, int) or not 0 <= broker_id <= BROKER_ID_MAX:
            raise InvalidArgument(f"broker id {broker_id!r} is outside 0..{BROKER_ID_MAX}")
        self.data_dir = Path(data_dir)
        self.broker_id = broker_id
        self.default_config = default_config
        self._topic_configs = dict(topic_configs or {})
        self._load_in_parallel = load_in_parallel
        self._load_workers = load_workers
        self._clock = clock
        self._sync = sync
        self._syncfs_min_logs = syncfs_min_logs
        self._syncfs_quiet_min_logs = syncfs_quiet_min_logs
        self._use_syncfs = use_syncfs
        self.syncfs_decision: SyncfsDecision | None = None
        """Whether this data directory's flush rounds may use syncfs, and why (decided by :meth:`open`)."""
        self._sync_filesystem = sync_filesystem
        self._idle_close_seconds = idle_close_seconds
        self.files = FileCache(max_open_files)
        self.flusher = Flusher(clock=clock, idle_hook=self._close_idle_files,
                               idle_interval_seconds=min(10.0, idle_close_seconds),
                               inline_max_logs=sync_inline_max_logs)
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._by_tag: dict[int, PartitionLog] = {}
        self._lock_fd = -1
        self._opened = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> LogManager:
        """Lock the data directory, load and recover every partition found there, start the flusher."""
        if self._opened:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            checkpoint_path = self.data_dir / CHECKPOINT_FILE
            states = read_clean_states(checkpoint_path)
            mark_format = self._check_format()
            # From here on a crash must look unclean: the checkpoint goes before the first append.
            remove_file(checkpoint_path, sync_dir=True, sync=self._sync)
            found: list[tuple[str, int, Path]] = []
            for entry in sorted(os.listdir(self.data_dir)):
                path = self.data_dir / entry
                if not path.is_dir():
                    continue
                if entry.startswith("."):  # the broker's own stores (.delay: docs/delayed.md), not partitions
                    continue
                if entry.endswith(_DELETING_SUFFIX):
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                parsed = parse_partition_dir_name(entry)
                if parsed is None:
                    log.warning("ignoring %s: not a <topic>-<partition> directory", path)
                    continue
                found.append((parsed[0], parsed[1], path))
            logs = self._open_logs(found, states)
            for partition_log in logs:
                self._register(partition_log)
            if mark_format:  # only once every partition opened: a refused old directory stays unmarked
                try:
                    write_json(self.data_dir / FORMAT_FILE, {"record_batch_format": MAGIC}, sync=self._sync)
                except OSError as exc:  # a full disk must not keep the broker from starting read-only
                    log.warning("cannot write %s (%s); it is written at the next start", FORMAT_FILE, exc)
            self._start_flusher()
            self._opened = True
        except BaseException:
            self._close_filesystem_sync()
            for partition_log in list(self._logs.values()):
                partition_log.abandon()
            self._logs.clear()
            self._by_tag.clear()
            self._unlock_data_dir()
            raise
        return self

    start = open

    def _check_format(self) -> bool:
        """Refuse a data directory written in another record batch format; True if it is not marked yet."""
        path = self.data_dir / FORMAT_FILE
        document = read_json(path)
        if document is None:
            if path.exists():
                raise StorageError(f"{path} is damaged; it should say {{\"record_batch_format\": {MAGIC}}}")
            return True
        version = document.get("record_batch_format") if isinstance(document, dict) else None
        if version != MAGIC:
            raise StorageError(f"data directory {self.data_dir} holds record batch format {version!r} ({path}); "
                               f"this metaq reads format {MAGIC} only and there is no migration: move the "
                               "directory away (or delete it) and start again")
        return False

    def _open_logs(self, found: list[tuple[str, int, Path]],
                   states: dict[str, CleanState | None]) -> list[PartitionLog]:
        def open_one(item: tuple[str, int, Path]) -> PartitionLog:
            topic, partition, path = item
            try:
                return PartitionLog.open(path, topic, partition, self.config_for(topic), self.broker_id,
                                         clock=self._clock, flusher=self.flusher, files=self.files,
                                         sync=self._sync, clean_state=states.get(path.name))
            except (OSError, StorageError) as exc:
                raise StorageError(f"cannot open partition {topic}-{partition} in {path}: {exc}") from exc

        if self._load_in_parallel and len(found) > 1:
            with ThreadPoolExecutor(max_workers=self._load_workers, thread_name_prefix="metaq-load") as pool:
                return list(pool.map(open_one, found))
        return [open_one(item) for item in found]

    def _register(self, partition_log: PartitionLog) -> None:
        other = self._by_tag.get(partition_log.tag)
        if other is not None:
            raise StorageError(
                f"partitions {other.topic}-{other.partition} and {partition_log.topic}-"
                f"{partition_log.partition} share message id tag {partition_log.tag:012x}; "
                "their message ids would be ambiguous")
        self._logs[(partition_log.topic, partition_log.partition)] = partition_log
        self._by_tag[partition_log.tag] = partition_log

    def close(self) -> None:
        """Flush and close every log, record the clean shutdown in one checkpoint, stop the flusher."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        states: dict[str, CleanState] = {}
        errors: list[str] = []
        with self._lock:
            logs = list(self._logs.values())
        # No flush round from here on (each close syncs what is left of its own log): so that nothing is
        # written to an index file after the syncfs below, which then covers those files too.
        self.flusher.stop()
        covered = set(self.flusher.sync_covered(logs))

        def close_one(partition_log: PartitionLog) -> tuple[PartitionLog, CleanState | None, str | None]:
            try:
                return partition_log, partition_log.close(write_marker=False,
                                                          sync_indexes=partition_log not in covered), None
            except StorageError as exc:
                return partition_log, None, str(exc)

        # Many logs on a filesystem that can be synced whole were made durable by one syncfs above: their
        # closes sync nothing (unless one writes its index entries) and run here. Otherwise each close
        # fdatasyncs its log (and fsyncs index files earlier flushes wrote): one after another, 10,000
        # partitions took minutes on a busy disk; side by side the filesystem journal merges the syncs.
        quiet = {plog for plog in logs if plog in covered and not plog.close_writes_index_files()}
        closed = [close_one(partition_log) for partition_log in logs if partition_log in quiet]
        syncing = [partition_log for partition_log in logs if partition_log not in quiet]
        if len(syncing) > 1:
            with ThreadPoolExecutor(max_workers=self._load_workers, thread_name_prefix="metaq-close") as pool:
                closed += pool.map(close_one, syncing)
        else:
            closed += [close_one(partition_log) for partition_log in syncing]
        for partition_log, state, error in closed:
            if error is not None:
                errors.append(error)
            elif state is not None:
                states[partition_log.directory.name] = state
        self._close_filesystem_sync()
        try:
            write_clean_states(self.data_dir / CHECKPOINT_FILE, states, sync=self._sync)
        except OSError as exc:
            if not is_disk_full(exc):
                errors.append(f"cannot write the clean-shutdown checkpoint: {exc}")
            else:  # every log is synced: the next start only checks them as after a crash
                log.warning("cannot write the clean-shutdown checkpoint (the disk is full): the next start checks "
                            "every partition as after a crash; nothing is lost")
        self.files.close_all()
        self._unlock_data_dir()
        if errors:
            raise StorageError("closing the logs failed: " + "; ".join(errors))

    def _start_flusher(self) -> None:
        decision = decide_syncfs(self.data_dir, enabled=self._use_syncfs, min_logs=self._syncfs_min_logs)
        self.syncfs_decision = decision
        if decision.used:
            self.flusher.filesystem_sync = FilesystemSync(self.data_dir, self._syncfs_min_logs,
                                                          self._sync_filesystem or syncfs,
                                                          quiet_min_logs=self._syncfs_quiet_min_logs)
        log.info("data directory %s: %s", self.data_dir, decision.reason)
        self.flusher.start()

    def describe_syncs(self) -> dict[str, Any] | None:
        """How flushes are made durable here (``metaq stats``): the :class:`SyncfsDecision` and, where syncfs is
        used, the rounds it synced, its failures and the quiet rounds it left to fdatasyncs; None before open."""
        decision = self.syncfs_decision
        if decision is None:
            return None
        doc = decision.describe()
        whole = self.flusher.filesystem_sync
        if whole is not None:
            doc.update(syncfs_rounds=whole.syncs, syncfs_failures=whole.failures, syncfs_busy_skips=whole.busy_skips)
        return doc

    def _close_filesystem_sync(self) -> None:
        if self.flusher.filesystem_sync is not None:
            self.flusher.filesystem_sync.close()

    def __enter__(self) -> LogManager:
        return self.open()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StorageError(f"data directory {self.data_dir} is in use by another process") from None
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _close_idle_files(self) -> None:
        self.files.close_idle(self._idle_close_seconds)

    def _check_open(self) -> None:
        if not self._opened:
            raise StorageError("the log manager is not open; call open() first")
        if self._closed:
            raise LogClosedError("the log manager is closed")

    # ------------------------------------------------------------------ partitions

    def config_for(self, topic: str) -> LogConfig:
        return self._topic_configs.get(topic, self.default_config)

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def get_or_create(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log, created (empty) if missing. Refuses a tag already in use."""
        existing = self._logs.get((topic, partition))
        if existing is not None:
            return existing
        validate_topic(topic)
        validate_partition(partition)
        with self._lock:
            self._check_open()
            existing = self._logs.get((topic, partition))
            if existing is not None:
                return existing
            tag = partition_tag(topic, partition)
            other = self._by_tag.get(tag)
            if other is not None:
                raise StorageError(
                    f"cannot create {topic}-{partition}: its message id tag {tag:012x} is taken by "
                    f"{other.topic}-{other.partition}; use another topic name or partition")
            # opening the partition lists its directory and reads its files: out of descriptors, the pool
            # sheds idle ones and the open (which only creates what is missing) runs again
            partition_log = self.files.call(functools.partial(
                PartitionLog.open, self.data_dir / f"{topic}-{partition}", topic, partition, self.config_for(topic),
                self.broker_id, clock=self._clock, flusher=self.flusher, files=self.files, sync=self._sync))
            self._register(partition_log)
            return partition_log

    def partitions(self, topic: str) -> list[int]:
        return sorted(p for (t, p) in list(self._logs) if t == topic)

    def topics(self) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for topic, partition in sorted(self._logs):
            result.setdefault(topic, []).append(partition)
        return result

    def logs(self) -> list[PartitionLog]:
        return list(self._logs.values())

    def delete_topic(self, topic: str) -> list[int]:
        """Close and remove every partition of ``topic``; returns the partitions removed."""
        with self._lock:
            victims = [log_ for (t, _), log_ in self._logs.items() if t == topic]
            for partition_log in victims:
                del self._logs[(partition_log.topic, partition_log.partition)]
                self._by_tag.pop(partition_log.tag, None)
            self._topic_configs.pop(topic, None)
        for partition_log in victims:
            partition_log.delete()
        if victims:
            fsync_directory(self.data_dir, self._sync)
        return sorted(p.partition for p in victims)

    def set_topic_config(self, topic: str, config: LogConfig) -> None:
        """Change a topic's configuration live: flush policy, retention and limits apply at once."""
        validate_topic(topic)
        with self._lock:
            self._topic_configs[topic] = config
            logs = [log_ for (t, _), log_ in self._logs.items() if t == topic]
        for partition_log in logs:
            partition_log.set_config(config)

    def resolve_message_id(self, message_id: MessageId) -> tuple[str, int, int]:
        """(topic, partition, offset) of a message id, without a scan; MessageNotFound otherwise."""
        parts = split_message_id(message_id)
        if parts.broker_id != self.broker_id:
            raise MessageNotFound(message_id, f"it was assigned by broker {parts.broker_id}, "
                                              f"this is broker {self.broker_id}")
        partition_log = self._by_tag.get(parts.tag)
        if partition_log is None:
            raise MessageNotFound(message_id, f"no partition here has tag {parts.tag:012x}")
        start, end = partition_log.log_start_offset, partition_log.log_end_offset
        if not start <= parts.offset < end:
            raise MessageNotFound(message_id, f"offset {parts.offset} of {partition_log.topic}-"
                                              f"{partition_log.partition} is outside [{start}, {end})")
        return partition_log.topic, partition_log.partition, parts.offset

    # ------------------------------------------------------------------ maintenance

    def run_retention(self, topics: Iterable[str] | None = None, now_ms: int | None = None) -> RetentionOutcome:
        """Apply the deletePolicy of these topics' partitions (every topic's when None).

        A partition that fails is logged and named in the outcome; it does not hold back the others
        (the next run retries it). Blocking file work (zip archives included): run it off the event loop.
        """
        wanted = None if topics is None else set(topics)
        outcome = RetentionOutcome()
        for partition_log in sorted(self._iter_open_logs(), key=lambda lg: (lg.topic, lg.partition)):
            if wanted is not None and partition_log.topic not in wanted:
                continue
            name = f"{partition_log.topic}-{partition_log.partition}"
            try:
                bases = partition_log.apply_retention(now_ms)
            except StorageError as exc:
                outcome.failures[name] = str(exc)
                log.error("retention of %s failed (retried at the next run): %s", name, exc)
                continue
            if bases:
                outcome.removed[name] = bases
        return outcome

    def flush_all(self) -> None:
        """fdatasync every log (blocking). Raises StorageError naming the logs that failed."""
        errors = []
        for partition_log in self._iter_open_logs():
            try:
                partition_log.flush()
            except StorageError as exc:
                errors.append(str(exc))
        if errors:
            raise StorageError("flush failed: " + "; ".join(errors))

    def _iter_open_logs(self) -> Iterable[PartitionLog]:
        return [log_ for log_ in list(self._logs.values()) if not log_.closed]
