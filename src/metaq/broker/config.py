"""Broker configuration: MetaQ's ``server.ini``, its option names and its defaults.

Everything here is derived from one table, :data:`OPTIONS`: the parser, the CLI flags, the "did you
mean" suggestions, and the option table in ``docs/configuration.md`` (a unit test keeps the two in
step). A MetaQ user's ``server.ini`` should load unchanged; where metaq differs (loopback by default,
options it adds, MetaQ options it accepts but ignores) the table says so.

The reader is our own, line based, rather than :mod:`configparser`, because every refusal has to name
the file and line: ``server.ini:12: unflushTreshold: unknown key in [system]; did you mean
'unflushThreshold'?``. Refusing unknown keys is deliberate: a misspelt durability knob that is silently
ignored is worse than a broker that does not start.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import keyword
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from croniter import croniter

from metaq.errors import ConfigError, InvalidArgument
from metaq.types import validate_topic

__all__ = [
    "FRAME_OVERHEAD_BYTES",
    "OPTIONS",
    "BrokerConfig",
    "DeletePolicy",
    "Option",
    "TopicConfig",
    "TopicSettings",
    "TopicsDiff",
    "ZkConfig",
    "click_options",
    "diff_topics",
    "load_config",
    "merge_topic_configs",
    "next_run_ms",
    "options_markdown_rows",
    "overrides_from_click",
    "parse_config",
    "parse_delete_policy",
    "parse_topic_options",
    "quartz_to_croniter",
    "restart_required",
    "topic_options_text",
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
_SECTION_NAMES: tuple[Section, ...] = ("system", "zookeeper", "topic")


class _Invalid(Exception):
    """A value that does not fit its option; the caller adds the file, line and key."""


# --------------------------------------------------------------------------------------------------
# Value converters. Each takes the text after '=' (already stripped) and returns the typed value or
# raises _Invalid with what is wrong, in words a user can act on.

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
        raise _Invalid("empty value")
    sign = 1
    body = text
    if body[0] in "+-":
        if size:
            raise _Invalid(f"{text!r}: a size cannot be negative or signed")
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    total = 1
    for factor in body.split("*"):
        factor = factor.strip()
        match = (_SIZE_RE if size else _NUM_RE).fullmatch(factor)
        if match is None:
            kind, hint = ("a size", _SIZE_HINT) if size else ("an integer", _INT_HINT)
            raise _Invalid(f"{text!r} is not {kind}; {hint}")
        total *= int(match.group(1)) * (_UNITS[match.group(2).lower()] if size else 1)
    return sign * total


def _integer(lo: int, hi: int, *, size: bool = False) -> Converter:
    def convert(text: str) -> int:
        value = _parse_number(text, size=size)
        if not lo <= value <= hi:
            show = _format_size if size else str
            raise _Invalid(f"{text} is out of range; it must be between {show(lo)} and {show(hi)}")
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
    raise _Invalid(f"{text!r} is not a boolean; write true or false (yes/no and 1/0 also work)")


def _text(text: str) -> str:
    if not text:
        raise _Invalid("empty value")
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


def _host(text: str) -> str:
    if not _is_host(_text(text)):
        raise _Invalid(f"{text!r} is not an IP address or host name")
    return text


_ZK_SERVER_RE = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.-]+))(?::(?P<port>\d{1,5}))?")


def _zk_path(text: str) -> str:
    if not text.startswith("/"):
        raise _Invalid(f"{text!r} must be an absolute ZooKeeper path such as /meta")
    if text != "/":
        parts = text[1:].split("/")
        if any(p in ("", ".", "..") or any(c.isspace() or c == "\x00" for c in p) for p in parts):
            raise _Invalid(f"{text!r} is not a ZooKeeper path (empty, '.' or '..' part, or a space)")
    return text


def _zk_connect(text: str) -> str:
    servers, slash, chroot = _text(text).partition("/")
    if slash:
        _zk_path("/" + chroot)
    for server in servers.split(","):
        match = _ZK_SERVER_RE.fullmatch(server.strip())
        if match is None or (match["host"] is not None and not _is_host(match["host"])):
            raise _Invalid(f"{server.strip()!r} is not host:port (the form is host:port[,host:port...][/chroot])")
        if match["port"] is not None and not 1 <= int(match["port"]) <= 65535:
            raise _Invalid(f"port {match['port']} is outside 1..65535")
    return text


_IDENT_PATH_RE = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")


def _filter_ref(text: str) -> str:
    module, colon, attr = _text(text).partition(":")
    ok = colon and all(
        _IDENT_PATH_RE.fullmatch(part) and not any(keyword.iskeyword(w) for w in part.split("."))
        for part in (module.strip(), attr.strip())
    )
    if not ok:
        raise _Invalid(f"{text!r} is not module:callable (for example myapp.filters:only_vip)")
    return f"{module.strip()}:{attr.strip()}"


_GROUP_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _group_name(name: str) -> str:
    if not _GROUP_RE.fullmatch(name) or name in (".", ".."):
        raise _Invalid(
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
        raise _Invalid(f"{text!r}: policy {parts[0]!r} is unknown; write {form}")
    if len(parts) < 2 or len(parts) > (3 if kind == "archive" else 2):
        raise _Invalid(f"{text!r} has the wrong number of parts; write {form}")
    match = _RETENTION_RE.fullmatch(parts[1])
    if match is None or int(match.group(1)) == 0:
        raise _Invalid(f"{text!r}: retention {parts[1]!r} must be a positive whole number with s, m or h")
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
    except _Invalid as exc:
        raise ConfigError(f"deletePolicy: {exc}") from None


def _delete_policy_text(text: str) -> str:
    _delete_policy(text)
    return ",".join(p.strip() for p in text.split(","))


# -- deleteWhen (Quartz cron) -----------------------------------------------------------------------

_QUARTZ_DOW_NUM_RE = re.compile(r"(?<![/#\d])(\d+)")


def _quartz_dow(field_text: str) -> str:
    """Quartz counts days of the week 1 (SUN) to 7 (SAT); cron counts 0 (SUN) to 6 (SAT)."""

    def shift(match: re.Match[str]) -> str:
        n = int(match.group(1))
        if not 1 <= n <= 7:
            raise _Invalid(f"day of week {n} is outside Quartz's 1 (SUN) to 7 (SAT)")
        return str(n - 1)

    items = []
    for item in field_text.split(","):
        upper = item.upper()
        if upper == "L":  # alone, Quartz's L is the last day of the week: Saturday
            items.append("6")
        elif re.fullmatch(r"\d+L", upper):  # 6L: the last Friday of the month
            items.append("L" + _QUARTZ_DOW_NUM_RE.sub(shift, upper[:-1]))
        else:
            items.append(_QUARTZ_DOW_NUM_RE.sub(shift, item))
    return ",".join(items)


def _quartz_to_croniter(expr: str) -> str:
    fields = expr.split()
    if len(fields) not in (6, 7):
        raise _Invalid(
            f"{expr!r} has {len(fields)} fields; a Quartz expression has 6 or 7: "
            "second minute hour day-of-month month day-of-week [year]"
        )
    sec, minute, hour, dom, month, dow, *year = fields
    if "?" in (sec, minute, hour, month, *year):
        raise _Invalid(f"{expr!r}: '?' is only allowed in day-of-month or day-of-week")
    if dom not in ("?", "*") and dow not in ("?", "*"):
        raise _Invalid(
            f"{expr!r} restricts both day-of-month and day-of-week; "
            "Quartz needs '?' in one of them (for example 0 0 6 ? * MON)"
        )
    dom = "*" if dom == "?" else dom
    dow = "*" if dow in ("?", "*") else _quartz_dow(dow)
    # croniter wants the seconds as the sixth field (year seventh): croniter's own
    # second_at_beginning flag would do this too, but not in every version pyproject allows.
    return " ".join([minute, hour, dom, month, dow, sec, *year])


def _cron(text: str) -> str:
    converted = _quartz_to_croniter(_text(text))
    try:
        croniter(converted, datetime.now()).get_next(datetime)
    except ValueError as exc:  # croniter's errors are ValueErrors; a date error means "never fires"
        raise _Invalid(f"{text!r} is not a usable Quartz cron expression ({exc})") from None
    except (KeyError, IndexError, TypeError, OverflowError):  # croniter can trip over garbage
        raise _Invalid(f"{text!r} is not a Quartz cron expression") from None
    return " ".join(text.split())


def quartz_to_croniter(expr: str) -> str:
    """Turn MetaQ's Quartz ``deleteWhen`` (``sec min hour dom month dow [year]``) into croniter's form.

    ``?`` becomes ``*``; days of the week move from Quartz's 1-7 (SUN-SAT) to cron's 0-6; the seconds
    move to the sixth field, where croniter expects them. Raises :class:`ConfigError` when ``expr`` is
    not a Quartz expression.
    """
    try:
        return _quartz_to_croniter(expr.strip())
    except _Invalid as exc:
        raise ConfigError(f"deleteWhen: {exc}") from None


def next_run_ms(expr: str, after_ms: int, tz: tzinfo | None = None) -> int:
    """When the Quartz cron ``expr`` next fires strictly after ``after_ms`` (epoch milliseconds).

    ``tz`` is the time zone the hours are read in; ``None`` means the broker's local time, as MetaQ's
    Quartz scheduler did (``0 0 6,18 * * ?`` runs at 06:00 and 18:00 on the wall clock).
    """
    try:
        converted = _quartz_to_croniter(expr.strip())
    except _Invalid as exc:
        raise ConfigError(f"deleteWhen: {exc}") from None
    seconds, millis = divmod(after_ms, 1000)
    start = datetime.fromtimestamp(seconds, tz).replace(microsecond=millis * 1000)
    try:
        nxt = croniter(converted, start).get_next(datetime)
    except ValueError as exc:
        raise ConfigError(f"deleteWhen: {expr!r}: {exc}") from None
    return int(nxt.timestamp()) * 1000 + nxt.microsecond // 1000


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
    _opt("serverPort", "server_port", "int", "8123", _SYSTEM,
         "TCP port clients and other brokers connect to (0: the OS picks a free port).", _port),
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
         "Keep real-time statistics.", _boolean, reload="live"),
    _opt("updateConsumerOffsets", "update_consumer_offsets", "bool", "false", _SYSTEM,
         "Move a consumer whose offset is out of range to the newest offset instead of failing "
         "(handy in development, keep false in production).", _boolean),
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
    # -- [system], MetaQ options metaq accepts and ignores -----------------------------------------
    _opt("getProcessThreadCount", "", "int", None, _SYSTEM,
         "Ignored: the broker serves requests on one asyncio event loop.", _positive,
         status="ignored", default_doc="CPUs*10 in MetaQ"),
    _opt("putProcessThreadCount", "", "int", None, _SYSTEM,
         "Ignored: the broker serves requests on one asyncio event loop.", _positive,
         status="ignored", default_doc="CPUs*10 in MetaQ"),
    _opt("dashboardHttpPort", "", "int", "8120", _SYSTEM,
         "Ignored: metaq has no HTTP dashboard.", _port, status="ignored"),
    _opt("flushTxLogAtCommit", "", "int", "1", _SYSTEM,
         "Ignored: no transactions yet (MetaQ's transaction log flushing).", _integer(0, 2),
         status="ignored"),
    _opt("maxCheckpoints", "", "int", "3", _SYSTEM,
         "Ignored: no transactions yet (transaction log checkpoints kept).", _positive,
         status="ignored"),
    _opt("checkpointInterval", "", "int", "3600000", _SYSTEM,
         "Ignored: no transactions yet (ms between transaction checkpoints).",
         _integer(1, 2**63 - 1), status="ignored"),
    _opt("maxTxTimeoutTimerCapacity", "", "int", "30000", _SYSTEM,
         "Ignored: no transactions yet (transaction timeout timers).", _positive, status="ignored"),
    _opt("maxTxTimeoutInSeconds", "", "int", "60", _SYSTEM,
         "Ignored: no transactions yet (longest transaction, seconds).", _positive, status="ignored"),
    _opt("dataLogPath", "", "path", None, _SYSTEM,
         "Ignored: no transaction log yet (MetaQ's transaction log directory).", _path,
         status="ignored", default_doc="dataPath"),
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
    # -- [topic=NAME] only -------------------------------------------------------------------------
    _opt("group.GROUP", "group_filters", "filter", None, _TOPIC,
         "Server-side filter for consumer group GROUP of this topic: a Python module:callable "
         "(MetaQ names a Java class here).",
         _filter_ref, reload="live", default_doc="none"),
)

_GROUP_PREFIX = "group."


def _by_section(section: Section) -> dict[str, Option]:
    return {o.key: o for o in OPTIONS if section in o.sections}


_SYSTEM_OPTIONS = _by_section("system")
_TOPIC_OPTIONS = _by_section("topic")
_ZK_OPTIONS = _by_section("zookeeper")
_SETTABLE = {k: o for k, o in _SYSTEM_OPTIONS.items() if o.status != "ignored"}
_TOPIC_ATTRS = tuple(o.attr for o in _TOPIC_OPTIONS.values() if o.attr != "group_filters")


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
# The model.


@dataclass(frozen=True)
class ZkConfig:
    """The ``[zookeeper]`` section; its presence (with ``zk.zkEnable`` true) means ZooKeeper mode."""

    connect: str
    session_timeout_ms: int = 30000
    connection_timeout_ms: int = 30000
    sync_time_ms: int = 5000
    root: str = "/meta"
    enable: bool = True


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

    @property
    def retention(self) -> DeletePolicy:
        return parse_delete_policy(self.delete_policy)


@dataclass(frozen=True)
class BrokerConfig:
    """A broker's whole configuration, checked. Build it with :func:`load_config` or :func:`parse_config`."""

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
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    zookeeper: ZkConfig | None = None
    source_path: Path | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Things accepted but worth telling the operator (ignored MetaQ options, odd combinations).

    Not logged here: whoever loads the configuration reports them (the broker command prints them)."""

    def topic_settings(self, topic: str) -> TopicSettings:
        """Effective settings for ``topic``, configured or dynamic. Raises InvalidArgument for a bad name."""
        validate_topic(topic)
        own = self.topics.get(topic)
        values: dict[str, Any] = {}
        for attr in _TOPIC_ATTRS:
            value = getattr(own, attr) if own is not None else None
            values[attr] = getattr(self, attr) if value is None else value
        filters = dict(own.group_filters) if own is not None else {}
        return TopicSettings(topic=topic, configured=own is not None, group_filters=filters, **values)

    def with_overrides(self, overrides: Mapping[str, str]) -> BrokerConfig:
        """A copy with [system] options replaced by text values keyed by MetaQ name (``serverPort``).

        Values are checked exactly as in a file; errors name the flag (``--serverPort: ...``). A
        relative ``dataPath`` given this way is relative to the current directory.
        """
        values = {o.attr: getattr(self, o.attr) for o in _SETTABLE.values()}
        where: dict[str, str] = {}
        for key, text in overrides.items():
            opt = _SETTABLE.get(key)
            if opt is None:
                raise ConfigError(f"--{key}: unknown option{_suggest(key, _SETTABLE, prefix='--')}")
            values[opt.attr] = _convert(opt, str(text).strip(), f"--{key}")
            where[opt.key] = f"--{key}"
        warnings = [w for w in self.warnings if not w.endswith(_STALL_WARNING)]
        _cross_check(values, where, warnings)
        return dataclasses.replace(self, warnings=tuple(warnings), **values)


# --------------------------------------------------------------------------------------------------
# Parsing.


def _suggest(word: str, known: Iterable[str], *, prefix: str = "", fmt: str = "{}") -> str:
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
    return " (comments must be on a line of their own)" if re.search(r"\s[;#]", text) else ""


def _convert(opt: Option, text: str, where: str) -> Any:
    try:
        return opt.parse(text)
    except _Invalid as exc:
        raise ConfigError(f"{where}: {exc}{_comment_hint(text)}") from None


_STALL_WARNING = ": a consumer can stall on a message larger than one transfer"


def _cross_check(values: dict[str, Any], where: Mapping[str, str], warnings: list[str]) -> None:
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
    if values["max_transfer_bytes"] < values["max_message_bytes"]:
        warnings.append(
            f"{at('maxMessageSize', 'maxTransferSize')}: maxTransferSize ({values['max_transfer_bytes']}) is "
            f"below maxMessageSize ({values['max_message_bytes']}){_STALL_WARNING}"
        )


@dataclass
class _Section:
    header: str
    line: int
    entries: list[tuple[int, str, str]]


def _read_ini(text: str, source: str) -> list[_Section]:
    """Sections with their entries and line numbers; only the shape of the file is checked here."""
    sections: list[_Section] = []
    for number, raw in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ConfigError(f"{source}:{number}: {_shown(line)}: section header without a closing ']'")
            sections.append(_Section(line[1:-1].strip(), number, []))
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(f"{source}:{number}: {_shown(line)}: expected key=value, a [section] or a comment")
        if not sections:
            raise ConfigError(f"{source}:{number}: {key}: key outside any section; put it under [system]")
        sections[-1].entries.append((number, key, value.strip()))
    return sections


def _shown(text: str, limit: int = 60) -> str:
    """Text as an error message may quote it: control characters escaped, long names cut."""
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _section_kind(sec: _Section, source: str) -> tuple[Section, str]:
    head, eq, rest = sec.header.partition("=")
    if sec.header == "system":
        return "system", ""
    if sec.header == "zookeeper":
        return "zookeeper", ""
    if eq and head.strip() == "topic":
        name = rest.strip()
        try:
            validate_topic(name)
        except InvalidArgument as exc:
            raise ConfigError(f"{source}:{sec.line}: [{_shown(sec.header)}]: {exc}") from None
        return "topic", name
    if head.strip().lower() in ("topic", "topics") or sec.header.lower().startswith("topic"):
        guess = re.sub(r"^topics?\s*[=:\s]?\s*", "", sec.header, flags=re.IGNORECASE)
        hint = f"; did you mean '[topic={guess}]'?" if guess else "; a topic section is written [topic=NAME]"
    else:
        hint = _suggest(sec.header, ["system", "zookeeper", "topic=NAME"], fmt="[{}]")
    raise ConfigError(
        f"{source}:{sec.line}: [{_shown(sec.header)}]: unknown section (known: [system], [zookeeper], "
        f"[topic=NAME]){hint}"
    )


def _misplaced(key: str, here: str) -> str:
    if key.startswith(_GROUP_PREFIX):
        return f"consumer group filters belong in a [topic=NAME] section, not {here}"
    homes = [s for s in _SECTION_NAMES if key in _by_section(s)]
    if not homes:
        return ""
    home = "[topic=NAME]" if homes == ["topic"] else f"[{homes[0]}]"
    return f"is a {home} option and cannot be set in {here}"


def _unknown_key(key: str, here: str, known: Iterable[str], where: str) -> ConfigError:
    misplaced = _misplaced(key, here)
    key = _shown(key)
    if misplaced:
        return ConfigError(f"{where}: {key}: {misplaced}")
    names = list(known)
    if "group.GROUP" in names and "." in key:
        head, _, tail = key.partition(".")
        if difflib.get_close_matches(head.lower(), ["group"], n=1, cutoff=0.6):
            return ConfigError(f"{where}: {key}: unknown key in {here}; did you mean 'group.{tail}'?")
    plain = [n for n in names if n != "group.GROUP"]
    return ConfigError(f"{where}: {key}: unknown key in {here}{_suggest(key, plain)}")


def _entries(
    sec: _Section, source: str, known: Mapping[str, Option], here: str
) -> dict[str, tuple[int, Option, str]]:
    """Key -> (line, option, text) for one section, refusing duplicates and unknown keys."""
    seen: dict[str, tuple[int, Option, str]] = {}
    group_opt = known.get("group.GROUP")
    for number, key, text in sec.entries:
        where = f"{source}:{number}"
        if key in seen:
            raise ConfigError(f"{where}: {key}: set twice in {here} (first at line {seen[key][0]})")
        opt = known.get(key)
        if opt is None and group_opt is not None and key.startswith(_GROUP_PREFIX):
            try:
                _group_name(key[len(_GROUP_PREFIX):])
            except _Invalid as exc:
                raise ConfigError(f"{where}: {key}: {exc}") from None
            opt = group_opt
        if opt is None:
            raise _unknown_key(key, here, known, where)
        seen[key] = (number, opt, text)
    return seen


def _absolute(path: Path, base_dir: Path | None) -> Path:
    return path if path.is_absolute() or base_dir is None else base_dir / path


def parse_config(text: str, source: str = "<string>", base_dir: Path | None = None) -> BrokerConfig:
    """Parse the text of a ``server.ini``. ``source`` names it in errors.

    ``base_dir`` is where a relative ``dataPath`` is anchored (:func:`load_config` passes the file's
    directory); without it a relative path stays relative to the current directory.
    """
    sections = _read_ini(text, source)
    warnings: list[str] = []
    system: dict[str, tuple[int, Option, str]] = {}
    zk_section: _Section | None = None
    zk_entries: dict[str, tuple[int, Option, str]] = {}
    topics: dict[str, TopicConfig] = {}
    first_line: dict[str, int] = {}

    for sec in sections:
        kind, name = _section_kind(sec, source)
        label = f"[{sec.header}]" if kind != "topic" else f"[topic={name}]"
        ident = label if kind != "topic" else f"topic={name}"
        if ident in first_line:
            raise ConfigError(
                f"{source}:{sec.line}: {label}: section appears twice (first at line {first_line[ident]})"
            )
        first_line[ident] = sec.line
        if kind == "system":
            system = _entries(sec, source, _SYSTEM_OPTIONS, "[system]")
        elif kind == "zookeeper":
            zk_section, zk_entries = sec, _entries(sec, source, _ZK_OPTIONS, "[zookeeper]")
        else:
            topics[name] = _topic_config(name, _entries(sec, source, _TOPIC_OPTIONS, label), source)

    values: dict[str, Any] = {o.attr: o.parse(o.default) for o in _SETTABLE.values() if o.default is not None}
    where: dict[str, str] = {}
    for key, (number, opt, text) in sorted(system.items(), key=lambda item: item[1][0]):
        loc = f"{source}:{number}: {key}"
        value = _convert(opt, text, loc)
        if opt.status == "ignored":
            reason = opt.help.removeprefix("Ignored: ").rstrip(".")
            warnings.append(f"{loc}: MetaQ option accepted but ignored: {reason}")
            continue
        values[opt.attr] = value
        where[key] = loc
    values["data_path"] = _absolute(values["data_path"], base_dir)
    _cross_check(values, where, warnings)

    zookeeper = None
    if zk_section is not None:
        zk_values: dict[str, Any] = {}
        for key, (number, opt, text) in zk_entries.items():
            zk_values[opt.attr] = _convert(opt, text, f"{source}:{number}: {key}")
        if zk_values.get("enable", True):
            if "connect" not in zk_values:
                raise ConfigError(
                    f"{source}:{zk_section.line}: zk.zkConnect: required in [zookeeper] "
                    "(remove the section, or set zk.zkEnable=false, for embedded mode)"
                )
            zookeeper = ZkConfig(**zk_values)

    return BrokerConfig(**values, topics=topics, zookeeper=zookeeper, warnings=tuple(warnings))


def _topic_config(name: str, entries: Mapping[str, tuple[int, Option, str]], source: str) -> TopicConfig:
    values: dict[str, Any] = {}
    filters: dict[str, str] = {}
    for key, (number, opt, text) in entries.items():
        value = _convert(opt, text, f"{source}:{number}: {key}")
        if opt.attr == "group_filters":
            filters[key[len(_GROUP_PREFIX):]] = value
        else:
            values[opt.attr] = value
    return TopicConfig(name=name, group_filters=filters, **values)


def parse_topic_options(topic: str, options: Iterable[tuple[str, str]], *, source: str = "configs",
                        filters: bool = True) -> TopicConfig:
    """A ``[topic=NAME]`` section given as (key, value) pairs rather than lines of a file.

    CreateTopic's ``configs`` and the options stored for a created topic are checked by the same
    validator as server.ini, with the same messages; an error names ``source[i]`` (the pair's index)
    instead of a file and line. ``filters=False`` refuses ``group.GROUP`` keys: a server-side filter
    runs code on the broker, so only the operator's server.ini may name one.
    """
    try:
        validate_topic(topic)
    except InvalidArgument as exc:
        raise ConfigError(f"{source}: {exc}") from None
    here = f"[topic={_shown(topic)}]"
    seen: dict[str, int] = {}
    values: dict[str, Any] = {}
    group_filters: dict[str, str] = {}
    group_opt = _TOPIC_OPTIONS["group.GROUP"]
    for index, (raw_key, raw_text) in enumerate(options):
        key, text = str(raw_key).strip(), str(raw_text).strip()
        where = f"{source}[{index}]"
        if key in seen:
            raise ConfigError(f"{where}: {_shown(key)}: set twice (first at {source}[{seen[key]}])")
        seen[key] = index
        if key.startswith(_GROUP_PREFIX):
            if not filters:
                raise ConfigError(f"{where}: {_shown(key)}: a consumer group filter runs code on the broker; "
                                  f"only server.ini's {here} section may set one")
            try:
                group = _group_name(key[len(_GROUP_PREFIX):])
            except _Invalid as exc:
                raise ConfigError(f"{where}: {_shown(key)}: {exc}") from None
            group_filters[group] = _convert(group_opt, text, f"{where}: {key}")
            continue
        opt = _TOPIC_OPTIONS.get(key)
        if opt is None:
            raise _unknown_key(key, here, _TOPIC_OPTIONS, where)
        values[opt.attr] = _convert(opt, text, f"{where}: {key}")
    return TopicConfig(name=topic, group_filters=group_filters, **values)


def topic_options_text(config: TopicConfig) -> dict[str, str]:
    """A TopicConfig back as server.ini keys and text values (what :func:`parse_topic_options` reads)."""
    out: dict[str, str] = {}
    for opt in _TOPIC_OPTIONS.values():
        if opt.attr == "group_filters":
            continue
        value = getattr(config, opt.attr)
        if value is not None:
            out[opt.key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    for group, ref in sorted(config.group_filters.items()):
        out[f"{_GROUP_PREFIX}{group}"] = ref
    return out


def merge_topic_configs(base: TopicConfig, over: TopicConfig) -> TopicConfig:
    """``over``'s values where it sets them, else ``base``'s (filters: both, ``over`` winning per group)."""
    values = {attr: getattr(over, attr) if getattr(over, attr) is not None else getattr(base, attr)
              for attr in _TOPIC_ATTRS}
    return TopicConfig(name=over.name, group_filters={**base.group_filters, **over.group_filters}, **values)


def load_config(path: str | Path) -> BrokerConfig:
    """Read and check a ``server.ini``. Errors name the file and line."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file: {exc.strerror or exc}") from None
    config = parse_config(text, str(path), base_dir=path.resolve().parent)
    return dataclasses.replace(config, source_path=path)


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
    defaults_changed = any(getattr(old, a) != getattr(new, a) for a in _TOPIC_ATTRS)
    return TopicsDiff(
        added=frozenset(new.topics.keys() - old.topics.keys()),
        removed=frozenset(old.topics.keys() - new.topics.keys()),
        changed=changed,
        defaults_changed=defaults_changed,
    )


def restart_required(old: BrokerConfig, new: BrokerConfig) -> list[str]:
    """The MetaQ names of changed options that a reload cannot apply (the broker logs them)."""
    keys = [
        o.key
        for o in _SETTABLE.values()
        if o.reload == "restart" and getattr(old, o.attr) != getattr(new, o.attr)
    ]
    if old.zookeeper != new.zookeeper:
        keys.append("[zookeeper]")
    return keys


# --------------------------------------------------------------------------------------------------
# CLI flags.

_F = TypeVar("_F", bound=Callable[..., Any])


def _click_check(opt: Option) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:
            try:
                opt.parse(value.strip())
            except _Invalid as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        return value

    return check


def click_options() -> Callable[[_F], _F]:
    """A decorator adding one flag per [system] option: ``--serverPort`` (and ``--server-port``).

    Every flag defaults to None, so only the flags given override the file; the parameter names are
    the BrokerConfig attribute names (``server_port``). Turn them back into MetaQ keys with
    :func:`overrides_from_click` and apply them with :meth:`BrokerConfig.with_overrides`.
    """

    def decorate(func: _F) -> _F:
        for opt in reversed(list(_SETTABLE.values())):
            decls = [opt.flag] + ([f"--{opt.kebab}"] if opt.kebab != opt.key else [])
            func = click.option(
                *decls,
                opt.attr,
                default=None,
                metavar=opt.kind.upper(),
                callback=_click_check(opt),
                help=f"{opt.help} [server.ini default: {opt.default_text}]",
            )(func)
        return func

    return decorate


def overrides_from_click(kwargs: Mapping[str, object]) -> dict[str, str]:
    """The flags actually given, as MetaQ key -> text, ready for :meth:`BrokerConfig.with_overrides`."""
    return {o.key: str(kwargs[o.attr]) for o in _SETTABLE.values() if kwargs.get(o.attr) is not None}
