"""The broker core without a network: the handler registry, the one error mapping, Broker.handle.

The request handling users see is tested against real brokers (tests/integration); these tests hold
the seams a transport relies on: every API has one handler, a failure of any kind becomes the API's
own error response (a coroutine's too), and the mapping is the one docs/broker.md shows.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

from metaq.broker.core import Broker, Handler
from metaq.broker.error_mapping import WIRE_ERRORS, error_response, wire_error
from metaq.broker.handlers import REQUEST_HANDLERS
from metaq.broker.ini import load_broker_config
from metaq.broker.session import Session
from metaq.errors import (
    BrokerStoppingError,
    ConfigError,
    DiskFullError,
    InvalidArgument,
    InvalidRequestError,
    ProtocolError,
    StorageError,
    UnknownServerError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.storage.errors import DamagedData, DiskFull, OffsetOutOfRange

REPO = Path(__file__).resolve().parents[3]

RAISED = [
    (UnknownTopicError("no topic 'x'"), UnknownTopicError.code),
    (OffsetOutOfRange(9, 0, 5), 1),
    (DamagedData("t-0", 3, 7, 100, "bad crc"), 74),
    (DiskFull("no space"), 507),
    (InvalidArgument("bad value"), 42),
    (ConfigError("server.ini:1: bad"), 42),
    (ProtocolError("bad bytes"), 2),
    (StorageError("closed"), 56),
]


def test_every_api_has_exactly_one_handler_keyed_by_its_request_type() -> None:
    assert set(REQUEST_HANDLERS) == {spec.request for spec in m.APIS.values()}


@pytest.mark.parametrize(("exc", "code"), RAISED, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else "")
def test_the_mapping_answers_each_kind_of_failure_with_its_code(exc: Exception, code: int) -> None:
    assert wire_error(exc, "Fetch") == (code, exc.message if isinstance(exc, UnknownTopicError) else str(exc))
    response = error_response(m.FetchRequest.API_KEY, exc)
    assert isinstance(response, m.FetchResponse) and response.error_code == code


def test_an_unexpected_exception_is_unknown_server_error_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise KeyError("boom")
    except KeyError as exc:
        raised = exc
    with caplog.at_level(logging.ERROR, logger="metaq.broker"):
        assert wire_error(raised, "Produce") == (UnknownServerError.code, "KeyError: 'boom'")
    (record,) = caplog.records
    assert record.getMessage() == "unexpected error handling Produce" and record.exc_info is not None


def test_docs_broker_md_shows_the_mapping_in_its_order() -> None:
    docs = (REPO / "docs" / "broker.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(?:storage\.)?(\w+)`(?: \([^)]*\))? \| `(\w+)` \((-?\d+)\) \|$", docs, re.M)
    table = [(kind.__name__, error.name, error.code) for kind, error in WIRE_ERRORS]
    assert [(kind, name, int(code)) for kind, name, code in rows] == table


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    """A core with a registry of its own (not opened: these handlers touch no partition)."""
    config = load_broker_config(None, {"dataPath": str(tmp_path / "data")})

    def fails(broker: Broker, request: Any, session: Any) -> Any:
        raise DiskFull("the disk is full")

    async def fails_later(broker: Broker, request: Any, session: Any) -> Any:
        await asyncio.sleep(0)
        raise StorageError("fsync failed")

    def answers(broker: Broker, request: Any, session: Any) -> Any:
        return m.ProduceResponse(partition=3)

    handlers: dict[type, Handler] = {m.DeleteTopicRequest: fails, m.VerifyRequest: fails_later,
                                     m.ProduceRequest: answers}
    return Broker(config, handlers)


def test_handle_never_raises(broker: Broker) -> None:
    deleted = broker.handle(m.DeleteTopicRequest("t"))
    assert (deleted.error_code, deleted.error_message) == (DiskFullError.code, "the disk is full")
    verified = asyncio.run(broker.handle(m.VerifyRequest()))
    assert isinstance(verified, m.VerifyResponse) and verified.error_code == 56
    unserved = broker.handle(m.MetadataRequest())
    assert isinstance(unserved, m.MetadataResponse) and unserved.error_code == InvalidRequestError.code
    assert "Metadata is not served" in unserved.error_message


def test_a_draining_broker_refuses_produce_with_broker_stopping(broker: Broker) -> None:
    assert broker.handle(m.ProduceRequest("t", 0)).partition == 3
    broker.stopping = True
    refused = broker.handle(m.ProduceRequest("t", 0))
    assert (refused.error_code, refused.error_message) == (BrokerStoppingError.code, BrokerStoppingError.hint)


def test_pipelined_produces_over_a_quota_are_handled_in_order_at_the_rate(tmp_path: Path) -> None:
    """A client that pipelines (a Kafka client sends up to 1,024 requests before the first answer) gets no more
    than its quota: each produce is counted as it is admitted, not once stored (an fsync later), and the requests
    that wait for the principal's debt are handled one at a time in the order sent."""
    rate, size, count = 200_000, 100_000, 7
    config = load_broker_config(None, {"dataPath": str(tmp_path / "data"), "quotaProducerByteRate": str(rate)})
    handled: list[tuple[int, float]] = []

    async def stores(broker: Broker, request: Any, session: Any) -> Any:
        handled.append((request.partition, time.monotonic()))
        await asyncio.sleep(0.05)  # the fsync: it is done long after the next requests were read
        return m.ProduceResponse(partition=request.partition)

    broker = Broker(config, {m.ProduceRequest: stores})

    async def main() -> list[Any]:
        session = Session()
        pending = [broker.handle(m.ProduceRequest("t", i, records=b"x" * size), session) for i in range(count)]
        return list(await asyncio.gather(*pending))

    start = time.monotonic()
    answers = asyncio.run(main())
    assert [a.partition for a in answers] == list(range(count))
    assert [p for p, _ in handled] == list(range(count)), "handled in the order sent"
    for n, (_, at) in enumerate(handled, 1):  # one second's burst, then the rate (plus the request admitted last)
        assert n * size <= rate * (at - start + 1.0) + size, f"request {n} handled {at - start:.2f} s in"
