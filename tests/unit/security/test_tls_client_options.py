"""The TLS options of every client entry point: ClientConfig, the Spark options and the CLI flags."""

from __future__ import annotations

import ssl
from pathlib import Path

import click
import pytest

from metaq.cli.options import tls_config
from metaq.client.config import ClientConfig
from metaq.errors import ConfigError
from metaq.net.tls import ClientTls
from metaq.spark.options import ReadOptions, WriteOptions
from metaq.testing.certs import Pki, make_pki

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def test_client_config_builds_a_verifying_context_when_tls_is_asked(pki: Pki) -> None:
    assert ClientConfig().connection_settings().ssl_context is None
    implied = ClientConfig(tls_ca_file=str(pki.ca))
    assert implied.tls, "a CA file alone turns TLS on"
    context = implied.connection_settings().ssl_context
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    lax = ClientConfig(tls=True, tls_ca_file=str(pki.ca), tls_check_hostname=False).ssl_context()
    assert lax is not None and not lax.check_hostname
    with pytest.raises(ConfigError, match=r"client certificate file .* does not exist"):
        ClientConfig(tls_cert_file="/nonexistent.pem").connection_settings()


def test_spark_options_take_tls(pki: Pki, tmp_path: Path) -> None:
    assert ReadOptions.parse({"topic": "t"}).tls is None
    opts = ReadOptions.parse({"topic": "t", "tlsCaFile": str(pki.ca), "tlsCheckHostname": "false"})
    assert opts.tls == ClientTls(str(pki.ca), None, None, False)
    write = WriteOptions.parse({"tls": "true", "tlsCertFile": str(pki.client_cert), "tlsKeyFile": str(pki.client_key)})
    assert write.tls == ClientTls(None, str(pki.client_cert), str(pki.client_key), True)
    with pytest.raises(ConfigError, match=r"tlsKeyFile.*needs 'tlsCertFile'"):
        WriteOptions.parse({"tlsKeyFile": str(pki.client_key)})


def test_cli_tls_flags_become_client_options(pki: Pki) -> None:
    assert tls_config(False, None, None, None) == {}
    assert tls_config(True, None, None, None) == {"tls": True, "tls_ca_file": None, "tls_cert_file": None,
                                                  "tls_key_file": None}
    assert tls_config(False, "ca.pem", None, None)["tls"] is True
    with pytest.raises(click.UsageError, match="--key-file needs --cert-file"):
        tls_config(False, None, None, "k.pem")


def test_credentials_go_together_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from metaq.cli.options import credentials_from_env

    with pytest.raises(ConfigError, match="go together"):
        ClientConfig(sasl_username="alice")
    settings = ClientConfig(sasl_username="alice", sasl_password="pw").connection_settings()
    assert settings.sasl_username == "alice" and "pw" not in repr(settings)
    opts = ReadOptions.parse({"topic": "t", "user": "alice", "password": "pw"})
    assert (opts.user, opts.password) == ("alice", "pw") and "pw" not in repr(opts)
    with pytest.raises(ConfigError, match="go together"):
        WriteOptions.parse({"user": "alice"})
    monkeypatch.delenv("METAQ_USER", raising=False)
    assert credentials_from_env() == {}
    monkeypatch.setenv("METAQ_USER", "alice")
    monkeypatch.delenv("METAQ_PASSWORD", raising=False)
    with pytest.raises(click.UsageError, match="METAQ_PASSWORD"):
        credentials_from_env()
    monkeypatch.setenv("METAQ_PASSWORD", "pw")
    assert credentials_from_env() == {"sasl_username": "alice", "sasl_password": "pw"}
