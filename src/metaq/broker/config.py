"""The broker's configuration as checked values: [system], [zookeeper] and [topic=NAME] sections.

:class:`BrokerConfig` is what the broker runs with. It is built by :mod:`metaq.broker.ini` from a
``server.ini`` (or the defaults), with flags applied by :meth:`BrokerConfig.with_overrides`; every
value was checked by the option table (:mod:`metaq.broker.options`). What a live reload changes is
:func:`diff_topics`; what it leaves for a restart, :func:`restart_required` (the running values of those
options stay in force until then: :func:`keep_restart_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metaq.broker.options import (
    SETTABLE,
    STALL_WARNING,
    STAT_IGNORED,
    TOPIC_ATTRS,
    ZK_OPTIONS,
    DeletePolicy,
    convert,
    cross_check,
    parse_delete_policy,
    suggest,
)
from metaq.cluster.zk_security import ZkSecurity
from metaq.errors import ConfigError
from metaq.types import validate_topic

__all__ = [
    "BrokerConfig",
    "TopicConfig",
    "TopicSettings",
    "TopicsDiff",
    "ZkConfig",
    "diff_topics",
    "keep_restart_options",
    "merge_topic_configs",
    "restart_required",
]


@dataclass(frozen=True)
class ZkConfig:
    """The ``[zookeeper]`` section; its presence (with ``zk.zkEnable`` true) means ZooKeeper mode."""

    connect: str
    session_timeout_ms: int = 30000
    connection_timeout_ms: int = 30000
    sync_time_ms: int = 5000
    root: str = "/meta"
    enable: bool = True
    sasl_user: str | None = None
    """ZooKeeper SASL user (password: env METAQ_ZK_PASSWORD); docs/security.md#zookeeper."""
    sasl_mechanism: str = "DIGEST-MD5"
    set_acl: bool = False
    """Kafka's zookeeper.set.acl: create every znode with ACLs (metaq.cluster.zk_security)."""
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_check_hostname: bool = True

    def security(self) -> ZkSecurity:
        """How to reach ZooKeeper (the password from METAQ_ZK_PASSWORD); ConfigError when it is missing."""
        return ZkSecurity.from_env(
            self.sasl_user, sasl_mechanism=self.sasl_mechanism, set_acl=self.set_acl, tls=self.tls,
            tls_ca_file=_str(self.tls_ca_file), tls_cert_file=_str(self.tls_cert_file),
            tls_key_file=_str(self.tls_key_file), tls_check_hostname=self.tls_check_hostname)


def _str(path: Path | None) -> str | None:
    return None if path is None else str(path)


@dataclass(frozen=True)
class TopicConfig:
    """A ``[topic=NAME]`` section: only what it overrides; ``None`` means "as in [system]"."""

    name: str
    num_partitions: int | None = None
    unflush_threshold: int | None = None
    unflush_interval_ms: int | None = None
    delete_policy: str | None = None
    delete_when: str | None = None
    accept_publish: bool | None = None
    accept_subscribe: bool | None = None
    stat: bool | None = None
    sync_replication: bool | None = None
    group_filters: dict[str, str] = field(default_factory=dict)
    """Consumer group -> ``"module:callable"`` of its server-side filter (checked for shape only)."""


@dataclass(frozen=True)
class TopicSettings:
    """The effective settings of one topic: its own section's values, else [system]'s."""

    topic: str
    configured: bool
    """True when the topic has a ``[topic=...]`` section; False for a dynamic topic."""
    num_partitions: int
    unflush_threshold: int
    unflush_interval_ms: int
    delete_policy: str
    delete_when: str
    accept_publish: bool
    accept_subscribe: bool
    stat: bool
    group_filters: dict[str, str]
    sync_replication: bool = False

    @property
    def retention(self) -> DeletePolicy:
        return parse_delete_policy(self.delete_policy)


@dataclass(frozen=True)
class BrokerConfig:
    """A broker's whole configuration, checked. Built by :mod:`metaq.broker.ini` (``load_config``, ``parse_config``)."""

    broker_id: int
    data_path: Path
    server_port: int
    host_name: str
    num_partitions: int
    unflush_threshold: int
    unflush_interval_ms: int
    max_segment_bytes: int
    max_transfer_bytes: int
    delete_policy: str
    delete_when: str
    accept_publish: bool
    accept_subscribe: bool
    stat: bool
    update_consumer_offsets: bool
    load_message_stores_in_parallel: bool
    verify_after_unclean_start: bool
    max_open_files: int
    """0: auto (options.MAX_OPEN_FILES_AUTO; the broker's service sets the budget from the open-files limit)."""
    syncfs: str
    """auto (where the data directory's filesystem honours syncfs) or off."""
    syncfs_min_partitions: int
    syncfs_quiet_min_partitions: int
    sync_inline_max_partitions: int
    max_message_bytes: int
    max_batch_bytes: int
    auto_create_topics: bool
    max_connections: int
    connection_idle_timeout_s: int
    connection_handshake_timeout_s: int
    max_waiting_fetches: int
    max_waiting_fetches_per_connection: int
    max_frame_bytes: int
    max_partial_frames_bytes: int
    dashboard_http_port: int | None = None
    """Where /metrics is served over HTTP (0: any free port); None: not served."""
    sync_replication: bool = False
    min_in_sync_slaves: int = 1
    in_sync_max_lag_ms: int = 10_000
    degrade_to_async: bool = False
    auto_failover: bool = False
    http_port: int = -1
    flush_tx_log_at_commit: int = 1
    max_checkpoints: int = 3
    checkpoint_interval_ms: int = 3_600_000
    max_tx_timeout_timer_capacity: int = 30_000
    max_tx_timeout_s: int = 60
    transaction_first_check_ms: int = 6000
    transaction_check_interval_ms: int = 60_000
    transaction_check_max: int = 15
    file_umask: int = 0o077
    """fileUmask: the broker process's umask (docs/security.md#files-on-disk)."""
    data_log_path: Path | None = None
    """The transaction log's directory (MetaQ's dataLogPath); None: ``data_path / ".txlog"``."""
    max_delay_s: int = 604_800
    """The longest delay of a delayed message (docs/delayed.md)."""
    malloc_trim_threshold_bytes: int = 0
    """glibc's trim threshold, set at start-up (mallopt); 0: glibc's own."""
    malloc_mmap_threshold_bytes: int = 0
    """glibc's mmap threshold, set at start-up (mallopt); 0: glibc's own."""
    ssl_port: int | None = None
    """The TLS client port (docs/security.md); None: no TLS listener."""
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None
    ssl_ca_file: Path | None = None
    ssl_client_auth: str = "none"
    ssl_http: bool = True
    kafka_port: int | None = None
    """The Kafka-protocol listener (docs/kafka.md); None: off."""
    kafka_ssl_port: int | None = None
    """The Kafka-protocol listener over TLS (with sslCertFile); None: off."""
    ssl_replication: bool = False
    auth_required: bool = False
    sasl_users_file: Path | None = None
    replication_user: str | None = None
    acl_enabled: bool = False
    acl_file: Path | None = None
    super_users: tuple[str, ...] = ()
    http_basic_auth_over_plaintext: bool = False
    quota_producer_byte_rate: int = 0
    quota_consumer_byte_rate: int = 0
    quota_max_connections: int = 0
    quota_overrides: dict[str, Any] = field(default_factory=dict)
    """Per-principal quotas (metaq.broker.options.QuotaOverride by principal) over the three defaults."""
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    zookeeper: ZkConfig | None = None
    source_path: Path | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Things accepted but worth telling the operator (ignored MetaQ options, odd combinations).

    Not logged here: whoever loads the configuration reports them (the broker command prints them)."""

    @property
    def tx_log_dir(self) -> Path:
        return self.data_log_path if self.data_log_path is not None else self.data_path / ".txlog"

    @property
    def ha_mode(self) -> bool:
        """Replication with epochs and the in-sync set (docs/replication.md): syncReplication for [system] or
        any topic, or autoFailover. Every replica then needs a replica id (--slave-id)."""
        return self.auto_failover or self.sync_replication or any(t.sync_replication for t in self.topics.values())

    def topic_settings(self, topic: str) -> TopicSettings:
        """Effective settings for ``topic``, configured or dynamic. Raises InvalidArgument for a bad name."""
        validate_topic(topic)
        own = self.topics.get(topic)
        values: dict[str, Any] = {}
        for attr in TOPIC_ATTRS:
            value = getattr(own, attr) if own is not None else None
            values[attr] = getattr(self, attr) if value is None else value
        filters = dict(own.group_filters) if own is not None else {}
        return TopicSettings(topic=topic, configured=own is not None, group_filters=filters, **values)

    def with_overrides(self, overrides: Mapping[str, str]) -> BrokerConfig:
        """A copy with [system] options replaced by text values keyed by MetaQ name (``serverPort``).

        Values are checked exactly as in a file; errors name the flag (``--serverPort: ...``). A
        relative ``dataPath`` given this way is relative to the current directory.
        """
        values = {o.attr: getattr(self, o.attr) for o in SETTABLE.values()}
        where: dict[str, str] = {}
        for key, text in overrides.items():
            opt = SETTABLE.get(key)
            if opt is None:
                raise ConfigError(f"--{key}: unknown option{suggest(key, SETTABLE, prefix='--')}")
            values[opt.attr] = convert(opt, str(text).strip(), f"--{key}")
            where[opt.key] = f"--{key}"
        warnings = [w for w in self.warnings if not w.endswith(STALL_WARNING)]
        if "stat" in overrides:
            warnings.append(f"--stat: {STAT_IGNORED}")
        cross_check(values, where, warnings)
        return dataclasses.replace(self, warnings=tuple(warnings), **values)


def merge_topic_configs(base: TopicConfig, over: TopicConfig) -> TopicConfig:
    """``over``'s values where it sets them, else ``base``'s (filters: both, ``over`` winning per group)."""
    values = {attr: getattr(over, attr) if getattr(over, attr) is not None else getattr(base, attr)
              for attr in TOPIC_ATTRS}
    return TopicConfig(name=over.name, group_filters={**base.group_filters, **over.group_filters}, **values)


# --------------------------------------------------------------------------------------------------
# Reload support.


@dataclass(frozen=True)
class TopicsDiff:
    """What a reload changes for topics (see :func:`diff_topics`)."""

    added: frozenset[str]
    """Topics with a [topic=...] section now but not before."""
    removed: frozenset[str]
    """Topics whose section went away; they fall back to the [system] values (dynamic topics)."""
    changed: frozenset[str]
    """Topics configured before and after whose effective settings differ."""
    defaults_changed: bool
    """A [system] value that topics inherit changed, so every topic without its own value is affected."""

    @property
    def topics(self) -> frozenset[str]:
        return self.added | self.removed | self.changed

    def __bool__(self) -> bool:
        return bool(self.topics) or self.defaults_changed


def diff_topics(old: BrokerConfig, new: BrokerConfig) -> TopicsDiff:
    """Which topics' settings differ between two configurations (for a live reload)."""
    both = old.topics.keys() & new.topics.keys()
    changed = frozenset(t for t in both if old.topic_settings(t) != new.topic_settings(t))
    defaults_changed = any(getattr(old, a) != getattr(new, a) for a in TOPIC_ATTRS)
    return TopicsDiff(
        added=frozenset(new.topics.keys() - old.topics.keys()),
        removed=frozenset(old.topics.keys() - new.topics.keys()),
        changed=changed,
        defaults_changed=defaults_changed,
    )


def restart_required(old: BrokerConfig, new: BrokerConfig) -> list[str]:
    """The MetaQ names of changed options that a reload cannot apply, in the option table's order:
    [system] keys, then [zookeeper]'s (``[zookeeper]`` itself when the section came or went)."""
    keys = [
        o.key
        for o in SETTABLE.values()
        if o.reload == "restart" and getattr(old, o.attr) != getattr(new, o.attr)
    ]
    if (old.zookeeper is None) != (new.zookeeper is None):
        keys.append("[zookeeper]")
    elif old.zookeeper is not None and new.zookeeper is not None:
        keys += [o.key for o in ZK_OPTIONS.values()
                 if getattr(old.zookeeper, o.attr) != getattr(new.zookeeper, o.attr)]
    return keys


def keep_restart_options(running: BrokerConfig, new: BrokerConfig) -> BrokerConfig:
    """``new`` with every option a reload cannot apply (and [zookeeper]) as in ``running``: what a reload
    puts in force. Without it a request reading such an option (maxTransferSize, say) would take the new
    value while the rest of the broker runs with the old one, and a later reload would no longer see the
    change as pending."""
    kept = {o.attr: getattr(running, o.attr) for o in SETTABLE.values() if o.reload == "restart"}
    return dataclasses.replace(new, zookeeper=running.zookeeper, **kept)
