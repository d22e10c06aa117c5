"""Acks that wait for an fsync (unflushThreshold=1, group commit) are answered on the broker's event loop, once
the flusher's thread has completed their durable futures: in the order of their produces, and with the
storage error when the sync failed."""

from __future__ import annotations

import asyncio
import threading

from metaq.broker.appending import ack_when_durable
from metaq.errors import StorageError, StorageFailureError
from metaq.protocol import messages as m
from metaq.storage.flush import new_durable_future, resolve


def test_acks_made_durable_in_another_thread_are_answered_on_the_loop_in_order() -> None:
    async def main() -> None:
        loop_thread = threading.get_ident()
        futures = [new_durable_future() for _ in range(3)]
        replies = [ack_when_durable(f, m.ProduceResponse(partition=i, base_offset=10 * i))
                   for i, f in enumerate(futures)]
        answered: list[tuple[int, int]] = []
        for reply in replies:
            reply.on_done(lambda result: answered.append((threading.get_ident(), result.partition)))

        flusher = threading.Thread(target=lambda: [resolve(f) for f in futures])  # one flusher round
        flusher.start()
        flusher.join()
        assert answered == []  # never from the flusher's thread: the transport is not thread-safe
        results = await asyncio.wait_for(asyncio.gather(*(r.wait() for r in replies)), 10)
        assert [(r.partition, r.base_offset, r.error_code) for r in results] == [(0, 0, 0), (1, 10, 0), (2, 20, 0)]
        assert answered == [(loop_thread, 0), (loop_thread, 1), (loop_thread, 2)]

    asyncio.run(main())


def test_an_ack_whose_sync_failed_answers_the_storage_error() -> None:
    async def main() -> None:
        ok, failed = new_durable_future(), new_durable_future()
        good = ack_when_durable(ok, m.ProduceResponse(partition=0, base_offset=5))
        bad = ack_when_durable(failed, m.ProduceResponse(partition=1, base_offset=7))
        flusher = threading.Thread(target=lambda: (resolve(failed, StorageError("fdatasync: EIO")), resolve(ok)))
        flusher.start()
        flusher.join()
        bad_result, good_result = await asyncio.wait_for(asyncio.gather(bad.wait(), good.wait()), 10)
        assert bad_result.error_code == StorageFailureError.code
        assert "not made durable" in bad_result.error_message and "EIO" in bad_result.error_message
        assert (good_result.error_code, good_result.base_offset) == (0, 5)

    asyncio.run(main())


def test_an_ack_whose_connection_closed_first_is_dropped() -> None:
    async def main() -> None:
        durable = new_durable_future()
        reply = ack_when_durable(durable, m.ProduceResponse(partition=0))
        answered: list[object] = []
        reply.on_done(answered.append)
        reply.cancel()  # the transport lost the connection before the sync finished
        later = new_durable_future()
        marker = ack_when_durable(later, m.ProduceResponse(partition=1))
        resolve(durable)
        resolve(later)
        await asyncio.wait_for(marker.wait(), 10)  # acks are answered in order: the cancelled one came first
        assert answered == [] and reply.done

    asyncio.run(main())
