"""Who may fetch as a replica (metaq.broker.replica_access), and the handshake that says so (ApiVersions v1)."""

from __future__ import annotations

import pytest

from metaq.broker.config import BrokerConfig
from metaq.broker.ini import parse_config
from metaq.broker.replica_access import replica_fetch_refusal
from metaq.broker.session import Session
from metaq.errors import ClusterAuthorizationError
from metaq.net.codec import ConnectionSettings, handshake_request, handshake_versions
from metaq.protocol import messages as m
from metaq.protocol.codec import ClientConnection, ServerConnection


def config(text: str = "") -> BrokerConfig:
    return parse_config("[system]\n" + text, "server.ini")


LOCKED = config("authRequired=true\nreplicationUser=replicator\nsuperUsers=User:admin\n")
FETCH = m.FetchRequest(topic="orders", partition=0, offset=0, max_bytes=1 << 20, replica_id=1)


@pytest.mark.parametrize(("principal", "said"), [("User:replicator", 1), ("User:admin", 1)])
def test_a_replication_principal_that_said_so_at_the_handshake_fetches_as_a_replica(principal: str,
                                                                                     said: int) -> None:
    assert replica_fetch_refusal(LOCKED, FETCH, Session(principal=principal, replica_id=said)) is None


@pytest.mark.parametrize(("principal", "said", "why"), [
    ("User:bob", 1, "User:bob may not fetch as replica 1"),            # any other user
    (None, 1, "an unauthenticated connection"),                         # (authRequired refuses it anyway)
    ("User:replicator", -1, "said no replica at its handshake"),        # a consumer connection of the slave's user
    ("User:replicator", 2, "said replica 2"),                           # another replica's id
])
def test_anyone_else_is_refused(principal: str | None, said: int, why: str) -> None:
    refusal = replica_fetch_refusal(LOCKED, FETCH, Session(principal=principal, replica_id=said))
    assert isinstance(refusal, ClusterAuthorizationError) and why in str(refusal)


def test_without_authentication_the_handshake_is_taken_at_its_word() -> None:
    open_broker = config()
    assert replica_fetch_refusal(open_broker, FETCH, Session(replica_id=1)) is None
    assert replica_fetch_refusal(open_broker, FETCH, Session()) is not None


def test_the_replica_handshake_is_apiversions_v1_and_everyone_else_still_sends_v0() -> None:
    plain = ConnectionSettings("c", 1, 1, 1, 1 << 20)
    replica = ConnectionSettings("c", 1, 1, 1, 1 << 20, replica_id=3)
    for settings, version in ((plain, 0), (replica, 1)):
        client = ClientConnection("c")
        client.set_versions(handshake_versions(settings))
        _, frame = client.send(handshake_request(settings))
        server = ServerConnection()
        server.receive_data(bytes(frame) if isinstance(frame, (bytes, bytearray)) else b"".join(frame))
        event = server.next_event()
        assert event.header.api_version == version
        assert event.request.replica_id == (3 if version else -1)
