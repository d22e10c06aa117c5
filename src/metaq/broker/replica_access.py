"""Who may fetch as a replica: a Fetch with ``replica_id >= 0`` is a slave copying its master's log.

Such a fetch is not counted against a quota, and in HA mode it is what the master's in-sync set and high
watermark are made of (:mod:`metaq.broker.replication.master`): a client that could send one would read
past its quota, and could keep a dead slave "in sync" (acks would then count a copy that does not exist,
and a failover to that slave would lose them). So a replica fetch is served as one only when both hold:

* the connection said at its handshake (ApiVersions v1, ``replica_id``) that it fetches as that replica;
* with ``authRequired``, it authenticated (SASL or its client certificate) as a replication principal:
  ``User:<replicationUser>`` or a super-user (``superUsers``), as Kafka lets only its brokers' principal
  (ClusterAction) fetch as a follower.

Anything else with a replica id is refused with CLUSTER_AUTHORIZATION_FAILED, and counted against the
sender's fetch quota as any consumer's fetch is. Without ``authRequired`` nothing proves who a connection
is: a connection that says so at its handshake is taken at its word (docs/security.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metaq.broker.session import Session
from metaq.errors import ClusterAuthorizationError
from metaq.protocol import messages as m
from metaq.security.principal import user_principal

if TYPE_CHECKING:
    from metaq.broker.config import BrokerConfig


def replication_principals(config: BrokerConfig) -> frozenset[str]:
    """The principals that may fetch as replicas when authentication is required."""
    principals = set(config.super_users)
    if config.replication_user:
        principals.add(user_principal(config.replication_user))
    return frozenset(principals)


def replica_fetch_refusal(config: BrokerConfig, request: m.FetchRequest, session: Session | None) -> Exception | None:
    """None when ``request`` (a Fetch with ``replica_id >= 0``) may be served as a replica's, else the error."""
    if session is None:  # in-process (tests, the broker's own calls): no connection to check
        return None
    if session.replica_id != request.replica_id:
        said = f"replica {session.replica_id}" if session.replica_id >= 0 else "no replica"
        return ClusterAuthorizationError(
            f"a replica fetch (replica_id={request.replica_id}) on a connection that said {said} at its handshake: "
            "only a slave's replica fetcher fetches as a replica; a consumer sends replica_id=-1")
    if not config.auth_required:
        return None
    if session.principal is not None and session.principal in replication_principals(config):
        return None
    who = session.principal or "an unauthenticated connection"
    return ClusterAuthorizationError(
        f"{who} may not fetch as replica {request.replica_id}: replica fetches are for the replication principal "
        "(replicationUser, or a super-user: superUsers)")
