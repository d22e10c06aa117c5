"""The broker core: topics, partitions and their logs, consumer groups and request handling, with no network.

A transport (TCP: :mod:`metaq.broker.transport`; later HTTP, and the replica fetcher of the HA mode)
decodes a request and calls :meth:`Broker.handle` with it and the :class:`~metaq.broker.session.Session`
of its connection. The core finds the handler registered for the request's type (the registry of
:mod:`metaq.broker.handlers`), and whatever the handler raises becomes the API's own error response
through the one mapping of :mod:`metaq.broker.error_mapping`. Nothing here knows sockets or frames.

Lifecycle: :meth:`Broker.open` (blocking: loads every partition), serving, :meth:`Broker.drain`
(refuses new produces and fetches, answers what is in flight), :meth:`Broker.close` (flushes, writes
the clean-shutdown record). :class:`metaq.broker.service.BrokerService` runs it with its transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from metaq.broker import authorization
from metaq.broker.cluster import ClusterLink
from metaq.broker.committing import reapply_on_open
from metaq.broker.config import (
    BrokerConfig,
    TopicConfig,
    TopicSettings,
    diff_topics,
    keep_restart_options,
    merge_topic_configs,
    restart_required,
)
from metaq.broker.delay.store import DelayStore
from metaq.broker.error_mapping import error_response
from metaq.broker.filters import MessageFilter, load_filters
from metaq.broker.groups import GroupCoordinator
from metaq.broker.ini import load_broker_config, topic_options_text
from metaq.broker.options import MAX_OPEN_FILES_PROVISIONAL, SYSTEM_OPTIONS, TOPIC_ATTRS
from metaq.broker.partition_state import PartitionStateStore
from metaq.broker.quotas import FETCH, PRODUCE, Quotas
from metaq.broker.replica_access import replica_fetch_refusal
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.broker.session import DeferredReply, FileReply, Session
from metaq.broker.stats import BrokerStats
from metaq.broker.topic_options import TopicOptionsStore
from metaq.broker.transactions import TransactionCoordinator
from metaq.broker.waiters import FetchWaiters
from metaq.errors import (
    BrokerStoppingError,
    ConfigError,
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    NotMasterError,
    SaslAuthenticationError,
    StorageError,
    StorageFailureError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.fsutil import datasync, syncfs
from metaq.protocol import messages as m
from metaq.security.acl import Acls
from metaq.storage import LogConfig, LogManager, PartitionLog
from metaq.storage.txlog import TransactionLog
from metaq.types import validate_topic

log = logging.getLogger("metaq.broker")

Handler = Callable[["Broker", Any, Session | None], Any]
"""A request handler: (broker, request, session) -> the response, a FileReply, or a coroutine of one."""

REFUSED_WHILE_STOPPING: frozenset[type] = frozenset({m.ProduceRequest, m.MultiProduceRequest, m.FetchRequest,
                                                     m.MultiFetchRequest})
"""Requests a draining broker answers with BROKER_STOPPING (the others still work while it drains)."""
METERED: frozenset[type] = frozenset({m.ProduceRequest, m.MultiProduceRequest, m.FetchRequest, m.MultiFetchRequest})
"""Requests whose bytes count against the principal's quotas (metaq.broker.quotas); slaves' fetches do not.
A MultiFetch v0 reply has no throttle_time_ms (v1 has): its connection is muted all the same, the client not told."""
BEFORE_AUTHENTICATION: frozenset[type] = frozenset({m.ApiVersionsRequest, m.SaslHandshakeRequest,
                                                    m.SaslAuthenticateRequest})
"""What an unauthenticated connection may send when authRequired is set; anything else is refused and
the connection closed."""


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

    def replica_fetch(self, req: m.FetchRequest, plog: PartitionLog) -> tuple[dict[str, int], int]:
        """A slave's fetch: extra reply fields, and the offset the reply stops before (-1: none)."""

    def replica_reply(self, req: m.FetchRequest, plog: PartitionLog) -> tuple[dict[str, int], int]:
        """:meth:`replica_fetch`'s reply fields as of now (a long poll answered later), without its checks."""

    async def hand_over(self, replica_id: int, timeout_s: float) -> tuple[int, int]:
        """A planned switchover to ``replica_id`` (-1: any in-sync slave); (new master, its epoch)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Reloaded:
    """What a reload did: the topics whose settings changed, and the changed options it could not apply."""

    changed_topics: list[str]
    restart_required: list[str]


@dataclass
class TopicState:
    settings: TopicSettings
    num_partitions: int
    closed: set[int] = field(default_factory=set)
    """Partitions closed for publishing (MetaQ's `metaq topic close`): produce gets 403. Kept across
    restarts in the data directory (:mod:`metaq.broker.partition_state`)."""


class Broker:
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
        self.quotas = Quotas(lambda: self.config)
        """Byte rates and connection counts per principal (quota* options; docs/security.md#quotas)."""
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

    def _effective(self, file_config: BrokerConfig) -> BrokerConfig:
        """``file_config`` with the created topics' options as [topic=...] sections under its own.

        Where both set a key, server.ini's section wins: the operator's file is what a reload applies.
        A slave with autoSyncMasterConfig takes its master's topic options instead of its file's.
        """
        file_config = self._with_master_topics(file_config)
        if not self._created:
            return file_config
        topics = dict(self._created)
        for name, section in file_config.topics.items():
            topics[name] = merge_topic_configs(topics[name], section) if name in topics else section
        return dataclasses.replace(file_config, topics=topics)

    def _with_master_topics(self, file_config: BrokerConfig) -> BrokerConfig:
        if self._master_topics is None:
            return file_config
        topics, defaults = self._master_topics
        config = file_config.with_overrides(defaults) if defaults else file_config
        own_filters = {n: t.group_filters for n, t in file_config.topics.items() if t.group_filters}
        merged = {n: dataclasses.replace(t, group_filters=own_filters.get(n, {})) for n, t in topics.items()}
        return dataclasses.replace(config, topics=merged)

    def apply_master_topics(self, topics: Mapping[str, TopicConfig], defaults: Mapping[str, str]) -> list[str]:
        """autoSyncMasterConfig: take the master's topic options (its [topic=...] sections and the topic
        defaults of its [system]) in place of this slave's own, live, as a reload does; the topics affected.
        ConfigError (nothing changed) when they do not check out here."""
        previous = self._master_topics
        self._master_topics = (dict(topics), dict(defaults))
        try:
            return self._apply(self._file_config)
        except Exception:
            self._master_topics = previous
            raise

    def master_topics_document(self) -> dict[str, Any]:
        """What a master publishes for autoSyncMasterConfig slaves: its effective topic sections (server-side
        group filters left out: they name code, which a slave runs only from its own file) and the topic
        defaults of its [system]."""
        topics = {}
        for name, section in self.config.topics.items():
            topics[name] = {k: v for k, v in topic_options_text(section).items() if not k.startswith("group.")}
        defaults = {}
        for attr in TOPIC_ATTRS:
            opt = next(o for o in SYSTEM_OPTIONS.values() if o.attr == attr)
            value = getattr(self.config, attr)
            defaults[opt.key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return {"topics": topics, "defaults": defaults}

    def load_filters(self) -> None:
        """Import the server-side filters server.ini names (at start); ConfigError naming the one that fails."""
        self.filters = load_filters(self._file_config.topics)

    def reload_from_file(self) -> Reloaded:
        """Read server.ini again, with the start's flags over it, and apply its [topic=…] changes and the
        live [system] options; what it cannot apply (restart-only options) is reported, and the values
        the broker started with stay in force for them.

        The one reload path: SIGHUP and the Reload request (`metaq admin reload`) both come here, so they
        log the same lines and fail the same way. A file that is refused, or a server-side filter that
        cannot be loaded, changes nothing: one ERROR line, no traceback, and InvalidRequestError saying why.
        """
        path = self.config_path
        if not path:
            log.warning("reload ignored: the broker was started without -f server.ini")
            raise InvalidRequestError("the broker was started without -f server.ini: nothing to reload")
        try:
            new_config = load_broker_config(path, self.cli_overrides)
            filters = load_filters(new_config.topics)  # changed modules imported again
            pending = restart_required(self._started_config, new_config)
            changed = self._apply(keep_restart_options(self._started_config, new_config))
        except ConfigError as exc:  # the operator's mistake, not the broker's
            log.error("reload of %s refused: %s", path, exc)
            raise InvalidRequestError(f"{exc} (the running configuration is unchanged)") from None
        except StorageError as exc:  # a grown topic's new partition could not be created
            log.error("reload of %s failed: %s", path, exc)
            raise
        self.filters = filters
        log.info("reloaded %s: topics changed: %s", path, ", ".join(changed) or "none")
        if pending:
            log.warning("reload of %s: changed but applied only by a restart: %s", path, ", ".join(pending))
        self.announce_config()
        return Reloaded(changed, pending)

    def announce_config(self) -> None:
        """A master in ZooKeeper mode publishes its topic options (for autoSyncMasterConfig slaves)."""
        if self.slave is None and self.cluster.mode == "zookeeper":
            self.cluster.publish_config(self.master_topics_document())

    def _apply(self, new_config: BrokerConfig) -> list[str]:
        self._file_config = new_config
        new_config = self._effective(new_config)
        diff = diff_topics(self.config, new_config)
        self.config = new_config
        affected = set(self.topics) | set(new_config.topics) if diff.defaults_changed else set(diff.topics)
        for topic in sorted(affected):
            if topic in self.topics or topic in new_config.topics:
                self.ensure_topic(topic, None)
        return sorted(affected)

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

    # -- requests -------------------------------------------------------------------------------

    def handle(self, request: Any, session: Session | None = None, *, deferred: bool = False) -> Any:
        """The response to ``request``, or a coroutine of it; never raises (see error_mapping).

        ``session`` is the connection the request came on, as the handlers see it (a fetch counts its
        long polls against it). A coroutine answers its own errors too; only its cancellation is left
        to the caller. With ``deferred`` a waiting fetch comes back as a
        :class:`~metaq.broker.waiters.DeferredReply`, resolved (metered first) in the step of the append
        that wakes it; without it, as a coroutine awaiting that reply.
        """
        kind = type(request)
        if (session is not None and session.principal is None and self.config.auth_required
                and kind not in BEFORE_AUTHENTICATION):
            session.close_after_reply = True
            name = getattr(kind, "API_NAME", kind.__name__)
            return m.error_response(getattr(kind, "API_KEY", -1), SaslAuthenticationError.code,
                                    f"{name} refused: this broker requires authentication (authRequired) and "
                                    f"the connection has not authenticated; {SaslAuthenticationError.hint}")
        replica = kind is m.FetchRequest and request.replica_id >= 0
        try:
            if session is not None and self.config.acl_enabled and session.principal is not None:
                authorization.check(self.acls, session.principal, request)
            if replica:
                refusal = replica_fetch_refusal(self.config, request, session)
                if refusal is not None:
                    replica = False  # metered as the consumer's fetch it is
                    raise refusal
            handler = self.handlers.get(kind)
            if handler is None:
                raise InvalidRequestError(f"{kind.API_NAME} is not served by this broker version")
            if self.stopping and kind in REFUSED_WHILE_STOPPING:
                raise BrokerStoppingError(BrokerStoppingError.hint)
            result = handler(self, request, session)
            if kind is m.MetadataRequest and session is not None and self.config.acl_enabled \
                    and session.principal is not None:
                result = authorization.filter_metadata(self.acls, session.principal, request, result)
        except Exception as exc:
            result = error_response(kind.API_KEY, exc)
        metered = session is not None and kind in METERED and not replica
        if isinstance(result, DeferredReply):
            if metered:
                assert session is not None
                result.on_done(functools.partial(self._meter, request, session=session))
            return result if deferred else self._answer(kind.API_KEY, result.wait())
        if inspect.iscoroutine(result):
            return self._answer(kind.API_KEY, result, request if metered else None, session)
        if metered:
            assert session is not None
            self._meter(request, result, session)
        return result

    async def _answer(self, api_key: int, pending: Awaitable[Any], metered: Any = None,
                      session: Session | None = None) -> Any:
        try:
            result = await pending
        except Exception as exc:
            result = error_response(api_key, exc)
        if metered is not None and session is not None:
            self._meter(metered, result, session)
        return result

    def _meter(self, request: Any, result: Any, session: Session) -> None:
        """Count a produce's or a fetch's bytes against the principal's quota; the throttle into the reply."""
        if isinstance(request, m.ProduceRequest):
            throttle_ms = self.quotas.record(session, PRODUCE, len(request.records))
        elif isinstance(request, m.MultiProduceRequest):  # every batch's records, as that many Produces
            throttle_ms = self.quotas.record(session, PRODUCE, sum(len(p.records) for p in request.partitions))
        elif isinstance(request, m.MultiFetchRequest):
            fetched = sum(len(p.records) for p in getattr(result, "partitions", ()))
            throttle_ms = self.quotas.record(session, FETCH, fetched)
        else:
            nbytes = result.file_slice.size if isinstance(result, FileReply) else len(getattr(result, "records", b""))
            throttle_ms = self.quotas.record(session, FETCH, nbytes)
        if throttle_ms:
            response = result.response if isinstance(result, FileReply) else result
            if hasattr(response, "throttle_time_ms"):
                response.throttle_time_ms = throttle_ms

    # -- lifecycle ----------------------------------------------------------------------------

    def request_started(self) -> None:
        """A transport started running a coroutine :meth:`handle` returned (drain waits for it)."""
        self.in_flight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

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
