"""Which ACL each request needs, checked at the one dispatch point (:meth:`metaq.broker.core.Broker.handle`).

:func:`required` maps a request to the (resource type, name, operation) triples it needs; a request
needing several (a FetchRequest of one topic needs one, a MultiFetchRequest or MultiProduceRequest one per
topic it names; others may name no resource) is allowed only if every one is. The ACLs themselves
(:class:`metaq.security.acl.Acls`) are swapped in by :func:`metaq.broker.security_sources.refresh_acls`, a
background job re-reading the ACL file or ZooKeeper node: a change applies within a second, without a restart.

Request types this table does not know (an API added later) need ``admin`` on the cluster: nothing new
is open by default.
"""

from __future__ import annotations

from typing import Any

from metaq.errors import (
    BrokerError,
    ClusterAuthorizationError,
    GroupAuthorizationError,
    TopicAuthorizationError,
)
from metaq.protocol import messages as m
from metaq.security.acl import CLUSTER_NAME, Acls

Need = tuple[str, str, str]
"""(resource type, resource name, operation)."""

_TOPIC_OPERATION: dict[type, str] = {
    m.ProduceRequest: "produce",
    m.FetchRequest: "consume",
    m.ListOffsetsRequest: "describe",
    m.FindMessagesRequest: "consume",
    m.CreateTopicRequest: "admin",
    m.DeleteTopicRequest: "admin",
    m.PartitionStateRequest: "admin",
}
_GROUP_OPERATION: dict[type, str] = {
    m.JoinGroupRequest: "consume",
    m.HeartbeatRequest: "consume",
    m.LeaveGroupRequest: "consume",
    m.OffsetCommitRequest: "consume",
    m.OffsetFetchRequest: "describe",
    m.DescribeGroupRequest: "describe",
}
_CLUSTER_OPERATION: dict[type, str] = {
    m.StatsRequest: "describe",
    m.ListGroupsRequest: "describe",
    m.LookupMessageRequest: "describe",
    m.ListTransactionsRequest: "describe",
    m.ReloadRequest: "admin",
    m.VerifyRequest: "admin",
    m.PromoteRequest: "admin",
}
FREE: frozenset[type] = frozenset({m.ApiVersionsRequest, m.SaslHandshakeRequest, m.SaslAuthenticateRequest,
                                   m.MetadataRequest})
"""Needing no ACL to be sent: the handshake, and Metadata (its answer is filtered instead:
:func:`filter_metadata`)."""
_ERRORS: dict[str, type[BrokerError]] = {"topic": TopicAuthorizationError, "group": GroupAuthorizationError,
                                         "cluster": ClusterAuthorizationError}


def required(request: Any) -> list[Need]:
    kind = type(request)
    if kind in FREE:
        return []
    if kind is m.MultiFetchRequest:  # consume on every topic it names
        return [("topic", topic, "consume") for topic in dict.fromkeys(p.topic for p in request.partitions)]
    if kind is m.MultiProduceRequest:  # produce on every topic it names
        return [("topic", topic, "produce") for topic in dict.fromkeys(p.topic for p in request.partitions)]
    if kind in _TOPIC_OPERATION:
        return [("topic", str(request.topic), _TOPIC_OPERATION[kind])]
    if kind in _GROUP_OPERATION:
        return [("group", str(request.group), _GROUP_OPERATION[kind])]
    return [("cluster", CLUSTER_NAME, _CLUSTER_OPERATION.get(kind, "admin"))]


def check(acls: Acls, principal: str, request: Any) -> None:
    """Raise the matching *_AUTHORIZATION_FAILED error unless ``principal`` may send ``request``."""
    for resource_type, name, operation in required(request):
        if not acls.allows(principal, resource_type, name, operation):
            what = name if resource_type != "cluster" else "the cluster"
            raise _ERRORS[resource_type](
                f"{principal} may not {operation} {resource_type} {what!r}" if resource_type != "cluster"
                else f"{principal} may not {operation} {what} ({type(request).__name__.removesuffix('Request')})")


def filter_metadata(acls: Acls, principal: str, request: m.MetadataRequest, response: Any) -> Any:
    """``response`` (a MetadataResponse) showing only the topics ``principal`` may describe (describe is
    implied by produce, consume and admin). A topic asked for by name and not allowed is answered
    TOPIC_AUTHORIZATION_FAILED with no partitions, whether it exists or not (its existence is not told);
    in a list of every topic it is left out."""
    if not isinstance(response, m.MetadataResponse) or response.error_code:
        return response
    shown = []
    for info in response.topics:
        if acls.allows(principal, "topic", info.name, "describe"):
            shown.append(info)
        elif request.topics is not None:
            shown.append(m.TopicInfo(info.name, TopicAuthorizationError.code, []))
    response.topics = shown
    return response
