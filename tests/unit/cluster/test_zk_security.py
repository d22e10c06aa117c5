"""ZooKeeper authentication settings and the ACL each metaq znode gets (metaq.cluster.zk_security)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.ini import parse_config
from metaq.cluster.layout import Paths
from metaq.cluster.zk_security import ALL, CREATE, READ, AclEntry, ZkSecurity, acl_for, describe_acl
from metaq.errors import ConfigError

BROKERS = ("sasl", "metaq")
ANYONE_READS = AclEntry(READ, "world", "anyone")


@pytest.mark.parametrize(("path", "expected"), [
    ("/meta", (AclEntry(ALL, *BROKERS), ANYONE_READS)),
    ("/meta/brokers/ids/1/master", (AclEntry(ALL, *BROKERS), ANYONE_READS)),
    ("/meta/brokers/replica-groups/1", (AclEntry(ALL, *BROKERS), ANYONE_READS)),
    ("/meta/metaq-security", (AclEntry(ALL, *BROKERS),)),
    ("/meta/metaq-security/users/admin", (AclEntry(ALL, *BROKERS),)),   # credentials: the brokers alone
    ("/meta/metaq-security/acls", (AclEntry(ALL, *BROKERS),)),
    ("/meta/consumers", (AclEntry(ALL, *BROKERS), AclEntry(READ | CREATE, "world", "anyone"))),
    ("/meta/consumers/billing/offsets/orders/1-0", (AclEntry(ALL, *BROKERS), ANYONE_READS)),
])
def test_each_node_gets_the_acl_of_its_place_in_the_layout(path: str, expected: tuple[AclEntry, ...]) -> None:
    assert acl_for(path, Paths("/meta"), BROKERS) == expected


def test_a_security_node_elsewhere_in_the_name_is_not_taken_for_the_security_subtree() -> None:
    assert acl_for("/meta/consumers/metaq-security", Paths("/meta"), BROKERS)[1] == ANYONE_READS
    assert acl_for("/meta/metaq-securityx", Paths("/meta"), BROKERS)[1] == ANYONE_READS


def test_describe_acl() -> None:
    assert describe_acl(acl_for("/meta/consumers", Paths("/meta"), BROKERS)) == \
        "sasl:metaq=all, world:anyone=read+create"


def test_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ConfigError, match="need a ZooKeeper identity"):
        ZkSecurity(set_acl=True)
    with pytest.raises(ConfigError, match="METAQ_ZK_PASSWORD"):
        ZkSecurity(sasl_user="metaq")
    with pytest.raises(ConfigError, match="not supported"):
        ZkSecurity(sasl_user="metaq", sasl_password="x", sasl_mechanism="PLAIN")
    assert ZkSecurity(tls_ca_file="ca.pem").tls  # a CA file implies TLS
    assert "secret" not in repr(ZkSecurity(sasl_user="metaq", sasl_password="secret"))


def test_zookeeper_section_options(monkeypatch: pytest.MonkeyPatch) -> None:
    text = ("[system]\n[zookeeper]\nzk.zkConnect=127.0.0.1:2181\nzk.zkSaslUser=metaq\nzk.zkSetAcl=true\n"
            "zk.zkSslCaFile=ca.pem\n")
    zk = parse_config(text, "server.ini", base_dir=Path("/etc/metaq")).zookeeper
    assert zk is not None and (zk.sasl_user, zk.set_acl, str(zk.tls_ca_file)) == ("metaq", True, "/etc/metaq/ca.pem")
    monkeypatch.setenv("METAQ_ZK_PASSWORD", "pw")
    security = zk.security()
    assert (security.sasl_password, security.tls, security.identity) == ("pw", True, ("sasl", "metaq"))
    monkeypatch.delenv("METAQ_ZK_PASSWORD")
    with pytest.raises(ConfigError, match="METAQ_ZK_PASSWORD"):
        zk.security()
    with pytest.raises(ConfigError, match=r"zk\.zkSetAcl=true needs zk\.zkSaslUser"):
        parse_config("[zookeeper]\nzk.zkConnect=127.0.0.1:2181\nzk.zkSetAcl=true\n", "server.ini")
