"""The wire error table: every code maps back to its class, an unknown code never raises KeyError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq import errors
from metaq.errors import BrokerError, UnknownServerError, all_error_classes, error_class, error_for_code
from metaq.protocol.codec import ClientConnection, RequestHeader, ServerConnection
from metaq.protocol.messages import APIS, FetchRequest, error_response

CLASSES = all_error_classes()
REGISTERED = {cls.code for cls in CLASSES}


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_every_registered_code_round_trips_to_its_class(cls: type[BrokerError]) -> None:
    exc = error_for_code(cls.code, "what went wrong")
    assert type(exc) is cls
    assert exc.message == "what went wrong" and cls.name in str(exc)
    assert error_class(cls.code) is cls
    assert -(1 << 15) <= cls.code < (1 << 15), "error_code travels as an int16"
    assert isinstance(cls.retriable, bool) and isinstance(cls.refresh_metadata, bool)
    assert error_for_code(cls.code).message  # a default message: the hint or the name


def test_codes_and_names_are_unique_and_success_is_not_an_error() -> None:
    assert len(REGISTERED) == len(CLASSES)
    assert len({c.name for c in CLASSES}) == len(CLASSES)
    assert errors.NONE == 0 and errors.NONE not in REGISTERED
    assert [c.code for c in CLASSES] == sorted(REGISTERED)


@given(code=st.integers(-(1 << 15), (1 << 15) - 1).filter(lambda c: c not in REGISTERED), message=st.text(max_size=20))
def test_unknown_code_becomes_unknown_server_error(code: int, message: str) -> None:
    exc = error_for_code(code, message)
    assert type(exc) is UnknownServerError
    assert str(code) in exc.message
    assert error_class(code) is UnknownServerError


@pytest.mark.parametrize("cls", CLASSES, ids=[c.name for c in CLASSES])
def test_code_survives_the_wire(cls: type[BrokerError]) -> None:
    """A broker answers any API with its own response type carrying only the error; the client maps it back."""
    client, server = ClientConnection(), ServerConnection()
    cid, _ = client.send(FetchRequest())
    client.receive_data(server.encode_response(RequestHeader(5, client.version_for(5), cid, ""),
                                               error_response(5, cls.code, "m")))
    event = client.next_event()
    assert type(error_for_code(event.response.error_code, event.response.error_message)) is cls
    for key in APIS:
        assert error_response(key, cls.code, "m").error_code == cls.code


def test_error_taxonomy() -> None:
    """Remote misbehaviour and local misuse are different classes, as callers fix them in different places."""
    assert issubclass(errors.CorruptRecordError, errors.ProtocolError)
    assert not issubclass(errors.ProtocolError, errors.InvalidArgument)
    assert not issubclass(errors.InvalidArgument, errors.ProtocolError)
    assert issubclass(errors.InvalidArgument, ValueError)
    for cls in (errors.ProtocolError, errors.InvalidArgument, BrokerError, errors.ConnectionClosedError):
        assert issubclass(cls, errors.MetaqError)


def test_the_errors_of_the_tools_are_metaq_errors_too() -> None:
    """``except MetaqError`` catches every error metaq raises to a caller; the two that were ValueErrors stay so."""
    from metaq.broker.cron import CronError
    from metaq.client.xa import XAError
    from metaq.cluster.layout import LayoutError
    from metaq.security.scram import ScramError

    for cls in (XAError, CronError, LayoutError, ScramError):
        assert issubclass(cls, errors.MetaqError), cls
    assert issubclass(CronError, ValueError) and issubclass(LayoutError, ValueError)


@pytest.mark.parametrize("version", [-1, -32768, 1, 32767])
def test_a_bad_version_is_answered_with_an_error_code_in_a_layout_the_api_has(version: int) -> None:
    """The reply to an unsupported (even negative) version is never just a correlation id."""
    import struct

    from metaq.protocol import schema
    from metaq.protocol.codec import BadRequest, response_version

    for key, spec in sorted(APIS.items()):
        if spec.min_version <= version <= spec.max_version:
            continue
        server = ServerConnection()
        payload = struct.pack(">hhih", key, version, 9, 1) + b"c"
        server.receive_data(struct.pack(">I", len(payload)) + payload)
        event = server.next_event()
        assert isinstance(event, BadRequest) and event.error_code == errors.UnsupportedVersionError.code
        frame = server.encode_response(event.header, error_response(key, event.error_code, str(event.error)))
        at = response_version(event.header)
        assert spec.min_version <= at <= spec.max_version
        reply = schema.decode(spec.response, at, frame, 8)
        assert reply.error_code == errors.UnsupportedVersionError.code and f"v{version}" in reply.error_message
