"""Client and producer settings, with their defaults in one place (docs/client.md lists them)."""

from __future__ import annotations

import dataclasses
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from metaq.client.replicas import READ_FROM_CHOICES, ReadFrom
from metaq.errors import ConfigError
from metaq.net.codec import ConnectionSettings
from metaq.net.retry import RetryPolicy
from metaq.net.tls import ClientTls
from metaq.protocol.records import Compression
from metaq.types import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from metaq.cluster.zk_security import ZkSecurity

KiB = 1024
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Settings of a session: connections, timeouts, metadata."""

    client_id: str = "metaq-python"
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    """How long a request may wait for its reply. A timeout closes the connection: replies come back
    in request order, so everything sent after the late request is stuck behind it."""
    max_in_flight: int = 64
    """Requests sent and not yet answered, per connection; more wait for a slot."""
    reconnect_attempts: int = 3
    """Connection attempts (with exponential backoff and jitter, :meth:`reconnect_retry`) before a request fails."""
    reconnect_backoff_s: float = 0.05
    reconnect_backoff_max_s: float = 2.0
    metadata_max_age_s: float = 30.0
    """Topic metadata older than this is refreshed in the background on next use."""
    metadata_min_interval_s: float = 0.05
    """Refreshes of one topic triggered by errors are at least this far apart."""
    write_buffer_high_bytes: int = 1 * MiB
    """Bytes buffered in a connection's transport before writers wait for it to drain."""
    max_frame_bytes: int = 64 * MiB
    unreachable_avoid_s: float = 2.0
    """How long producers leave out a broker that could not be reached (or a partition that refused a
    batch before appending it) when round robin or random picks partitions; a ZooKeeper-mode session
    takes a broker back as soon as it registers again."""
    broker_restart_wait_s: float = 60.0
    """Cluster mode: how long a pull consumer's ``iterate`` keeps retrying a partition whose broker
    cannot be reached (restarting; killed and not yet expired in ZooKeeper) before it ends with the
    error. It reconnects at the broker's registered address, so a restart on another port is followed."""
    zk_connect: str | None = None
    """Cluster mode (MetaQ's ``MetaClientConfig.zkConfig``): ZooKeeper's ``host:port[,host:port...]``.
    The brokers, topics and partitions are then read from ZooKeeper (watched, never per message)
    instead of being asked of ``servers`` (docs/cluster.md)."""
    zk_root: str = "/meta"
    """The cluster's root znode (MetaQ's ``zk.zkRoot``)."""
    zk_session_timeout_ms: int = 30_000
    zk_connection_timeout_ms: int = 30_000
    zk_sasl_username: str | None = None
    """Cluster mode: log in to ZooKeeper with SASL DIGEST-MD5 as this user (docs/security.md#zookeeper). The
    znodes of this client's consumer groups are then made with ACLs: only this identity may change them."""
    zk_sasl_password: str | None = field(default=None, repr=False)
    zk_tls: bool = False
    """Cluster mode: reach ZooKeeper over TLS (its secureClientPort); implied by any zk_tls_* file."""
    zk_tls_ca_file: str | None = None
    zk_tls_cert_file: str | None = None
    zk_tls_key_file: str | None = None
    zk_tls_check_hostname: bool = True
    read_from: ReadFrom = "master"
    """Which copy of a partition consumers read (pull and group consumers; MetaQ lets them read a master
    or its slaves): ``"master"`` (default), ``"slave"`` (only a live slave; with none, fetches wait for
    one), ``"prefer-slave"`` (a live slave, the master when none is). Slaves are found in ZooKeeper, so
    anything but ``"master"`` needs ``zk_connect``. A slave may be behind its master: an offset past
    its log end waits, never jumps (docs/replication.md#consumers-reading-from-slaves)."""

    tls: bool = False
    """Connect over TLS (the brokers' sslPort; in cluster mode the TLS ports registered in ZooKeeper). Implied
    by any tls_* file. The broker's certificate is always verified (docs/security.md)."""
    tls_ca_file: str | None = None
    """CA certificates (PEM) the broker's certificate is checked against; None: the system's trusted CAs."""
    tls_cert_file: str | None = None
    """This client's certificate (PEM chain), sent when the broker asks (mTLS, sslClientAuth)."""
    tls_key_file: str | None = None
    """The key of tls_cert_file (PEM, not password-protected); None: it is in tls_cert_file."""
    tls_check_hostname: bool = True
    """Check that the broker's certificate names the host connected to. False only for test setups."""
    sasl_username: str | None = None
    """Authenticate every connection as this user (SASL SCRAM-SHA-256; docs/security.md); None: do not."""
    sasl_password: str | None = field(default=None, repr=False)
    """The user's password: used to compute the SCRAM proof, never sent."""

    def __post_init__(self) -> None:
        if not self.tls and (self.tls_ca_file or self.tls_cert_file or self.tls_key_file):
            object.__setattr__(self, "tls", True)
        _positive(self, "connect_timeout_s", "request_timeout_s", "max_in_flight", "write_buffer_high_bytes",
                  "max_frame_bytes", "metadata_max_age_s",
                  "unreachable_avoid_s", "broker_restart_wait_s", "zk_session_timeout_ms", "zk_connection_timeout_ms")
        _non_negative(self, "reconnect_backoff_s", "reconnect_backoff_max_s", "metadata_min_interval_s")
        if self.reconnect_attempts < 1:
            raise ConfigError(f"reconnect_attempts must be >= 1, not {self.reconnect_attempts}")
        if (self.sasl_username is None) != (self.sasl_password is None):
            raise ConfigError("sasl_username and sasl_password go together")
        if (self.zk_sasl_username is None) != (self.zk_sasl_password is None):
            raise ConfigError("zk_sasl_username and zk_sasl_password go together")
        if self.read_from not in READ_FROM_CHOICES:
            raise ConfigError(f"read_from must be one of {', '.join(READ_FROM_CHOICES)}, not {self.read_from!r}")
        if self.read_from != "master" and self.zk_connect is None:
            raise ConfigError(f"read_from={self.read_from!r} needs cluster mode (zk_connect): a client finds "
                              "slaves in ZooKeeper (docs/replication.md)")

    def connection_settings(self) -> ConnectionSettings:
        """How the session's connections are opened (TLS when ``tls``: :mod:`metaq.net.tls`). ConfigError when
        a TLS file cannot be loaded."""
        return ConnectionSettings(self.client_id, self.connect_timeout_s, self.request_timeout_s, self.max_in_flight,
                                  self.max_frame_bytes, self.write_buffer_high_bytes, self.ssl_context(),
                                  self.sasl_username, self.sasl_password)

    def zk_security(self) -> ZkSecurity:
        """How this client reaches ZooKeeper (cluster mode): its own consumer groups' nodes get ACLs when it
        logs in (they name its identity)."""
        from metaq.cluster.zk_security import ZkSecurity  # metaq.cluster only in cluster mode

        return ZkSecurity(sasl_user=self.zk_sasl_username, sasl_password=self.zk_sasl_password,
                          set_acl=self.zk_sasl_username is not None, tls=self.zk_tls, tls_ca_file=self.zk_tls_ca_file,
                          tls_cert_file=self.zk_tls_cert_file, tls_key_file=self.zk_tls_key_file,
                          tls_check_hostname=self.zk_tls_check_hostname)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of this configuration (None: plain TCP)."""
        if not self.tls:
            return None
        return ClientTls(self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.tls_check_hostname).context()

    def reconnect_retry(self, max_attempts: int | None = None) -> RetryPolicy:
        """How connections are tried again: ``reconnect_attempts`` attempts in all (or ``max_attempts``),
        waiting ``reconnect_backoff_s`` doubling up to ``reconnect_backoff_max_s``, jittered x0.5 to x1.0."""
        return RetryPolicy(self.reconnect_backoff_s, self.reconnect_backoff_max_s, jitter=0.5,
                           max_attempts=self.reconnect_attempts if max_attempts is None else max_attempts)


UNBOUNDED_RETRIES = 2**31 - 1
"""An idempotent producer's ``retries`` unless set: as many resends as ``delivery_timeout_ms`` leaves time for
(Kafka's default), none of which can store a batch twice."""


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Settings of one producer."""

    batch_bytes: int = 64 * KiB
    """Target size of one partition's batch (one produce frame); a full batch is sent at once."""
    linger_ms: float = 5.0
    """Longest a message waits for its batch to fill while the partition has a batch in flight.
    An idle partition's batch is sent at the end of the current event-loop step instead."""
    compression: Compression = Compression.NONE
    max_buffered_bytes: int = 32 * MiB
    """Bytes of messages accepted and not yet acknowledged; ``send`` waits when this is reached."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest encoded message (payload + key + attribute + headers + 28 bytes) accepted locally."""
    acks: int = 1
    """1: the broker answers after its flush policy; 0: one-way for every send (MetaQ's async producer)."""
    request_timeout_s: float | None = None
    """None: the session's request_timeout_s."""
    delivery_timeout_ms: float = 120_000.0
    """The whole life of a send (Kafka's name and default): buffering, waiting for metadata, an open partition, a
    master or a connection, and resends. A send ends within it, stored, certainly not stored, or "may have been
    stored" (``error.maybe_stored``); a batch in flight at its deadline gets its failure then (docs/producer.md)."""
    retries: int | None = None
    """Resends of a batch whose failure may have stored it (a lost connection, a timeout): each can store it twice
    unless the producer is idempotent. None: 0 as MetaQ, or :data:`UNBOUNDED_RETRIES` with ``enable_idempotence``.
    A batch certainly not stored (a refusal before the append, a broker that could not be reached) is sent again
    within ``delivery_timeout_ms`` whatever this says: that cannot store it twice."""
    retry_backoff_ms: float = 100.0
    multi_produce: bool = True
    """Batches for several partitions of one broker that leave together (a burst spread round robin, a
    resend after a reconnect) go as one MultiProduce request with one reply, when the broker serves it
    (docs/protocol.md); False: one Produce request per batch, as older versions did."""
    enable_idempotence: bool = False
    """Stamp every batch with this producer's id and a sequence number per partition, so that the broker
    stores a resent batch once and answers with the original offsets (docs/transactions.md). Needs
    acks=1; retries default to :data:`UNBOUNDED_RETRIES`."""

    @property
    def effective_retries(self) -> int:
        """The retries in use: ``retries``, or :data:`IDEMPOTENT_RETRIES` for an idempotent producer, else 0."""
        if self.retries is not None:
            return self.retries
        return UNBOUNDED_RETRIES if self.enable_idempotence else 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "compression", Compression.parse(self.compression))
        _positive(self, "batch_bytes", "max_buffered_bytes", "max_message_bytes")
        _non_negative(self, "linger_ms", "retry_backoff_ms")
        _positive(self, "delivery_timeout_ms")
        if self.retries is not None:
            _non_negative(self, "retries")
        if self.acks not in (0, 1):
            raise ConfigError(f"acks must be 0 (one-way) or 1, not {self.acks!r}")
        if self.enable_idempotence and self.acks != 1:
            raise ConfigError("enable_idempotence needs acks=1: a one-way send gets no answer to retry on")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s must be > 0, not {self.request_timeout_s!r}")
        if self.batch_bytes > DEFAULT_MAX_BATCH_BYTES:
            raise ConfigError(f"batch_bytes {self.batch_bytes} is over the broker's batch limit "
                              f"{DEFAULT_MAX_BATCH_BYTES}")
        if self.max_buffered_bytes < self.batch_bytes:
            raise ConfigError(f"max_buffered_bytes ({self.max_buffered_bytes}) must be at least "
                              f"batch_bytes ({self.batch_bytes})")


_C = TypeVar("_C")


def build_config(cls: type[_C], options: dict[str, Any]) -> _C:
    """``cls(**options)``, with an unknown option named in a ConfigError instead of a TypeError."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(known))}")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{cls.__name__}: {exc}") from None


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name} must be a number > 0, not {value!r}")


def _non_negative(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be a number >= 0, not {value!r}")
