"""The one place TLS contexts are built (metaq.net.tls), the ZooKeeper registration of a TLS port, and the
broker's TLS options: what a user configures is checked, and a bad file is named."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from metaq.broker.config import BrokerConfig
from metaq.broker.ini import parse_config
from metaq.cluster import layout
from metaq.cluster.registry import Address, BrokerEntry, ClusterSnapshot
from metaq.errors import ConfigError
from metaq.net.tls import ServerTls, client_context, describe_tls_error, peer_common_name, server_context
from metaq.testing.certs import Pki, make_pki

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_contexts_refuse_anything_below_tls_1_2_and_always_verify_the_broker(pki: Pki) -> None:
    server = server_context(str(pki.server_cert), str(pki.server_key))
    client = client_context(str(pki.ca))
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_NONE
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert not client_context(str(pki.ca), check_hostname=False).check_hostname
    want = server_context(str(pki.server_cert), str(pki.server_key), str(pki.ca), "want")
    need = server_context(str(pki.server_cert), str(pki.server_key), str(pki.ca), "need")
    assert (want.verify_mode, need.verify_mode) == (ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED)


def test_bad_files_are_named_in_the_error(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server certificate file '.*missing\.pem' does not exist"):
        server_context(str(tmp_path / "missing.pem"), str(pki.server_key))
    with pytest.raises(ConfigError, match="the key must match the certificate"):
        server_context(str(pki.server_cert), str(pki.client_key))
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match="cannot load the client CA file"):
        server_context(str(pki.server_cert), str(pki.server_key), str(garbage), "want")
    with pytest.raises(ConfigError, match="sslClientAuth=need needs sslCaFile"):
        server_context(str(pki.server_cert), str(pki.server_key), None, "need")
    with pytest.raises(ConfigError, match="needs its certificate file"):
        client_context(str(pki.ca), key_file=str(pki.client_key))


def test_a_failed_reload_keeps_the_context_in_use(pki: Pki, tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    tls = ServerTls(str(cert), str(key))
    context = tls.context
    key.write_bytes(pki.client_key.read_bytes())  # does not match the certificate
    with pytest.raises(ConfigError):
        tls.reload()
    assert tls.reloads == 0 and tls.context is context
    key.write_bytes(pki.server_key.read_bytes())
    tls.reload()
    assert tls.reloads == 1 and tls.context is context, "reloaded in place: listeners keep their context object"


def test_peer_common_name_and_error_words() -> None:
    cert = {"subject": ((("countryName", "CN"),), (("commonName", "alice"),))}
    assert peer_common_name(cert) == "alice"
    assert peer_common_name({}) is None and peer_common_name(None) is None
    err = ssl.SSLCertVerificationError(1, "certificate verify failed")
    err.verify_message = "certificate has expired"
    assert "has expired" in describe_tls_error(err)


def test_registration_carries_the_tls_port_in_a_query_older_readers_ignore() -> None:
    url = layout.broker_url("10.0.0.1", 8123, 8124)
    assert url == "meta://10.0.0.1:8123?sslPort=8124"
    assert layout.parse_broker_url(url) == ("10.0.0.1", 8123)
    assert layout.parse_broker_tls_port(url) == 8124
    assert layout.parse_broker_tls_port("meta://10.0.0.1:8123") is None
    assert layout.parse_broker_tls_port("meta://10.0.0.1:8123?slaveId=1&sslPort=99999") is None
    assert layout.broker_url("10.0.0.1", 8123) == "meta://10.0.0.1:8123"


def test_a_tls_client_sees_the_cluster_at_its_tls_ports_only() -> None:
    snapshot = ClusterSnapshot(brokers={
        1: BrokerEntry(1, Address("h1", 8123), {0: Address("s1", 8123)}, {-1: 8124, 0: 9124}),
        2: BrokerEntry(2, Address("h2", 8123)),  # no TLS port: a TLS client cannot reach it
    })
    tls = snapshot.over_tls()
    assert tls.address(1) == Address("h1", 8124) and tls.brokers[1].slaves == {0: Address("s1", 9124)}
    assert tls.address(2) is None
    assert tls.servers() == "h1:8124"


def test_broker_tls_options_are_checked_together(pki: Pki, tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    text = "[system]\nsslPort=0\nsslCertFile=certs/server.pem\nsslKeyFile=certs/server.key\nsslClientAuth=WANT\n" \
           "sslCaFile=/etc/ca.pem\n"
    config = parse_config(text, "server.ini", base_dir=tmp_path)
    assert config.ssl_cert_file == tmp_path / "certs" / "server.pem", "relative to the file's directory"
    assert config.ssl_ca_file == Path("/etc/ca.pem")
    assert (config.ssl_port, config.ssl_client_auth) == (0, "want")
    assert (config.ssl_http, config.ssl_replication) == (True, False)
    with pytest.raises(ConfigError, match="sslPort needs sslCertFile"):
        parse_config("[system]\nsslPort=8124\n")
    with pytest.raises(ConfigError, match="sslClientAuth=need needs sslCaFile"):
        parse_config("[system]\nsslCertFile=a.pem\nsslClientAuth=need\n")
    with pytest.raises(ConfigError, match="sslReplication needs sslCaFile"):
        parse_config("[system]\nsslCertFile=a.pem\nsslReplication=true\n")
    with pytest.raises(ConfigError, match="'sometimes' is not one of none, want, need"):
        parse_config("[system]\nsslClientAuth=sometimes\n")
    with pytest.raises(ConfigError, match="--sslPort: sslPort needs sslCertFile"):
        BrokerConfig.with_overrides(parse_config(""), {"sslPort": "0"})
