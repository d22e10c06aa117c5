"""TLS on every listener, against real broker processes and certificates made for the test.

What a user relies on: produce and consume over TLS from the async client, the blocking client and the
CLI; a broker whose certificate is not trusted, expired or for another host is refused with an error that
says which; sslClientAuth=need keeps out a client without a certificate; the plaintext and TLS ports
serve side by side (a migration); SIGHUP makes new connections get a new certificate while open ones go
on; a slave replicates from its master's TLS port found in ZooKeeper; the HTTP API and /metrics speak HTTPS.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.client import Message, MessageSessionFactory
from metaq.client.blocking import BlockingClient
from metaq.errors import ConnectionClosedError
from metaq.net.tls import ClientTls
from metaq.protocol.records import decode_fetched
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.certs import Pki, issue, load_ca, make_pki, write_cert

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_options(cert: Path, key: Path, **more: Any) -> dict[str, Any]:
    return {"sslPort": 0, "sslCertFile": str(cert), "sslKeyFile": str(key), **more}


@pytest.fixture
def tls_broker(broker_factory: Callable[..., BrokerProcess], pki: Pki) -> BrokerProcess:
    return broker_factory({"numPartitions": 2, "unflushThreshold": 0,
                           **tls_options(pki.server_cert, pki.server_key)})


def tls_servers(proc: BrokerProcess, host: str = "127.0.0.1") -> str:
    assert proc.tls_port is not None, "the broker printed no TLS ready line"
    return f"{host}:{proc.tls_port}"


def peer_serial(host: str, port: int, ca: Path) -> int:
    """The serial number of the certificate a new TLS connection to host:port is shown."""
    from cryptography import x509

    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


async def produce_and_consume(servers: str, topic: str, values: list[bytes], **config: Any) -> list[bytes]:
    async with await MessageSessionFactory.connect(servers, **config) as session:
        await session.admin().create_topic(topic, 1)
        producer = session.create_producer()
        for value in values:
            assert (await producer.send(Message(topic, value))).success
        consumer = session.create_pull_consumer()
        got = []
        async for message in consumer.iterate(topic, 0, 0, max_wait_ms=100):
            got.append(bytes(message.data))
            if len(got) == len(values):
                break
        return got


# -- round trips --------------------------------------------------------------------------------


def test_async_client_round_trip_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    values = [f"secret {i}".encode() for i in range(50)]
    got = asyncio.run(produce_and_consume(tls_servers(tls_broker), "tls-async", values, tls_ca_file=str(pki.ca)))
    assert got == values


def test_blocking_client_round_trip_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    from metaq.protocol.records import encode_values

    with BlockingClient(tls_servers(tls_broker), tls=ClientTls(ca_file=str(pki.ca))) as client:
        reply = client.produce("tls-blocking", "0-0", encode_values([b"a", b"b"], 1))
        assert reply.base_offset == 0
        fetched = client.fetch("tls-blocking", "0-0", 0, 1 << 20)
    got, _ = decode_fetched(fetched.records, "tls-blocking", 0, 0)
    assert [bytes(r.data) for r in got] == [b"a", b"b"]


def test_large_replies_over_tls_arrive_whole_in_both_clients(tls_broker: BrokerProcess, pki: Pki) -> None:
    """Replies from 64 KiB up are received into buffers of their own (BufferedProtocol, recv_into): over TLS
    too, with asyncio's and uvloop's SSL transports and the blocking client's SSL socket."""
    import uvloop

    values = [bytes([i]) * 200_000 for i in range(12)]
    servers = tls_servers(tls_broker)
    assert asyncio.run(produce_and_consume(servers, "tls-big", values, tls_ca_file=str(pki.ca))) == values
    assert uvloop.run(produce_and_consume(servers, "tls-big-uv", values, tls_ca_file=str(pki.ca))) == values
    with BlockingClient(servers, tls=ClientTls(ca_file=str(pki.ca))) as client:
        got: list[bytes] = []
        offset = 0
        while offset < len(values):
            fetched = client.fetch("tls-big", "0-0", offset, 300_000)
            records, offset = decode_fetched(fetched.records, "tls-big", 0, offset)
            got += [bytes(r.data) for r in records]
    assert got == values


def test_cli_round_trip_over_tls_with_flags_and_with_env(tls_broker: BrokerProcess, pki: Pki) -> None:
    s = ["-s", tls_servers(tls_broker)]
    sent = metaq("produce", "tls-cli", *s, "--ca-file", str(pki.ca), input="one\ntwo\n")
    assert sent.returncode == 0, sent.stderr
    env = {**os.environ, "METAQ_TLS": "1", "METAQ_TLS_CA_FILE": str(pki.ca)}
    got = metaq("consume", "tls-cli", *s, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["one", "two"]
    # without TLS flags, the same command on the TLS port fails and says why
    plain = metaq("consume", "tls-cli", *s)
    assert plain.returncode != 0
    assert "closed the connection" in plain.stderr or "TLS" in plain.stderr


def test_logging_handler_sends_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    import logging

    from metaq.logging import MetaqHandler

    logger = logging.getLogger("metaq-tls-test")
    logger.propagate = False
    handler = MetaqHandler(tls_servers(tls_broker), "tls-logs", client_options={"tls_ca_file": str(pki.ca)},
                           error_interval_s=60)
    logger.addHandler(handler)
    try:
        for i in range(20):
            logger.warning("event %d", i)
        assert handler.drain(30), "every record sent over TLS"
    finally:
        logger.removeHandler(handler)
        handler.close()
    with BlockingClient(tls_servers(tls_broker), tls=ClientTls(ca_file=str(pki.ca))) as client:
        stored = []
        for pid in client.partitions_for("tls-logs"):
            fetched = client.fetch("tls-logs", pid, 0, 1 << 20)
            stored += [bytes(r.data) for r in decode_fetched(fetched.records, "tls-logs", pid.partition, 0)[0]]
    assert sorted(json.loads(line)["message"] for line in stored) == sorted(f"event {i}" for i in range(20))


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("which", "expected"), [
    ("rogue", "not signed by the CA given"),
    ("expired", "has expired"),
    ("other_host", "does not name the host"),
])
def test_untrusted_expired_or_misnamed_broker_certificates_are_refused(
        broker_factory: Callable[..., BrokerProcess], pki: Pki, which: str, expected: str) -> None:
    cert, key = {"rogue": (pki.rogue_cert, pki.rogue_key), "expired": (pki.expired_cert, pki.expired_key),
                 "other_host": (pki.other_host_cert, pki.other_host_key)}[which]
    proc = broker_factory(tls_options(cert, key))
    with pytest.raises(ConnectionClosedError, match=expected):
        asyncio.run(produce_and_consume(tls_servers(proc), "never", [b"x"], tls_ca_file=str(pki.ca),
                                        reconnect_attempts=1))
    with pytest.raises(ConnectionClosedError, match=expected):
        BlockingClient(tls_servers(proc), tls=ClientTls(ca_file=str(pki.ca)))
    cli = metaq("produce", "never", "-s", tls_servers(proc), "--ca-file", str(pki.ca), input="x\n")
    assert cli.returncode != 0 and expected in cli.stderr
    with pytest.raises(OSError):
        peer_serial("127.0.0.1", proc.tls_port or 0, pki.ca)


def test_client_auth_need_refuses_a_client_without_a_certificate_and_serves_one_with(
        broker_factory: Callable[..., BrokerProcess], pki: Pki) -> None:
    proc = broker_factory(tls_options(pki.server_cert, pki.server_key, sslCaFile=str(pki.ca), sslClientAuth="need"))
    proc.allow_log(r"SSL|certificate")
    with pytest.raises(ConnectionClosedError, match=r"client certificate|TLS|closed"):
        BlockingClient(tls_servers(proc), tls=ClientTls(ca_file=str(pki.ca)))
    with pytest.raises(ConnectionClosedError):
        asyncio.run(produce_and_consume(tls_servers(proc), "mtls", [b"x"], tls_ca_file=str(pki.ca),
                                        reconnect_attempts=1))
    got = asyncio.run(produce_and_consume(tls_servers(proc), "mtls", [b"x"], tls_ca_file=str(pki.ca),
                                          tls_cert_file=str(pki.client_cert), tls_key_file=str(pki.client_key)))
    assert got == [b"x"]
    cli = metaq("consume", "mtls", "-s", tls_servers(proc), "--ca-file", str(pki.ca),
                "--cert-file", str(pki.client_cert), "--key-file", str(pki.client_key))
    assert cli.returncode == 0 and cli.stdout.splitlines() == ["x"], cli.stderr


def test_a_client_certificate_from_another_ca_is_refused(broker_factory: Callable[..., BrokerProcess],
                                                         pki: Pki) -> None:
    proc = broker_factory(tls_options(pki.server_cert, pki.server_key, sslCaFile=str(pki.ca), sslClientAuth="need"))
    with pytest.raises(ConnectionClosedError):
        BlockingClient(tls_servers(proc), tls=ClientTls(ca_file=str(pki.ca), cert_file=str(pki.rogue_cert),
                                                         key_file=str(pki.rogue_key)))


def test_plaintext_and_tls_ports_side_by_side(tls_broker: BrokerProcess, pki: Pki) -> None:
    values = [b"plain"]
    assert asyncio.run(produce_and_consume(tls_broker.servers, "side", values)) == values
    with BlockingClient(tls_servers(tls_broker), tls=ClientTls(ca_file=str(pki.ca))) as client:
        fetched = client.fetch("side", "0-0", 0, 1 << 20)
    assert [bytes(r.data) for r in decode_fetched(fetched.records, "side", 0, 0)[0]] == values
    # a TLS client on the plaintext port is told it may be the wrong port
    with pytest.raises(ConnectionClosedError, match="TLS"):
        BlockingClient(tls_broker.servers, tls=ClientTls(ca_file=str(pki.ca)), timeout_s=5)
    # a plaintext client on the TLS port gets nothing but a closed connection; the broker goes on
    with pytest.raises(ConnectionClosedError):
        BlockingClient(tls_servers(tls_broker), timeout_s=5)
    assert asyncio.run(produce_and_consume(tls_broker.servers, "side2", values)) == values


def test_tls_options_are_checked_at_start(broker_factory: Callable[..., BrokerProcess], pki: Pki,
                                          tmp_path: Path) -> None:
    no_cert = broker_factory({"sslPort": 0}, start=False, name="no-cert")
    no_cert.expect_exit_code(2)
    with pytest.raises(Exception, match="sslPort needs sslCertFile"):
        no_cert.start()
    missing = broker_factory(tls_options(tmp_path / "nope.pem", pki.server_key), start=False, name="missing")
    missing.expect_exit_code(1)
    with pytest.raises(Exception, match=r"nope\.pem.*does not exist"):
        missing.start()
    need = broker_factory(tls_options(pki.server_cert, pki.server_key, sslClientAuth="need"), start=False,
                          name="need")
    need.expect_exit_code(2)
    with pytest.raises(Exception, match="sslClientAuth=need needs sslCaFile"):
        need.start()


# -- reload --------------------------------------------------------------------------------------


def test_sighup_reloads_the_certificate_for_new_connections_and_keeps_open_ones(
        tls_broker: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    port = tls_broker.tls_port
    assert port is not None
    from cryptography import x509

    old_serial = x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
    assert peer_serial("127.0.0.1", port, pki.ca) == old_serial
    # the broker reads the files named in its options again: replace their content
    live_cert, live_key = tmp_path / "live.pem", tmp_path / "live.key"
    live_cert.write_bytes(pki.server_cert.read_bytes())
    live_key.write_bytes(pki.server_key.read_bytes())
    tls_broker.stop()
    tls_broker.options.update(sslCertFile=str(live_cert), sslKeyFile=str(live_key))
    tls_broker.start()
    client = BlockingClient(tls_servers(tls_broker), tls=ClientTls(ca_file=str(pki.ca)))
    try:
        from metaq.protocol.records import encode_values

        client.produce("reload", "0-0", encode_values([b"before"], 1))
        ca_cert, ca_key = load_ca(pki)
        new_serial = 0x5EC0DE
        write_cert(tmp_path / "live", *issue(ca_cert, ca_key, "broker", serial=new_serial))
        tls_broker.signal(signal.SIGHUP)
        wait_until(lambda: peer_serial("127.0.0.1", port, pki.ca) == new_serial, 10,
                   message="new connections shown the new certificate")
        assert any("TLS certificate reloaded" in line for line in tls_broker.log_lines)
        # the connection opened before the reload goes on with the old certificate
        conn = client._bootstrap()
        der = conn.sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
        assert x509.load_der_x509_certificate(der).serial_number == old_serial
        client.produce("reload", "0-0", encode_values([b"after"], 1))
        fetched = client.fetch("reload", "0-0", 0, 1 << 20)
        assert [bytes(r.data) for r in decode_fetched(fetched.records, "reload", 0, 0)[0]] == [b"before", b"after"]
    finally:
        client.close()
    # a broken file on the next SIGHUP is logged and the certificate in use is kept
    live_key.write_text("not a key")
    tls_broker.allow_log(r"TLS certificate not reloaded")
    tls_broker.signal(signal.SIGHUP)
    wait_until(lambda: any("TLS certificate not reloaded" in line for line in tls_broker.log_lines), 10,
               message="the failed reload logged")
    assert peer_serial("127.0.0.1", port, pki.ca) == new_serial


# -- HTTP and metrics ------------------------------------------------------------------------------


def test_http_api_and_metrics_over_https(broker_factory: Callable[..., BrokerProcess], pki: Pki) -> None:
    proc = broker_factory(tls_options(pki.server_cert, pki.server_key, httpPort=0, dashboardHttpPort=0))
    assert proc.http_url is not None and proc.http_url.startswith("https://")
    assert proc.metrics_url is not None and proc.metrics_url.startswith("https://")
    context = ssl.create_default_context(cafile=str(pki.ca))
    with urllib.request.urlopen(f"{proc.http_url}/openapi.json", context=context, timeout=10) as reply:
        assert "paths" in json.loads(reply.read())
    wait_until(lambda: _get(proc.metrics_url or "", context) == 200, 10, message="metrics served")
    with urllib.request.urlopen(proc.metrics_url, context=context, timeout=10) as reply:
        assert b"metaq" in reply.read()
    untrusting = ssl.create_default_context(cafile=str(pki.rogue_ca))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"{proc.http_url}/openapi.json", context=untrusting, timeout=10)


def _get(url: str, context: ssl.SSLContext) -> int:
    try:
        with urllib.request.urlopen(url, context=context, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_ssl_http_false_keeps_http_plain(broker_factory: Callable[..., BrokerProcess], pki: Pki) -> None:
    proc = broker_factory(tls_options(pki.server_cert, pki.server_key, httpPort=0, sslHttp=False))
    assert proc.http_url is not None and proc.http_url.startswith("http://")
    with urllib.request.urlopen(f"{proc.http_url}/openapi.json", timeout=10) as reply:
        assert reply.status == 200


# -- cluster mode ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_slave_replicates_over_tls_and_tls_clients_use_registered_tls_ports(
        cluster_factory: Callable[..., BrokerProcess], pki: Pki, zookeeper: Any, zk_client: Any,
        zk_root: str) -> None:
    common = {"sslCaFile": str(pki.ca), "sslClientAuth": "need", "sslReplication": True,
              **tls_options(pki.server_cert, pki.server_key)}
    topics = "[topic=orders]\nnumPartitions=2\n"
    master = cluster_factory(1, topics=topics, **common)
    slave = cluster_factory(1, topics=topics, name="broker-1-slave-0", args=["--slave", "--slave-id", "0"], **common)
    data = zk_client.get(f"{zk_root}/brokers/ids/1/master")[0].decode()
    assert data == f"meta://127.0.0.1:{master.port}?sslPort={master.tls_port}"
    wait_until(lambda: zk_client.exists(f"{zk_root}/brokers/ids/1/slave0"), 10, message="the slave registered")
    assert zk_client.get(f"{zk_root}/brokers/ids/1/slave0")[0].decode().endswith(f"?sslPort={slave.tls_port}")

    client_tls = {"tls_ca_file": str(pki.ca), "tls_cert_file": str(pki.client_cert),
                  "tls_key_file": str(pki.client_key)}

    async def produce() -> list[int]:
        async with await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root,
                                                       **client_tls) as session:
            producer = session.create_producer()
            offsets = []
            for i in range(20):
                result = await producer.send(Message("orders", f"m{i}".encode()))
                assert result.success, result.error
                offsets.append(result.offset)
            return offsets

    assert len(asyncio.run(produce())) == 20
    tls = ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))

    def on_slave() -> list[bytes]:
        out = []
        with BlockingClient(tls_servers(slave), tls=tls) as client:
            for p in (0, 1):
                fetched = client.fetch("orders", f"1-{p}", 0, 1 << 20)
                out += [bytes(r.data) for r in decode_fetched(fetched.records, "orders", p, 0)[0]]
        return sorted(out)

    wait_until(lambda: on_slave() == sorted(f"m{i}".encode() for i in range(20)), 30,
               message="the slave holds every message, fetched from the master over TLS")
    # the slave fetched from the master's TLS port (the one registered as sslPort), not its plaintext one
    assert any(f"the master of broker 1 is at 127.0.0.1:{master.tls_port}" in line for line in slave.log_lines)


# -- a TLS-only broker (serverPort=-1) ---------------------------------------------------------------


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (from /proc: its socket inodes in LISTEN state)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_a_tls_only_broker_listens_on_its_tls_port_alone(broker_factory: Callable[..., BrokerProcess],
                                                         pki: Pki) -> None:
    from metaq.protocol import messages as m

    proc = broker_factory({"serverPort": -1, "numPartitions": 1, **tls_options(pki.server_cert, pki.server_key)})
    assert proc.tls_port is not None and proc.port == proc.tls_port  # the ready line names the TLS port
    assert listening_ports(proc.pid) == {proc.tls_port}
    values = [b"only over tls"]
    assert asyncio.run(produce_and_consume(tls_servers(proc), "tls-only", values, tls_ca_file=str(pki.ca))) == values
    with BlockingClient(tls_servers(proc), tls=ClientTls(ca_file=str(pki.ca))) as client:
        assert [b.port for b in client.request(m.MetadataRequest()).brokers] == [proc.tls_port]
    # a plaintext client on the one port is refused, the broker goes on
    with pytest.raises(ConnectionClosedError):
        BlockingClient(tls_servers(proc), timeout_s=5)
    assert asyncio.run(produce_and_consume(tls_servers(proc), "tls-only-2", values, tls_ca_file=str(pki.ca))) == values
    # serverPort=-1 without a TLS port is refused at start, saying why
    portless = broker_factory({"serverPort": -1}, start=False, name="portless")
    portless.expect_exit_code(2)
    with pytest.raises(Exception, match=r"serverPort=-1 .* sslPort"):
        portless.start()


@pytest.mark.slow
def test_tls_only_brokers_in_cluster_mode_are_found_through_zookeeper(
        cluster_factory: Callable[..., BrokerProcess], pki: Pki, zookeeper: Any, zk_client: Any,
        zk_root: str) -> None:
    common = {"sslCaFile": str(pki.ca), "sslReplication": True, **tls_options(pki.server_cert, pki.server_key)}
    topics = "[topic=orders]\nnumPartitions=1\n"
    tls_only = ["--serverPort", "-1"]  # after the harness's own --serverPort: the last flag wins
    master = cluster_factory(1, topics=topics, args=tls_only, **common)
    slave = cluster_factory(1, topics=topics, name="broker-1-slave-0", args=["--slave", *tls_only], **common)
    assert listening_ports(master.pid) == {master.tls_port}
    data = zk_client.get(f"{zk_root}/brokers/ids/1/master")[0].decode()
    assert data == f"meta://127.0.0.1:{master.tls_port}?sslPort={master.tls_port}"

    async def produce() -> int:
        async with await MessageSessionFactory.connect(zk_connect=zookeeper.connect_string, zk_root=zk_root,
                                                       tls_ca_file=str(pki.ca)) as session:
            producer = session.create_producer()
            for i in range(10):
                assert (await producer.send(Message("orders", f"m{i}".encode()))).success
            return 10

    assert asyncio.run(produce()) == 10

    def on_slave() -> list[bytes]:
        with BlockingClient(tls_servers(slave), tls=ClientTls(ca_file=str(pki.ca))) as client:
            fetched = client.fetch("orders", "1-0", 0, 1 << 20)
            return [bytes(r.data) for r in decode_fetched(fetched.records, "orders", 0, 0)[0]]

    wait_until(lambda: on_slave() == [f"m{i}".encode() for i in range(10)], 30,
               message="the TLS-only slave follows its TLS-only master")
