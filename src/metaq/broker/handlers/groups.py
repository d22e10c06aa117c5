"""Consumer-group requests, answered by the broker's group coordinator (:mod:`metaq.broker.groups`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from metaq.broker.groups import GroupCoordinator
from metaq.broker.session import Session
from metaq.protocol import messages as m

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


def _coordinator(method: Callable[[GroupCoordinator, Any], Awaitable[Any]]) -> Handler:
    """A handler passing the request to ``method`` of the broker's coordinator."""

    def handle(broker: Broker, request: Any, session: Session | None) -> Awaitable[Any]:
        return method(broker.groups, request)

    handle.__name__ = f"handle_{method.__name__}"
    return handle


def handle_join(broker: Broker, request: m.JoinGroupRequest, session: Session | None) -> Awaitable[Any]:
    return broker.groups.join(request, whole_cluster=session is not None and session.whole_cluster_groups)


HANDLERS: dict[type, Handler] = {
    m.JoinGroupRequest: handle_join,
    m.HeartbeatRequest: _coordinator(GroupCoordinator.heartbeat),
    m.LeaveGroupRequest: _coordinator(GroupCoordinator.leave),
    m.OffsetCommitRequest: _coordinator(GroupCoordinator.commit_offsets),
    m.OffsetFetchRequest: _coordinator(GroupCoordinator.fetch_offsets),
    m.ListGroupsRequest: _coordinator(GroupCoordinator.list_groups),
    m.DescribeGroupRequest: _coordinator(GroupCoordinator.describe_group),
}
