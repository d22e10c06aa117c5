"""The broker's request handlers, in one registry keyed by request type.

Each module serves one subject and exports ``HANDLERS``, request dataclass -> handler; a handler is
``(broker, request, session) -> response`` (or a FileReply, or a coroutine of either) and raises
instead of building error responses (:mod:`metaq.broker.error_mapping` answers for it). A transport
never looks here: it calls :meth:`metaq.broker.core.Broker.handle`.

=================  ===========================================================================
module             requests
=================  ===========================================================================
produce            Produce, MultiProduce
fetch              Fetch, ListOffsets
topics             Metadata, CreateTopic, DeleteTopic, PartitionState, Reload
diagnostics        ApiVersions, Stats, LookupMessage, FindMessages, Verify
replication        Promote
transactions       Transaction (and Produce v1 into a transaction, called from produce)
sasl               SaslHandshake, SaslAuthenticate (SCRAM-SHA-256)
groups             JoinGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups,
                   DescribeGroup (the group coordinator)
=================  ===========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping

from metaq.broker.core import Handler
from metaq.broker.handlers import diagnostics, fetch, groups, produce, replication, sasl, topics, transactions
from metaq.protocol import messages as m

__all__ = ["REQUEST_HANDLERS"]


def _registry(*tables: Mapping[type, Handler]) -> dict[type, Handler]:
    registry: dict[type, Handler] = {}
    for table in tables:
        for request, handler in table.items():
            assert request not in registry, f"{request.__name__} has two handlers"
            assert any(spec.request is request for spec in m.APIS.values()), f"{request.__name__} is not a request"
            registry[request] = handler
    return registry


REQUEST_HANDLERS: Mapping[type, Handler] = _registry(
    produce.HANDLERS, fetch.HANDLERS, topics.HANDLERS, diagnostics.HANDLERS, groups.HANDLERS,
    replication.HANDLERS, sasl.HANDLERS, transactions.HANDLERS)
"""Every request this broker serves (all of :data:`metaq.protocol.messages.APIS`)."""
