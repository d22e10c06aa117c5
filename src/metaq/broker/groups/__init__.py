"""The group coordinator of standalone mode: each broker balances a consumer group's partitions on it.

:mod:`.coordinator` (:class:`GroupCoordinator`: membership, the rebalance protocol and its invariant),
:mod:`.offsets` (OffsetCommit checked against the generation, OffsetFetch), :mod:`.state` (what a group and
a member are, names and limits).
"""

from metaq.broker.groups.coordinator import GroupCoordinator
from metaq.broker.groups.state import EMPTY, PREPARING_REBALANCE, STABLE, Group, Member, validate_group

__all__ = ["EMPTY", "PREPARING_REBALANCE", "STABLE", "Group", "GroupCoordinator", "Member", "validate_group"]
