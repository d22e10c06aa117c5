"""What a consumer group is on a standalone broker: its states, members, names and limits.

A group is *Empty*, *PreparingRebalance* or *Stable* (:mod:`.coordinator` moves it between them); a
:class:`Member` is what the coordinator knows of one consumer of it (its subscription, its session, what it
owns in the current generation, a JoinGroup waiting for the rebalance).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from metaq.broker.error_mapping import error_response
from metaq.cluster.assignment import PartitionRef
from metaq.errors import (
    BrokerError,
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    UnknownPartitionError,
)
from metaq.protocol import messages as m
from metaq.types import BROKER_ID_MAX, PartitionId, validate_topic

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
STABLE = "Stable"

SESSION_TIMEOUT_MIN_MS = 50
SESSION_TIMEOUT_MAX_MS = 30 * 60 * 1000
REBALANCE_TIMEOUT_MAX_MS = 30 * 60 * 1000
MEMBERS_PER_GROUP_MAX = 10_000
GROUPS_MAX = 100_000
TOPICS_PER_MEMBER_MAX = 1_000
REPORTED_PARTITIONS_MAX = 100_000
"""Partitions one JoinGroup may report (over all its topics)."""
DEFAULT_TICK_MS = 50

_GROUP_RE = re.compile(r"[A-Za-z0-9._@-]{1,249}")

PartitionsOf = Callable[[str], Sequence[PartitionRef | tuple[int, int]]]
Clock = Callable[[], float]
"""Milliseconds from an arbitrary origin (monotonic)."""


def _monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def validate_group(name: object) -> str:
    if not isinstance(name, str) or not _GROUP_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidRequestError(
            f"consumer group name {name!r} must be 1-249 letters, digits, '-', '_', '.' or '@' (not '.' or '..')")
    return name


@dataclass
class Member:
    member_id: str
    client_id: str
    topics: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_seen_ms: float
    assignment: dict[str, list[PartitionId]] = field(default_factory=dict)
    """topic -> partitions owned in the group's current generation (empty while rejoining)."""
    reported: dict[str, tuple[PartitionId, ...]] = field(default_factory=dict)
    """topic -> the partitions the member saw when it last joined (JoinGroup ``partitions``)."""
    join: asyncio.Future[m.JoinGroupResponse] | None = None
    """Set while the member waits in JoinGroup for the rebalance to complete."""


@dataclass
class Group:
    name: str
    state: str = EMPTY
    generation: int = 0
    strategy: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_deadline_ms: float = 0.0
    rebalance_reason: str = ""
    partitions: dict[str, tuple[PartitionRef, ...]] = field(default_factory=dict)
    """Every subscribed topic's partitions when the current generation was formed."""
    rebalances: int = 0
    whole_cluster: bool = False
    """Balanced over every partition its members report, other brokers' too (a Kafka group: one coordinator
    for the cluster), not only this broker's (a standalone group)."""


def _error(cls: Any, exc: BrokerError) -> Any:
    return error_response(cls.API_KEY, exc)


def _ref_error_code(topic: str, broker_id: int, partition: int) -> int:
    try:
        validate_topic(topic)
    except InvalidArgument:
        return InvalidTopicError.code
    return UnknownPartitionError.code if partition < 0 or not 0 <= broker_id <= BROKER_ID_MAX else 0


