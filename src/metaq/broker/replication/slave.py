"""An async slave (MetaQ's): follow every partition of the master registered under this broker id.

The master is found in ZooKeeper at ``<root>/brokers/ids/<id>/master`` and its topics under
``brokers/topics-pub|topics-sub/<topic>/<id>-m`` (the registry's watched snapshot: no ZooKeeper call
here). Every topic the master announces is created here with the master's partition count (the slave
then announces ``topics-sub/<topic>/<id>-s<slaveId>`` itself, through the normal topic path), and each
partition gets a :class:`~metaq.broker.replication.fetcher.PartitionFollower`. A change of the cluster
view (the master restarted, maybe on another address; a new topic) is picked up at once through a
registry listener, and at least every ``RECONCILE_S`` anyway.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from typing import Any

from metaq.broker.config import BrokerConfig
from metaq.broker.core import Broker
from metaq.broker.ini import parse_topic_options
from metaq.broker.replication.fetcher import FollowerEpochs, PartitionFollower
from metaq.broker.replication.slave_config import SlaveConfig
from metaq.cluster.registry import Address, ClusterSnapshot
from metaq.errors import ConfigError, MetaqError
from metaq.net.codec import ConnectionSettings
from metaq.net.retry import wait_event
from metaq.net.tls import client_context

log = logging.getLogger("metaq.broker.replication")

RECONCILE_S = 1.0
REPLICATION_PASSWORD_ENV = "METAQ_REPLICATION_PASSWORD"
"""The password of replicationUser: an environment variable, never a flag or a line of server.ini."""
CONNECT_TIMEOUT_S = 5.0
FOLLOWERS_MAX = 10_000
"""One connection each: a limit so a misconfigured master cannot make the slave open without bound."""


def replication_tls(config: BrokerConfig) -> ssl.SSLContext | None:
    """sslReplication: the context a slave fetches from its master with (the master verified against sslCaFile,
    this broker's sslCertFile presented as its client certificate); None: plain TCP."""
    if not config.ssl_replication:
        return None
    assert config.ssl_ca_file is not None  # the option check makes sslReplication need sslCaFile
    return client_context(str(config.ssl_ca_file),
                          None if config.ssl_cert_file is None else str(config.ssl_cert_file),
                          None if config.ssl_key_file is None else str(config.ssl_key_file))


class SlaveReplicator:
    """The replica fetchers of a slave broker, and their state for ``metaq stats``."""

    def __init__(self, broker: Broker, slave: SlaveConfig, *, ha: FollowerEpochs | None = None) -> None:
        self.broker = broker
        self.ha = ha
        self.slave = slave
        self.broker_id = broker.config.broker_id
        self.followers: dict[tuple[str, int], PartitionFollower] = {}
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._master: Address | None = None
        self._config_watched = False
        self.master_config_applied = 0
        """autoSyncMasterConfig: how many times the master's topic options were applied."""
        self.master_config_error = ""
        self._settings = ConnectionSettings(
            client_id=f"metaq-slave-{self.broker_id}-s{slave.slave_id}/{slave.slave_group}",
            connect_timeout_s=CONNECT_TIMEOUT_S, request_timeout_s=slave.slave_max_delay_ms / 1000 + 10,
            max_in_flight=1, max_frame_bytes=broker.config.max_frame_bytes, ssl_context=replication_tls(broker.config),
            sasl_username=broker.config.replication_user,
            sasl_password=os.environ.get(REPLICATION_PASSWORD_ENV) if broker.config.replication_user else None,
            replica_id=slave.slave_id)
        self._master_address = (broker.cluster.master_tls_address if broker.config.ssl_replication
                                else broker.cluster.master_address)
        """Where the master is fetched from: its TLS port with sslReplication, else its plaintext one."""

    async def run(self) -> None:
        """Reconcile followers with the master's topics until cancelled."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def on_snapshot(_snapshot: ClusterSnapshot) -> None:  # the registry's thread: hop to the loop
            loop.call_soon_threadsafe(changed.set)

        self.broker.cluster.registry.add_listener(on_snapshot)
        self.broker.replication = self
        if self.slave.auto_sync_master_config and not self._config_watched:
            self._config_watched = True

            def on_config(document: dict[str, Any] | None) -> None:  # the registry's thread: hop to the loop
                loop.call_soon_threadsafe(self._apply_master_config, document)

            self.broker.cluster.registry.watch_master_config(self.broker_id, on_config)
        self.followers.clear()  # run again after a failed promotion: fresh followers
        self._tasks.clear()
        self._master = None
        log.info("slave %d of broker %d: following the master registered in ZooKeeper (%s)", self.slave.slave_id,
                 self.broker_id, self.broker.cluster.where)
        try:
            while True:
                changed.clear()
                try:
                    self._reconcile()
                except MetaqError as exc:  # a topic that cannot be created here: logged, tried again
                    log.error("slave cannot follow the master's topics: %s", exc)
                await wait_event(changed, RECONCILE_S)
        finally:
            for task in self._tasks.values():
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _apply_master_config(self, document: dict[str, Any] | None) -> None:
        """autoSyncMasterConfig: the master published its topic options; apply them as a reload would. A
        vanished document (the master stopped) keeps what was applied last."""
        if document is None or self.broker.replication is not self or self.broker.slave is None:
            return
        try:
            topics_raw, defaults = document.get("topics"), document.get("defaults")
            if not isinstance(topics_raw, dict) or not isinstance(defaults, dict):
                raise ConfigError("the master's topic options are not {topics: {...}, defaults: {...}}")
            topics = {str(name): parse_topic_options(str(name), sorted((str(k), str(v)) for k, v in opts.items()),
                                                     source=f"the master's [topic={name}]", filters=False)
                      for name, opts in topics_raw.items() if isinstance(opts, dict)}
            changed = self.broker.apply_master_topics(topics, {str(k): str(v) for k, v in defaults.items()})
        except (ConfigError, MetaqError) as exc:
            log.error("slave %d: the master's topic options are not applied (autoSyncMasterConfig): %s",
                      self.slave.slave_id, exc)
            self.master_config_error = str(exc)
            return
        self.master_config_applied += 1
        self.master_config_error = ""
        log.info("slave %d: applied the master's topic options (autoSyncMasterConfig); topics changed: %s",
                 self.slave.slave_id, ", ".join(changed) or "none")

    def _reconcile(self) -> None:
        broker = self.broker
        master = self._master_address()
        if master != self._master:
            if master is None:
                log.warning("the master of broker %d is not registered%s: waiting for it", self.broker_id,
                            " with a TLS port (sslReplication needs sslPort on the master)"
                            if broker.config.ssl_replication else "")
            else:
                log.info("the master of broker %d is at %s", self.broker_id, master)
            self._master = master
            for follower in self.followers.values():
                follower.wake()
        for topic, count in sorted(broker.cluster.master_topics().items()):
            state = broker.topics.get(topic)
            if state is None or state.num_partitions < count:
                broker.ensure_topic(topic, count)
            for partition in range(count):
                key = (topic, partition)
                if key in self.followers:
                    continue
                if len(self.followers) >= FOLLOWERS_MAX:
                    log.error("slave follows %d partitions already (the limit); %s-%d is not replicated",
                              FOLLOWERS_MAX, topic, partition)
                    return
                _, plog = broker.partition_log(topic, partition)
                follower = PartitionFollower(plog, self.broker_id, self._master_address, self._settings,
                                             max_bytes=broker.config.max_transfer_bytes,
                                             max_wait_ms=self.slave.slave_max_delay_ms,
                                             on_append=broker.waiters.notify, epochs=self.ha)
                self.followers[key] = follower
                self._tasks[key] = asyncio.get_running_loop().create_task(follower.run(), name=repr(follower))

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        partitions: dict[str, dict[str, Any]] = {}
        max_lag_messages = 0
        max_lag_ms = 0
        for (topic, partition), follower in sorted(self.followers.items()):
            entry = follower.describe(now)
            partitions.setdefault(topic, {})[str(partition)] = entry
            max_lag_messages = max(max_lag_messages, entry["lag_messages"])
            max_lag_ms = max(max_lag_ms, entry["lag_ms"])
        return {"role": "slave", "mode": "async", "broker_id": self.broker_id, "slave_id": self.slave.slave_id,
                "slave_group": self.slave.slave_group, "slave_max_delay_ms": self.slave.slave_max_delay_ms,
                "auto_sync_master_config": self.slave.auto_sync_master_config,
                "master_config_applied": self.master_config_applied, "master_config_error": self.master_config_error,
                "master": str(self._master) if self._master is not None else None,
                "max_lag_messages": max_lag_messages, "max_lag_ms": max_lag_ms, "partitions": partitions}
