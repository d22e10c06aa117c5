"""A thin synchronous facade for scripts: the asyncio client on an event loop in a daemon thread.

Every method hands its call to the loop thread (``asyncio.run_coroutine_threadsafe``) and waits for
the result; no client logic lives here. Each call crosses threads once, which costs tens of
microseconds: bulk data should go through ``send_batch`` (one crossing per batch) and
``iterate`` crosses once per fetch, not per message.

Callbacks given to ``send_async`` run on the client's loop thread: keep them short and never call
this facade from them (that would wait on the thread that has to answer).

Signals: a call waiting for the loop thread is interrupted like any blocking call (Ctrl-C raises
KeyboardInterrupt, a signal handler's ``sys.exit()`` raises SystemExit, in the waiting thread); the
coroutine it waited for is then cancelled on the loop, and an iterator being left this way closes its
fetch loop only once that coroutine has stopped. Cleanup never replaces the exception that interrupted it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from metaq.client.admin import Admin, FindResult, MessageLocation, ReloadResult, TopicDescription
from metaq.client.config import ClientConfig
from metaq.client.consumer import (
    DEFAULT_FETCH_MAX_BYTES,
    DEFAULT_MAX_WAIT_MS,
    OutOfRangePolicy,
    PullConsumer,
    StartOffset,
)
from metaq.client.exceptions import ClientClosedError
from metaq.client.metadata import Partition
from metaq.client.producer import BatchSendResult, Producer
from metaq.client.selectors import PartitionSelector
from metaq.client.session import MessageSessionFactory
from metaq.client.transaction import TransactionChecker, TransactionError, TransactionResult, Xid
from metaq.errors import InvalidArgument
from metaq.protocol.records import MessageBatch
from metaq.types import Message, MessageId, PartitionKey, SendResult

T = TypeVar("T")

log = logging.getLogger("metaq.client.sync")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _LoopThread:
    """One event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._main, name="metaq-client-loop", daemon=True)
        self._stopped = False
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _check_thread(self) -> None:
        if self._stopped:
            raise ClientClosedError("the session is closed")
        if threading.current_thread() is self._thread:
            raise InvalidArgument("the sync client was called from its own event loop thread (a send_async "
                                  "callback?); use the async API there")

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        self._check_thread()
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except BaseException:
            fut.cancel()  # interrupted (Ctrl-C, a signal handler's exit, the timeout): stop the coroutine too
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a plain function on the loop thread (objects that need a running loop are made there)."""
        self._check_thread()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def go() -> None:
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(go)
        return fut.result()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


class SyncProducer:
    """Blocking wrapper of :class:`~metaq.client.Producer`."""

    def __init__(self, lt: _LoopThread, producer: Producer) -> None:
        self._lt = lt
        self.producer = producer

    def send(self, message: Message, timeout_s: float | None = None) -> SendResult:
        """Send one message and wait for its result (:meth:`Producer.send <metaq.client.Producer.send>`).

        Never raises for broker or network failures: check ``result.success`` and ``result.error``."""
        return self._lt.run(self.producer.send(message, timeout_s))

    def send_async(self, message: Message, callback: Callable[[SendResult], object] | None = None
                   ) -> concurrent.futures.Future[SendResult]:
        """The future completes with the SendResult; ``callback(result)`` runs on the client thread. Refused
        inside a transaction (TransactionError), as the asyncio producer's: use send there."""
        if self.producer.in_transaction:
            raise TransactionError("send_async cannot be used inside a transaction: use send (docs/transactions.md)")
        fut = self._lt.submit(self.producer.send(message))
        if callback is not None:
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else callback(f.result()))
        return fut

    def send_oneway(self, message: Message) -> SendResult:
        """Send without an acknowledgement (:meth:`Producer.send_oneway <metaq.client.Producer.send_oneway>`):
        the result's partition, offset and id are -1."""
        return self._lt.call(self.producer.send_oneway, message)

    def send_batch(self, topic: str, items: Iterable[bytes | bytearray | Message], *,
                   partition: PartitionKey | None = None, timeout_s: float | None = None) -> BatchSendResult:
        """Send many messages of one topic in as few frames as possible and wait for them all
        (:meth:`Producer.send_batch <metaq.client.Producer.send_batch>`): the fast path for bulk data."""
        return self._lt.run(self.producer.send_batch(topic, items, partition=partition, timeout_s=timeout_s))

    @contextlib.contextmanager
    def transaction(self, timeout_s: float | None = None, producer_group: str = "") -> Iterator[None]:
        """``with producer.transaction(): producer.send(...)``: commit on exit, roll back on an exception."""
        self.begin_transaction(timeout_s, producer_group)
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def begin_transaction(self, timeout_s: float | None = None, producer_group: str = "") -> str:
        """Start a local transaction: :meth:`send` puts messages into it until :meth:`commit` or :meth:`rollback`.
        Returns the transaction's id (what :meth:`transaction_status` takes)."""
        return self._lt.run(self.producer.begin_transaction(timeout_s, producer_group))

    def commit(self) -> TransactionResult:
        """Make the transaction's messages visible, all at once; returns where they were stored."""
        return self._lt.run(self.producer.commit())

    def rollback(self) -> None:
        """Drop the transaction's messages; none is ever visible."""
        self._lt.run(self.producer.rollback())

    def transaction_status(self, transaction_id: str, broker_id: int | None = None) -> str:
        """How a transaction ended, as its broker tells (see Producer.transaction_status)."""
        return self._lt.run(self.producer.transaction_status(transaction_id, broker_id))

    # half messages (docs/transactions.md)
    def send_in_transaction(self, message: Message, execute: Callable[..., Any], producer_group: str,
                            timeout_s: float | None = None) -> tuple[str, str]:
        """``execute(message, transaction_id)`` runs in a worker thread of the client."""
        return self._lt.run(self.producer.send_in_transaction(message, execute, producer_group, timeout_s))

    def start_transaction_checker(self, producer_group: str, check: Callable[..., Any]) -> TransactionChecker:
        """``check(message, transaction_id)`` or ``check(transaction_id)`` runs in a worker thread of the client."""
        return self._lt.run(self.producer.start_transaction_checker(producer_group, check))

    def stop_transaction_checker(self, checker: TransactionChecker) -> None:
        """Stop answering check-backs with ``checker`` (from :meth:`start_transaction_checker`)."""
        self._lt.run(checker.stop())

    # XA: the DB-API two-phase-commit interface (docs/transactions.md)
    def tpc_begin(self, xid: Any, timeout_s: float | None = None) -> None:
        """XA: start a transaction branch named by ``xid``
        (:meth:`Producer.tpc_begin <metaq.client.Producer.tpc_begin>`)."""
        self._lt.run(self.producer.tpc_begin(xid, timeout_s))

    def tpc_prepare(self) -> None:
        """XA: prepare the current branch (its messages are stored, still invisible)."""
        self._lt.run(self.producer.tpc_prepare())

    def tpc_commit(self, xid: Any = None) -> None:
        """XA: commit the current branch, or, with ``xid``, a prepared branch found by :meth:`tpc_recover`."""
        self._lt.run(self.producer.tpc_commit(xid))

    def tpc_rollback(self, xid: Any = None) -> None:
        """XA: roll back the current branch, or, with ``xid``, a prepared branch found by :meth:`tpc_recover`."""
        self._lt.run(self.producer.tpc_rollback(xid))

    def tpc_recover(self) -> list[Xid]:
        """XA: the prepared branches on every broker the session knows (MetaQ's ``recover()``)."""
        return self._lt.run(self.producer.tpc_recover())

    @property
    def rerouted_batches(self) -> int:
        """Batches moved to another partition after a failure that proved them not stored."""
        return self.producer.rerouted_batches

    def flush(self) -> None:
        """Send everything buffered now and wait until each batch is acknowledged or has failed."""
        self._lt.run(self.producer.flush())

    def close(self) -> None:
        """Flush, then refuse further sends (:class:`~metaq.errors.ClientClosedError`). Idempotent."""
        self._lt.run(self.producer.close())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPullConsumer:
    """Blocking wrapper of :class:`~metaq.client.PullConsumer`."""

    def __init__(self, lt: _LoopThread, consumer: PullConsumer) -> None:
        self._lt = lt
        self.consumer = consumer

    def get(self, topic: str, partition: PartitionKey, offset: int,
            max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> list[Message]:
        """Messages from ``offset`` on, at most about ``max_bytes`` of them; ``[]`` at the end. No waiting.

        Raises :class:`~metaq.errors.OffsetOutOfRangeError` (with ``earliest``/``latest``) for an offset outside
        the partition."""
        return self._lt.run(self.consumer.get(topic, partition, offset, max_bytes))

    def iterate(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                max_messages: int | None = None, stop_at_end: bool = False,
                on_out_of_range: OutOfRangePolicy = "raise", group: str = "") -> Iterator[Message]:
        """A blocking generator over :meth:`PullConsumer.iterate <metaq.client.PullConsumer.iterate>` (one thread
        crossing per fetch): the messages of one partition in offset order, from ``offset`` (``"earliest"``,
        ``"latest"`` or a number); ``stop_at_end=True`` ends it at the end of the partition instead of waiting
        for more (long polling)."""
        agen = self.consumer._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                      max_messages=max_messages, stop_at_end=stop_at_end,
                                      on_out_of_range=on_out_of_range, group=group, columns=True)
        for batches in self._blocking(agen):
            for batch in batches:
                yield from batch  # Messages built one at a time (see PullConsumer.iterate)

    def iterate_columns(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                        max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                        max_messages: int | None = None, stop_at_end: bool = False,
                        on_out_of_range: OutOfRangePolicy = "raise", group: str = "") -> Iterator[MessageBatch]:
        """A blocking generator over
        :meth:`PullConsumer.iterate_columns <metaq.client.PullConsumer.iterate_columns>` (one thread crossing per
        fetch): one :class:`~metaq.client.MessageBatch` per stored batch."""
        agen = self.consumer._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                      max_messages=max_messages, stop_at_end=stop_at_end,
                                      on_out_of_range=on_out_of_range, group=group, columns=True)
        for batches in self._blocking(agen):
            yield from batches

    def _blocking(self, agen: AsyncGenerator[Any, None]) -> Iterator[Any]:
        """Items of ``agen``, one loop-thread crossing each. Left early (a break, an exception, a signal
        while waiting), the step in progress is cancelled and awaited on the loop before ``agen`` is
        closed: closing a generator still running raises RuntimeError, which would hide the interrupt."""
        running: list[asyncio.Task[Any]] = []

        async def step() -> Any:
            task = asyncio.current_task()
            assert task is not None
            running[:] = [task]
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return None

        async def close() -> None:
            for task in running:
                if not task.done():
                    task.cancel()
                with contextlib.suppress(BaseException):  # its end is the interrupt's business, not ours
                    await task
            await agen.aclose()

        try:
            while (item := self._lt.run(step())) is not None:
                yield item
        finally:
            if not self._lt.stopped:
                try:
                    self._lt.run(close())
                except Exception as exc:  # never replace the exception (or signal) that is ending the loop
                    log.debug("closing an iterator's fetch loop failed: %r", exc)

    def iterate_batches(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                        max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                        max_messages: int | None = None, stop_at_end: bool = False,
                        on_out_of_range: OutOfRangePolicy = "raise", group: str = "") -> Iterator[list[Message]]:
        """As :meth:`iterate`, one non-empty list of messages per fetch (cheaper per message)."""
        agen = self.consumer.iterate_batches(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                             max_messages=max_messages, stop_at_end=stop_at_end,
                                             on_out_of_range=on_out_of_range, group=group)
        yield from self._blocking(agen)

    def offsets(self, topic: str, partition: PartitionKey) -> tuple[int, int]:
        """``(earliest, latest)``: the first stored offset and the next offset to be written."""
        return self._lt.run(self.consumer.offsets(topic, partition))

    def offset_for_time(self, topic: str, partition: PartitionKey, timestamp_ms: int) -> int:
        """The first offset whose message timestamp is at or after ``timestamp_ms`` (latest if none)."""
        return self._lt.run(self.consumer.offset_for_time(topic, partition, timestamp_ms))

    def close(self) -> None:
        """Stop this consumer's fetches. The session stays open."""
        self._lt.run(self.consumer.close())

    def __enter__(self) -> SyncPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncAdmin:
    """Blocking wrapper of :class:`~metaq.client.Admin`."""

    def __init__(self, lt: _LoopThread, admin: Admin) -> None:
        self._lt = lt
        self.admin = admin

    def create_topic(self, topic: str, num_partitions: int = -1, configs: dict[str, str] | None = None, *,
                     broker_id: int | None = None) -> int:
        """Create a topic (-1 partitions: the broker's ``numPartitions``); returns its partition count.

        ``configs`` are MetaQ topic options (``{"deletePolicy": "delete,24h"}``);
        :class:`~metaq.errors.TopicExistsError` if it exists."""
        return self._lt.run(self.admin.create_topic(topic, num_partitions, configs, broker_id=broker_id))

    def delete_topic(self, topic: str, *, broker_id: int | None = None) -> None:
        """Delete a topic and its data on a broker (:class:`~metaq.errors.UnknownTopicError` if there is none)."""
        self._lt.run(self.admin.delete_topic(topic, broker_id=broker_id))

    def broker_ids(self) -> list[int]:
        """The ids of the brokers this session knows."""
        return self._lt.run(self.admin.broker_ids())

    def list_topics(self) -> dict[str, list[Partition]]:
        """Every topic the brokers know, with its partitions in (broker id, partition) order."""
        return self._lt.run(self.admin.list_topics())

    def describe_topic(self, topic: str) -> TopicDescription:
        """The topic's partitions with their earliest and latest offsets."""
        return self._lt.run(self.admin.describe_topic(topic))

    def close_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        """Stop accepting publishes (MetaQ's ``topic close``); -1: every partition. Reads still work."""
        self._lt.run(self.admin.close_partition(topic, partition, broker_id=broker_id))

    def open_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        """Accept publishes again (-1: every partition)."""
        self._lt.run(self.admin.open_partition(topic, partition, broker_id=broker_id))

    def stats(self, topic: str | None = None, *, broker_id: int | None = None) -> dict[str, Any]:
        """The broker's statistics (uptime, per topic and partition counts, bytes, offsets)."""
        return self._lt.run(self.admin.stats(topic, broker_id=broker_id))

    def reload(self, *, broker_id: int | None = None) -> ReloadResult:
        """Make the broker re-read its server.ini: the topics whose settings changed, and in
        ``restart_required`` the changed keys that take effect only after a restart."""
        return self._lt.run(self.admin.reload(broker_id=broker_id))

    def verify(self, topic: str | None = None, partition: PartitionKey = -1, *, broker_id: int | None = None,
               timeout_s: float = 3600.0) -> list[dict[str, Any]]:
        """Have a broker check every stored byte and index entry; one report per partition
        (:meth:`Admin.verify <metaq.client.Admin.verify>`). Slow on big logs: it reads everything once."""
        return self._lt.run(self.admin.verify(topic, partition, broker_id=broker_id, timeout_s=timeout_s))

    def lookup_message(self, message_id: MessageId | str) -> MessageLocation:
        """Where a message id points: topic, partition, offset."""
        return self._lt.run(self.admin.lookup_message(message_id))

    def find(self, topic: str, *, key: bytes | str | None = None, from_ms: int = -1, to_ms: int = -1,
             limit: int = 100, partition: PartitionKey = -1, timeout_s: float = 600.0) -> FindResult:
        """Messages of ``topic`` by key and/or timestamp range (:meth:`Admin.find <metaq.client.Admin.find>`)."""
        return self._lt.run(self.admin.find(topic, key=key, from_ms=from_ms, to_ms=to_ms, limit=limit,
                                            partition=partition, timeout_s=timeout_s))

    def promote(self, *, broker_id: int | None = None, replica_id: int = -1,
                timeout_s: float = 30.0) -> tuple[int, int]:
        """Planned switchover of a replica group's master to a slave; returns (new master's replica id, its
        epoch) (:meth:`Admin.promote <metaq.client.Admin.promote>`)."""
        return self._lt.run(self.admin.promote(broker_id=broker_id, replica_id=replica_id, timeout_s=timeout_s))

    def list_offsets(self, topic: str, partition: PartitionKey, timestamp_ms: int = -1) -> int:
        """-2: the earliest offset; -1: the latest (next to be written); else the first offset at or after the
        timestamp."""
        return self._lt.run(self.admin.list_offsets(topic, partition, timestamp_ms))


class SyncGroupConsumer:
    """Blocking wrapper of the group (listener) consumer: MetaQ's shape for scripts.

    ``subscribe(...)`` then ``complete_subscribe()``; listeners run as in the async consumer (sync
    listeners in its thread pool). ``close()`` commits and leaves the group.
    """

    def __init__(self, lt: _LoopThread, consumer: Any) -> None:
        self._lt = lt
        self.consumer = consumer

    def subscribe(self, topic: str, max_size: int, listener: Any, message_filter: Any = None) -> SyncGroupConsumer:
        """Subscribe to ``topic``: ``listener(message)`` (or ``listener(message, ctx)``) is called for each
        message, fetched ``max_size`` bytes at a time; ``message_filter`` drops messages before the listener.
        Returns the consumer, so calls chain. Takes effect at :meth:`complete_subscribe`."""
        self._lt.call(self.consumer.subscribe, topic, max_size, listener, message_filter)
        return self

    def complete_subscribe(self) -> None:
        """Join the group and start delivering to the listeners (in the background)."""
        self._lt.run(self.consumer.complete_subscribe())

    def commit(self) -> None:
        """Commit the acknowledged offsets now (they are also committed every ``commit_offset_period_ms``)."""
        self._lt.run(self.consumer.commit())

    def assignment(self) -> list[Any]:
        """The partitions this member owns now."""
        return self._lt.call(self.consumer.assignment)

    def close(self) -> None:
        """Commit, leave the group (its partitions move to the other members) and stop."""
        if not self._lt.stopped:
            self._lt.run(self.consumer.close())

    def __enter__(self) -> SyncGroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncSessionFactory:
    """Blocking wrapper of :class:`~metaq.client.MessageSessionFactory`. Use :func:`connect`."""

    def __init__(self, lt: _LoopThread, session: MessageSessionFactory) -> None:
        self._lt = lt
        self.session = session

    @classmethod
    def connect(cls, servers: str | list[str] | None = None, **config: Any) -> SyncSessionFactory:
        """Reach the first answering server of ``"host:port[,host:port]"`` (or, with ``zk_connect``, the
        brokers registered in ZooKeeper); ``config`` takes :class:`~metaq.client.config.ClientConfig` options."""
        lt = _LoopThread()
        try:
            session = lt.run(MessageSessionFactory.connect(servers, **config))
        except BaseException:
            lt.stop()
            raise
        return cls(lt, session)

    @property
    def config(self) -> ClientConfig:
        """The session's settings."""
        return self.session.config

    def create_producer(self, selector: PartitionSelector | None = None, **producer_config: Any) -> SyncProducer:
        """A producer; ``selector`` picks partitions (default: round robin). ``producer_config`` takes
        :class:`~metaq.client.config.ProducerConfig` options (``linger_ms``, ``compression``, ``acks``, ...)."""
        return SyncProducer(self._lt, self._lt.call(self.session.create_producer, selector, **producer_config))

    def create_async_producer(self, selector: PartitionSelector | None = None,
                              **producer_config: Any) -> SyncProducer:
        """MetaQ's async producer: every send is one-way (``acks=0``, results -1)."""
        return SyncProducer(self._lt, self._lt.call(self.session.create_async_producer, selector,
                                                    **producer_config))

    def create_pull_consumer(self, *, verify_crc: bool = True) -> SyncPullConsumer:
        """A consumer that reads partitions from offsets you choose (no group)."""
        return SyncPullConsumer(self._lt, self._lt.call(self.session.create_pull_consumer, verify_crc=verify_crc))

    def create_consumer(self, config: Any, offset_storage: Any = None) -> SyncGroupConsumer:
        """A group consumer (``metaq.client.group.ConsumerConfig``), see docs/consumers.md."""
        return SyncGroupConsumer(self._lt, self._lt.call(self.session.create_consumer, config, offset_storage))

    def admin(self) -> SyncAdmin:
        """Topics, partitions, statistics, message lookups, switchovers."""
        return SyncAdmin(self._lt, self._lt.call(self.session.admin))

    def partitions(self, topic: str) -> list[Partition]:
        """The topic's partitions in (broker id, partition) order, freshly fetched; ``[]`` if unknown."""
        return self._lt.run(self.session.partitions(topic))

    def close(self) -> None:
        """Flush producers, close everything, stop the loop thread. Idempotent."""
        if self._lt.stopped:
            return
        try:
            self._lt.run(self.session.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> SyncSessionFactory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(servers: str | list[str] | None = None, **config: Any) -> SyncSessionFactory:
    """A synchronous session: ``with connect("127.0.0.1:8123") as session: ...``."""
    return SyncSessionFactory.connect(servers, **config)
