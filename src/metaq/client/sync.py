"""A thin synchronous facade for scripts: the asyncio client on an event loop in a daemon thread.

Every method hands its call to the loop thread (``asyncio.run_coroutine_threadsafe``) and waits for
the result; no client logic lives here. Each call crosses threads once, which costs tens of
microseconds: bulk data should go through ``send_batch`` (one crossing per batch) and
``iterate`` crosses once per fetch, not per message.

Callbacks given to ``send_async`` run on the client's loop thread: keep them short and never call
this facade from them (that would wait on the thread that has to answer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from metaq.client.admin import Admin, FindResult, MessageLocation, TopicDescription
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
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

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
    """Blocking wrapper of :class:`~metaq.client.producer.Producer`."""

    def __init__(self, lt: _LoopThread, producer: Producer) -> None:
        self._lt = lt
        self.producer = producer

    def send(self, message: Message, timeout_s: float | None = None) -> SendResult:
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
        return self._lt.call(self.producer.send_oneway, message)

    def send_batch(self, topic: str, items: Iterable[bytes | bytearray | Message], *,
                   partition: PartitionKey | None = None, timeout_s: float | None = None) -> BatchSendResult:
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
        """Returns the transaction's id."""
        return self._lt.run(self.producer.begin_transaction(timeout_s, producer_group))

    def commit(self) -> TransactionResult:
        return self._lt.run(self.producer.commit())

    def rollback(self) -> None:
        self._lt.run(self.producer.rollback())

    def transaction_status(self, transaction_id: str, broker_id: int | None = None) -> str:
        """How a transaction ended, as its broker tells (see Producer.transaction_status)."""
        return self._lt.run(self.producer.transaction_status(transaction_id, broker_id))

    # half messages (docs/transactions.md)
    def send_in_transaction(self, message: Message, execute: Callable[..., Any], producer_group: str,
                            timeout_s: float | None = None) -> tuple[str, str]:
        """``execute(message, transaction_id)`` runs in a worker thread of the client."""
        return self._lt.run(self.producer.send_in_transaction(message, execute, producer_group, timeout_s))

    def start_transaction_checker(self, producer_group: str, check: Callable[[str], Any]) -> TransactionChecker:
        """``check(transaction_id)`` runs in a worker thread of the client."""
        return self._lt.run(self.producer.start_transaction_checker(producer_group, check))

    def stop_transaction_checker(self, checker: TransactionChecker) -> None:
        self._lt.run(checker.stop())

    # XA: the DB-API two-phase-commit interface (docs/transactions.md)
    def tpc_begin(self, xid: Any, timeout_s: float | None = None) -> None:
        self._lt.run(self.producer.tpc_begin(xid, timeout_s))

    def tpc_prepare(self) -> None:
        self._lt.run(self.producer.tpc_prepare())

    def tpc_commit(self, xid: Any = None) -> None:
        self._lt.run(self.producer.tpc_commit(xid))

    def tpc_rollback(self, xid: Any = None) -> None:
        self._lt.run(self.producer.tpc_rollback(xid))

    def tpc_recover(self) -> list[Xid]:
        return self._lt.run(self.producer.tpc_recover())

    @property
    def rerouted_batches(self) -> int:
        """Batches moved to another partition after a failure that proved them not stored."""
        return self.producer.rerouted_batches

    def flush(self) -> None:
        self._lt.run(self.producer.flush())

    def close(self) -> None:
        self._lt.run(self.producer.close())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncPullConsumer:
    """Blocking wrapper of :class:`~metaq.client.consumer.PullConsumer`."""

    def __init__(self, lt: _LoopThread, consumer: PullConsumer) -> None:
        self._lt = lt
        self.consumer = consumer

    def get(self, topic: str, partition: PartitionKey, offset: int,
            max_bytes: int = DEFAULT_FETCH_MAX_BYTES) -> list[Message]:
        return self._lt.run(self.consumer.get(topic, partition, offset, max_bytes))

    def iterate(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                max_messages: int | None = None, stop_at_end: bool = False,
                on_out_of_range: OutOfRangePolicy = "raise", group: str = "") -> Iterator[Message]:
        """A blocking generator over :meth:`PullConsumer.iterate` (one thread crossing per fetch)."""
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
        """A blocking generator over :meth:`PullConsumer.iterate_columns` (one thread crossing per fetch)."""
        agen = self.consumer._iterate(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                      max_messages=max_messages, stop_at_end=stop_at_end,
                                      on_out_of_range=on_out_of_range, group=group, columns=True)
        for batches in self._blocking(agen):
            yield from batches

    def _blocking(self, agen: AsyncGenerator[Any, None]) -> Iterator[Any]:
        async def step() -> Any:
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (item := self._lt.run(step())) is not None:
                yield item
        finally:
            if not self._lt.stopped:
                self._lt.run(agen.aclose())

    def iterate_batches(self, topic: str, partition: PartitionKey, offset: StartOffset = "earliest", *,
                        max_wait_ms: int = DEFAULT_MAX_WAIT_MS, max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
                        max_messages: int | None = None, stop_at_end: bool = False,
                        on_out_of_range: OutOfRangePolicy = "raise", group: str = "") -> Iterator[list[Message]]:
        agen = self.consumer.iterate_batches(topic, partition, offset, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                             max_messages=max_messages, stop_at_end=stop_at_end,
                                             on_out_of_range=on_out_of_range, group=group)

        async def step() -> list[Message] | None:
            try:
                return await agen.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (batch := self._lt.run(step())) is not None:
                yield batch
        finally:
            if not self._lt.stopped:
                self._lt.run(agen.aclose())

    def offsets(self, topic: str, partition: PartitionKey) -> tuple[int, int]:
        return self._lt.run(self.consumer.offsets(topic, partition))

    def offset_for_time(self, topic: str, partition: PartitionKey, timestamp_ms: int) -> int:
        return self._lt.run(self.consumer.offset_for_time(topic, partition, timestamp_ms))

    def close(self) -> None:
        self._lt.run(self.consumer.close())

    def __enter__(self) -> SyncPullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncAdmin:
    """Blocking wrapper of :class:`~metaq.client.admin.Admin`."""

    def __init__(self, lt: _LoopThread, admin: Admin) -> None:
        self._lt = lt
        self.admin = admin

    def create_topic(self, topic: str, num_partitions: int = -1, configs: dict[str, str] | None = None, *,
                     broker_id: int | None = None) -> int:
        return self._lt.run(self.admin.create_topic(topic, num_partitions, configs, broker_id=broker_id))

    def delete_topic(self, topic: str, *, broker_id: int | None = None) -> None:
        self._lt.run(self.admin.delete_topic(topic, broker_id=broker_id))

    def broker_ids(self) -> list[int]:
        return self._lt.run(self.admin.broker_ids())

    def list_topics(self) -> dict[str, list[Partition]]:
        return self._lt.run(self.admin.list_topics())

    def describe_topic(self, topic: str) -> TopicDescription:
        return self._lt.run(self.admin.describe_topic(topic))

    def close_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        self._lt.run(self.admin.close_partition(topic, partition, broker_id=broker_id))

    def open_partition(self, topic: str, partition: PartitionKey = -1, *, broker_id: int | None = None) -> None:
        self._lt.run(self.admin.open_partition(topic, partition, broker_id=broker_id))

    def stats(self, topic: str | None = None, *, broker_id: int | None = None) -> dict[str, Any]:
        return self._lt.run(self.admin.stats(topic, broker_id=broker_id))

    def reload(self, *, broker_id: int | None = None) -> list[str]:
        return self._lt.run(self.admin.reload(broker_id=broker_id))

    def verify(self, topic: str | None = None, partition: PartitionKey = -1, *, broker_id: int | None = None,
               timeout_s: float = 3600.0) -> list[dict[str, Any]]:
        return self._lt.run(self.admin.verify(topic, partition, broker_id=broker_id, timeout_s=timeout_s))

    def lookup_message(self, message_id: MessageId | str) -> MessageLocation:
        return self._lt.run(self.admin.lookup_message(message_id))

    def find(self, topic: str, *, key: bytes | str | None = None, from_ms: int = -1, to_ms: int = -1,
             limit: int = 100, partition: PartitionKey = -1, timeout_s: float = 600.0) -> FindResult:
        return self._lt.run(self.admin.find(topic, key=key, from_ms=from_ms, to_ms=to_ms, limit=limit,
                                            partition=partition, timeout_s=timeout_s))

    def promote(self, *, broker_id: int | None = None, replica_id: int = -1,
                timeout_s: float = 30.0) -> tuple[int, int]:
        return self._lt.run(self.admin.promote(broker_id=broker_id, replica_id=replica_id, timeout_s=timeout_s))

    def list_offsets(self, topic: str, partition: PartitionKey, timestamp_ms: int = -1) -> int:
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
        self._lt.call(self.consumer.subscribe, topic, max_size, listener, message_filter)
        return self

    def complete_subscribe(self) -> None:
        self._lt.run(self.consumer.complete_subscribe())

    def commit(self) -> None:
        self._lt.run(self.consumer.commit())

    def assignment(self) -> list[Any]:
        return self._lt.call(self.consumer.assignment)

    def close(self) -> None:
        if not self._lt.stopped:
            self._lt.run(self.consumer.close())

    def __enter__(self) -> SyncGroupConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncSessionFactory:
    """Blocking wrapper of :class:`~metaq.client.session.MessageSessionFactory`. Use :func:`connect`."""

    def __init__(self, lt: _LoopThread, session: MessageSessionFactory) -> None:
        self._lt = lt
        self.session = session

    @classmethod
    def connect(cls, servers: str | list[str] | None = None, **config: Any) -> SyncSessionFactory:
        lt = _LoopThread()
        try:
            session = lt.run(MessageSessionFactory.connect(servers, **config))
        except BaseException:
            lt.stop()
            raise
        return cls(lt, session)

    @property
    def config(self) -> ClientConfig:
        return self.session.config

    def create_producer(self, selector: PartitionSelector | None = None, **producer_config: Any) -> SyncProducer:
        return SyncProducer(self._lt, self._lt.call(self.session.create_producer, selector, **producer_config))

    def create_async_producer(self, selector: PartitionSelector | None = None,
                              **producer_config: Any) -> SyncProducer:
        return SyncProducer(self._lt, self._lt.call(self.session.create_async_producer, selector,
                                                    **producer_config))

    def create_pull_consumer(self, *, verify_crc: bool = True) -> SyncPullConsumer:
        return SyncPullConsumer(self._lt, self._lt.call(self.session.create_pull_consumer, verify_crc=verify_crc))

    def create_consumer(self, config: Any, offset_storage: Any = None) -> SyncGroupConsumer:
        """A group consumer (``metaq.client.group.ConsumerConfig``), see docs/consumers.md."""
        return SyncGroupConsumer(self._lt, self._lt.call(self.session.create_consumer, config, offset_storage))

    def admin(self) -> SyncAdmin:
        return SyncAdmin(self._lt, self._lt.call(self.session.admin))

    def partitions(self, topic: str) -> list[Partition]:
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
