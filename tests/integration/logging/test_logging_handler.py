"""metaq.logging.MetaqHandler against real broker processes: delivery, a broker that is down, bounds."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metaq.client import connect
from metaq.logging import MetaqHandler
from metaq.testing.broker import BrokerProcess, wait_until
from metaq.testing.ports import unused_port

TOPIC = "app-logs"


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """An application logger whose only handler is the one under test.

    The name is made unique and the logger created on first use in the test body (pytest attaches
    its capture handler to the non-propagating loggers that exist when the test starts).
    """
    log = _LazyLogger()
    yield log  # type: ignore[misc]
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


class _LazyLogger:
    def __init__(self) -> None:
        self._log: logging.Logger | None = None

    def __getattr__(self, name: str) -> Any:
        if self._log is None:
            self._log = logging.getLogger(f"metaq-test-{time.monotonic_ns()}")
            self._log.setLevel(logging.DEBUG)
            self._log.propagate = False
        return getattr(self._log, name)


def _read_all(servers: str, topic: str = TOPIC) -> list[Any]:
    """Every message of the topic (all partitions), in partition order."""
    with connect(servers) as session:
        consumer = session.create_pull_consumer()
        return [m for p in session.partitions(topic)
                for m in consumer.iterate(topic, p, "earliest", stop_at_end=True)]


def _seqs(messages: list[Any]) -> Counter[int]:
    return Counter(json.loads(m.data)["seq"] for m in messages)


def _wait_for_all(servers: str, expected: int, timeout_s: float = 60) -> list[Any]:
    def got() -> list[Any] | None:
        try:
            msgs = _read_all(servers)
        except Exception:
            return None
        return msgs if len(_seqs(msgs)) >= expected else None
    result: list[Any] = wait_until(got, timeout_s, interval_s=0.2, message=f"{expected} records in the topic")
    return result


def _log_many(log: logging.Logger, n: int, first: int = 0) -> None:
    """Log n records (seq first..first+n-1)."""
    for i in range(first, first + n):
        log.info("request %d served", i, extra={"seq": i, "path": f"/api/orders/{i % 7}"})


def test_records_arrive_with_fields_attribute_and_key(broker: BrokerProcess, logger: logging.Logger) -> None:
    handler = MetaqHandler(broker.servers, TOPIC, key_func=lambda r: f"req-{r.seq}")  # type: ignore[attr-defined]
    logger.addHandler(handler)
    _log_many(logger, 1500)
    logger.warning("disk almost full", extra={"seq": 1500, "free_mb": 12})
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("order failed", extra={"seq": 1501})
    assert handler.drain(30)
    msgs = _read_all(broker.servers)
    assert _seqs(msgs) == Counter(range(1502))
    by_seq = {json.loads(m.data)["seq"]: m for m in msgs}
    doc = json.loads(by_seq[7].data)
    assert doc["message"] == "request 7 served" and doc["level"] == "INFO" and doc["path"] == "/api/orders/0"
    assert doc["logger"] == logger.name and doc["timestamp"].endswith("Z")
    assert by_seq[7].attribute == "INFO" and by_seq[7].key == b"req-7"
    assert by_seq[1500].attribute == "WARNING" and json.loads(by_seq[1500].data)["free_mb"] == 12
    assert "ValueError: boom" in json.loads(by_seq[1501].data)["exception"]
    assert by_seq[1501].attribute == "ERROR"
    stats = handler.stats()
    assert (stats.accepted, stats.sent, stats.dropped, stats.pending) == (1502, 1502, 0, 0)


def test_broker_down_logging_returns_and_records_arrive_later(tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    handler = MetaqHandler(f"127.0.0.1:{port}", TOPIC, retry_backoff_max_s=0.5, error_interval_s=60)
    logger.addHandler(handler)
    _log_many(logger, 10_000)  # nothing listens on the port: every connection attempt is refused
    assert handler.stats().pending == 10_000 and handler.stats().sent == 0
    with BrokerProcess(tmp_path / "broker", {"numPartitions": 2}, port=port) as broker:
        msgs = _wait_for_all(broker.servers, 10_000)
        # nothing was ever half-stored (connections were refused), so nothing is sent twice
        assert _seqs(msgs) == Counter(range(10_000))
        assert handler.drain(10)
        assert handler.stats().sent == 10_000 and handler.stats().dropped == 0


def test_emit_never_waits_for_a_broker_that_does_not_answer(broker: BrokerProcess, logger: logging.Logger) -> None:
    # A stopped broker accepts connections (the kernel does) and never answers: the worst case for a
    # caller that waited on the network. The application's logging calls all return while it is stopped.
    handler = MetaqHandler(broker.servers, TOPIC, batch_records=100, error_interval_s=60)
    logger.addHandler(handler)
    _log_many(logger, 100)
    assert handler.drain(30), "records flow while the broker answers"
    broker.signal(signal.SIGSTOP)
    try:
        app = threading.Thread(target=_log_many, args=(logger, 10_000, 100))
        app.start()
        app.join(60)
        assert not app.is_alive(), "emit() blocked while the broker was stopped"
        stats = handler.stats()
        assert (stats.accepted, stats.dropped) == (10_100, 0)
        assert (stats.sent, stats.pending) == (100, 10_000), "nothing is acknowledged while the broker is stopped"
    finally:
        broker.signal(signal.SIGCONT)
    assert handler.drain(60)
    assert _seqs(_read_all(broker.servers)).keys() == set(range(10_100))


def test_broker_killed_mid_stream_at_least_once(tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    broker = BrokerProcess(tmp_path / "broker", {"numPartitions": 2, "unflushThreshold": 0}, port=port).start()
    handler = MetaqHandler(broker.servers, TOPIC, batch_records=200, retry_backoff_max_s=0.5, error_interval_s=60)
    logger.addHandler(handler)
    try:
        stop = threading.Event()
        logged = [0]

        def app() -> None:
            while not stop.is_set() and logged[0] < 200_000:
                _log_many(logger, 50, logged[0])
                logged[0] += 50
                time.sleep(0.001)

        t = threading.Thread(target=app)
        t.start()
        wait_until(lambda: handler.stats().sent > 3000, 30, message="records flowing")
        broker.kill()  # SIGKILL while batches are in flight
        errors = handler.stats().send_errors
        wait_until(lambda: handler.stats().send_errors > errors, 30, message="the handler to notice")
        broker.start()
        wait_until(lambda: handler.stats().sent > logged[0] // 2 + 3000, 30, message="records flowing again")
        stop.set()
        t.join()
        assert handler.drain(30)
        counts = _seqs(_read_all(broker.servers))
        assert set(counts) == set(range(logged[0])), "every logged record arrives"
        duplicates = sum(c - 1 for c in counts.values())
        # only a batch in flight when the broker died can be stored twice (at-least-once)
        assert duplicates <= 200 * 4, duplicates
    finally:
        broker.stop()


def test_memory_bound_drops_oldest_without_spill_dir(tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    handler = MetaqHandler(f"127.0.0.1:{port}", TOPIC, max_buffered_records=1000, batch_records=100,
                           retry_backoff_max_s=0.3, error_interval_s=60)
    logger.addHandler(handler)
    _log_many(logger, 5000)
    stats = handler.stats()
    assert stats.pending <= 1000 + 100 and stats.dropped >= 5000 - 1100
    assert stats.pending + stats.dropped == 5000
    with BrokerProcess(tmp_path / "broker", {"numPartitions": 2}, port=port) as broker:
        assert handler.drain(30)
        counts = _seqs(_read_all(broker.servers))
        assert sum(counts.values()) == len(counts) == 5000 - handler.stats().dropped
        assert set(range(4000, 5000)) <= set(counts), "the newest records are kept"


def test_spill_dir_keeps_everything_beyond_the_memory_bound(tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    handler = MetaqHandler(f"127.0.0.1:{port}", TOPIC, max_buffered_records=500, batch_records=100,
                           spill_dir=tmp_path / "spill", retry_backoff_max_s=0.3, error_interval_s=60)
    logger.addHandler(handler)
    _log_many(logger, 5000)
    stats = handler.stats()
    assert stats.dropped == 0 and stats.spilled >= 4000 and stats.pending == 5000
    with BrokerProcess(tmp_path / "broker", {"numPartitions": 2}, port=port) as broker:
        assert handler.drain(30)
        assert _seqs(_read_all(broker.servers)) == Counter(range(5000))
    assert not list((tmp_path / "spill").glob("*.spill")), "sent spill files are removed"


def test_close_keeps_unsent_records_for_the_next_handler(tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    spill = tmp_path / "spill"
    first = MetaqHandler(f"127.0.0.1:{port}", TOPIC, spill_dir=spill, error_interval_s=60)
    logger.addHandler(first)
    _log_many(logger, 300)
    closing = threading.Thread(target=first.close, kwargs={"timeout": 0.5})
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close() gives up on a broker that is down"
    assert first.stats().dropped == 0 and list(spill.glob("*.spill"))
    logger.removeHandler(first)
    with BrokerProcess(tmp_path / "broker", {"numPartitions": 2}, port=port) as broker:
        second = MetaqHandler(broker.servers, TOPIC, spill_dir=spill)
        logger.addHandler(second)
        _log_many(logger, 10, first=300)
        assert second.drain(30)
        assert _seqs(_read_all(broker.servers)) == Counter(range(310))


def test_the_application_never_sees_an_exception(tmp_path: Path, logger: logging.Logger,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def bad_key(record: logging.LogRecord) -> str:
        if getattr(record, "seq", 0) == 3:
            raise RuntimeError("key_func bug")
        return "k"

    handler = MetaqHandler(f"127.0.0.1:{unused_port()}", TOPIC, key_func=bad_key, error_interval_s=60,
                           retry_backoff_max_s=0.2)
    logger.addHandler(handler)
    logger.info("%d apples", "not a number")  # a formatting error in the application's call
    _log_many(logger, 5)                       # record 3 makes key_func raise
    handler.flush(0.3)                         # broker down: returns after the bound
    handler.close(timeout=0.2)
    logger.info("after close", extra={"seq": 99})  # counted as dropped, silently
    stats = handler.stats()
    assert stats.failed == 2 and stats.accepted == 4 and stats.dropped == 5
    err = capsys.readouterr().err
    assert err.count("metaq.logging.MetaqHandler") <= 2, err  # rate-limited, not one line per problem


def test_records_of_the_handlers_own_thread_are_not_queued(broker: BrokerProcess,
                                                           logger: logging.Logger) -> None:
    # A handler on the root logger also sees the metaq client's own log records; the ones its
    # background thread produces must not be fed back into it.
    handler = MetaqHandler(broker.servers, TOPIC)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        logging.getLogger("metaq.client.test").warning("from the app thread", extra={"seq": 0})
        logged = threading.Event()

        def from_the_handler_thread() -> None:
            logging.getLogger("metaq.client.test").warning("from the handler thread", extra={"seq": 1})
            logged.set()

        handler._loop.call_soon_threadsafe(from_the_handler_thread)  # type: ignore[union-attr]
        assert logged.wait(10)
        assert handler.drain(10)
        assert _seqs(_read_all(broker.servers)) == Counter([0])
    finally:
        root.removeHandler(handler)
        handler.close()



KILLED_APP = """
import logging, sys, time
from metaq.logging import MetaqHandler
handler = MetaqHandler(sys.argv[1], "app-logs", max_buffered_records=100, batch_records=1000,
                       spill_dir=sys.argv[2], retry_backoff_max_s=0.3, error_interval_s=600)
log = logging.getLogger("app")
log.addHandler(handler)
log.setLevel(logging.INFO)
log.propagate = False
for i in range(800):
    log.info("request %d served", i, extra={"seq": i, "path": f"/api/orders/{i % 7}"})
print(handler.stats().spilled, flush=True)
time.sleep(600)  # killed here, with everything above still in its hands
"""


def test_records_spilled_before_the_application_is_killed_are_sent_by_the_next_handler(
        tmp_path: Path, logger: logging.Logger) -> None:
    port = unused_port()
    spill = tmp_path / "spill"
    app = subprocess.Popen([sys.executable, "-c", KILLED_APP, f"127.0.0.1:{port}", str(spill)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert app.stdout is not None
        assert app.stdout.readline().strip() == "700"  # the 700 oldest were spilled, the newest 100 queued
    finally:
        app.kill()
        app.wait(30)
    with BrokerProcess(tmp_path / "broker", {"numPartitions": 2}, port=port) as broker:
        heir = MetaqHandler(broker.servers, TOPIC, spill_dir=spill)  # claims the killed application's files
        logger.addHandler(heir)
        assert heir.drain(30)
        counts = _seqs(_read_all(broker.servers))
    assert set(counts) == set(range(700)), f"lost: {sorted(set(range(700)) - set(counts))[:20]}..."


@pytest.mark.parametrize("interval_s", [0.2, None])
def test_spilled_records_not_yet_fsynced_are_counted_until_the_next_sync(
        tmp_path: Path, logger: logging.Logger, interval_s: float | None) -> None:
    handler = MetaqHandler(f"127.0.0.1:{unused_port()}", TOPIC, max_buffered_records=100, spill_dir=tmp_path,
                           spill_sync_interval_s=interval_s, retry_backoff_max_s=0.3, error_interval_s=60)
    logger.addHandler(handler)
    _log_many(logger, 600)
    assert handler.stats().spilled == 500
    if interval_s is None:  # never fsynced by the handler: all of them stay at risk of a machine crash
        time.sleep(0.5)  # several would-be sync intervals; nothing may sync them
        assert handler.stats().spilled_unsynced == 500
    else:
        wait_until(lambda: handler.stats().spilled_unsynced == 0, 10, message="the spill to be fsynced")
