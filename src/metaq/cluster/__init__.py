"""Where brokers, partitions, group members and offsets are registered.

Standalone mode (the default) keeps all of this inside the one broker; the ZooKeeper mode to come keeps
it in ZooKeeper. Both balance a group's partitions with the pure functions of
:mod:`metaq.cluster.assignment`, so a group sees the same split whichever mode coordinates it.
"""

from metaq.cluster.assignment import (
    STRATEGIES,
    PartitionRef,
    assign,
    assign_topics,
    check_assignment,
    consistent_hash_assign,
    range_assign,
)

__all__ = ["STRATEGIES", "PartitionRef", "assign", "assign_topics", "check_assignment", "consistent_hash_assign",
           "range_assign"]
