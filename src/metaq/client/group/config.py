"""ConsumerConfig: MetaQ's consumer options, with MetaQ's defaults.

Field names are MetaQ's in snake case with the unit last (``maxDelayFetchTimeInMills`` ->
``max_delay_fetch_ms``); :meth:`ConsumerConfig.from_metaq` also takes MetaQ's own camelCase names, so a
MetaQ properties file maps over unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from metaq.errors import ConfigError, InvalidArgument
from metaq.types import DEAD_LETTER_TOPIC_PREFIX, validate_topic

RejectionPolicy = Literal["recover", "skip", "dead-letter"]
REJECTION_POLICIES: tuple[str, ...] = ("recover", "skip", "dead-letter")

DEFAULT_RECOVER_DIR = Path("~/.meta_recover")
"""MetaQ's local recover directory."""


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """A group consumer's settings: MetaQ's ``ConsumerConfig`` names in snake case, the unit last.

    :meth:`from_metaq` also takes MetaQ's own names (``fetchRunnerCount``, ``loadBalanceStrategyType``, ...)."""

    group: str
    """The consumer group (MetaQ ``group``). Groups are independent: each has its own offsets."""
    consumer_id: str = ""
    """MetaQ ``consumerId``: names this member in ``metaq group describe``; standalone brokers order the
    members by it, so it must be unique in the group ('' = MetaQ's ``<group>_<host>-<ms>-<random>``).
    Broadcast members keep their offsets under it, so give each broadcast member a stable, distinct id
    ('' = the host name)."""
    fetch_runner_count: int = dataclasses.field(default_factory=lambda: os.cpu_count() or 1)
    """MetaQ ``fetchRunnerCount``: partitions processed at once (listener calls run in parallel across
    partitions, in order within one); also the size of the thread pool for synchronous listeners."""
    max_delay_fetch_ms: int = 5000
    """MetaQ ``maxDelayFetchTimeInMills``: with long polling, how long the broker holds an empty fetch;
    without it, the longest back-off between fetches of an empty partition (each empty reply adds a
    tenth of it)."""
    long_poll: bool = True
    """Let the broker hold an empty fetch (with ``multi_fetch``: one long poll over many partitions; without
    it, one connection per owned partition). False: MetaQ's client back-off on one shared connection."""
    multi_fetch: bool = True
    """Fetch all owned partitions of a broker with MultiFetch requests over ONE connection per broker
    (brokers that serve it; older ones, and reads from slaves, are fetched partition by partition)."""
    commit_offset_period_ms: int = 5000
    """MetaQ ``commitOffsetPeriodInMills``: how often acknowledged offsets are committed. Offsets are
    also committed before a rebalance gives partitions up and on close. The bound on duplicates after a
    crash is what was consumed in one period."""
    consume_from_max_offset: bool = False
    """MetaQ ``consumeFromMaxOffset``: a group (or broadcast member) with no committed offset starts at
    the partition's end instead of its beginning."""
    max_fetch_retries: int = 5
    """MetaQ ``maxFetchRetries``: redeliveries of a message whose listener raised (or marked it
    rollback-only) before the rejection policy gets it: 1 + max_fetch_retries deliveries in all."""
    retry_backoff_ms: int = -1
    """The wait before each redelivery of a failed message grows by this much per retry (MetaQ's: the
    fetch of a failed message is delayed a tenth of ``max_delay_fetch_ms`` more each time), up to
    ``retry_backoff_max_ms``. -1 = a tenth of max_delay_fetch_ms (500 ms by default: 0.5, 1, 1.5, 2,
    2.5 s before the 5 redeliveries, 7.5 s in all); 0 = redeliver at once. The partition waits (its
    order is kept); other partitions go on."""
    retry_backoff_max_ms: int = -1
    """The longest wait before a redelivery; -1 = max_delay_fetch_ms (5 s by default)."""
    rejection_policy: RejectionPolicy = "recover"
    """What happens to a message after its retries: ``recover`` keeps it in the local recover store
    (retried in the background, survives restarts); ``skip`` drops it (logged); ``dead-letter`` produces
    it to the group's dead-letter topic ``%DLQ%<group>`` and moves on only once that is acknowledged
    (:mod:`metaq.client.group.dead_letter`)."""
    dead_letter_partitions: int = 1
    """Partitions of the dead-letter topic when the ``dead-letter`` policy has to create it."""
    recover_message_interval_ms: int = 5 * 60 * 1000
    """MetaQ ``recoverMessageIntervalInMills``: how often the recover store retries its messages."""
    recover_dir: str | Path = DEFAULT_RECOVER_DIR
    """Where the recover store keeps messages (one directory per group)."""
    max_increase_fetch_data_retries: int = 5
    """MetaQ ``maxIncreaseFetchDataRetries``: doublings of the fetch size for a message larger than the
    subscription's max_size before the partition reports an error."""
    load_balance_strategy: str = "range"
    """MetaQ ``loadBalanceStrategyType``: ``range`` (DEFAULT) or ``consistent_hash`` (CONSIST)."""
    session_timeout_ms: int = 10_000
    """A member silent this long is dropped from the group and its partitions move."""
    rebalance_timeout_ms: int = 30_000
    """How long a rebalance waits for members to commit and rejoin before dropping them."""
    heartbeat_interval_ms: int = 0
    """0 = a third of session_timeout_ms."""
    broadcast: bool = False
    """MetaQ's broadcast consumer: every member reads every partition; offsets per member (local file)."""
    dedup_window: int = 4096
    """Recent acknowledged message ids remembered to drop redeliveries seen by this consumer (0 = off)."""

    def __post_init__(self) -> None:
        if not isinstance(self.group, str) or not self.group:
            raise ConfigError("ConsumerConfig.group is required (the consumer group name)")
        for name in ("fetch_runner_count", "max_delay_fetch_ms", "commit_offset_period_ms", "dead_letter_partitions",
                     "recover_message_interval_ms", "session_timeout_ms", "rebalance_timeout_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"ConsumerConfig.{name} must be an integer > 0, not {value!r}")
        for name in ("retry_backoff_ms", "retry_backoff_max_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ConfigError(f"ConsumerConfig.{name} must be an integer >= -1, not {value!r}")
        for name in ("max_fetch_retries", "max_increase_fetch_data_retries", "heartbeat_interval_ms",
                     "dedup_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"ConsumerConfig.{name} must be an integer >= 0, not {value!r}")
        if self.rejection_policy not in REJECTION_POLICIES:
            raise ConfigError(f"rejection_policy must be 'recover', 'skip' or 'dead-letter', "
                              f"not {self.rejection_policy!r}")
        if self.rejection_policy == "dead-letter":
            try:
                validate_topic(DEAD_LETTER_TOPIC_PREFIX + self.group)
            except InvalidArgument as exc:
                raise ConfigError(f"rejection_policy 'dead-letter' needs a group name that can follow "
                                  f"{DEAD_LETTER_TOPIC_PREFIX!r} in a topic name: {exc}") from None
        if self.load_balance_strategy not in ("range", "consistent_hash"):
            raise ConfigError(f"load_balance_strategy must be 'range' or 'consistent_hash', "
                              f"not {self.load_balance_strategy!r}")
        if self.rebalance_timeout_ms < self.session_timeout_ms:
            raise ConfigError("rebalance_timeout_ms must be >= session_timeout_ms")

    @property
    def heartbeat_ms(self) -> int:
        """The heartbeat period in use: ``heartbeat_interval_ms``, or a third of ``session_timeout_ms``."""
        return self.heartbeat_interval_ms or max(1, self.session_timeout_ms // 3)

    def retry_delay_ms(self, retry: int) -> int:
        """The wait before redelivery number ``retry`` (1, 2, ...) of a failed message."""
        step = self.max_delay_fetch_ms // 10 if self.retry_backoff_ms < 0 else self.retry_backoff_ms
        cap = self.max_delay_fetch_ms if self.retry_backoff_max_ms < 0 else self.retry_backoff_max_ms
        return min(cap, retry * step)

    @classmethod
    def from_metaq(cls, **options: Any) -> ConsumerConfig:
        """Build from MetaQ's names (``fetchRunnerCount=4``) or ours; ConfigError names an unknown one."""
        known = {f.name for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for key, value in options.items():
            name = METAQ_NAMES.get(key, key)
            if name not in known:
                raise ConfigError(f"unknown consumer option {key!r}; known: "
                                  f"{', '.join(sorted(set(METAQ_NAMES) | known))}")
            if name == "load_balance_strategy" and isinstance(value, str):
                value = {"DEFAULT": "range", "CONSIST": "consistent_hash"}.get(value.upper(), value)
            out[name] = value
        return cls(**out)


METAQ_NAMES: dict[str, str] = {
    "group": "group",
    "consumerId": "consumer_id",
    "fetchRunnerCount": "fetch_runner_count",
    "maxDelayFetchTimeInMills": "max_delay_fetch_ms",
    "commitOffsetPeriodInMills": "commit_offset_period_ms",
    "consumeFromMaxOffset": "consume_from_max_offset",
    "maxFetchRetries": "max_fetch_retries",
    "recoverMessageIntervalInMills": "recover_message_interval_ms",
    "maxIncreaseFetchDataRetries": "max_increase_fetch_data_retries",
    "loadBalanceStrategyType": "load_balance_strategy",
}
