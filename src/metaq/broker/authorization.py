"""Which ACL each request needs, checked at the one dispatch point (:meth:`metaq.broker.core.Broker.handle`).

:func:`required` maps a request to the (resource type, name, operation) triples it needs; a request
needing several (a FetchRequest of one topic needs one, a MultiFetchRequest or MultiProduceRequest one per
topic it names; others may name no resource) is allowed only if every one is. :func:`authorize` checks
them, and for the requests whose answer lists topics or groups returns a filter for the answer (or, for
OffsetCommit, takes the entries of forbidden topics out of the request and answers them itself): a
principal sees only the topics and groups it may describe, and a forbidden topic is answered the same
whether it exists or not (TOPIC_AUTHORIZATION_FAILED, never UNKNOWN_TOPIC). The ACLs themselves
(:class:`metaq.security.acl.Acls`) are swapped in by :func:`metaq.broker.security_sources.refresh_acls`, a
background job re-reading the ACL file or ZooKeeper node: a change applies within a second, without a restart,
to open connections too (every request is checked against the ACLs in force).

Request types this table does not know (an API added later) need ``admin`` on the cluster: nothing new
is open by default. Every refusal is written to the audit log (:mod:`metaq.broker.audit`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from metaq.broker import audit
from metaq.errors import (
    BrokerError,
    ClusterAuthorizationError,
    GroupAuthorizationError,
    MessageNotFoundError,
    TopicAuthorizationError,
    TransactionAuthorizationError,
)
from metaq.protocol import messages as m
from metaq.security.acl import CLUSTER_NAME, Acls

if TYPE_CHECKING:
    from metaq.broker.session import Session


class Authorizing(Protocol):
    """What :func:`authorize` needs of the broker (the core, which imports this module)."""

    @property
    def acls(self) -> Acls: ...

    @property
    def topics(self) -> Mapping[str, Any]: ...

    @property
    def audit(self) -> Callable[..., None]: ...

    @property
    def config(self) -> Any: ...

Need = tuple[str, str, str]
"""(resource type, resource name, operation)."""
AnswerFilter = Callable[[Any], Any]
"""Applied to a request's answer before it leaves the core (what the principal may see of it)."""

_TOPIC_OPERATION: dict[type, str] = {
    m.ProduceRequest: "produce",
    m.FetchRequest: "consume",
    m.ListOffsetsRequest: "describe",
    m.FindMessagesRequest: "consume",
    m.CreateTopicRequest: "create",
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
    m.LookupMessageRequest: "describe",
    m.ReloadRequest: "admin",
    m.VerifyRequest: "admin",
    m.PromoteRequest: "admin",
}
_TRANSACTION_OPERATION: dict[int, str] = {
    m.TX_BEGIN: "produce", m.TX_PREPARE: "produce", m.TX_COMMIT: "produce", m.TX_ROLLBACK: "produce",
    m.TX_STATUS: "describe",
}
FREE: frozenset[type] = frozenset({m.ApiVersionsRequest, m.SaslHandshakeRequest, m.SaslAuthenticateRequest,
                                   m.MetadataRequest, m.ListGroupsRequest, m.CheckTransactionsRequest})
"""Needing no ACL to be sent: the handshake, and the listings whose answers are filtered instead
(Metadata: the topics the principal may describe; ListGroups: the groups; CheckTransactions: the
principal's own transactions, in its handler)."""
_ERRORS: dict[str, type[BrokerError]] = {"topic": TopicAuthorizationError, "group": GroupAuthorizationError,
                                         "cluster": ClusterAuthorizationError,
                                         "transaction": TransactionAuthorizationError}


def required(request: Any, missing: Callable[[str], bool] = lambda topic: False) -> list[Need]:
    """What ``request`` needs. ``missing(topic)``: the topic does not exist and a produce would create it
    (autoCreateTopics), which needs ``create`` besides ``produce``."""
    kind = type(request)
    if kind in FREE:
        return []
    needs: list[Need]
    if kind is m.MultiFetchRequest:  # consume on every topic it names
        needs = [("topic", topic, "consume") for topic in dict.fromkeys(p.topic for p in request.partitions)]
    elif kind is m.MultiProduceRequest:  # produce on every topic it names
        needs = [("topic", topic, "produce") for topic in dict.fromkeys(p.topic for p in request.partitions)]
    elif kind in _TOPIC_OPERATION:
        needs = [("topic", str(request.topic), _TOPIC_OPERATION[kind])]
    elif kind in _GROUP_OPERATION:
        needs = [("group", str(request.group), _GROUP_OPERATION[kind])]
        if kind is m.JoinGroupRequest:  # the partitions of every topic it names come back in its assignment
            named = dict.fromkeys([*request.topics, *(a.topic for a in request.partitions)])
            needs += [("topic", topic, "consume") for topic in named]
    elif kind is m.TransactionRequest:
        if request.op not in _TRANSACTION_OPERATION:  # recover: lists the principal's own (its handler)
            return []
        return [("transaction", request.transaction_id, _TRANSACTION_OPERATION[request.op])]
    else:
        return [("cluster", CLUSTER_NAME, _CLUSTER_OPERATION.get(kind, "admin"))]
    if kind in (m.FetchRequest, m.MultiFetchRequest) and request.group:  # applies that group's filter
        needs.append(("group", request.group, "consume"))
    if kind in (m.ProduceRequest, m.MultiProduceRequest):
        topics = [request.topic] if kind is m.ProduceRequest else [n[1] for n in needs]
        needs += [("topic", topic, "create") for topic in topics if missing(topic)]
        if request.transaction_id:
            needs.append(("transaction", request.transaction_id, "produce"))
    return needs


def allowed(acls: Acls, principal: str, resource_type: str, name: str, operation: str) -> bool:
    """Whether ``acls`` allow it; ``create`` on a topic is also allowed by ``create`` on the cluster (Kafka's
    CREATE) and by ``admin`` on the topic."""
    if acls.allows(principal, resource_type, name, operation):
        return True
    if operation == "create" and resource_type == "topic":
        return acls.allows(principal, "cluster", CLUSTER_NAME, "create") or acls.allows(principal, "topic", name,
                                                                                           "admin")
    return False


def refusal(principal: str, need: Need, request: Any) -> BrokerError:
    resource_type, name, operation = need
    if resource_type == "cluster":
        return ClusterAuthorizationError(
            f"{principal} may not {operation} the cluster ({type(request).__name__.removesuffix('Request')})")
    what = "transaction id" if resource_type == "transaction" else resource_type
    return _ERRORS[resource_type](f"{principal} may not {operation} {what} {name!r}")


def check(acls: Acls, principal: str, request: Any, missing: Callable[[str], bool] = lambda topic: False) -> None:
    """Raise the matching *_AUTHORIZATION_FAILED error unless ``principal`` may send ``request``."""
    for need in required(request, missing):
        if not allowed(acls, principal, *need):
            raise refusal(principal, need, request)


def resource_name(resource_type: str, name: str) -> str:
    """How the audit log names a resource."""
    return "cluster" if resource_type == "cluster" else f"{resource_type}:{name}"


def authorize(broker: Authorizing, session: Session, request: Any) -> tuple[Any, AnswerFilter | None]:
    """Check ``request`` for the session's principal (the refusal raised, and written to the audit log);
    the request to handle (OffsetCommit: without the entries of forbidden topics) and a filter for its
    answer, or None."""
    acls = broker.acls
    principal = session.principal
    assert principal is not None
    topics = broker.topics
    auto_create = broker.config.auto_create_topics

    def missing(topic: str) -> bool:
        return auto_create and topic not in topics

    for need in required(request, missing):
        if not allowed(acls, principal, *need):
            exc = refusal(principal, need, request)
            broker.audit(principal, need[2], resource_name(need[0], need[1]), audit.DENIED, session.peer,
                         type(request).__name__.removesuffix("Request"))
            raise exc
    shape = _SHAPERS.get(type(request))
    if shape is None or principal in acls.super_users:
        return request, None
    return shape(acls, principal, request)


def _may_describe(acls: Acls, principal: str) -> Callable[[str], bool]:
    return lambda topic: acls.allows(principal, "topic", topic, "describe")


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


def _metadata(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter]:
    return request, lambda response: filter_metadata(acls, principal, request, response)


def _offset_fetch(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter]:
    """Every committed offset: only the topics the principal may describe. Named partitions of a topic it may
    not describe: offset -1 and TOPIC_AUTHORIZATION_FAILED, whether the topic exists or not (Kafka's
    OffsetFetch)."""
    may = _may_describe(acls, principal)

    def shape(response: Any) -> Any:
        if not isinstance(response, m.OffsetFetchResponse) or response.error_code:
            return response
        if request.partitions is None:
            response.offsets = [o for o in response.offsets if may(o.topic)]
        else:
            for o in response.offsets:
                if not o.error_code and not may(o.topic):
                    o.offset, o.metadata, o.error_code = -1, None, TopicAuthorizationError.code
        return response

    return request, shape


def _offset_commit(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter | None]:
    """Entries of topics the principal may not consume are not committed: each is answered
    TOPIC_AUTHORIZATION_FAILED in its place, whether the topic exists or not (Kafka's OffsetCommit)."""
    refused = [i for i, e in enumerate(request.offsets) if not acls.allows(principal, "topic", e.topic, "consume")]
    if not refused:
        return request, None
    kept = [e for i, e in enumerate(request.offsets) if i not in set(refused)]
    entries = request.offsets

    def shape(response: Any) -> Any:
        if not isinstance(response, m.OffsetCommitResponse) or response.error_code:
            return response
        results = iter(response.results)
        merged = []
        for i, e in enumerate(entries):
            if i in refused_set:
                merged.append(m.OffsetEntry(e.topic, e.broker_id, e.partition, e.offset, e.metadata,
                                            TopicAuthorizationError.code))
            else:
                merged.append(next(results))
        response.results = merged
        words = f"{len(refused)} of {len(entries)} offsets refused: {principal} may not consume their topics"
        response.error_message = f"{words}; {response.error_message}" if response.error_message else words
        return response

    refused_set = set(refused)
    return dataclasses.replace(request, offsets=kept), shape


def _describe_group(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter]:
    may = _may_describe(acls, principal)

    def shape(response: Any) -> Any:
        for member in getattr(response, "members", ()):
            member.assignment = [a for a in member.assignment if may(a.topic)]
        return response

    return request, shape


def _list_groups(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter | None]:
    if acls.allows(principal, "cluster", CLUSTER_NAME, "describe"):
        return request, None

    def shape(response: Any) -> Any:
        if isinstance(response, m.ListGroupsResponse):
            response.groups = [g for g in response.groups if acls.allows(principal, "group", g, "describe")]
        return response

    return request, shape


def _lookup_message(acls: Acls, principal: str, request: Any) -> tuple[Any, AnswerFilter]:
    """A message id of a topic the principal may not describe is answered as one that does not exist."""

    def shape(response: Any) -> Any:
        if isinstance(response, m.LookupMessageResponse) and not response.error_code \
                and not acls.allows(principal, "topic", response.topic, "describe"):
            return m.error_response(m.LookupMessageRequest.API_KEY, MessageNotFoundError.code,
                                    f"message {request.message_id:032x} is not stored on this broker")
        return response

    return request, shape


_SHAPERS: dict[type, Callable[[Acls, str, Any], tuple[Any, AnswerFilter | None]]] = {
    m.MetadataRequest: _metadata,
    m.OffsetFetchRequest: _offset_fetch,
    m.OffsetCommitRequest: _offset_commit,
    m.DescribeGroupRequest: _describe_group,
    m.ListGroupsRequest: _list_groups,
    m.LookupMessageRequest: _lookup_message,
}
"""Requests whose answer (or, for OffsetCommit, whose entries) depend on what the principal may see."""


def filtered(result: Any, answer_filter: AnswerFilter) -> Any:
    """``answer_filter`` applied to a handler's result, or to what its coroutine returns."""
    if inspect.iscoroutine(result) or isinstance(result, asyncio.Future):
        return _filtered_later(result, answer_filter)
    return answer_filter(result)


async def _filtered_later(pending: Awaitable[Any], answer_filter: AnswerFilter) -> Any:
    return answer_filter(await pending)
