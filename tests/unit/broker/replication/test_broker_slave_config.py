"""MetaQ's async_slave.properties: the four keys with MetaQ's names and defaults, clear errors otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from metaq.broker.replication.slave_config import (
    DEFAULT_SLAVE_GROUP,
    SlaveConfig,
    load_slave_config,
    parse_slave_properties,
)
from metaq.errors import ConfigError

SEED_FILE = """\
#slave编号,大于等于0表示作为slave启动,同一个master下的slave编号应该设不同值.
slaveId=0

#作为slave启动时向master订阅消息的group,如果没配置则默认为meta-slave-group
slaveGroup=meta-slave-group

#slave数据同步的最大延时,单位毫秒
slaveMaxDelayInMills=500

autoSyncMasterConfig=true
"""


def test_metaqs_own_file_from_the_seed_parses() -> None:
    config = parse_slave_properties(SEED_FILE)
    assert config == SlaveConfig(slave_id=0, slave_group="meta-slave-group", slave_max_delay_ms=500,
                                 auto_sync_master_config=True)


def test_defaults_without_a_file_and_the_slave_id_flag_wins(tmp_path: Path) -> None:
    assert load_slave_config(None) == SlaveConfig(0, DEFAULT_SLAVE_GROUP, 500, False)
    path = tmp_path / "async_slave.properties"
    path.write_text("slaveId=2\nslaveMaxDelayInMills = 50\n! a comment\n")
    config = load_slave_config(path, slave_id=3)
    assert (config.slave_id, config.slave_max_delay_ms, config.source_path) == (3, 50, path)


@pytest.mark.parametrize(("text", "message"), [
    ("slaveID=1", "unknown key; async_slave.properties takes slaveId, slaveGroup"),
    ("slaveId=-1", "start without --slave"),
    ("slaveId=x", "must be an integer"),
    ("slaveMaxDelayInMills=0", "outside 1..3600000"),
    ("autoSyncMasterConfig=maybe", "expected true or false"),
    ("slaveGroup=", "empty"),
    ("justakey", "expected key=value"),
])
def test_mistakes_are_named_with_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"async_slave\.properties:1") as err:
        parse_slave_properties(text)
    assert message in str(err.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the slave configuration"):
        load_slave_config(tmp_path / "missing.properties")
