"""The broker core: topics, partitions and their logs, consumer groups and request handling, with no network.

A transport (TCP: :mod:`metaq.broker.transport`; later HTTP, and the replica fetcher of the HA mode)
decodes a request and calls :meth:`Broker.handle` with it and the :class:`~metaq.broker.session.Session`
of its connection. The core finds the handler registered for the request's type (the registry of
:mod:`metaq.broker.handlers`), and whatever the handler raises becomes the API's own error response
through the one mapping of :mod:`metaq.broker.error_mapping`. Nothing here knows sockets or frames.

This module holds the broker's state (topics and their partitions' logs, the group coordinator, the
delay store, transactions, quotas) and the topics' lifecycle; two parts of the :class:`Broker` are
modules of their own: the dispatch of a request with the checks every request passes
(:mod:`metaq.broker.dispatch`), and the configuration while the broker runs, reload included
(:mod:`metaq.broker.reload`).

Lifecycle: :meth:`Broker.open` (blocking: loads every partition), serving, :meth:`Broker.drain`
(refuses new produces and fetches, answers what is in flight), :meth:`Broker.close` (flushes, writes
the clean-shutdown record). :class:`metaq.broker.service.BrokerService` runs it with its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from metaq.broker import audit
from metaq.broker.cluster import ClusterLink
from metaq.broker.committing import reapply_on_open
from metaq.broker.config import (
    BrokerConfig,
    TopicConfig,
    TopicSettings,
)
from metaq.broker.delay.store import DelayStore
from metaq.broker.dispatch import RequestDispatch
from metaq.broker.filters import MessageFilter
from metaq.broker.groups import GroupCoordinator
from metaq.broker.ini import topic_options_text
from metaq.broker.options import MAX_OPEN_FILES_PROVISIONAL
from metaq.broker.partition_state import PartitionStateStore
from metaq.broker.quotas import Quotas
from metaq.broker.reload import Reloading
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.broker.session import Session, SessionTable
from metaq.broker.stats import BrokerStats
from metaq.broker.topic_options import TopicOptionsStore
from metaq.broker.transactions import TransactionCoordinator
from metaq.broker.waiters import FetchWaiters
from metaq.errors import (
    InvalidArgument,
    InvalidTopicError,
    NotMasterError,
    StorageFailureError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.fsutil import datasync, syncfs
from metaq.protocol import messages as m
from metaq.security.acl import Acls
from metaq.security.scram import MockCredentials
from metaq.storage import LogConfig, LogManager, PartitionLog
from metaq.storage.txlog import TransactionLog
from metaq.types import validate_topic

log = logging.getLogger("metaq.broker")

Handler = Callable[["Broker", Any, Session | None], Any]
"""A request handler: (broker, request, session) -> the response, a FileReply, or a coroutine of one."""


def check_topic_name(topic: str) -> None:
    """INVALID_TOPIC for a name no topic can have."""
    try:
        validate_topic(topic)
    except InvalidArgument as exc:
        raise InvalidTopicError(str(exc)) from None


class ReplicationView(Protocol):
    """What the core needs of a slave's replication (the fetcher itself lives outside the network-free
    core, in :mod:`metaq.broker.replication`): its state for ``metaq stats``."""

    def describe(self) -> dict[str, Any]: ...


class ReplicaGroupView(Protocol):
    """What the core needs of a replica group with epochs (sync replication, failover; implemented in
    :mod:`metaq.broker.replication.ha`, outside the network-free core)."""

    def check_writable(self, what: str) -> None:
        """NOT_MASTER unless this broker is the master now (and sure of it)."""

    def before_append(self, plog: PartitionLog) -> None:
        """Checks before a produce is written (NOT_ENOUGH_REPLICAS), and the epoch history."""

    def after_append(self, plog: PartitionLog, end_offset: int) -> Awaitable[None] | None:
        """What the ack must wait for besides durability (the in-sync slaves), or None."""

    def visible_end(self, plog: PartitionLog) -> int:
        """Where consumers may read up to (the high watermark of a sync-replicated partition)."""

    def replica_fetch(self, req: m.FetchRequest, plog: PartitionLog,
                      session: Session | None) -> tuple[dict[str, int], int]:
        """A slave's fetch (on ``session``, its connection): extra reply fields, and the offset the reply stops
        before (-1: none)."""

    def connection_closed(self, session: Session) -> None:
        """A client connection closed (a slave's may tell the master that the slave is gone)."""

    def replica_reply(self, req: m.FetchRequest, plog: PartitionLog) -> tuple[dict[str, int], int]:
        """:meth:`replica_fetch`'s reply fields as of now (a long poll answered later), without its checks."""

    async def hand_over(self, replica_id: int, timeout_s: float) -> tuple[int, int]:
        """A planned switchover to ``replica_id`` (-1: any in-sync slave); (new master, its epoch)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]: ...


@dataclass
class TopicState:
    settings: TopicSettings
    num_partitions: int
    closed: set[int] = field(default_factory=set)
    """Partitions closed for publishing (MetaQ's `metaq topic close`): produce gets 403. Kept across
    restarts in the data directory (:mod:`metaq.broker.partition_state`)."""


class Broker(Reloading, RequestDispatch):
    """Topics, partitions, consumer groups, and the requests on them. Network-free: a transport feeds it.

    ``handlers`` is the request registry, request type -> :data:`Handler`
    (:data:`metaq.broker.handlers.REQUEST_HANDLERS`). ``config_path`` and ``overrides`` are the
    server.ini and the flags the broker was started with: what a reload reads again. ``sync`` is the
    sync the logs use for their files and directories (:func:`~metaq.fsutil.datasync`); tests inject one that
    is held, counted or fails.
    """

    def __init__(self, config: BrokerConfig, handlers: Mapping[type, Handler], *, config_path: str | None = None,
                 overrides: Mapping[str, str] | None = None, sync: Callable[[int], None] = datasync,
                 cluster: ClusterLink | None = None, slave: SlaveConfig | None = None,
                 replica: SlaveConfig | None = None) -> None:
        self.config = config
        self.slave = slave
        """Set when this broker is an async slave of its broker id's master (``metaq broker --slave``)."""
        self.replication: ReplicationView | None = None
        """The slave's replica fetchers, once started (:mod:`metaq.broker.replication`)."""
        self.replica = replica if replica is not None else slave
        """This broker's replica identity (slaveId) in its replica group, also as master (HA mode)."""
        self.ha: ReplicaGroupView | None = None
        """Set in HA mode (syncReplication or autoFailover): epochs, the in-sync set, the role."""
        """The effective configuration: server.ini and flags, plus the options of created topics."""
        self._file_config = config
        self._started_config = config
        """The file's configuration the broker started with: what options a reload cannot apply keep from it."""
        self.filters: dict[str, MessageFilter] = {}
        """The server-side group filters in force, ``module:callable`` -> the callable (metaq.broker.filters):
        loaded by :meth:`load_filters` at start and again by every reload."""
        self._master_topics: tuple[dict[str, TopicConfig], dict[str, str]] | None = None
        """autoSyncMasterConfig: the master's topic sections and topic defaults, over this slave's file."""
        self.config_path = config_path
        self.cli_overrides = dict(overrides or {})
        self.handlers = dict(handlers)
        self.topic_options = TopicOptionsStore(config.data_path)
        self._created: dict[str, TopicConfig] = {}
        """Options of topics created with CreateTopic configs (as if server.ini had their sections)."""
        self.creating: set[str] = set()
        """Topics whose CreateTopic is storing their options (a second CreateTopic is refused)."""
        self.stats = BrokerStats()
        self.waiters = FetchWaiters(config.max_waiting_fetches, config.max_waiting_fetches_per_connection)
        self.logs = LogManager(config.data_path, config.broker_id, self._log_config(None),
                               load_in_parallel=config.load_message_stores_in_parallel,
                               max_open_files=config.max_open_files or MAX_OPEN_FILES_PROVISIONAL,
                               sync=self.stats.fsync_seconds.timed(sync),
                               syncfs_min_logs=config.syncfs_min_partitions,
                               syncfs_quiet_min_logs=config.syncfs_quiet_min_partitions,
                               use_syncfs=config.syncfs != "off",
                               sync_inline_max_logs=config.sync_inline_max_partitions,
                               sync_filesystem=self.stats.fsync_seconds.timed(syncfs))
        self.delay = DelayStore(config.data_path, config.broker_id, self._log_config(None),
                                max_delay_ms=config.max_delay_s * 1000, flusher=self.logs.flusher,
                                files=self.logs.files, sync=self.stats.fsync_seconds.timed(sync))
        """Delayed messages until due (docs/delayed.md); its deliverer runs as a service task."""
        self.stats.delayed = self.delay.describe
        self.stats.durability = self.logs.describe_syncs
        self.transactions: TransactionCoordinator | None = None
        """The transaction log and the transactions' states (docs/transactions.md): opened at start when
        the log exists, else by the first transaction request."""
        self._tx_sync = sync
        self.stats.transactions = lambda: self.transactions.describe() if self.transactions is not None else None
        self.partition_states = PartitionStateStore(config.data_path)
        self._partition_state_lock = asyncio.Lock()
        self.topics: dict[str, TopicState] = {}
        self.groups = GroupCoordinator(self.partition_refs, config.data_path, broker_id=config.broker_id)
        self.stopping = False
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.host = config.host_name
        """Where clients reach this broker (Metadata advertises it): the transport sets it once bound."""
        self.port = 0
        self.acls = Acls((), config.super_users)
        """The ACLs in force (aclEnabled): swapped in by metaq.broker.security_sources.refresh_acls."""
        self.credentials: Callable[[str], Any] | None = None
        """How SASL finds a user's stored credential (blocking; set on first use, metaq.broker.handlers.sasl)."""
        self.mock_credentials: MockCredentials | None = None
        """What an unknown user's login is answered with (security_sources.mock_credentials; set on first use)."""
        self.user_iterations: list[int] = []
        """The PBKDF2 iteration counts of the stored users (kept by metaq.broker.user_watch): unknown users'
        mock credentials take one of them."""
        self.sessions = SessionTable()
        """The connections authenticated by SASL, by principal: closed when their user is removed or its password
        changes (metaq.broker.user_watch)."""
        self.quotas = Quotas(lambda: self.config)
        """Byte rates and connection counts per principal (quota* options; docs/security.md#quotas)."""
        self.audit = audit.Audit(lambda: self.config)
        """The audit log (auditLog; :mod:`metaq.broker.audit`): ``self.audit(principal, operation, ...)``."""
        self.tls_port: int | None = None
        """The TLS port (sslPort) once bound; registered in ZooKeeper beside the plaintext one."""
        self.cluster_host = config.host_name
        """The host registered in the cluster (the service sets it at join)."""
        self.cluster = cluster if cluster is not None else ClusterLink.for_config(
            config, slave_id=slave.slave_id if slave is not None else -1)
        """This broker's place in its cluster (embedded, or ZooKeeper): registration and the cluster view."""

    # -- configuration ------------------------------------------------------------------------

    def _log_config(self, topic: str | None) -> LogConfig:
        c = self.config
        s = c.topic_settings(topic) if topic else None
        return LogConfig(
            segment_bytes_max=c.max_segment_bytes,
            unflush_threshold=s.unflush_threshold if s else c.unflush_threshold,
            unflush_interval_ms=s.unflush_interval_ms if s else c.unflush_interval_ms,
            delete_policy=s.delete_policy if s else c.delete_policy,
            max_message_bytes=c.max_message_bytes,
            max_batch_bytes=c.max_batch_bytes,
        )

    # -- topics and partitions ----------------------------------------------------------------

    def open(self) -> None:
        """Load existing partitions and the configured topics (blocking: call before serving)."""
        self.logs.open()
        self._created = self.topic_options.load()
        self.config = self._effective(self._file_config)
        for topic, partitions in self.logs.topics().items():
            self.logs.set_topic_config(topic, self._log_config(topic))
            self._topic_state(topic, max(partitions) + 1)
        for topic in self.config.topics:
            self.ensure_topic(topic, None)
        for topic, closed in self.partition_states.load().items():
            state = self.topics.get(topic)
            if state is not None:
                state.closed |= {p for p in closed if p < state.num_partitions}
                self.announce(topic)
        self.groups.open()
        self.delay.open(self.logs.get, self._delivered)
        if self.config.tx_log_dir.is_dir():
            self._open_transactions()

    def tx_coordinator(self) -> TransactionCoordinator:
        """The transactions, the log opened (created) on first use."""
        if self.transactions is None:
            self._open_transactions()
            assert self.transactions is not None
        return self.transactions

    def _open_transactions(self) -> None:
        c = self.config
        coordinator = TransactionCoordinator(
            TransactionLog(c.tx_log_dir, max_checkpoints=c.max_checkpoints, sync=self._tx_sync),
            max_timeout_s=c.max_tx_timeout_s, capacity=c.max_tx_timeout_timer_capacity,
            flush_at_commit=c.flush_tx_log_at_commit, checkpoint_interval_ms=c.checkpoint_interval_ms,
            check_first_ms=c.transaction_first_check_ms, check_interval_ms=c.transaction_check_interval_ms,
            check_max=c.transaction_check_max)
        self.transactions = coordinator
        for tx in coordinator.open():  # COMMIT logged, not all applied: finish it (duplicates are dropped)
            reapply_on_open(self, tx)

    def _delivered(self, topic: str, partition: int, count: int) -> None:
        """Delayed messages were appended to a partition: wake its long polls, count them in."""
        self.stats.partition(topic, partition).put_messages += count
        self.waiters.notify(topic, partition)

    def partition_refs(self, topic: str) -> list[tuple[int, int]]:
        """(broker id, partition) of a topic's partitions here, for the group coordinator."""
        state = self.topics.get(topic)
        return [(self.config.broker_id, p) for p in range(state.num_partitions)] if state else []

    def _topic_state(self, topic: str, num_partitions: int) -> TopicState:
        """Create or update a topic's state; a topic never shrinks (its partitions hold data)."""
        state = self.topics.get(topic)
        settings = self.config.topic_settings(topic)
        if state is None:
            state = self.topics[topic] = TopicState(settings, num_partitions)
        else:
            state.settings = settings
            state.num_partitions = max(state.num_partitions, num_partitions)
        return state

    def ensure_topic(self, topic: str, num_partitions: int | None) -> TopicState:
        """Open (creating if needed) every partition of a topic.

        ``num_partitions``: an explicit count (CreateTopic); None uses the topic's numPartitions — for a
        topic with a [topic=...] section that count also grows an existing topic on reload.
        """
        settings = self.config.topic_settings(topic)
        if num_partitions and num_partitions > 0:
            n = num_partitions
        elif topic in self.topics and not settings.configured:
            n = self.topics[topic].num_partitions
        else:
            n = settings.num_partitions
        self.logs.set_topic_config(topic, self._log_config(topic))
        state = self._topic_state(topic, n)
        for p in range(state.num_partitions):
            self.logs.get_or_create(topic, p)
        self.announce(topic)
        return state

    def announce(self, topic: str, *, force: bool = False) -> None:
        """Tell the cluster (in the background) what this broker now holds of ``topic`` (``force``: even
        if it was said already, after a change of role)."""
        state = self.topics.get(topic)
        if state is None:
            self.cluster.withdraw(topic)
            return
        every_partition_closed = len(state.closed) >= state.num_partitions
        self.cluster.publish(topic, state.num_partitions,
                             accept_publish=state.settings.accept_publish and not every_partition_closed,
                             accept_subscribe=state.settings.accept_subscribe, force=force)

    async def create_topic_with_options(self, options: TopicConfig) -> TopicState:
        """Store the options (off the event loop), then create the topic as if server.ini named it.

        The caller has put the topic in :attr:`creating`; it is taken out here, whatever happens.
        """
        topic = options.name
        loop = asyncio.get_running_loop()
        try:
            try:
                await loop.run_in_executor(None, self.topic_options.save, topic, topic_options_text(options))
            except OSError as exc:
                raise StorageFailureError(f"cannot store the options of topic {topic!r}: {exc}") from None
            self._created[topic] = options
            self.config = self._effective(self._file_config)
            try:
                state = self.ensure_topic(topic, options.num_partitions)
                self.announce_config()
                return state
            except Exception:  # no topic: no stored options either
                del self._created[topic]
                self.config = self._effective(self._file_config)
                await loop.run_in_executor(None, self.topic_options.remove, topic)
                raise
        finally:
            self.creating.discard(topic)

    def _closed_partitions(self) -> dict[str, set[int]]:
        return {name: set(state.closed) for name, state in self.topics.items() if state.closed}

    async def set_partitions_open(self, topic: str, partitions: list[int], open_: bool) -> None:
        """Open or close partitions of ``topic`` for publishing, stored durably (off the event loop)
        before the change is applied: once answered, a restart keeps it."""
        async with self._partition_state_lock:  # one write at a time, each from the state before it
            state = self.topics.get(topic)
            if state is None:
                raise UnknownTopicError(f"topic {topic!r} does not exist")
            closed = (state.closed - set(partitions)) if open_ else (state.closed | set(partitions))
            if closed != state.closed:
                wanted = self._closed_partitions()
                wanted[topic] = closed
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self.partition_states.save, wanted)
                except OSError as exc:
                    raise StorageFailureError(f"cannot store the state of {topic}'s partitions in "
                                              f"{self.partition_states.path}: {exc}") from None
                if self.topics.get(topic) is not state:  # deleted while we wrote: store it without the topic
                    with contextlib.suppress(OSError):
                        await asyncio.get_running_loop().run_in_executor(None, self.partition_states.save,
                                                                         self._closed_partitions())
                    raise UnknownTopicError(f"topic {topic!r} was deleted meanwhile")
                state.closed = closed
        self.announce(topic)  # a topic with every partition closed leaves topics-pub

    def delete_topic(self, topic: str) -> None:
        """Remove a topic here: its partitions' files, stored options and counters; its waiting fetches end."""
        state = self.topics.pop(topic)
        if state.closed:  # a topic created again later starts with every partition open
            try:
                self.partition_states.save(self._closed_partitions())
            except OSError as exc:
                log.warning("cannot update %s after deleting topic %s: %s", self.partition_states.path, topic, exc)
        self.announce(topic)  # withdrawn first: producers stop routing here before the files go
        self.logs.delete_topic(topic)
        if self._created.pop(topic, None) is not None:
            self.topic_options.remove(topic)
            self.config = self._effective(self._file_config)
        self.stats.forget_topic(topic)
        self.waiters.notify_all()

    def publish_refused(self, topic: str) -> str:
        """Why ``topic`` takes no messages (its acceptPublish is false) and what to change: the message of
        the produce refusal and of `metaq topic open`'s, which cannot override it."""
        own = self.config.topics.get(topic)
        if own is not None and own.accept_publish is not None:
            where = f"server.ini's [topic={topic}] section sets acceptPublish=false: set it to true"
        elif "acceptPublish" in self.cli_overrides:
            where = ("the broker was started with --acceptPublish false: restart it without the flag, or give "
                     f"[topic={topic}] acceptPublish=true in server.ini")
        else:
            where = (f"server.ini's [system] sets acceptPublish=false for every topic: set acceptPublish=true "
                     f"there or in a [topic={topic}] section")
        reload = ", then reload the broker (metaq admin reload, or SIGHUP)" if "restart" not in where else ""
        return f"topic {topic!r} does not accept publishing on broker {self.config.broker_id}: {where}{reload}"

    def audit_topic(self, operation: str, topic: str, session: Session | None, detail: str = "") -> None:
        """A topic created or deleted, in the audit log (who, from where)."""
        self.audit(session.principal if session is not None else None, operation, f"topic:{topic}", audit.DONE,
                   session.peer if session is not None else None, detail)

    def refuse_writes_on_slave(self, what: str) -> None:
        """NOT_MASTER for a write (produce, topic changes) sent to a slave: its log is the master's copy."""
        if self.ha is not None:
            self.ha.check_writable(what)
            return
        if self.slave is not None:
            raise NotMasterError(f"broker {self.config.broker_id} here is slave {self.slave.slave_id}: it serves "
                                 f"fetches but refuses {what}; send it to the master of broker id "
                                 f"{self.config.broker_id}")

    def partition_log(self, topic: str, partition: int) -> tuple[TopicState, PartitionLog]:
        """A partition's state and log; UNKNOWN_TOPIC / UNKNOWN_PARTITION when it does not exist here."""
        check_topic_name(topic)
        state = self.topics.get(topic)
        if state is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist on broker {self.config.broker_id}")
        if not 0 <= partition < state.num_partitions:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0..{state.num_partitions - 1} on this broker; got {partition}")
        plog = self.logs.get(topic, partition) or self.logs.get_or_create(topic, partition)
        return state, plog

    # -- lifecycle ----------------------------------------------------------------------------

    def request_started(self) -> None:
        """A transport started running a coroutine :meth:`handle` returned (drain waits for it)."""
        self.in_flight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def connection_closed(self, session: Session) -> None:
        """A transport's connection closed: a slave's replica connection going tells its master (HA mode)."""
        if session.replica_id >= 0 and self.ha is not None:
            self.ha.connection_closed(session)

    async def drain(self, timeout_s: float) -> None:
        """Wait until in-flight requests have been answered (bounded)."""
        self.stopping = True
        await self.groups.close()  # answers JoinGroups waiting for a rebalance
        self.waiters.notify_all()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    def close(self) -> None:
        try:
            self.delay.close()
            if self.transactions is not None:
                self.transactions.txlog.close()
        finally:
            self.logs.close()
