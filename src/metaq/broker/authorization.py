"""Which ACL each request needs, checked at the one dispatch point (:meth:`metaq.broker.core.Broker.handle`).

:func:`required` maps a request to the (resource type, name, operation) triples it needs; a request
needing several (a FetchRequest of one topic needs one, a MultiFetchRequest or MultiProduceRequest one per
topic it names; others may name no resource) is allowed only if every one is. The ACLs themselves
(:class:`metaq.security.acl.Acls`) are swapped in by :func:`refresh_acls`, a background job re-reading the
ACL file or ZooKeeper node every ``ACL_REFRESH_S``: a change applies within that time, without a restart.

Request types this table does not know (an API added later) need ``admin`` on the cluster: nothing new
is open by default.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from metaq.errors import (
    BrokerError,
    ClusterAuthorizationError,
    ConfigError,
    GroupAuthorizationError,
    MetaqError,
    TopicAuthorizationError,
)
from metaq.protocol import messages as m
from metaq.security.acl import ACL_FILE_NAME, CLUSTER_NAME, AclFile, Acls, decode_acls
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import ScramCredential

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.auth")

ACL_REFRESH_S: Final = 1.0
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


CredentialLookup = Callable[[str], ScramCredential | None]


def credential_lookup(broker: Broker) -> CredentialLookup:
    """Where ``broker`` finds a user's credential (blocking): ZooKeeper in cluster mode, else its users file."""
    store = broker.cluster.registry.user_acl_store()
    if store is not None:
        def from_zookeeper(name: str) -> ScramCredential | None:
            data = store.read_user(name)
            if data is None:
                return None
            try:
                return ScramCredential.from_json(json.loads(data))
            except ValueError as exc:
                raise ConfigError(f"user {name!r} in ZooKeeper is damaged: {exc}") from None

        return from_zookeeper
    config = broker.config
    return UsersFile(config.sasl_users_file or config.data_path / USERS_FILE_NAME).lookup


def acl_source(broker: Broker) -> Callable[[], tuple[object, bytes | None]]:
    """A blocking function giving (a stamp that changes with the ACLs, their bytes) for ``broker``."""
    store = broker.cluster.registry.user_acl_store()
    if store is not None:
        def from_zookeeper() -> tuple[object, bytes | None]:
            data, version = store.read_acls()
            return version, data

        return from_zookeeper
    config = broker.config
    acl_file = AclFile(config.acl_file or config.data_path / ACL_FILE_NAME)

    def from_file() -> tuple[object, bytes | None]:
        stamp = acl_file.stamp()
        return stamp, acl_file.read_bytes() if stamp is not None else None

    return from_file


def acl_source_name(broker: Broker) -> str:
    """Where ``broker``'s ACLs are stored, for messages."""
    if broker.cluster.mode == "zookeeper":
        return "the ACLs in ZooKeeper"
    return str(broker.config.acl_file or broker.config.data_path / ACL_FILE_NAME)


async def refresh_acls(broker: Broker) -> None:
    """Keep ``broker.acls`` in step with the stored ACLs (a background job when aclEnabled is set)."""
    source = acl_source(broker)
    seen: object = object()
    while True:
        try:
            stamp, data = await asyncio.to_thread(source)
            if stamp != seen:
                broker.acls = decode_acls(data, broker.config.super_users, source=acl_source_name(broker))
                log.info("ACLs loaded: %d entries, %d super-users", len(broker.acls.entries),
                         len(broker.acls.super_users))
                seen = stamp
        except (ConfigError, MetaqError, OSError) as exc:
            log.error("ACLs not reloaded, the ones in force stay: %s", exc)
        await asyncio.sleep(ACL_REFRESH_S)
