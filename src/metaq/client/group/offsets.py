"""Where a consumer group's offsets live: one :class:`OffsetStorage` interface, four stores.

An offset stored for a partition is the next offset to consume (everything before it is done). Every
store keys a partition as ``brokerId-partition`` (``"1-3"``, :class:`metaq.types.PartitionId`), the key
of MetaQ's ZooKeeper offsets (``offsets/<topic>/<brokerId-partition>``), so a group over several brokers
keeps one offset per broker partition. Data written before partition ids carried the broker id (a bare
partition number) is refused with an error saying what to remove: such a key cannot say which broker's
partition it meant.

* :class:`BrokerOffsetStorage` — the default for groups: OffsetCommit/OffsetFetch of each partition to
  the broker that holds it (in standalone mode each broker coordinates the group for its own
  partitions), which keeps them durable in its data directory and *fences* them: a member that lost its
  partitions in a rebalance cannot overwrite the new owner's offsets.
* :class:`LocalFileOffsetStorage` — the default for broadcast: one JSON file per group on this machine,
  replaced atomically (temp file, fsync, rename, fsync the directory).
* :class:`ZooKeeperOffsetStorage` — the default for groups in cluster mode (MetaQ's): persistent nodes
  ``<root>/consumers/<group>/offsets/<topic>/<brokerId-partition>`` through the session's registry.
  Not fenced by ZooKeeper itself; the group consumer commits only while its fetch lease holds (see
  :mod:`metaq.client.group.membership`), so a member whose session expired does not write.
* :class:`SqliteOffsetStorage` and :class:`PostgresOffsetStorage` — a table ``metaq_offsets`` in a
  database (MetaQ's MysqlOffsetStorage): the group's offsets outlive the machines and the brokers.

The file and SQL stores are not fenced (as MetaQ's ZooKeeper and MySQL stores were not): in group mode a
member that was dropped from the group may still write an offset once before it notices. The bound on
the effect is the same commit period that bounds duplicates.

Every store runs its blocking I/O in a thread of its own, never on the event loop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from metaq.cluster.registry import GroupRegistry
from metaq.errors import InvalidArgument, StorageError, error_for_code
from metaq.fsutil import atomic_write
from metaq.net.codec import raise_for_error
from metaq.protocol import messages as m
from metaq.types import PartitionId, TopicPartition

Request = Callable[[Any], Awaitable[Any]]
BrokerRequest = Callable[[int, Any], Awaitable[Any]]
"""(broker id, request) -> that broker's response."""
Fence = Callable[[int], tuple[int, str]]
"""broker id -> (generation, member id) a commit of that broker's partitions carries."""


class OffsetStorage(abc.ABC):
    """MetaQ's OffsetStorage: load and commit a group's offsets. Implement it to keep them elsewhere."""

    @abc.abstractmethod
    async def load(self, group: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Committed offsets of ``partitions``; a partition never committed is absent."""

    @abc.abstractmethod
    async def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, generation: int = m.NO_GENERATION,
                     member_id: str = "") -> None:
        """Store ``offsets`` durably before returning. ``generation``/``member_id`` let a fencing store
        refuse a member that no longer owns the partitions (raise the broker's error)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the store holds."""


class BrokerOffsetStorage(OffsetStorage):
    """Offsets kept by the brokers (standalone mode): each partition's at the broker that holds it.

    The consumer binds it (:meth:`bind_brokers`, with each broker's generation and member id for fencing);
    :meth:`for_session` binds one to a session for tools. :meth:`bind` sends every request to one broker
    instead (a single-broker setup, or a test)."""

    def __init__(self, request: Request | None = None) -> None:
        self._request = request
        self._request_to: BrokerRequest | None = None
        self._fence: Fence | None = None

    def bind(self, request: Request) -> None:
        """Give the store the session's request function (the consumer does it when it starts)."""
        self._request = request

    def bind_brokers(self, request_to: BrokerRequest, fence: Fence | None = None) -> None:
        """Send each partition's requests to its own broker; ``fence`` gives the generation and member id
        a commit to that broker carries (else the ones :meth:`commit` is given)."""
        self._request_to = request_to
        self._fence = fence

    @classmethod
    def for_session(cls, session: Any) -> BrokerOffsetStorage:
        """One bound to a :class:`~metaq.client.session.MessageSessionFactory` (or its core): requests go to
        each partition's broker (admin tools, ``metaq group reset``)."""
        core = session._core if hasattr(session, "_core") else session
        storage = cls()

        async def request_to(broker_id: int, request: Any) -> Any:
            return await (await core.connection(broker_id)).request(request)

        storage.bind_brokers(request_to)
        return storage

    def _send(self, broker_id: int) -> Request:
        if self._request_to is not None:
            request_to = self._request_to
            return lambda request: request_to(broker_id, request)
        if self._request is None:
            raise InvalidArgument("BrokerOffsetStorage is not bound to a broker connection")
        return self._request

    def _by_broker(self, partitions: Iterable[TopicPartition]) -> dict[int, list[TopicPartition]]:
        """Partitions per broker to ask (all under one key when bound to a single broker)."""
        out: dict[int, list[TopicPartition]] = {}
        for tp in sorted(partitions):
            out.setdefault(tp.partition.broker_id if self._request_to is not None else -1, []).append(tp)
        return out

    async def load(self, group: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        async def one(broker_id: int, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            refs = [m.TopicPartitionRef(tp.topic, tp.partition.broker_id, tp.partition.partition) for tp in tps]
            request = m.OffsetFetchRequest(group, refs)
            resp: m.OffsetFetchResponse = raise_for_error(await self._send(broker_id)(request))
            return {TopicPartition(e.topic, PartitionId(e.broker_id, e.partition)): e.offset for e in resp.offsets
                    if e.offset >= 0}

        found: dict[TopicPartition, int] = {}
        for part in await asyncio.gather(*(one(b, tps) for b, tps in self._by_broker(partitions).items())):
            found.update(part)
        return found

    async def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, generation: int = m.NO_GENERATION,
                     member_id: str = "") -> None:
        """Commit to every broker concerned (all are tried); the first failure is raised after."""
        async def one(broker_id: int, tps: list[TopicPartition]) -> None:
            fenced = self._fence(broker_id) if self._fence is not None and broker_id >= 0 else (generation,
                                                                                                 member_id)
            entries = [m.OffsetEntry(tp.topic, tp.partition.broker_id, tp.partition.partition, offsets[tp])
                       for tp in tps]
            resp: m.OffsetCommitResponse = raise_for_error(
                await self._send(broker_id)(m.OffsetCommitRequest(group, *fenced, entries)))
            refused = [e for e in resp.results if e.error_code]
            if refused:
                where = [f"{e.topic}:{e.broker_id}-{e.partition}" for e in refused]
                raise error_for_code(refused[0].error_code, f"offsets refused for {where}: "
                                                            f"{resp.error_message or ''}", resp)

        results = await asyncio.gather(*(one(b, tps) for b, tps in self._by_broker(offsets).items()),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


class _ThreadedStorage(OffsetStorage):
    """Runs blocking calls in one dedicated thread (SQLite connections belong to their thread)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"metaq-{type(self).__name__}")

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        await self._run(self._close_sync)
        self._executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        pass

    async def load(self, group: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        result: dict[TopicPartition, int] = await self._run(self._load_sync, group, list(partitions))
        return result

    async def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, generation: int = m.NO_GENERATION,
                     member_id: str = "") -> None:
        if offsets:
            await self._run(self._commit_sync, group, dict(offsets))

    def _load_sync(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise NotImplementedError

    def _commit_sync(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        raise NotImplementedError


_SAFE = re.compile(r"[^A-Za-z0-9._@-]")


class ZooKeeperOffsetStorage(OffsetStorage):
    """MetaQ's ZkOffsetStorage: ``offsets/<topic>/<brokerId-partition>`` (persistent) in the cluster's
    ZooKeeper, through a :class:`~metaq.cluster.registry.GroupRegistry` (blocking calls, made in a thread)."""

    def __init__(self, registry: GroupRegistry) -> None:
        self.registry = registry

    async def load(self, group: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        wanted = list(partitions)

        def read() -> dict[TopicPartition, int]:
            out = {}
            for tp in wanted:
                offset = self.registry.load_offset(group, tp.topic, tp.partition)
                if offset is not None:
                    out[tp] = offset
            return out

        return await asyncio.to_thread(read)

    async def commit(self, group: str, offsets: Mapping[TopicPartition, int], *, generation: int = m.NO_GENERATION,
                     member_id: str = "") -> None:
        due = {(tp.topic, tp.partition): offset for tp, offset in offsets.items()}
        await asyncio.to_thread(self.registry.commit_offsets, group, due)


class LocalFileOffsetStorage(_ThreadedStorage):
    """``<directory>/<group>.json``: {"offsets": {"topic": {"brokerId-partition": offset}}}, replaced
    atomically on commit. A file of the earlier format (bare partition numbers) is refused."""

    def __init__(self, directory: str | Path = "~/.meta_offsets", *, fsync: bool = True) -> None:
        super().__init__()
        self.directory = Path(directory).expanduser()
        self.fsync = fsync
        self._cache: dict[str, dict[TopicPartition, int]] = {}

    def path(self, group: str) -> Path:
        """The file holding ``group``'s offsets (one JSON file per group in ``directory``)."""
        return self.directory / (_SAFE.sub("_", group) + ".json")

    def _read(self, group: str) -> dict[TopicPartition, int]:
        cached = self._cache.get(group)
        if cached is not None:
            return cached
        out: dict[TopicPartition, int] = {}
        path = self.path(group)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            doc = {}
        for topic, parts in doc.get("offsets", {}).items():
            for p, off in parts.items():
                try:
                    pid = PartitionId.parse(p)
                except InvalidArgument:
                    raise StorageError(
                        f"offsets file {path} keys partition {p!r} of topic {topic!r}, not brokerId-partition: it "
                        "was written by an earlier metaq, whose keys do not say which broker's partition they "
                        "meant; delete the file (the group starts over per its consume_from_max_offset) or "
                        "rewrite each key as brokerId-partition") from None
                out[TopicPartition(topic, pid)] = int(off)
        self._cache[group] = out
        return out

    def _load_sync(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        have = self._read(group)
        return {tp: have[tp] for tp in partitions if tp in have}

    def _commit_sync(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        merged = dict(self._read(group))
        merged.update(offsets)
        doc: dict[str, dict[str, int]] = {}
        for tp, off in sorted(merged.items()):
            doc.setdefault(tp.topic, {})[str(tp.partition)] = off
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(group)
        data = json.dumps({"group": group, "updated_ms": int(time.time() * 1000), "offsets": doc}).encode()
        atomic_write(path, data, sync=os.fsync if self.fsync else None, tmp_path=path.with_suffix(".json.tmp"))
        self._cache[group] = merged



TABLE = "metaq_offsets"
_DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (group_id VARCHAR(255) NOT NULL, topic VARCHAR(255) NOT NULL, "
        "broker_partition VARCHAR(32) NOT NULL, next_offset BIGINT NOT NULL, updated_ms BIGINT NOT NULL, "
        "PRIMARY KEY (group_id, topic, broker_partition))")
_PROBE = f"SELECT broker_partition FROM {TABLE} WHERE 1 = 0"
"""Fails on a table of the earlier layout (``partition_id INTEGER``, no broker id)."""


class SqlOffsetStorage(_ThreadedStorage):
    """Offsets in table ``metaq_offsets`` through a DB-API connection (``connect()`` makes one), a row
    per (group, topic, ``brokerId-partition``). A table of the earlier layout (an integer
    ``partition_id``) is refused with an error naming it.

    ``paramstyle`` is the driver's placeholder ('?' for sqlite3, '%s' for psycopg). The upsert is
    ``INSERT ... ON CONFLICT ... DO UPDATE``, which SQLite (3.24+) and PostgreSQL both speak.
    """

    def __init__(self, connect: Callable[[], Any], placeholder: str) -> None:
        super().__init__()
        self._connect = connect
        self._ph = placeholder
        self._conn: Any = None

    def _db(self) -> Any:
        if self._conn is None:
            conn = self._connect()
            cur = conn.cursor()
            cur.execute(_DDL)
            conn.commit()
            try:
                cur.execute(_PROBE)
                cur.fetchall()
            except Exception as exc:  # the driver's own error for a missing column
                with contextlib.suppress(Exception):
                    conn.rollback()
                conn.close()
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise StorageError(
                    f"table {TABLE} has the layout of an earlier metaq (partition_id INTEGER, without the broker "
                    f"id: {reason}); its keys cannot say which broker's partition they meant. Drop or rename the "
                    f"table (e.g. ALTER TABLE {TABLE} RENAME TO {TABLE}_old) and metaq creates the new one") from None
            conn.commit()
            self._conn = conn
        return self._conn

    def _load_sync(self, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        wanted = set(partitions)
        cur = self._db().cursor()
        cur.execute(f"SELECT topic, broker_partition, next_offset FROM {TABLE} WHERE group_id = {self._ph}", (group,))
        rows = cur.fetchall()
        self._db().commit()
        return {tp: int(off) for t, p, off in rows if (tp := TopicPartition(t, PartitionId.parse(p))) in wanted}

    def _commit_sync(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        ph = self._ph
        conn = self._db()
        now = int(time.time() * 1000)
        sql = (f"INSERT INTO {TABLE} (group_id, topic, broker_partition, next_offset, updated_ms) "
               f"VALUES ({ph}, {ph}, {ph}, {ph}, {ph}) ON CONFLICT (group_id, topic, broker_partition) "
               "DO UPDATE SET next_offset = excluded.next_offset, updated_ms = excluded.updated_ms")
        try:
            cur = conn.cursor()
            cur.executemany(sql, [(group, tp.topic, str(tp.partition), off, now)
                                  for tp, off in sorted(offsets.items())])
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None



class SqliteOffsetStorage(SqlOffsetStorage):
    """Offsets in an SQLite database file (stdlib sqlite3; WAL + synchronous=FULL: a commit survives
    a crash of the process and of the machine)."""

    def __init__(self, path: str | Path) -> None:
        self.db_path = Path(path).expanduser()

        def connect() -> Any:
            import sqlite3

            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.db_path)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            return conn

        super().__init__(connect, "?")


class PostgresOffsetStorage(SqlOffsetStorage):
    """Offsets in PostgreSQL through psycopg 3 (``pip install metaq[postgres]``); ``conninfo`` is a
    libpq connection string (``"host=127.0.0.1 port=5432 dbname=metaq user=metaq"``)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

        def connect() -> Any:
            import psycopg

            return psycopg.connect(conninfo)

        super().__init__(connect, "%s")
