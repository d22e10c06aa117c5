"""Every command that talks to a broker takes the same TLS and SASL options (issue 39's bug): `metaq group dlq`,
`metaq group redrive` and `metaq cluster` could not reach a TLS-only broker with authentication on."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_process import metaq

from metaq.cluster.zookeeper import ZooKeeperRegistry
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.certs import Pki, make_pki
from metaq.testing.zookeeper import cluster_config
from metaq.types import PartitionId

PASSWORD = "alice's password, long enough"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def locked_down(pki: Pki) -> dict[str, Any]:
    """A TLS-only broker with authentication required."""
    return {"serverPort": -1, "sslPort": 0, "sslCertFile": str(pki.server_cert), "sslKeyFile": str(pki.server_key),
            "authRequired": True, "numPartitions": 1}


def env_for(user: str = "alice", **more: str) -> dict[str, str]:
    return {**os.environ, "METAQ_USER": user, "METAQ_PASSWORD": PASSWORD, **more}


def add_alice(*where: str) -> None:
    done = metaq("acl", "user", "add", "alice", *where, env={**os.environ, "METAQ_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr


def test_group_dlq_and_redrive_reach_a_tls_only_broker_with_flags_or_environment(
        broker_factory: Callable[..., BrokerProcess], pki: Pki, tmp_path: Path) -> None:
    add_alice("--data-path", str(tmp_path / "broker"))
    broker = broker_factory(locked_down(pki))
    servers = f"127.0.0.1:{broker.tls_port}"
    listed = metaq("group", "dlq", "billing", "-s", servers, "--ca-file", str(pki.ca), env=env_for())
    assert listed.returncode == 0, listed.stderr
    assert listed.stderr.strip() == "no dead letters in %DLQ%billing"
    redrive = metaq("group", "redrive", "billing", "--dry-run", "-s", servers, env=env_for(
        METAQ_TLS_CA_FILE=str(pki.ca)))
    assert redrive.returncode == 0, redrive.stderr
    assert "would send back 0 messages from %DLQ%billing" in redrive.stderr
    without = metaq("group", "dlq", "billing", "-s", servers, env=env_for())  # no TLS: told what to add
    assert without.returncode == 1 and "--tls" in without.stderr


def test_metaq_cluster_reads_lags_from_tls_brokers_with_authentication(
        broker_factory: Callable[..., BrokerProcess], pki: Pki, zookeeper: Any, zk_root: str) -> None:
    zk = ["-z", zookeeper.connect_string, "--zk-root", zk_root]
    add_alice(*zk)
    text = cluster_config(1, zookeeper.connect_string, zk_root, system=locked_down(pki),
                          topics="[topic=orders]\nnumPartitions=1\n")
    broker = broker_factory(config_text=text)
    produced = metaq("produce", "orders", *zk, "--ca-file", str(pki.ca), input="a\nb\nc\n", env=env_for())
    assert produced.returncode == 0, produced.stderr
    registry = ZooKeeperRegistry(zookeeper.connect_string, zk_root, watch_cluster=False).start()
    try:
        registry.commit_offsets("billing", {("orders", PartitionId(1, 0)): 1})
    finally:
        registry.close()

    shown = metaq("cluster", *zk, "--ca-file", str(pki.ca), env=env_for())
    assert shown.returncode == 0, shown.stderr
    assert f"1   master  127.0.0.1:{broker.tls_port}" in shown.stdout  # its TLS address
    row = next(line.split() for line in shown.stdout.splitlines() if line.strip().startswith("orders  1-0"))
    assert row[-3:] == ["1", "3", "2"], shown.stdout  # committed 1, log end 3 (asked over TLS as alice), lag 2
    assert shown.stderr == ""
    wait_until(lambda: any("authenticated as User:alice" in line for line in broker.log_lines), 10,
               message="metaq cluster to log in as alice")
