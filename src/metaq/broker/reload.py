"""The broker's configuration while it runs: server.ini read again, and the topic options layered over it.

The configuration in force (:attr:`metaq.broker.core.Broker.config`) is server.ini with the start's flags
over it, plus the options of topics created with CreateTopic configs (kept in the data directory,
:mod:`metaq.broker.topic_options`), and on an autoSyncMasterConfig slave its master's topic options in place
of its own file's. A reload (SIGHUP, or `metaq admin reload`: :meth:`Reloading.reload_from_file`) reads the
file again and applies what it can live; a master publishes its topic options for its slaves
(:meth:`Reloading.announce_config`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metaq.broker.cluster import ClusterLink
from metaq.broker.config import (
    BrokerConfig,
    TopicConfig,
    diff_topics,
    keep_restart_options,
    merge_topic_configs,
    restart_required,
)
from metaq.broker.filters import MessageFilter, load_filters
from metaq.broker.ini import load_broker_config, topic_options_text
from metaq.broker.options import SYSTEM_OPTIONS, TOPIC_ATTRS
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.errors import ConfigError, InvalidRequestError, StorageError

log = logging.getLogger("metaq.broker")


@dataclass(frozen=True)
class Reloaded:
    """What a reload did: the topics whose settings changed, and the changed options it could not apply."""

    changed_topics: list[str]
    restart_required: list[str]


class Reloading:
    """Reload and the configuration layers: a mixin of :class:`metaq.broker.core.Broker`, whose attributes
    below are."""

    config: BrokerConfig
    """In force: the file's configuration with the created topics' (and a master's) options."""
    _file_config: BrokerConfig
    """server.ini and the start's flags, as last read."""
    _started_config: BrokerConfig
    _created: dict[str, TopicConfig]
    _master_topics: tuple[dict[str, TopicConfig], dict[str, str]] | None
    filters: dict[str, MessageFilter]
    config_path: str | None
    cli_overrides: dict[str, str]
    topics: dict[str, Any]
    slave: SlaveConfig | None
    cluster: ClusterLink

    def ensure_topic(self, topic: str, num_partitions: int | None) -> Any:
        raise NotImplementedError  # the Broker's

    def _effective(self, file_config: BrokerConfig) -> BrokerConfig:
        """``file_config`` with the created topics' options as [topic=...] sections under its own.

        Where both set a key, server.ini's section wins: the operator's file is what a reload applies.
        A slave with autoSyncMasterConfig takes its master's topic options instead of its file's.
        """
        file_config = self._with_master_topics(file_config)
        if not self._created:
            return file_config
        topics = dict(self._created)
        for name, section in file_config.topics.items():
            topics[name] = merge_topic_configs(topics[name], section) if name in topics else section
        return dataclasses.replace(file_config, topics=topics)

    def _with_master_topics(self, file_config: BrokerConfig) -> BrokerConfig:
        if self._master_topics is None:
            return file_config
        topics, defaults = self._master_topics
        config = file_config.with_overrides(defaults) if defaults else file_config
        own_filters = {n: t.group_filters for n, t in file_config.topics.items() if t.group_filters}
        merged = {n: dataclasses.replace(t, group_filters=own_filters.get(n, {})) for n, t in topics.items()}
        return dataclasses.replace(config, topics=merged)

    def apply_master_topics(self, topics: Mapping[str, TopicConfig], defaults: Mapping[str, str]) -> list[str]:
        """autoSyncMasterConfig: take the master's topic options (its [topic=...] sections and the topic
        defaults of its [system]) in place of this slave's own, live, as a reload does; the topics affected.
        ConfigError (nothing changed) when they do not check out here."""
        previous = self._master_topics
        self._master_topics = (dict(topics), dict(defaults))
        try:
            return self._apply(self._file_config)
        except Exception:
            self._master_topics = previous
            raise

    def master_topics_document(self) -> dict[str, Any]:
        """What a master publishes for autoSyncMasterConfig slaves: its effective topic sections (server-side
        group filters left out: they name code, which a slave runs only from its own file) and the topic
        defaults of its [system]."""
        topics = {}
        for name, section in self.config.topics.items():
            topics[name] = {k: v for k, v in topic_options_text(section).items() if not k.startswith("group.")}
        defaults = {}
        for attr in TOPIC_ATTRS:
            opt = next(o for o in SYSTEM_OPTIONS.values() if o.attr == attr)
            value = getattr(self.config, attr)
            defaults[opt.key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
        return {"topics": topics, "defaults": defaults}

    def load_filters(self) -> None:
        """Import the server-side filters server.ini names (at start); ConfigError naming the one that fails."""
        self.filters = load_filters(self._file_config.topics)

    def reload_from_file(self) -> Reloaded:
        """Read server.ini again, with the start's flags over it, and apply its [topic=…] changes and the
        live [system] options; what it cannot apply (restart-only options) is reported, and the values
        the broker started with stay in force for them.

        The one reload path: SIGHUP and the Reload request (`metaq admin reload`) both come here, so they
        log the same lines and fail the same way. A file that is refused, or a server-side filter that
        cannot be loaded, changes nothing: one ERROR line, no traceback, and InvalidRequestError saying why.
        """
        path = self.config_path
        if not path:
            log.warning("reload ignored: the broker was started without -f server.ini")
            raise InvalidRequestError("the broker was started without -f server.ini: nothing to reload")
        try:
            new_config = load_broker_config(path, self.cli_overrides)
            filters = load_filters(new_config.topics)  # changed modules imported again
            pending = restart_required(self._started_config, new_config)
            changed = self._apply(keep_restart_options(self._started_config, new_config))
        except ConfigError as exc:  # the operator's mistake, not the broker's
            log.error("reload of %s refused: %s", path, exc)
            raise InvalidRequestError(f"{exc} (the running configuration is unchanged)") from None
        except StorageError as exc:  # a grown topic's new partition could not be created
            log.error("reload of %s failed: %s", path, exc)
            raise
        self.filters = filters
        log.info("reloaded %s: topics changed: %s", path, ", ".join(changed) or "none")
        if pending:
            log.warning("reload of %s: changed but applied only by a restart: %s", path, ", ".join(pending))
        self.announce_config()
        return Reloaded(changed, pending)

    def announce_config(self) -> None:
        """A master in ZooKeeper mode publishes its topic options (for autoSyncMasterConfig slaves)."""
        if self.slave is None and self.cluster.mode == "zookeeper":
            self.cluster.publish_config(self.master_topics_document())

    def _apply(self, new_config: BrokerConfig) -> list[str]:
        self._file_config = new_config
        new_config = self._effective(new_config)
        diff = diff_topics(self.config, new_config)
        self.config = new_config
        affected = set(self.topics) | set(new_config.topics) if diff.defaults_changed else set(diff.topics)
        for topic in sorted(affected):
            if topic in self.topics or topic in new_config.topics:
                self.ensure_topic(topic, None)
        return sorted(affected)
