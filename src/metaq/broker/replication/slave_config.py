"""MetaQ's ``async_slave.properties``: what makes a broker the async slave of its broker id's master.

MetaQ starts a slave with ``metaServer.sh start slave`` and reads these keys from
``conf/async_slave.properties`` (seed 004)::

    slaveId=0                       # >= 0: run as a slave; slaves of one master need distinct ids
    slaveGroup=meta-slave-group     # the group the slave subscribes to its master with
    slaveMaxDelayInMills=500        # the longest the slave's data may lag (ms)
    autoSyncMasterConfig=true       # follow the master's server.ini reloads (MetaQ 1.4.2)

metaq keeps the names: ``metaq broker --slave [--slave-config async_slave.properties] [--slave-id N]``.
What each key does in metaq (docs/replication.md): ``slaveId`` names the slave's ZooKeeper nodes;
``slaveMaxDelayInMills`` bounds the replica fetcher's long poll, so an idle partition's data is at most
that old when the master has new data; ``slaveGroup`` is accepted and only named in the fetcher's client
id (metaq's replica fetcher reads the master's partitions directly, never through a consumer group, so
a server-side group filter can never drop replicated messages); ``autoSyncMasterConfig`` is accepted
and acted on by the replica fetcher (the master's topic options, from ZooKeeper; docs/replication.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from metaq.errors import ConfigError

DEFAULT_SLAVE_GROUP = "meta-slave-group"
DEFAULT_MAX_DELAY_MS = 500
SLAVE_ID_MAX = 1024
KEYS = ("slaveId", "slaveGroup", "slaveMaxDelayInMills", "autoSyncMasterConfig")


@dataclass(frozen=True)
class SlaveConfig:
    """The checked ``async_slave.properties`` values of a broker started with ``--slave``."""

    slave_id: int = 0
    slave_group: str = DEFAULT_SLAVE_GROUP
    slave_max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    auto_sync_master_config: bool = False
    source_path: Path | None = None

    def with_slave_id(self, slave_id: int) -> SlaveConfig:
        return replace(self, slave_id=_slave_id(str(slave_id), "--slave-id"))


def _slave_id(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{where}: slaveId must be an integer 0..{SLAVE_ID_MAX}, not {text!r}") from None
    if not 0 <= value <= SLAVE_ID_MAX:
        raise ConfigError(f"{where}: slaveId {value} is outside 0..{SLAVE_ID_MAX} (a negative slaveId means "
                          "'not a slave' in MetaQ: start without --slave instead)")
    return value


def _bool(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "1"):
        return True
    if lowered in ("false", "no", "0"):
        return False
    raise ConfigError(f"{where}: expected true or false, not {text!r}")


def parse_slave_properties(text: str, source: str = "async_slave.properties") -> SlaveConfig:
    """Parse the properties text (``key=value`` lines, ``#`` and ``!`` comments). Unknown keys are an
    error naming the known ones, as a typo would otherwise silently leave a default in place."""
    values: dict[str, object] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        where = f"{source}:{number}: {key}"
        if not sep:
            raise ConfigError(f"{source}:{number}: expected key=value, got {line!r}")
        if key == "slaveId":
            values["slave_id"] = _slave_id(value, where)
        elif key == "slaveGroup":
            if not value:
                raise ConfigError(f"{where}: the group name is empty")
            values["slave_group"] = value
        elif key == "slaveMaxDelayInMills":
            try:
                delay = int(value)
            except ValueError:
                raise ConfigError(f"{where}: expected milliseconds (an integer), not {value!r}") from None
            if not 1 <= delay <= 3_600_000:
                raise ConfigError(f"{where}: {delay} is outside 1..3600000 ms")
            values["slave_max_delay_ms"] = delay
        elif key == "autoSyncMasterConfig":
            values["auto_sync_master_config"] = _bool(value, where)
        else:
            raise ConfigError(f"{where}: unknown key; async_slave.properties takes {', '.join(KEYS)}")
    return SlaveConfig(**values)  # type: ignore[arg-type]


def load_slave_config(path: str | Path | None, slave_id: int | None = None) -> SlaveConfig:
    """The slave configuration of ``metaq broker --slave``: the file (if any), then ``--slave-id``."""
    config = SlaveConfig()
    if path is not None:
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the slave configuration {source}: {exc.strerror or exc}") from None
        config = replace(parse_slave_properties(text, str(source)), source_path=source)
    if slave_id is not None:
        config = config.with_slave_id(slave_id)
    return config
