"""Issue 39's holes 6, 9 and 11 and the removed-user bug, against a broker locked down as docs/security.md says
(tests/integration/security/lockdown.py).

What a user relies on: a login does not tell which user names exist (an unknown user's salt is stable,
unpredictable and looks like a known one's); a stranger without credentials holds little and not for long
(small frames, a short authentication deadline, a few connections per address, on the binary, TLS and HTTP
ports); every refusal, failed login, topic creation or deletion and ACL or user change leaves one audit line;
a removed user's open connections are closed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_process import metaq
from lockdown import LockedDown, acl, start_locked_down

from metaq.errors import ConnectionClosedError, MetaqError, SaslAuthenticationError, TopicAuthorizationError
from metaq.net.blocking import BlockingConnection
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.security.scram import ScramClient
from metaq.testing import BrokerProcess, wait_until


@pytest.fixture
def locked(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> LockedDown:
    locked = start_locked_down(broker_factory, tmp_path, {"connectionAuthTimeoutSeconds": 5,
                                                           "maxUnauthenticatedConnectionsPerIp": 4,
                                                           "httpMaxConnections": 6, "httpHeaderTimeoutSeconds": 5})
    locked.broker.allow_log(r"authentication of .* failed|HTTP authentication of")
    return locked


def tls_socket(locked: LockedDown, port: int | None = None) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port or locked.address[1]), timeout=30)
    return locked.ssl_context().wrap_socket(raw, server_hostname="127.0.0.1")


def closed_by_peer(sock: socket.socket, timeout_s: float = 30.0) -> bool:
    """True once the broker closed (or reset) the connection, having sent nothing more."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def refused_at_once(locked: LockedDown, port: int | None = None, request: bytes = b"") -> bool:
    """Whether a new TLS connection to ``port`` is closed before it can be used (its handshake fails, or it is
    closed right after it)."""
    try:
        sock = tls_socket(locked, port)
    except (ssl.SSLError, OSError):
        return True
    try:
        if request:
            sock.sendall(request)
        return closed_by_peer(sock, 10)
    except OSError:
        return True
    finally:
        sock.close()


def salt_of(locked: LockedDown, user: str) -> tuple[bytes, int]:
    """The salt and iteration count the broker answers a SCRAM login of ``user`` with."""
    conn = BlockingConnection.open(locked.address, locked.settings(None))
    try:
        conn.call(m.SaslHandshakeRequest("SCRAM-SHA-256"))
        first = conn.call(m.SaslAuthenticateRequest(ScramClient(user, "x").first()))
        attrs = dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))
        return base64.b64decode(attrs["s"]), int(attrs["i"])
    finally:
        conn.close()


def test_a_login_does_not_tell_which_users_exist(locked: LockedDown) -> None:
    for name in ("mallory", "admin", "eve"):
        salt, iterations = salt_of(locked, name)
        assert salt != hashlib.sha256(name.encode()).digest()[:16], "computable from the name alone"
        assert (salt, iterations) == salt_of(locked, name), "stable, as a real user's"
        assert iterations == 4096, "drawn from the stored users' counts (all 4096 here)"
    assert salt_of(locked, "mallory")[0] != salt_of(locked, "eve")[0]
    with pytest.raises(SaslAuthenticationError, match="wrong user name or password"):
        BlockingConnection.open(locked.address, locked.settings("mallory", "x"))
    wait_until(lambda: any("principal=User:mallory operation=authenticate resource=cluster result=failed" in line
                           for line in locked.audit_lines()),
               10, message="the failed login in the audit log (written after the refusal is sent)")
    reply = locked.http("GET", "/topics", "mallory", password="wrong")
    assert reply.status == 401 and reply.headers["WWW-Authenticate"].startswith("Basic")
    locked.documented("GET", "/topics", reply)
    wait_until(lambda: any("principal=User:mallory" in line and "HTTP Basic" in line for line in locked.audit_lines()),
               10, message="the failed HTTP login in the audit log, naming the user")


def test_nothing_much_before_authentication(locked: LockedDown) -> None:
    # a frame over maxFrameSizeBeforeAuth (512 KiB) closes the connection at its 4-byte length
    sock = tls_socket(locked)
    sock.sendall(struct.pack(">i", 64 << 20) + b"\0" * 1024)
    assert closed_by_peer(sock)
    sock.close()
    # an idle unauthenticated connection is closed after connectionAuthTimeoutSeconds (5 s here), even one that
    # sent a request (ApiVersions)
    conn = BlockingConnection.open(locked.address, locked.settings(None))
    assert closed_by_peer(conn.sock)
    conn.close()
    # at most maxUnauthenticatedConnectionsPerIp (4) at once from one address: the fifth is closed at once; an
    # authenticated connection is not counted among them
    with locked.connection("alice") as alice:
        held = [tls_socket(locked) for _ in range(4)]
        try:
            assert refused_at_once(locked)
            alice.call(m.MetadataRequest())
        finally:
            for s in held:
                s.close()
    wait_until(lambda: _can_connect(locked), 30, message="the pending connections' slots given back")


def _can_connect(locked: LockedDown) -> bool:
    try:
        with locked.connection("alice") as alice:
            alice.call(m.MetadataRequest())
        return True
    except (MetaqError, OSError):
        return False


def test_the_http_port_has_a_connection_cap_and_a_header_deadline(locked: LockedDown) -> None:
    port = str(locked.broker.http_url).rsplit(":", 1)[1]
    slow = tls_socket(locked, int(port))
    slow.sendall(b"GET /topics HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
    assert closed_by_peer(slow), "closed after httpHeaderTimeoutSeconds"
    slow.close()
    held = [tls_socket(locked, int(port)) for _ in range(6)]
    try:
        assert refused_at_once(locked, int(port), b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        for s in held:
            s.close()
    wait_until(lambda: locked.http("GET", "/openapi.json", None).status == 200, 30, message="a freed HTTP slot")
    # an over-long request line: a 4xx, and no ERROR with a traceback in the broker's log (the fixture checks)
    long = tls_socket(locked, int(port))
    long.sendall(b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    long.settimeout(30)
    status_line = long.recv(12)
    assert status_line.startswith(b"HTTP/1.") and status_line[9:10] == b"4", status_line
    long.close()


def test_every_decision_that_matters_is_audited(locked: LockedDown, tmp_path: Path) -> None:
    where = ["--data-path", str(tmp_path / "broker")]
    with locked.client("bob") as bob, pytest.raises(TopicAuthorizationError):
        bob.produce("orders", "0-0", encode_values([b"x"], 1))
    with locked.client("root") as root:
        root.request(m.DeleteTopicRequest(topic="payroll"))
    acl(where, "add", "--principal", "User:carol", "--topic", "audit", "-o", "consume")
    done = metaq("acl", "user", "add", "dave", *where, env={**os.environ, "METAQ_PASSWORD": "dave pw"})
    assert done.returncode == 0, done.stderr

    def seen(*parts: str) -> bool:
        return any(all(p in line for p in parts) for line in locked.audit_lines())

    wait_until(lambda: seen("principal=User:carol", "operation=acl-add", "result=done"), 15,
               message="the ACL change audited")
    wait_until(lambda: seen("principal=User:dave", "operation=user-add"), 15, message="the new user audited")
    assert seen("principal=User:bob", "operation=produce", "resource=topic:orders", "result=denied",
                "client=127.0.0.1:")
    assert seen("principal=User:root", "operation=delete-topic", "resource=topic:payroll", "result=done")


def test_a_removed_user_loses_its_open_connections_and_a_removed_acl_applies_to_them(
        locked: LockedDown, tmp_path: Path) -> None:
    where = ["--data-path", str(tmp_path / "broker")]
    with locked.connection("bob") as bob:
        bob.call(m.FetchRequest(topic="audit", partition=0, offset=0))
        acl(where, "remove", "--principal", "User:bob", "--topic", "audit", "-o", "consume")
        wait_until(lambda: bob.call(m.FetchRequest(topic="audit", partition=0, offset=0)).error_code
                   == TopicAuthorizationError.code, 15, message="the removed ACL to apply to bob's open connection")
    with locked.connection("alice") as alice:
        alice.call(m.MetadataRequest())
        done = metaq("acl", "user", "remove", "alice", *where)
        assert done.returncode == 0, done.stderr

        def closed() -> bool:
            try:
                alice.call(m.MetadataRequest())
                return False
            except (MetaqError, OSError):
                return True

        wait_until(closed, 15, message="alice's connection closed once she was removed")
    with pytest.raises((SaslAuthenticationError, ConnectionClosedError)):
        BlockingConnection.open(locked.address, locked.settings("alice"))
    assert any("principal=User:alice" in line and "result=closed" in line for line in locked.audit_lines())



def test_the_kafka_port_has_the_same_limits_and_quotas(broker_factory: Callable[..., BrokerProcess],
                                                        tmp_path: Path) -> None:
    ck = pytest.importorskip("confluent_kafka")
    locked = start_locked_down(broker_factory, tmp_path, {
        "kafkaSslPort": 0, "connectionAuthTimeoutSeconds": 5, "maxUnauthenticatedConnectionsPerIp": 4,
        "quotaProducerByteRate": 20 * 1024, "quotaOverrides": "User:root=produce:0"})
    port = locked.broker.kafka_tls_port
    assert port is not None
    # before authentication: a 64 MiB frame closes the connection at its length; an idle one is closed in 5 s
    sock = tls_socket(locked, port)
    sock.sendall(struct.pack(">i", 64 << 20) + b"\0" * 1024)
    assert closed_by_peer(sock)
    sock.close()
    idle = tls_socket(locked, port)
    assert closed_by_peer(idle), "closed after connectionAuthTimeoutSeconds"
    idle.close()
    # counted per address with the binary TLS port: 4 pending there, the Kafka port refuses a fifth
    held = [tls_socket(locked) for _ in range(4)]
    try:
        assert refused_at_once(locked, port)
    finally:
        for s in held:
            s.close()
    # alice's produce quota (20 KiB/s) holds over Kafka too: 200 KiB take about 10 s, not a moment
    wait_until(lambda: _can_connect(locked), 30, message="the pending connections' slots given back")
    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL",
                            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                            "sasl.password": "alice pw", "ssl.ca.location": str(locked.pki.ca),
                            "message.timeout.ms": 120_000, "linger.ms": 5, "batch.size": 16384})
    outcomes: list[str] = []
    start = time.monotonic()
    for _ in range(200):
        producer.produce("orders", b"k" * 1000, on_delivery=lambda err, _m: outcomes.append(
            "ok" if err is None else err.name()))
    producer.flush(120)
    # counted up to the moment alice may send again: one more message waits for her debt (all 200 KiB may have
    # gone in one request, answered at once, while the connection was being set up)
    producer.produce("orders", b"last", on_delivery=lambda err, _m: outcomes.append("ok" if err is None else
                                                                                     err.name()))
    producer.flush(120)
    elapsed = time.monotonic() - start
    assert outcomes == ["ok"] * 201, outcomes[:3]
    assert 200 * 1000 / elapsed < 1.5 * 20 * 1024, f"{200 * 1000 / elapsed:.0f} B/s over Kafka, quota 20 KiB/s"
