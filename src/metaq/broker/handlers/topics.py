"""Topics and their configuration: Metadata, CreateTopic, DeleteTopic, PartitionState and Reload."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from metaq.broker.config import TopicConfig
from metaq.broker.core import check_topic_name
from metaq.broker.ini import parse_topic_options
from metaq.broker.session import Session
from metaq.cluster.metadata import registered_partitions
from metaq.errors import (
    InvalidArgument,
    InvalidRequestError,
    InvalidTopicError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from metaq.protocol import messages as m
from metaq.types import validate_topic
from metaq.wording import plural

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler


DEFAULT_PARTITIONS = -1
"""CreateTopic's num_partitions for "the broker's numPartitions"; any other value must be in range."""
PARTITIONS_PER_TOPIC_MAX = 10_000


def _topic_error_code(name: str) -> int:
    """INVALID_TOPIC for a name no topic can have, else UNKNOWN_TOPIC (per-topic codes in Metadata)."""
    try:
        validate_topic(name)
    except InvalidArgument:
        return InvalidTopicError.code
    return UnknownTopicError.code


def handle_metadata(broker: Broker, req: m.MetadataRequest, session: Session | None) -> m.MetadataResponse:
    """This broker's partitions from its own state (flags of closed partitions included), every other
    broker's from the cluster view (ZooKeeper mode): any broker answers for the whole cluster."""
    own_id = broker.config.broker_id
    snapshot = broker.cluster.snapshot()
    own_port = broker.port
    if session is not None and session.tls and broker.tls_port is not None:
        snapshot, own_port = snapshot.over_tls(), broker.tls_port  # a TLS client is sent to TLS ports only
    addresses = {b: e.master for b, e in snapshot.brokers.items() if e.master is not None and b != own_id}
    brokers = [m.BrokerInfo(own_id, broker.host, own_port)] + [
        m.BrokerInfo(b, address.host, address.port) for b, address in sorted(addresses.items())]
    if req.topics is None:
        names = sorted(set(broker.topics) | {t for t, e in snapshot.topics.items()
                                             if (set(e.publish) | set(e.subscribe)) & set(addresses)})
    else:
        names = req.topics
    out = []
    refused = []
    for name in names:
        parts = []
        state = broker.topics.get(name)
        if state is not None:
            s = state.settings
            parts = [m.PartitionInfo(p, own_id, 0, s.accept_publish and p not in state.closed, s.accept_subscribe)
                     for p in range(state.num_partitions)]
            if not s.accept_publish:  # the client's refusal then says what to change, not "metaq topic open"
                refused.append(m.PublishRefusal(name, own_id, broker.publish_refused(name)))
        parts += registered_partitions(snapshot.topics.get(name), addresses)
        if not parts:
            out.append(m.TopicInfo(name, _topic_error_code(name), []))
            continue
        out.append(m.TopicInfo(name, 0, parts))
    return m.MetadataResponse(brokers=brokers, topics=out, publish_refused=refused)


def handle_create_topic(broker: Broker, req: m.CreateTopicRequest, session: Session | None) -> Any:
    """The response; a coroutine of it when the request has configs (they are stored off the loop)."""
    topic = req.topic
    broker.refuse_writes_on_slave("CreateTopic (a slave creates the topics it learns of from its master)")
    check_topic_name(topic)
    if topic in broker.topics:
        raise TopicExistsError(f"topic {topic!r} already exists with "
                               f"{plural(broker.topics[topic].num_partitions, 'partition')}")
    if topic in broker.creating:
        raise TopicExistsError(f"topic {topic!r} is being created by another request")
    if req.num_partitions != DEFAULT_PARTITIONS and not 1 <= req.num_partitions <= PARTITIONS_PER_TOPIC_MAX:
        raise InvalidRequestError(
            f"num_partitions must be 1..{PARTITIONS_PER_TOPIC_MAX} or -1 (broker default); got {req.num_partitions}")
    if not req.configs:
        state = broker.ensure_topic(topic, req.num_partitions)
        return m.CreateTopicResponse(num_partitions=state.num_partitions)
    options = parse_topic_options(topic, [(e.key, e.value) for e in req.configs], filters=False)
    if options.num_partitions is not None and req.num_partitions not in (DEFAULT_PARTITIONS, options.num_partitions):
        raise InvalidRequestError(f"num_partitions {req.num_partitions} and configs numPartitions="
                                  f"{options.num_partitions} disagree; give one of them")
    count = (req.num_partitions if req.num_partitions != DEFAULT_PARTITIONS
             else options.num_partitions or broker.config.topic_settings(topic).num_partitions)
    broker.creating.add(topic)
    return _create_with_options(broker, dataclasses.replace(options, num_partitions=count))


async def _create_with_options(broker: Broker, options: TopicConfig) -> m.CreateTopicResponse:
    state = await broker.create_topic_with_options(options)
    return m.CreateTopicResponse(num_partitions=state.num_partitions)


def handle_delete_topic(broker: Broker, req: m.DeleteTopicRequest, session: Session | None) -> m.DeleteTopicResponse:
    broker.refuse_writes_on_slave("DeleteTopic")
    check_topic_name(req.topic)
    if req.topic not in broker.topics:
        raise UnknownTopicError(f"topic {req.topic!r} does not exist")
    broker.delete_topic(req.topic)
    return m.DeleteTopicResponse()


def handle_partition_state(broker: Broker, req: m.PartitionStateRequest, session: Session | None) -> Any:
    """A coroutine of the response: the change is stored in the data directory before it is answered."""
    check_topic_name(req.topic)
    state = broker.topics.get(req.topic)
    if state is None:
        raise UnknownTopicError(f"topic {req.topic!r} does not exist")
    if req.partition == -1:
        targets = list(range(state.num_partitions))
    elif 0 <= req.partition < state.num_partitions:
        targets = [req.partition]
    else:
        raise UnknownPartitionError(f"topic {req.topic!r} has no partition {req.partition}")
    if req.open and not state.settings.accept_publish:
        # opening would change nothing a producer sees: say what does instead of answering "opened"
        raise InvalidRequestError(f"{broker.publish_refused(req.topic)}. metaq topic open only reopens partitions "
                                  "closed with metaq topic close; nothing was changed")
    return _set_partitions_open(broker, req.topic, targets, req.open)


async def _set_partitions_open(broker: Broker, topic: str, partitions: list[int], open_: bool) -> Any:
    await broker.set_partitions_open(topic, partitions, open_)
    return m.PartitionStateResponse()


def handle_reload(broker: Broker, req: m.ReloadRequest, session: Session | None) -> m.ReloadResponse:
    reloaded = broker.reload_from_file()
    return m.ReloadResponse(changed_topics=reloaded.changed_topics, restart_required=reloaded.restart_required)


HANDLERS: dict[type, Handler] = {
    m.MetadataRequest: handle_metadata,
    m.CreateTopicRequest: handle_create_topic,
    m.DeleteTopicRequest: handle_delete_topic,
    m.PartitionStateRequest: handle_partition_state,
    m.ReloadRequest: handle_reload,
}
