"""The broker's option table: every server.ini key, its type, default, sections, docs and validator.

Everything about an option is derived from one table, :data:`OPTIONS`: the ini reader
(:mod:`metaq.broker.ini`), the flags (:mod:`metaq.broker.cli_options`), the "did you mean"
suggestions, and the option table in ``docs/configuration.md`` (a unit test keeps the two in step).
Where metaq differs from MetaQ (loopback by default, options it adds, MetaQ options it accepts but
ignores) the table says so.

A value converter takes the text after ``=`` and returns the typed value or raises
:class:`InvalidValue` saying what is wrong; :func:`convert` adds where the value was set (file and
line, or flag) and turns it into a :class:`~metaq.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import ipaddress
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from metaq.broker.cron import CronError, check_quartz
from metaq.errors import ConfigError

__all__ = [
    "FRAME_OVERHEAD_BYTES",
    "GROUP_PREFIX",
    "OPTIONS",
    "SECTION_NAMES",
    "SETTABLE",
    "SYSTEM_OPTIONS",
    "TOPIC_ATTRS",
    "TOPIC_OPTIONS",
    "ZK_OPTIONS",
    "DeletePolicy",
    "InvalidValue",
    "Option",
    "by_section",
    "convert",
    "cross_check",
    "group_name",
    "options_markdown_rows",
    "parse_delete_policy",
    "suggest",
]

FRAME_OVERHEAD_BYTES = 64 * 1024
"""Room a produce frame needs beyond its record batch (request header, topic name, partition)."""

_JAVA_INT_MAX = 2**31 - 1
_KIB = 1024
_UNITS = {"": 1, "k": _KIB, "m": _KIB**2, "g": _KIB**3}

Section = Literal["system", "topic", "zookeeper"]
Status = Literal["metaq", "extension", "ignored"]
Reload = Literal["live", "restart"]
Converter = Callable[[str], Any]
SECTION_NAMES: tuple[Section, ...] = ("system", "zookeeper", "topic")


class InvalidValue(Exception):
    """A value that does not fit its option; the caller adds the file, line and key."""


# --------------------------------------------------------------------------------------------------
# Value converters. Each takes the text after '=' (already stripped) and returns the typed value or
# raises InvalidValue with what is wrong, in words a user can act on.

_NUM_RE = re.compile(r"(\d{1,19})")
_SIZE_RE = re.compile(r"(\d{1,19})([kmg]?)", re.IGNORECASE)
_SIZE_HINT = "write bytes as digits, a product such as 1024*1024, or a number with k, m or g (1k = 1024)"
_INT_HINT = "write digits, optionally a product such as 60*60*1000"


def _format_size(n: int) -> str:
    for unit in ("g", "m", "k"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def _parse_number(text: str, *, size: bool) -> int:
    """Digits, or a product of them (MetaQ evaluates values as expressions); sizes may take k/m/g.

    Only ``*`` between whole numbers is understood: no eval, no powers, no parentheses.
    """
    if not text:
        raise InvalidValue("empty value")
    sign = 1
    body = text
    if body[0] in "+-":
        if size:
            raise InvalidValue(f"{text!r}: a size cannot be negative or signed")
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    total = 1
    for factor in body.split("*"):
        factor = factor.strip()
        match = (_SIZE_RE if size else _NUM_RE).fullmatch(factor)
        if match is None:
            kind, hint = ("a size", _SIZE_HINT) if size else ("an integer", _INT_HINT)
            raise InvalidValue(f"{text!r} is not {kind}; {hint}")
        total *= int(match.group(1)) * (_UNITS[match.group(2).lower()] if size else 1)
    return sign * total


def _integer(lo: int, hi: int, *, size: bool = False) -> Converter:
    def convert(text: str) -> int:
        value = _parse_number(text, size=size)
        if not lo <= value <= hi:
            show = _format_size if size else str
            raise InvalidValue(f"{text} is out of range; it must be between {show(lo)} and {show(hi)}")
        return value

    return convert


_TRUE = frozenset({"true", "yes", "1"})
_FALSE = frozenset({"false", "no", "0"})


def _boolean(text: str) -> bool:
    low = text.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidValue(f"{text!r} is not a boolean; write true or false (yes/no and 1/0 also work)")


def _text(text: str) -> str:
    if not text:
        raise InvalidValue("empty value")
    return text


def _path(text: str) -> Path:
    return Path(_text(text)).expanduser()


_HOST_LABEL_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    return len(text) <= 253 and all(_HOST_LABEL_RE.fullmatch(label) for label in text.split("."))


def _choice(*choices: str, fold: Callable[[str], str] = str.lower) -> Converter:
    """One of ``choices``, compared after ``fold`` (lower case, or upper for SASL mechanism names)."""
    def convert(text: str) -> str:
        folded = fold(_text(text))
        if folded not in choices:
            raise InvalidValue(f"{text!r} is not one of {', '.join(choices)}")
        return folded

    return convert


def _octal(lo: int, hi: int) -> Converter:
    def convert(text: str) -> int:
        try:
            value = int(_text(text), 8)
        except ValueError:
            raise InvalidValue(f"{text!r} is not an octal number such as 077") from None
        if not lo <= value <= hi:
            raise InvalidValue(f"{text} is not between {lo:o} and {hi:o} (octal)")
        return value

    return convert


def _principals(text: str) -> tuple[str, ...]:
    from metaq.security.acl import parse_super_users

    try:
        return parse_super_users(text)
    except ValueError as exc:
        raise InvalidValue(str(exc)) from None


@dataclass(frozen=True, slots=True)
class QuotaOverride:
    """What quotaOverrides sets for one principal (None: the default)."""

    produce_bytes_per_s: int | None = None
    fetch_bytes_per_s: int | None = None
    connections_max: int | None = None


_OVERRIDE_KEYS: Final = {"produce": "produce_bytes_per_s", "fetch": "fetch_bytes_per_s",
                         "connections": "connections_max"}


def parse_quota_overrides(text: str) -> dict[str, QuotaOverride]:
    """``User:alice=produce:1m,fetch:2m,connections:10;User:bob=produce:0`` -> principal -> limits.

    A key not given for a principal takes the [system] default (:func:`metaq.broker.quotas.limits_for`), so
    the values here are what is set; 0 means unlimited. ValueError names what is wrong.
    """
    out: dict[str, QuotaOverride] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        principal, eq, spec = part.partition("=")
        principal = principal.strip()
        if not eq or not principal.startswith("User:") or len(principal) == len("User:"):
            raise ValueError(f"{part!r}: write User:NAME=produce:BYTES,fetch:BYTES,connections:N")
        values: dict[str, int] = {}
        for item in spec.split(","):
            key, colon, number = item.strip().partition(":")
            key = key.strip()
            if not colon or key not in _OVERRIDE_KEYS:
                raise ValueError(f"{item.strip()!r} in {principal}: the keys are produce, fetch and connections "
                                 "(e.g. produce:1m)")
            try:
                value = _parse_number(number.strip(), size=key != "connections")
            except InvalidValue as exc:
                raise ValueError(f"{principal} {key}: {exc}") from None
            if value < 0:
                raise ValueError(f"{principal} {key}: {value} is negative (0 = unlimited)")
            values[_OVERRIDE_KEYS[key]] = value
        if principal in out:
            raise ValueError(f"{principal} is given twice")
        out[principal] = QuotaOverride(**values)
    return out


def _quota_overrides(text: str) -> dict[str, Any]:
    try:
        return dict(parse_quota_overrides(text))
    except ValueError as exc:
        raise InvalidValue(str(exc)) from None


def _host(text: str) -> str:
    if not _is_host(_text(text)):
        raise InvalidValue(f"{text!r} is not an IP address or host name")
    return text


_ZK_SERVER_RE = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+))(?::(?P<port>\d{1,5}))?")


def _zk_path(text: str) -> str:
    if not text.startswith("/"):
        raise InvalidValue(f"{text!r} must be an absolute ZooKeeper path such as /meta")
    if text != "/":
        parts = text[1:].split("/")
        if any(p in ("", ".", "..") or any(c.isspace() or c == "\x00" for c in p) for p in parts):
            raise InvalidValue(f"{text!r} is not a ZooKeeper path (empty, '.' or '..' part, or a space)")
    return text


def _zk_connect(text: str) -> str:
    servers, slash, chroot = _text(text).partition("/")
    if slash:
        _zk_path("/" + chroot)
    for server in servers.split(","):
        match = _ZK_SERVER_RE.fullmatch(server.strip())
        if match is None or (match["host"] is not None and not _is_host(match["host"])):
            raise InvalidValue(f"{server.strip()!r} is not host:port (the form is host:port[,host:port...][/chroot])")
        if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
            raise InvalidValue(f"port {match['port']} is outside 1..65535")
    return text


_IDENT_PATH_RE = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")


def _filter_ref(text: str) -> str:
    module, colon, attr = _text(text).partition(":")
    ok = colon and all(
        _IDENT_PATH_RE.fullmatch(part) and not any(keyword.iskeyword(w) for w in part.split("."))
        for part in (module.strip(), attr.strip())
    )
    if not ok:
        raise InvalidValue(f"{text!r} is not module:callable (for example myapp.filters:only_vip)")
    return f"{module.strip()}:{attr.strip()}"


_GROUP_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def group_name(name: str) -> str:
    if not _GROUP_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidValue(
            f"consumer group name {name!r} must be 1-249 letters, digits, '-', '_' or '.' (not '.' or '..')"
        )
    return name


# -- deletePolicy -----------------------------------------------------------------------------------

_RETENTION_RE = re.compile(r"(\d{1,9})([smh]?)", re.IGNORECASE)
_RETENTION_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "": 3_600_000}


@dataclass(frozen=True)
class DeletePolicy:
    """A parsed ``deletePolicy``: what happens to a segment older than ``retention_ms``."""

    kind: str
    """``delete`` (remove the file) or ``archive`` (keep it renamed, or zipped when ``compress``)."""
    retention_ms: int
    compress: bool = False


def _delete_policy(text: str) -> DeletePolicy:
    parts = [p.strip() for p in _text(text).split(",")]
    kind = parts[0].lower()
    form = "delete,N or archive,N[,true|false] (N in hours, or with s/m/h: 30m, 12h)"
    if kind not in ("delete", "archive"):
        raise InvalidValue(f"{text!r}: policy {parts[0]!r} is unknown; write {form}")
    if len(parts) < 2 or len(parts) > (3 if kind == "archive" else 2):
        raise InvalidValue(f"{text!r} has the wrong number of parts; write {form}")
    match = _RETENTION_RE.fullmatch(parts[1])
    if match is None or int(match.group(1)) == 0:
        raise InvalidValue(f"{text!r}: retention {parts[1]!r} must be a positive whole number with s, m or h")
    retention_ms = int(match.group(1)) * _RETENTION_MS[match.group(2).lower()]
    compress = _boolean(parts[2]) if len(parts) == 3 else False
    return DeletePolicy(kind, retention_ms, compress)


def parse_delete_policy(value: str) -> DeletePolicy:
    """Parse a MetaQ ``deletePolicy`` (``delete,168``, ``delete,30m``, ``archive,7h,true``).

    The retention unit is hours unless ``s``, ``m`` or ``h`` follows the number, as in MetaQ.
    Raises :class:`ConfigError` when the value is malformed.
    """
    try:
        return _delete_policy(value.strip())
    except InvalidValue as exc:
        raise ConfigError(f"deletePolicy: {exc}") from None


def _delete_policy_text(text: str) -> str:
    _delete_policy(text)
    return ",".join(p.strip() for p in text.split(","))


def _cron(text: str) -> str:
    try:
        return check_quartz(_text(text))
    except CronError as exc:
        raise InvalidValue(str(exc)) from None


# --------------------------------------------------------------------------------------------------
# The option table.

_SYSTEM: frozenset[Section] = frozenset({"system"})
_SYSTEM_AND_TOPIC: frozenset[Section] = frozenset({"system", "topic"})
_ZOOKEEPER: frozenset[Section] = frozenset({"zookeeper"})
_TOPIC: frozenset[Section] = frozenset({"topic"})


@dataclass(frozen=True)
class Option:
    """One row of the option table."""

    key: str
    """The name in ``server.ini`` (MetaQ's spelling); also the CLI flag ``--<key>``."""
    attr: str
    """The attribute on BrokerConfig, TopicConfig or ZkConfig; empty for ignored options."""
    kind: str
    """What the value is, for docs and flag metavars: int, size, bool, path, host, policy, cron, ..."""
    default: str | None
    """The default as it would be written in server.ini (None: none, see ``default_doc``)."""
    sections: frozenset[Section]
    help: str
    convert: Converter
    status: Status = "metaq"
    """``metaq``: MetaQ's option, same meaning; ``extension``: metaq's own; ``ignored``: accepted only."""
    reload: Reload = "restart"
    """``live``: a reload (SIGHUP, ``metaq admin reload``) applies a change; ``restart``: it does not."""
    default_doc: str = ""
    """What the docs show as the default when it is not simply ``default``."""

    @property
    def flag(self) -> str:
        return f"--{self.key}"

    @property
    def kebab(self) -> str:
        return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", self.key).lower()

    @property
    def default_text(self) -> str:
        return self.default_doc or (self.default if self.default is not None else "")

    def parse(self, text: str) -> Any:
        return self.convert(text)


def _opt(
    key: str,
    attr: str,
    kind: str,
    default: str | None,
    sections: frozenset[Section],
    help: str,
    convert: Converter,
    *,
    status: Status = "metaq",
    reload: Reload = "restart",
    default_doc: str = "",
) -> Option:
    return Option(key, attr, kind, default, sections, help, convert, status, reload, default_doc)


MAX_OPEN_FILES_AUTO = 0
"""maxOpenFiles=auto in BrokerConfig.max_open_files: the budget follows the open-files limit (broker/service.py)."""
MAX_OPEN_FILES_MAX = 1_000_000
MAX_OPEN_FILES_PROVISIONAL = 1024
"""The storage's budget under maxOpenFiles=auto until the broker's start has read the open-files limit."""
_open_files_number = _integer(16, MAX_OPEN_FILES_MAX)


def _open_files(text: str) -> int:
    """``auto`` (MAX_OPEN_FILES_AUTO) or a number of descriptors, 16..1000000."""
    if text.strip().lower() == "auto":
        return MAX_OPEN_FILES_AUTO
    try:
        return _open_files_number(text)
    except InvalidValue as exc:
        raise InvalidValue(f"{exc}, or auto") from None


_port = _integer(0, 65535)
_java_int = _integer(-(2**31), _JAVA_INT_MAX)
_positive = _integer(1, _JAVA_INT_MAX)

OPTIONS: tuple[Option, ...] = (
    # -- [system], MetaQ's own options ------------------------------------------------------------
    _opt("brokerId", "broker_id", "int", "0", _SYSTEM,
         "This broker's id (0-1024), unique among brokers sharing a ZooKeeper root; "
         "also the top bits of every message id it assigns.", _integer(0, 1024)),
    _opt("dataPath", "data_path", "path", "~/meta", _SYSTEM,
         "Directory holding one TOPIC-PARTITION directory per partition. ~ is expanded; "
         "relative paths in a file are relative to the file's directory, in a flag to the current one.", _path),
    _opt("fileUmask", "file_umask", "octal", "077", _SYSTEM,
         "umask of the broker process (octal): what every file and directory it makes (segments, indexes, "
         "offsets, the transaction log, the delay store, users and ACLs) is denied; 077: the broker's user "
         "alone reads them. At start dataPath and dataLogPath themselves lose these permissions too. "
         "docs/security.md#files-on-disk.", _octal(0, 0o777), status="extension"),
    _opt("serverPort", "server_port", "int", "8123", _SYSTEM,
         "TCP port clients and other brokers connect to (0: the OS picks a free port; -1: no plaintext port, "
         "a TLS-only broker serving sslPort alone, as httpPort=-1 turns the HTTP API off).", _integer(-1, 65535)),
    _opt("hostName", "host_name", "host", "127.0.0.1", _SYSTEM,
         "Address the broker listens on and advertises. MetaQ defaults to the machine's IP; "
         "metaq defaults to loopback, so set it to serve other machines.", _host),
    _opt("numPartitions", "num_partitions", "int", "1", _SYSTEM_AND_TOPIC,
         "Partitions a topic has on this broker.", _integer(1, 10000), reload="live"),
    _opt("unflushThreshold", "unflush_threshold", "int", "1000", _SYSTEM_AND_TOPIC,
         "fsync after this many messages: 1 = before every ack; N > 1 = every N messages or "
         "unflushInterval, whichever first; <= 0 = group commit.", _java_int, reload="live"),
    _opt("unflushInterval", "unflush_interval_ms", "int", "10000", _SYSTEM_AND_TOPIC,
         "Milliseconds between periodic fsyncs (must be > 0).", _positive, reload="live"),
    _opt("maxSegmentSize", "max_segment_bytes", "size", "1g", _SYSTEM,
         "Size at which a partition's segment file is closed and a new one started.",
         _integer(1, _JAVA_INT_MAX, size=True)),
    _opt("maxTransferSize", "max_transfer_bytes", "size", "1m", _SYSTEM,
         "Most bytes one fetch returns to a consumer; keep it above the largest message.",
         _integer(1, _JAVA_INT_MAX, size=True)),
    _opt("deletePolicy", "delete_policy", "policy", "delete,168", _SYSTEM_AND_TOPIC,
         "What happens to old segments: delete,N or archive,N[,compress]; N in hours, or with s/m/h.",
         _delete_policy_text, reload="live"),
    _opt("deleteWhen", "delete_when", "cron", "0 0 6,18 * * ?", _SYSTEM_AND_TOPIC,
         "When deletePolicy runs: a Quartz cron expression, seconds first, in local time.",
         _cron, reload="live"),
    _opt("acceptPublish", "accept_publish", "bool", "true", _SYSTEM_AND_TOPIC,
         "Accept messages from producers (false: not registered for publishing).", _boolean,
         reload="live"),
    _opt("acceptSubscribe", "accept_subscribe", "bool", "true", _SYSTEM_AND_TOPIC,
         "Serve consumers (false: not registered for subscribing).", _boolean, reload="live"),
    _opt("stat", "stat", "bool", "false", _SYSTEM_AND_TOPIC,
         "MetaQ's switch for real-time statistics. Accepted, with no effect (the broker warns at start): metaq "
         "keeps them for every topic always (metaq stats, /metrics).", _boolean, reload="live"),
    _opt("updateConsumerOffsets", "update_consumer_offsets", "bool", "false", _SYSTEM,
         "Move a consumer whose offset is out of range to the newest offset instead of failing "
         "(handy in development, keep false in production).", _boolean),
    _opt("dashboardHttpPort", "dashboard_http_port", "int", None, _SYSTEM,
         "HTTP port serving the web dashboard at / and Prometheus metrics at /metrics, on hostName (0: the "
         "OS picks a free port; the broker logs the address). Off unless set: MetaQ's default 8120 would make "
         "two brokers on one host collide (docs/operations.md).", _port, default_doc="off (MetaQ: 8120)"),
    _opt("loadMessageStoresInParallel", "load_message_stores_in_parallel", "bool", "false", _SYSTEM,
         "Open partitions in parallel at start-up (faster start, interleaved log lines).", _boolean),
    # -- [system], metaq's extensions --------------------------------------------------------------
    _opt("maxMessageSize", "max_message_bytes", "size", "1m", _SYSTEM,
         "Largest single message the broker accepts.", _integer(1, _JAVA_INT_MAX, size=True),
         status="extension"),
    _opt("maxBatchSize", "max_batch_bytes", "size", "16m", _SYSTEM,
         "Largest record batch (one produce request to one partition) the broker accepts.",
         _integer(1, _JAVA_INT_MAX, size=True), status="extension"),
    _opt("verifyAfterUncleanStart", "verify_after_unclean_start", "bool", "true", _SYSTEM,
         "After a start that was not preceded by a clean stop, check every stored byte of the partitions "
         "it recovered, in the background (damage is logged and shown in stats; `metaq admin verify` does "
         "the same on demand).", _boolean, status="extension"),
    _opt("maxOpenFiles", "max_open_files", "int/auto", "auto", _SYSTEM,
         "Descriptors the broker keeps open for segment and index files (an LRU: the least recently used "
         "idle one is closed past it, and any idle for 60 s). A partition costs about one while it is "
         "written or read. auto: the broker raises its soft RLIMIT_NOFILE to the hard one at start (as "
         "MetaQ's JVM does) and keeps what that leaves after maxConnections (at most half of it) and 256, "
         "up to 1000000. A number: the soft limit is raised (up to the hard one) to it plus maxConnections "
         "plus 256; under a lower hard limit the storage gets less (room is left for connections; at least "
         "64) and a WARNING says how much (docs/operations.md).", _open_files, status="extension"),
    _opt("syncfs", "syncfs", "choice", "auto", _SYSTEM,
         "auto: flush rounds may be made durable by one syncfs (syncfsMinPartitions, syncfsQuietMinPartitions, and "
         "the clean stop) only where the data directory's filesystem is known to honour it: ext4, xfs, btrfs, f2fs "
         "or tmpfs, on Linux 5.8+ (decided at start, logged, shown by `metaq stats`). Elsewhere (FUSE, NFS, "
         "overlayfs ...) and with off, every partition fdatasyncs its own files and fsyncs its new directory "
         "entries (docs/storage.md, \"Durability\").", _choice("auto", "off"), status="extension"),
    _opt("syncfsMinPartitions", "syncfs_min_partitions", "int", "32", _SYSTEM,
         "A flush round with at least this many partitions to sync makes them durable with one syncfs of the "
         "data directory's filesystem instead of an fdatasync each (where the syncfs option allows it; should one "
         "fail, each partition fdatasyncs its own files, and every flush does until a restart). "
         "It also writes back whatever else is dirty on that filesystem: set 0 (no syncfs at all, nor "
         "syncfsQuietMinPartitions) when the broker shares a disk with heavy writers.",
         _integer(0, 1_000_000), status="extension"),
    _opt("syncfsQuietMinPartitions", "syncfs_quiet_min_partitions", "int", "2", _SYSTEM,
         "A flush round with at least this many partitions (and fewer than syncfsMinPartitions) also uses one "
         "syncfs while the machine has at most 512 KiB of dirty pages to write back (Dirty + Writeback in "
         "/proc/meminfo), and once a second with up to 4 MiB (that syncfs writes back what a one-time write left); "
         "otherwise it fdatasyncs each partition, as a syncfs would wait for those pages. A syncfs of a "
         "few small appends costs about one fdatasync: with unflushThreshold=1 on 2 cores it cut the end-to-end "
         "p50 by 0.1 ms and halved p99 (four busy partitions), and raised the produce throughput by 13-24% (4 and "
         "64 partitions; figures: docs/benchmarks.md). 0: never.",
         _integer(0, 1_000_000), status="extension"),
    _opt("syncInlineMaxPartitions", "sync_inline_max_partitions", "int", "2", _SYSTEM,
         "A flush round that fdatasyncs each partition (one not made durable by a syncfs: syncfsMinPartitions, "
         "syncfsQuietMinPartitions) with at most this many partitions syncs them one after the other in the "
         "flusher's own thread; a larger one syncs them side by side on a pool of 4 threads. The pool's hand-offs "
         "cost CPU and wake-ups: with unflushThreshold=1 and a few busy partitions on a small machine, 4 gave a "
         "lower end-to-end latency (p99 halved on 2 cores) for 10-14% less throughput at saturation "
         "(figures: docs/benchmarks.md).",
         _integer(1, 1_000_000), status="extension"),
    _opt("autoCreateTopics", "auto_create_topics", "bool", "true", _SYSTEM,
         "MetaQ's dynamic topics: a topic with no [topic=...] section is created on first publish; "
         "false refuses it.", _boolean, status="extension"),
    _opt("maxConnections", "max_connections", "int", "10000", _SYSTEM,
         "Client connections the broker keeps open at once; the first request of one more is answered "
         "with TOO_MANY_CONNECTIONS and the connection closed.", _integer(1, 1_000_000),
         status="extension"),
    _opt("connectionIdleTimeoutSeconds", "connection_idle_timeout_s", "int", "600", _SYSTEM,
         "Close a connection that sent nothing and had no request in progress for this long (a waiting "
         "long poll is in progress); 0 = never.", _integer(0, _JAVA_INT_MAX), status="extension"),
    _opt("connectionHandshakeTimeoutSeconds", "connection_handshake_timeout_s", "int", "30", _SYSTEM,
         "Close a connection whose first request has not fully arrived this long after it opened; "
         "0 = never.", _integer(0, _JAVA_INT_MAX), status="extension"),
    _opt("maxWaitingFetches", "max_waiting_fetches", "int", "10000", _SYSTEM,
         "Long-polling fetches held at once; more are refused with TOO_MANY_REQUESTS.",
         _integer(1, 1_000_000), status="extension"),
    _opt("maxWaitingFetchesPerConnection", "max_waiting_fetches_per_connection", "int", "1000", _SYSTEM,
         "Long-polling fetches one connection may hold at once (at most maxWaitingFetches); more get "
         "TOO_MANY_REQUESTS on that connection while others are still served.",
         _integer(1, 1_000_000), status="extension"),
    _opt("maxFrameSize", "max_frame_bytes", "size", "64m", _SYSTEM,
         "Largest request frame read from a connection; at least maxBatchSize + 64k.",
         _integer(1, _JAVA_INT_MAX, size=True), status="extension"),
    _opt("maxPartialFramesSize", "max_partial_frames_bytes", "size", "128m", _SYSTEM,
         "Bytes of unfinished request frames buffered across all connections, at least maxFrameSize; "
         "past it the connection with the biggest unfinished frame gets TOO_MANY_REQUESTS for it.",
         _integer(1, _JAVA_INT_MAX, size=True), status="extension"),
    _opt("httpPort", "http_port", "int", "-1", _SYSTEM,
         "Port of the HTTP API (docs/http.md), on hostName: -1 = off, 0 = a free port (the bound address "
         "is logged and printed). MetaQ's jettyBroker plugin took it as serverPort in its own file.",
         _integer(-1, 65535), status="extension"),
    _opt("maxDelayInSeconds", "max_delay_s", "int", "604800", _SYSTEM,
         "The longest delay of a delayed message (docs/delayed.md), counted from its arrival; a longer one "
         "is refused with DELAY_TOO_LONG.", _integer(0, _JAVA_INT_MAX), status="extension"),
    _opt("mallocTrimThreshold", "malloc_trim_threshold_bytes", "size", "0", _SYSTEM,
         "Linux with glibc: free heap glibc keeps before giving memory back to the kernel, fixed at start-up "
         "(mallopt M_TRIM_THRESHOLD, as MALLOC_TRIM_THRESHOLD_ does; 128m suits ~1 MB messages: the broker's "
         "1 MB read buffers are then not handed back and faulted in again). 0 = glibc's own, moving "
         "threshold; ignored elsewhere (docs/operations.md).", _integer(0, _JAVA_INT_MAX, size=True),
         status="extension", default_doc="0 (glibc's)"),
    _opt("mallocMmapThreshold", "malloc_mmap_threshold_bytes", "size", "0", _SYSTEM,
         "Linux with glibc: blocks at least this large get an mmap of their own, fixed at start-up (mallopt "
         "M_MMAP_THRESHOLD, as MALLOC_MMAP_THRESHOLD_ does; at most 32m, older glibc's limit; 32m with "
         "mallocTrimThreshold=128m for ~1 MB messages). 0 = glibc's own, moving threshold; ignored elsewhere.",
         _integer(0, 32 * _KIB**2, size=True), status="extension", default_doc="0 (glibc's)"),
    _opt("kafkaPort", "kafka_port", "int", None, _SYSTEM,
         "Port of the Kafka-protocol listener (docs/kafka.md), on hostName: Kafka clients (kcat, librdkafka, "
         "kafka-python, ...) produce and consume metaq's topics there. 0 = a free port (the ready line prints "
         "it). Off unless set.", _port, status="extension", default_doc="off"),
    _opt("kafkaSslPort", "kafka_ssl_port", "int", None, _SYSTEM,
         "Port of the Kafka-protocol listener over TLS, with the broker's certificate (sslCertFile, sslClientAuth). "
         "0 = a free port. Off unless set.", _port, status="extension", default_doc="off"),
    # -- [system], TLS (docs/security.md) -----------------------------------------------------------
    _opt("sslPort", "ssl_port", "int", None, _SYSTEM,
         "TLS port for clients and slaves, on hostName beside the plaintext serverPort (0: the OS picks a free "
         "port; the ready line prints it). Needs sslCertFile. Off unless set.", _port, status="extension",
         default_doc="off"),
    _opt("sslCertFile", "ssl_cert_file", "path", None, _SYSTEM,
         "The broker's certificate chain (PEM; the key may be in it too) for sslPort, and for the HTTP API "
         "and /metrics when sslHttp is true. Re-read on SIGHUP: new connections get the new certificate.",
         _path, status="extension", default_doc="none"),
    _opt("sslKeyFile", "ssl_key_file", "path", None, _SYSTEM,
         "The private key of sslCertFile (PEM, not password-protected); none: the key is in sslCertFile.",
         _path, status="extension", default_doc="none"),
    _opt("sslCaFile", "ssl_ca_file", "path", None, _SYSTEM,
         "CA certificates (PEM) that client certificates are checked against (sslClientAuth), and that a "
         "slave checks its master's certificate against (sslReplication).", _path, status="extension",
         default_doc="none"),
    _opt("sslClientAuth", "ssl_client_auth", "choice", "none", _SYSTEM,
         "Client certificates on TLS listeners (mTLS): none = not asked; want = asked and checked when "
         "sent; need = a connection without a valid one is refused. want/need need sslCaFile.",
         _choice("none", "want", "need"), status="extension"),
    _opt("sslHttp", "ssl_http", "bool", "true", _SYSTEM,
         "With sslCertFile set: the HTTP API (httpPort) and /metrics (dashboardHttpPort) serve HTTPS with the "
         "same certificate; false keeps them plain HTTP.", _boolean, status="extension"),
    _opt("sslReplication", "ssl_replication", "bool", "false", _SYSTEM,
         "A slave fetches from its master's TLS port (registered in ZooKeeper), verifying it against sslCaFile "
         "and presenting sslCertFile/sslKeyFile as its client certificate.", _boolean, status="extension"),
    # -- [system], authentication (docs/security.md) -------------------------------------------------
    _opt("authRequired", "auth_required", "bool", "false", _SYSTEM,
         "Every connection must authenticate (SASL SCRAM-SHA-256, or a client certificate on the TLS port) "
         "before any request but ApiVersions and the SASL handshake; others get SASL_AUTHENTICATION_FAILED "
         "and the connection is closed. The HTTP API then needs HTTP Basic credentials of a stored user, over "
         "HTTPS (401 without them).", _boolean, status="extension"),
    _opt("httpBasicAuthOverPlaintext", "http_basic_auth_over_plaintext", "bool", "false", _SYSTEM,
         "With authRequired: accept HTTP Basic credentials on plain HTTP (httpPort, and the dashboard on "
         "dashboardHttpPort; they travel in clear text: a trusted network only); false refuses them with 403 "
         "unless the port serves HTTPS.",
         _boolean, status="extension"),
    _opt("saslUsersFile", "sasl_users_file", "path", None, _SYSTEM,
         "Embedded mode: the users file (hashed SCRAM credentials, `metaq acl user add --users-file`); "
         "re-read when it changes. ZooKeeper mode keeps users in ZooKeeper instead.", _path,
         status="extension", default_doc="dataPath/users.json"),
    _opt("aclEnabled", "acl_enabled", "bool", "false", _SYSTEM,
         "Check every request against the ACLs (`metaq acl add`; a file in embedded mode, ZooKeeper in cluster "
         "mode; re-read every second). No matching allow, or any matching deny: *_AUTHORIZATION_FAILED. Needs "
         "authRequired.", _boolean, status="extension"),
    _opt("aclFile", "acl_file", "path", None, _SYSTEM,
         "Embedded mode: the ACL file (`metaq acl add --acl-file`).", _path, status="extension",
         default_doc="dataPath/acls.json"),
    _opt("superUsers", "super_users", "principals", "", _SYSTEM,
         "Principals allowed everything whatever the ACLs say: User:NAME;User:NAME (a client certificate's CN "
         "is User:CN too).", _principals, status="extension", default_doc="none"),
    _opt("replicationUser", "replication_user", "text", None, _SYSTEM,
         "The user a slave authenticates as to its master (password from the METAQ_REPLICATION_PASSWORD "
         "environment variable); none: no SASL (a client certificate, sslReplication, may do).", _text,
         status="extension", default_doc="none"),
    # -- [system], quotas (docs/security.md#quotas) -----------------------------------------------------
    _opt("quotaProducerByteRate", "quota_producer_byte_rate", "size", "0", _SYSTEM,
         "Bytes per second each principal may produce to this broker (User:NAME, User:CN of a client "
         "certificate, User:ANONYMOUS where authRequired is off); over it, replies carry throttle_time_ms and "
         "the connection is not read for that long. 0 = unlimited. Applied on reload.",
         _integer(0, _JAVA_INT_MAX, size=True), status="extension", reload="live"),
    _opt("quotaConsumerByteRate", "quota_consumer_byte_rate", "size", "0", _SYSTEM,
         "Bytes per second each principal may fetch from this broker (slaves' replica fetches are not "
         "counted); throttled as quotaProducerByteRate. 0 = unlimited. Applied on reload.",
         _integer(0, _JAVA_INT_MAX, size=True), status="extension", reload="live"),
    _opt("quotaMaxConnections", "quota_max_connections", "int", "0", _SYSTEM,
         "Connections one principal may hold open to this broker at once; one more is refused with "
         "TOO_MANY_CONNECTIONS (counted when the principal is known: at connect, or at SASL authentication). "
         "0 = unlimited. Applied on reload to new connections.", _integer(0, 1_000_000), status="extension",
         reload="live"),
    _opt("quotaOverrides", "quota_overrides", "quotas", "", _SYSTEM,
         "Per-principal quotas over the three defaults: User:NAME=produce:BYTES,fetch:BYTES,connections:N;"
         "User:NAME=... (any of the three keys; 0 = unlimited). Applied on reload.", _quota_overrides,
         status="extension", reload="live", default_doc="none"),
    # -- [system], replication (docs/replication.md) ----------------------------------------------------
    _opt("syncReplication", "sync_replication", "bool", "false", _SYSTEM_AND_TOPIC,
         "Sync replication (MetaQ's 同步复制): a produce is acked only once every in-sync slave holds the "
         "batch (and at least minInSyncSlaves do); consumers of the master read only what they hold. "
         "Needs ZooKeeper mode and slaves with a slaveId.", _boolean, status="extension", reload="live"),
    _opt("minInSyncSlaves", "min_in_sync_slaves", "int", "1", _SYSTEM,
         "Sync replication: fewer in-sync slaves than this and produces are refused with "
         "NOT_ENOUGH_REPLICAS (or acked as async with degradeToAsync=true).", _integer(0, 1024),
         status="extension"),
    _opt("inSyncMaxLagMs", "in_sync_max_lag_ms", "int", "10000", _SYSTEM,
         "A slave that has not caught up with the master's log end for this long leaves the in-sync set "
         "(recorded in ZooKeeper); it rejoins once caught up. Also bounds how long a produce waits for a "
         "dead slave.", _integer(100, _JAVA_INT_MAX), status="extension"),
    _opt("degradeToAsync", "degrade_to_async", "bool", "false", _SYSTEM,
         "Sync replication with too few in-sync slaves: ack as async replication (a warning and a "
         "counter) instead of refusing writes. What is acked then can be lost with the master.",
         _boolean, status="extension"),
    _opt("autoFailover", "auto_failover", "bool", "false", _SYSTEM,
         "When the master of this broker id vanishes from ZooKeeper, an in-sync slave takes over under "
         "the same broker id with a new epoch; a deposed master becomes a slave. Every replica needs a "
         "distinct slaveId (--slave-id), the master too.", _boolean, status="extension"),
    # -- [system], MetaQ options metaq accepts and ignores -----------------------------------------
    _opt("getProcessThreadCount", "", "int", None, _SYSTEM,
         "Ignored: the broker serves requests on one asyncio event loop.", _positive,
         status="ignored", default_doc="CPUs*10 in MetaQ"),
    _opt("putProcessThreadCount", "", "int", None, _SYSTEM,
         "Ignored: the broker serves requests on one asyncio event loop.", _positive,
         status="ignored", default_doc="CPUs*10 in MetaQ"),
    _opt("flushTxLogAtCommit", "flush_tx_log_at_commit", "int", "1", _SYSTEM,
         "When the transaction log is fsynced: 0 = left to the OS; 1 = at every commit (and every XA "
         "prepare), before the commit is applied; 2 = once a second (a crash may lose the last second's "
         "commits). docs/transactions.md", _integer(0, 2)),
    _opt("maxCheckpoints", "max_checkpoints", "int", "3", _SYSTEM,
         "Transaction log generations kept; each checkpoint starts a new one holding only the live "
         "transactions, and the oldest beyond this is deleted.", _positive),
    _opt("checkpointInterval", "checkpoint_interval_ms", "int", "3600000", _SYSTEM,
         "ms between transaction log checkpoints (also taken when the log passes 256 MiB).",
         _integer(1, 2**63 - 1)),
    _opt("maxTxTimeoutTimerCapacity", "max_tx_timeout_timer_capacity", "int", "30000", _SYSTEM,
         "Most transactions open (or prepared) at once; a begin past it is refused with "
         "CONCURRENT_TRANSACTIONS (retriable).", _positive),
    _opt("maxTxTimeoutInSeconds", "max_tx_timeout_s", "int", "60", _SYSTEM,
         "Longest a transaction may stay open or prepared: then it is rolled back (an ERROR names it), and a "
         "later commit is told so. A client may ask for less, not more. Not for a prepared half message, "
         "which its producer or its group's checker decides.", _positive),
    _opt("transactionTimeOut", "transaction_first_check_ms", "int", "6000", _SYSTEM,
         "Half messages (RocketMQ's name and default): ms after its prepare before an undecided half "
         "transaction is first due for a check by its producer group's checker.",
         _integer(0, _JAVA_INT_MAX), status="extension"),
    _opt("transactionCheckInterval", "transaction_check_interval_ms", "int", "60000", _SYSTEM,
         "Half messages (RocketMQ's name and default): ms between checks of a half transaction still "
         "undecided.", _integer(1, _JAVA_INT_MAX), status="extension"),
    _opt("transactionCheckMax", "transaction_check_max", "int", "15", _SYSTEM,
         "Half messages (RocketMQ's name and default): checks handed to a connected checker of the group "
         "without a decision before the broker rolls the transaction back (an ERROR names it). A group with "
         "no checker connected uses up none.", _positive, status="extension"),
    _opt("dataLogPath", "data_log_path", "path", None, _SYSTEM,
         "Directory of the transaction log (MetaQ's dataLogPath).", _path, default_doc="dataPath/.txlog"),
    _opt("quartzThreadCount", "", "int", None, _SYSTEM,
         "Ignored: deleteWhen runs on the event loop, not a Quartz thread pool.", _positive,
         status="ignored", default_doc="Quartz's default"),
    # -- [zookeeper] -------------------------------------------------------------------------------
    _opt("zk.zkEnable", "enable", "bool", "true", _ZOOKEEPER,
         "false keeps the broker in embedded mode although a [zookeeper] section is present.", _boolean),
    _opt("zk.zkConnect", "connect", "zk", None, _ZOOKEEPER,
         "ZooKeeper servers: host:port[,host:port...][/chroot]. Required in [zookeeper].", _zk_connect,
         default_doc="required"),
    _opt("zk.zkSessionTimeoutMs", "session_timeout_ms", "int", "30000", _ZOOKEEPER,
         "ZooKeeper session timeout, ms.", _positive),
    _opt("zk.zkConnectionTimeoutMs", "connection_timeout_ms", "int", "30000", _ZOOKEEPER,
         "How long to wait for a ZooKeeper connection, ms.", _positive),
    _opt("zk.zkSyncTimeMs", "sync_time_ms", "int", "5000", _ZOOKEEPER,
         "How far a ZooKeeper follower may lag its leader, ms.", _positive),
    _opt("zk.zkRoot", "root", "zkpath", "/meta", _ZOOKEEPER,
         "ZooKeeper path under which brokers, topics and consumers are registered.", _zk_path),
    _opt("zk.zkSaslUser", "sasl_user", "text", None, _ZOOKEEPER,
         "Log in to ZooKeeper with SASL as this user (password from the METAQ_ZK_PASSWORD environment "
         "variable); every broker of a cluster uses the same one. docs/security.md#zookeeper.", _text,
         status="extension", default_doc="anonymous"),
    _opt("zk.zkSaslMechanism", "sasl_mechanism", "text", "DIGEST-MD5", _ZOOKEEPER,
         "SASL mechanism for ZooKeeper (DIGEST-MD5 only).", _choice("DIGEST-MD5", fold=str.upper), status="extension"),
    _opt("zk.zkSetAcl", "set_acl", "bool", "false", _ZOOKEEPER,
         "Create every znode with ACLs (Kafka's zookeeper.set.acl): only zk.zkSaslUser may change metaq's "
         "nodes, and only it may read users' credentials and the ACLs; needs zk.zkSaslUser. `metaq cluster "
         "secure` applies them to an existing tree.", _boolean, status="extension"),
    _opt("zk.zkSslEnable", "tls", "bool", "false", _ZOOKEEPER,
         "Connect to ZooKeeper over TLS (its secureClientPort, in zk.zkConnect).", _boolean, status="extension"),
    _opt("zk.zkSslCaFile", "tls_ca_file", "path", None, _ZOOKEEPER,
         "CA (PEM) ZooKeeper's certificate is checked against; implies zk.zkSslEnable.", _path,
         status="extension", default_doc="the system's CAs"),
    _opt("zk.zkSslCertFile", "tls_cert_file", "path", None, _ZOOKEEPER,
         "Client certificate (PEM) for a ZooKeeper with ssl.clientAuth=need.", _path, status="extension",
         default_doc="none"),
    _opt("zk.zkSslKeyFile", "tls_key_file", "path", None, _ZOOKEEPER,
         "Its key (PEM).", _path, status="extension", default_doc="in zk.zkSslCertFile"),
    _opt("zk.zkSslCheckHostname", "tls_check_hostname", "bool", "true", _ZOOKEEPER,
         "Check that ZooKeeper's certificate names the host in zk.zkConnect.", _boolean, status="extension"),
    # -- [topic=NAME] only -------------------------------------------------------------------------
    _opt("group.GROUP", "group_filters", "filter", None, _TOPIC,
         "Server-side filter for consumer group GROUP of this topic: a Python module:callable "
         "(MetaQ names a Java class here).",
         _filter_ref, reload="live", default_doc="none"),
)

GROUP_PREFIX = "group."


def by_section(section: Section) -> dict[str, Option]:
    return {o.key: o for o in OPTIONS if section in o.sections}


SYSTEM_OPTIONS = by_section("system")
TOPIC_OPTIONS = by_section("topic")
ZK_OPTIONS = by_section("zookeeper")
SETTABLE = {k: o for k, o in SYSTEM_OPTIONS.items() if o.status != "ignored"}
TOPIC_ATTRS = tuple(o.attr for o in TOPIC_OPTIONS.values() if o.attr != "group_filters")


def options_markdown_rows() -> list[str]:
    """The option table as Markdown rows, exactly as ``docs/configuration.md`` shows it."""
    origin = {"metaq": "MetaQ", "extension": "metaq extension", "ignored": "MetaQ, accepted, ignored"}
    rows = []
    for o in OPTIONS:
        where = ", ".join(f"[{s}=NAME]" if s == "topic" else f"[{s}]" for s in sorted(o.sections))
        default = f"`{o.default_text}`" if o.default is not None else o.default_text
        reload = o.reload if o.status != "ignored" else "-"
        rows.append(f"| {where} | `{o.key}` | {default} | {o.kind} | {origin[o.status]} | {reload} | {o.help} |")
    return rows


# --------------------------------------------------------------------------------------------------
# Checking values: one option (with where it was set), and options against each other.


def suggest(word: str, known: Iterable[str], *, prefix: str = "", fmt: str = "{}") -> str:
    """``; did you mean 'X'?`` for the known name closest to ``word``, or "" when none is close."""
    names = list(known)
    lower = {n.lower(): n for n in names}
    if word.lower() in lower:
        best = lower[word.lower()]
    else:
        close = difflib.get_close_matches(word.lower(), list(lower), n=1, cutoff=0.6)
        if not close:
            return ""
        best = lower[close[0]]
    return f"; did you mean '{prefix}{fmt.format(best)}'?"


def _comment_hint(text: str) -> str:
    return " (in server.ini a comment starts with ; or # after a space)" if re.search(r"[;#]", text) else ""


def convert(opt: Option, text: str, where: str) -> Any:
    try:
        return opt.parse(text)
    except InvalidValue as exc:
        raise ConfigError(f"{where}: {exc}{_comment_hint(text)}") from None


STALL_WARNING = ": a consumer can stall on a message larger than one transfer"
STAT_IGNORED = ("MetaQ option accepted but without effect: metaq keeps real-time statistics for every topic "
                "whatever stat says (metaq stats, /metrics)")


def cross_check(values: dict[str, Any], where: Mapping[str, str], warnings: list[str]) -> None:
    """Checks between options. An error names whichever of the keys involved was set last."""

    def at(*keys: str) -> str:
        given = [loc for key, loc in where.items() if key in keys]  # `where` is in the order set
        return given[-1] if given else keys[-1]

    if values["max_message_bytes"] > values["max_batch_bytes"]:
        raise ConfigError(
            f"{at('maxBatchSize', 'maxMessageSize')}: maxMessageSize ({values['max_message_bytes']}) "
            f"is larger than maxBatchSize ({values['max_batch_bytes']}); a one-message batch could not be sent"
        )
    need = values["max_batch_bytes"] + FRAME_OVERHEAD_BYTES
    if values["max_frame_bytes"] < need:
        raise ConfigError(
            f"{at('maxBatchSize', 'maxFrameSize')}: maxFrameSize ({values['max_frame_bytes']}) must be at "
            f"least maxBatchSize + 64k ({need}) so that a full batch fits in a frame"
        )
    if values["max_partial_frames_bytes"] < values["max_frame_bytes"]:
        raise ConfigError(
            f"{at('maxFrameSize', 'maxPartialFramesSize')}: maxPartialFramesSize "
            f"({values['max_partial_frames_bytes']}) must be at least maxFrameSize ({values['max_frame_bytes']}) "
            "so that a whole frame can be received"
        )
    if values.get("server_port", 0) < 0 and values.get("ssl_port") is None:
        raise ConfigError(f"{at('sslPort', 'serverPort')}: serverPort=-1 turns the plaintext port off, so sslPort "
                          "(with sslCertFile) must be set: a broker needs a port")
    if values.get("kafka_ssl_port") is not None and values.get("ssl_cert_file") is None:
        raise ConfigError(f"{at('sslCertFile', 'kafkaSslPort')}: kafkaSslPort needs sslCertFile (the broker's "
                          "certificate)")
    if values.get("ssl_port") is not None and values.get("ssl_cert_file") is None:
        raise ConfigError(f"{at('sslCertFile', 'sslPort')}: sslPort needs sslCertFile (the broker's certificate)")
    if values.get("ssl_client_auth", "none") != "none" and values.get("ssl_ca_file") is None:
        raise ConfigError(f"{at('sslCaFile', 'sslClientAuth')}: sslClientAuth={values['ssl_client_auth']} needs "
                          "sslCaFile (the CA that signs client certificates)")
    if values.get("ssl_key_file") is not None and values.get("ssl_cert_file") is None:
        raise ConfigError(f"{at('sslCertFile', 'sslKeyFile')}: sslKeyFile needs sslCertFile")
    if values.get("acl_enabled") and not values.get("auth_required"):
        raise ConfigError(f"{at('authRequired', 'aclEnabled')}: aclEnabled needs authRequired=true (ACLs name "
                          "authenticated principals)")
    if values.get("ssl_replication") and values.get("ssl_ca_file") is None:
        raise ConfigError(f"{at('sslCaFile', 'sslReplication')}: sslReplication needs sslCaFile (the CA the "
                          "master's certificate is checked against)")
    if values["max_transfer_bytes"] < values["max_message_bytes"]:
        warnings.append(
            f"{at('maxMessageSize', 'maxTransferSize')}: maxTransferSize ({values['max_transfer_bytes']}) is "
            f"below maxMessageSize ({values['max_message_bytes']}){STALL_WARNING}"
        )
