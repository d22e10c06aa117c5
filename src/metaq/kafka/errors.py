"""metaq's error codes as Kafka's: one table, for every response the Kafka listener writes.

metaq took most of its wire codes from Kafka (1 OFFSET_OUT_OF_RANGE, 3 UNKNOWN_TOPIC_OR_PARTITION, 6
NOT_LEADER_OR_FOLLOWER, 25 UNKNOWN_MEMBER_ID, 29 TOPIC_AUTHORIZATION_FAILED, ...): those pass through.
The codes of its own (HTTP-like 4xx/5xx, and a few numbers Kafka uses for something else) map to the
Kafka code whose client behaviour is the right one: retriable where metaq's error is, refreshing
metadata where a partition moved.
"""

from __future__ import annotations

# metaq code -> Kafka code, where they differ
_MAP: dict[int, int] = {
    4: 3,      # UNKNOWN_PARTITION -> UNKNOWN_TOPIC_OR_PARTITION
    403: 44,   # PARTITION_CLOSED (metaq topic close) -> POLICY_VIOLATION: not retriable, says why
    404: 3,    # MESSAGE_NOT_FOUND
    429: 7,    # TOO_MANY_REQUESTS -> REQUEST_TIMED_OUT (retriable)
    431: 7,    # TOO_MANY_CONNECTIONS
    503: 6,    # BROKER_STOPPING -> NOT_LEADER_OR_FOLLOWER: refresh metadata, follow the new master
    507: 56,   # DISK_FULL -> KAFKA_STORAGE_ERROR
    74: 2,     # STORED_DATA_CORRUPT -> CORRUPT_MESSAGE
    75: 6,     # FENCED_EPOCH (an older master's epoch) -> NOT_LEADER_OR_FOLLOWER
    90: 42,    # DELAY_TOO_LONG -> INVALID_REQUEST
    69: 69,    # GROUP_ID_NOT_FOUND (same)
}

_KAFKA_KNOWN_MAX = 130

# Kafka's codes the translation (metaq.kafka.apis) writes of its own
NONE = 0
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_NOT_AVAILABLE = 15
INCONSISTENT_GROUP_PROTOCOL = 23
UNKNOWN_MEMBER_ID = 25
ILLEGAL_GENERATION = 22
REBALANCE_IN_PROGRESS = 27
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
TOPIC_ALREADY_EXISTS = 36


def kafka_code(code: int) -> int:
    """The Kafka error code for a metaq error code (0 stays 0; anything unknown is UNKNOWN_SERVER_ERROR)."""
    if code == 0:
        return 0
    mapped = _MAP.get(code, code)
    return mapped if -1 <= mapped <= _KAFKA_KNOWN_MAX else -1
