"""A broker at work: its core, the TCP transport and the background jobs, started and stopped together.

`metaq broker` runs one per process (:mod:`metaq.broker.main` adds signals, the ready line and exit
codes); :mod:`metaq.testing.inprocess` runs one on a thread of a test process.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from metaq.allocator import tune_allocator
from metaq.broker.background import Job, default_jobs
from metaq.broker.config import BrokerConfig
from metaq.broker.connections import ConnectionLimits, ConnectionRegistry
from metaq.broker.core import Broker
from metaq.broker.options import MAX_OPEN_FILES_AUTO, MAX_OPEN_FILES_MAX
from metaq.broker.replication.ha import HighAvailability, ha_enabled
from metaq.broker.replication.slave import REPLICATION_PASSWORD_ENV, SlaveReplicator
from metaq.broker.transport import listen_tcp
from metaq.cluster.registry import RegistryError
from metaq.errors import ConfigError, StorageError
from metaq.net.tls import ClientAuth, ServerTls
from metaq.storage.files import raise_descriptor_limit

if TYPE_CHECKING:
    from metaq.broker.dashboard.server import MetricsServer
    from metaq.kafka.listener import KafkaListener

log = logging.getLogger("metaq.broker")

CLOSE_WAIT_S = 1.0
"""How long stop() waits for the listening socket to close."""
DESCRIPTORS_RESERVED = 256
"""Descriptors besides segment files and client connections: listeners, the data directory lock, offset and
transaction logs, ZooKeeper, replica fetchers, the HTTP API, Python itself."""
MIN_STORAGE_DESCRIPTORS = 64
"""The least descriptor budget the storage is given when the open-files limit is too low for maxOpenFiles."""


def advertised_host(bound_host: str) -> str:
    """The host other machines reach a broker at: the bound one, unless it is a wildcard."""
    if bound_host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return bound_host


def server_tls(config: BrokerConfig) -> ServerTls | None:
    """The TLS certificate of a broker's listeners (sslCertFile...), or None. StartupError when a file is
    missing or unusable: said at start, not at the first client's handshake."""
    if config.ssl_cert_file is None:
        return None
    try:
        return ServerTls(str(config.ssl_cert_file), None if config.ssl_key_file is None else str(config.ssl_key_file),
                         None if config.ssl_ca_file is None else str(config.ssl_ca_file),
                         cast(ClientAuth, config.ssl_client_auth))
    except ConfigError as exc:
        raise StartupError(str(exc)) from None


class _Servers:
    """The plaintext and the TLS listening sockets, closed and started together."""

    def __init__(self, plain: asyncio.Server, tls: asyncio.Server) -> None:
        self.plain = plain
        self.tls = tls
        self.sockets = plain.sockets

    def close(self) -> None:
        self.plain.close()
        self.tls.close()

    async def start_serving(self) -> None:
        await self.plain.start_serving()
        await self.tls.start_serving()

    async def wait_closed(self) -> None:
        await self.plain.wait_closed()
        await self.tls.wait_closed()


class StartupError(Exception):
    """The broker cannot start with a valid configuration (port taken, data directory unusable).

    Its message is the one line `metaq broker` prints before it exits.
    """


class BrokerService:
    """Serves ``broker`` over TCP on its configured hostName:serverPort, with ``jobs`` beside it.

    ``jobs`` default to what `metaq broker` runs (:func:`metaq.broker.background.default_jobs`).
    """

    def __init__(self, broker: Broker, *, jobs: Sequence[Job] | None = None) -> None:
        self.broker = broker
        self.registry = ConnectionRegistry(ConnectionLimits.from_config(broker.config), broker.stats)
        self.jobs = list(default_jobs(broker.config) if jobs is None else jobs)
        self._server: asyncio.Server | _Servers | None = None
        self._tasks: list[asyncio.Task[None]] = []
        tls = server_tls(broker.config)
        http_tls = tls.context if tls is not None and broker.config.ssl_http else None
        port = broker.config.http_port
        self.http: HttpListener | None = None
        if port >= 0:
            from metaq.http.listener import HttpListener  # aiohttp is loaded only when the API is on

            self.http = HttpListener(broker, broker.config.host_name, port, ssl_context=http_tls)
        """The HTTP API (httpPort >= 0; docs/http.md): bound with the TCP port, serving once the core is."""
        self.metrics: MetricsServer | None = None
        """/metrics and the dashboard over HTTP, when dashboardHttpPort is set (:mod:`metaq.broker.dashboard`)."""
        self.tls: ServerTls | None = tls
        """The TLS listeners' certificate (sslCertFile), reloaded by :meth:`reload_tls` (SIGHUP)."""
        self.tls_port: int | None = None
        """The bound TLS port (sslPort), once started."""
        self._tls_server: asyncio.Server | None = None
        self.http_ssl_context: ssl.SSLContext | None = http_tls
        self.kafka: KafkaListener | None = None
        """The Kafka-protocol listener (kafkaPort / kafkaSslPort; docs/kafka.md), bound with the others."""
        """What the HTTP API, /metrics and the dashboard serve HTTPS with (None: plain HTTP)."""

    async def start(self) -> None:
        """Bind, open the data directory (in a worker thread), serve, start the jobs; StartupError when
        the broker cannot. The port is bound first: a port in use leaves no data directory behind."""
        loop = asyncio.get_running_loop()
        config = self.broker.config
        try:
            self.broker.load_filters()  # a group filter that cannot be imported refuses the start (fails closed)
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        server: asyncio.Server | _Servers | None = None
        plain: asyncio.Server | None = None
        if config.server_port >= 0:  # serverPort=-1: a TLS-only broker (docs/security.md)
            try:
                server = plain = await listen_tcp(self.broker, self.registry, config.host_name, config.server_port)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                if exc.errno == errno.EADDRINUSE:
                    reason = "the address is already in use (another broker? choose another serverPort)"
                raise StartupError(f"cannot listen on {config.host_name}:{config.server_port}: {reason}") from None
        if config.ssl_port is not None:
            assert self.tls is not None  # the option check makes sslPort need sslCertFile
            try:
                self._tls_server = await listen_tcp(self.broker, self.registry, config.host_name, config.ssl_port,
                                                    ssl_context=self.tls.context)
            except OSError as exc:
                if server is not None:
                    server.close()
                reason = exc.strerror or str(exc)
                if exc.errno == errno.EADDRINUSE:
                    reason = "the address is already in use (choose another sslPort, or 0 for a free one)"
                raise StartupError(f"cannot listen for TLS on {config.host_name}:{config.ssl_port}: {reason}") from None
            server = _Servers(plain, self._tls_server) if plain is not None else self._tls_server
        assert server is not None, "serverPort=-1 needs sslPort (the option check)"
        if config.replication_user and not os.environ.get(REPLICATION_PASSWORD_ENV):
            server.close()
            raise StartupError(f"replicationUser={config.replication_user} needs its password in the "
                               f"{REPLICATION_PASSWORD_ENV} environment variable")
        cluster = self.broker.cluster
        if self.broker.slave is not None and cluster.mode != "zookeeper":
            server.close()
            raise StartupError("a slave (--slave) needs ZooKeeper mode to find its master: add a [zookeeper] "
                               "section with zk.zkConnect to server.ini (docs/replication.md)")
        ha: HighAvailability | None = None
        if ha_enabled(self.broker):
            if self.broker.replica is None:
                server.close()
                raise StartupError("syncReplication / autoFailover need a replica id on every replica of a broker "
                                   "id, the master too: start it with --slave-id N (distinct per replica; "
                                   "docs/replication.md)")
            ha = HighAvailability(self.broker, self.broker.replica)
            self.broker.ha = ha  # writes are refused until the epoch is started (its lease)
        if config.dashboard_http_port is not None:
            try:
                await self._bind_metrics(config.host_name, config.dashboard_http_port)
            except BaseException:
                server.close()
                raise
        try:
            self._bind_http()
            await self._bind_kafka()
        except StartupError:
            server.close()
            if self.http is not None:
                await self.http.close()
            await self._close_metrics()
            raise
        try:
            await loop.run_in_executor(None, self._connect_cluster)
            await loop.run_in_executor(None, self._open_data)
            await loop.run_in_executor(None, self._load_acls)
        except BaseException:
            server.close()
            if self.http is not None:
                await self.http.close()
            if self.kafka is not None:
                await self.kafka.close()
            await self._close_metrics()
            await loop.run_in_executor(None, cluster.close)
            raise
        await server.start_serving()
        if self.http is not None:
            await self.http.start()
        if self.kafka is not None:
            await self.kafka.start()
        self._server = server
        self.broker.host, self.broker.port = server.sockets[0].getsockname()[:2]
        if self._tls_server is not None:
            self.tls_port = self._tls_server.sockets[0].getsockname()[1]
            self.broker.tls_port = self.tls_port
            log.info("TLS clients on %s:%d (client certificates: %s)", self.broker.host, self.tls_port,
                     config.ssl_client_auth)
        try:
            # registered only once serving: a client that finds the broker can reach it
            await loop.run_in_executor(None, self._join_cluster)
        except BaseException:
            server.close()
            if self.http is not None:
                await self.http.close()
            if self.kafka is not None:
                await self.kafka.close()
            await self._close_metrics()
            await loop.run_in_executor(None, self.broker.close)
            await loop.run_in_executor(None, cluster.close)
            raise
        if self.metrics is not None:
            self.metrics.serve()
            log.info("metrics at %s", self.metrics.url)
        self._tasks = [loop.create_task(job(self.broker)) for job in self.jobs]
        if self.broker.slave is None:
            self._tasks.append(loop.create_task(self.broker.delay.run(), name="metaq-delay"))
        if ha is not None:
            self._tasks.append(loop.create_task(ha.run(), name="metaq-ha"))
        elif self.broker.slave is not None:
            replicator = SlaveReplicator(self.broker, self.broker.slave)
            self._tasks.append(loop.create_task(replicator.run(), name="metaq-slave"))
        self._tasks.append(loop.create_task(self.registry.run_sweeper()))

    def _bind_http(self) -> None:
        if self.http is None:
            return
        host, port = self.broker.config.host_name, self.broker.config.http_port
        try:
            self.http.bind()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                reason = "the address is already in use (choose another httpPort, or 0 for a free one)"
            raise StartupError(f"cannot listen for HTTP on {host}:{port}: {reason}") from None
    async def _bind_kafka(self) -> None:
        config = self.broker.config
        if config.kafka_port is None and config.kafka_ssl_port is None:
            return
        from metaq.kafka.listener import KafkaListener, bind_error  # kio is loaded only when the listener is on

        kafka = KafkaListener(self.broker, config.host_name, config.kafka_port, ssl_port=config.kafka_ssl_port,
                              ssl_context=self.tls.context if self.tls is not None else None,
                              advertised_host=advertised_host(config.host_name))
        try:
            await kafka.bind()
        except OSError as exc:
            raise StartupError(bind_error(config.host_name, exc)) from None
        self.kafka = kafka

    async def _bind_metrics(self, host: str, port: int) -> None:
        """Take the metrics port now, before the data directory: a taken port leaves nothing behind."""
        from metaq.broker.dashboard.server import MetricsServer, bind_error  # aiohttp is loaded only when asked for

        metrics = MetricsServer(self.broker)
        try:
            await metrics.bind(host, port, ssl_context=self.http_ssl_context)
        except OSError as exc:
            raise StartupError(bind_error(host, port, exc)) from None
        self.metrics = metrics

    async def _close_metrics(self) -> None:
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            await metrics.close()

    def reload_tls(self) -> bool:
        """Read the certificate files again (SIGHUP): new TLS connections use them, open ones keep theirs.
        A file that cannot be loaded is logged and the old certificate kept. False when there is no TLS."""
        if self.tls is None:
            return False
        try:
            self.tls.reload()
        except ConfigError as exc:
            log.error("TLS certificate not reloaded, the old one is still served: %s", exc)
            return False
        log.info("TLS certificate reloaded from %s (reload %d)", self.tls.cert_file, self.tls.reloads)
        return True

    def _load_acls(self) -> None:
        """aclEnabled: the ACLs as stored now, before the first request (refresh_acls follows changes)."""
        if not self.broker.config.acl_enabled:
            return
        from metaq.broker.security_sources import acl_source, acl_source_name
        from metaq.security.acl import decode_acls

        try:
            _, data = acl_source(self.broker)()
            self.broker.acls = decode_acls(data, self.broker.config.super_users, source=acl_source_name(self.broker))
        except (ConfigError, RegistryError) as exc:
            raise StartupError(f"cannot load the ACLs: {exc}") from None

    def _connect_cluster(self) -> None:
        try:
            self.broker.cluster.connect()
        except RegistryError as exc:
            raise StartupError(str(exc)) from None

    def _join_cluster(self) -> None:
        broker = self.broker
        broker.cluster_host = advertised_host(broker.host)
        ha = broker.ha if isinstance(broker.ha, HighAvailability) else None
        as_master = ha is not None and broker.slave is None
        if as_master:
            assert ha is not None
            try:
                ha.check_may_be_master()
            except (RuntimeError, RegistryError) as exc:
                raise StartupError(str(exc)) from None
        topics = {}
        for name, state in broker.topics.items():
            every_partition_closed = len(state.closed) >= state.num_partitions
            topics[name] = (state.num_partitions, state.settings.accept_publish and not every_partition_closed,
                            state.settings.accept_subscribe)
        try:
            broker.cluster.join(broker.cluster_host, broker.port, topics, tls_port=broker.tls_port,
                                ports=self.kafka.registered_ports() if self.kafka is not None else None)
        except RegistryError as exc:
            raise StartupError(str(exc)) from None
        if as_master:
            assert ha is not None
            try:
                ha.start_epoch()
            except RegistryError as exc:
                broker.cluster.leave()
                raise StartupError(f"cannot start a new master epoch: {exc}") from None
        broker.announce_config()

    def _open_data(self) -> None:
        """Create or open the data directory and everything in it (blocking)."""
        config = self.broker.config
        path = config.data_path
        if path.exists() and not path.is_dir():
            raise StartupError(f"dataPath {path} is not a directory")
        # glibc's heap thresholds fixed when asked (mallocTrimThreshold, mallocMmapThreshold; off by default, a
        # no-op without glibc): docs/benchmarks-history.md, "1 MB messages: glibc's heap trimming, broker and consumer"
        if (config.malloc_trim_threshold_bytes or config.malloc_mmap_threshold_bytes) and tune_allocator(
                config.malloc_trim_threshold_bytes, config.malloc_mmap_threshold_bytes):
            log.info("glibc heap: trim threshold %s, mmap threshold %s (mallocTrimThreshold, mallocMmapThreshold)",
                     config.malloc_trim_threshold_bytes or "glibc's", config.malloc_mmap_threshold_bytes or "glibc's")
        self._budget_descriptors(config)
        try:
            self.broker.open()
        except (OSError, StorageError, ConfigError) as exc:
            if isinstance(exc, OSError):
                detail = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            else:
                detail = str(exc)
            raise StartupError(f"cannot open dataPath {path}: {detail}") from None

    def _budget_descriptors(self, config: BrokerConfig) -> None:
        """Raise the soft open-files limit for the storage's descriptor budget (maxOpenFiles) and the
        connections, and give the storage what the limit leaves after connections (maxConnections of them,
        at most half of the limit) and DESCRIPTORS_RESERVED. ``auto``: as far as the hard limit goes (MetaQ's
        JVM raises its soft limit to the hard one by default, -XX:+MaxFDLimit), the budget being what is
        left, up to MAX_OPEN_FILES_MAX. A number the limit cannot give is cut, with a WARNING."""
        files = self.broker.logs.files
        auto = config.max_open_files == MAX_OPEN_FILES_AUTO
        asked = MAX_OPEN_FILES_MAX if auto else config.max_open_files
        wanted = asked + config.max_connections + DESCRIPTORS_RESERVED
        limit = raise_descriptor_limit(wanted)
        if limit >= wanted and not auto:
            return
        budget = max(MIN_STORAGE_DESCRIPTORS, min(asked, limit - DESCRIPTORS_RESERVED
                                                  - min(config.max_connections, limit // 2)))
        files.set_budget(budget)
        if auto:
            log.info("maxOpenFiles=auto: the open-files limit is %d; the storage keeps up to %d files open",
                     limit, budget)
        else:
            log.warning("the open-files limit is %d, below maxOpenFiles %d + maxConnections %d + %d: the storage "
                        "keeps at most %d files open, to leave connections room (each partition written beyond "
                        "that reopens its file). Raise the limit (ulimit -n, or LimitNOFILE= in a systemd unit) "
                        "or lower those options (docs/operations.md)", limit, config.max_open_files,
                        config.max_connections, DESCRIPTORS_RESERVED, budget)

    async def stop(self, drain_s: float) -> None:
        """Stop accepting connections, answer what is in flight (for at most ``drain_s``), stop the jobs,
        close the logs. Raises what closing the logs raised (a StorageError after a failed sync)."""
        loop = asyncio.get_running_loop()
        # first out of the cluster: producers and consumers route away while in-flight requests finish
        await loop.run_in_executor(None, self.broker.cluster.leave)
        server, self._server = self._server, None
        if server is not None:
            server.close()
        if self.http is not None:
            await self.http.stop_accepting()
        if self.kafka is not None:
            await self.kafka.stop_accepting()
        await self._close_metrics()
        await self.broker.drain(drain_s)
        if self.http is not None:
            await self.http.close()  # after the drain answered its long polls
        if self.kafka is not None:
            await self.kafka.close()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        try:
            await loop.run_in_executor(None, self.broker.close)
        finally:
            await loop.run_in_executor(None, self.broker.cluster.close)
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), CLOSE_WAIT_S)
