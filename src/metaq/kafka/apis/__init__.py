"""Each Kafka API as requests to the broker core: translation only, one module per API family.

Every answer comes from :meth:`metaq.broker.core.Broker.handle` with the connection's
:class:`~metaq.broker.session.Session`, so authentication (authRequired), ACLs, quotas, limits, the produce
path (one append per batch, the idempotent producer's duplicate check, the flush policy, sync replication)
and the group coordinator are the core's: nothing here decides what the core would decide differently.
What is here: Kafka's shapes, the partition mapping (:class:`Layout`), record batch conversion
(:mod:`metaq.protocol.kafka.records`) and error codes (:mod:`metaq.kafka.errors`).

The handlers are coroutines ``(ctx, header, body) -> response body`` (a kio dataclass of the request's
API and version, built with :func:`metaq.protocol.kafka.codec.build`), or None for a produce with acks=0.

:mod:`.context` (the connection's :class:`Context`, a topic's :class:`Layout`), :mod:`.data` (Metadata,
Produce, Fetch, ListOffsets), :mod:`.groups` (the group coordinator's APIs and offsets), :mod:`.admin`
(ApiVersions, SASL, topics, configs, producer ids); :data:`HANDLERS` is the table of them by API key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from metaq.kafka.apis.admin import (
    api_versions,
    create_topics,
    delete_topics,
    describe_configs,
    init_producer_id,
    sasl_authenticate,
    sasl_handshake,
)
from metaq.kafka.apis.context import Advertised, Context, Layout, Peers
from metaq.kafka.apis.data import fetch, list_offsets, metadata, produce
from metaq.kafka.apis.groups import (
    describe_groups,
    find_coordinator,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    offset_commit,
    offset_fetch,
    sync_group,
)
from metaq.protocol.kafka.codec import RequestHeader

HANDLERS: dict[int, Callable[[Context, RequestHeader, Any], Awaitable[Any]]] = {
    0: produce, 1: fetch, 2: list_offsets, 3: metadata, 8: offset_commit, 9: offset_fetch, 10: find_coordinator,
    11: join_group, 12: heartbeat, 13: leave_group, 14: sync_group, 15: describe_groups, 16: list_groups,
    17: sasl_handshake, 18: api_versions, 19: create_topics, 20: delete_topics, 22: init_producer_id,
    32: describe_configs, 36: sasl_authenticate,
}


__all__ = ["HANDLERS", "Advertised", "Context", "Layout", "Peers"]
