"""The Kafka APIs around the data: the connection's handshake (ApiVersions, SaslHandshake,
SaslAuthenticate), topics (CreateTopics, DeleteTopics), configs (DescribeConfigs, read-only) and producer
ids (InitProducerId).
"""

from __future__ import annotations

import secrets
from typing import Any

from metaq.kafka.apis.context import Context, _response
from metaq.kafka.errors import (
    INVALID_REQUEST,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_VERSION,
    kafka_code,
)
from metaq.protocol import messages as m
from metaq.protocol.kafka.codec import RequestHeader, api_versions_body

PRODUCER_EPOCH_MAX = (1 << 15) - 1


# -- ApiVersions --------------------------------------------------------------------------------------------

async def api_versions(ctx: Context, header: RequestHeader, req: Any) -> Any:
    return api_versions_body(header.api_version)


# -- topics, configs, producer ids ---------------------------------------------------------------------

async def create_topics(ctx: Context, header: RequestHeader, req: Any) -> Any:
    out = []
    for t in req.topics:
        count = t.num_partitions if t.num_partitions > 0 else -1
        entry = {"name": t.name, "error_code": 0, "error_message": None, "num_partitions": count,
                 "replication_factor": 1, "configs": None}
        if req.validate_only:
            r = await ctx.core(m.MetadataRequest([t.name]))
            if r.topics and not r.topics[0].error_code:
                entry.update(error_code=TOPIC_ALREADY_EXISTS, error_message=f"topic {t.name!r} already exists")
        else:
            r = await ctx.core(m.CreateTopicRequest(t.name, count))
            entry.update(error_code=kafka_code(r.error_code), error_message=r.error_message,
                         num_partitions=r.num_partitions if not r.error_code else -1)
        out.append(entry)
    return _response(header, {"topics": out, "throttle_time": ctx.throttle_ms()})


async def delete_topics(ctx: Context, header: RequestHeader, req: Any) -> Any:
    out = []
    for name in req.topic_names:
        r = await ctx.core(m.DeleteTopicRequest(name))
        out.append({"name": name, "error_code": kafka_code(r.error_code), "error_message": r.error_message})
    return _response(header, {"responses": out, "throttle_time": ctx.throttle_ms()})


_TOPIC, _BROKER = 2, 4


async def describe_configs(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """What metaq has of Kafka's topic and broker configs (read-only): enough for admin clients' listings."""
    config = ctx.broker.config
    results = []
    for res in req.resources:
        entry: dict[str, Any] = {"error_code": 0, "error_message": None, "resource_type": res.resource_type,
                                 "resource_name": res.resource_name, "configs": []}
        if res.resource_type == _TOPIC:
            r = await ctx.core(m.MetadataRequest([res.resource_name]))
            code = r.error_code or (r.topics[0].error_code if r.topics else UNKNOWN_TOPIC_OR_PARTITION)
            if code:
                entry.update(error_code=kafka_code(code), error_message=f"no topic {res.resource_name!r}")
            else:
                s = config.topic_settings(res.resource_name)
                values = {"cleanup.policy": "delete", "max.message.bytes": str(config.max_message_bytes),
                          "metaq.deletePolicy": str(s.delete_policy), "num.partitions": str(s.num_partitions)}
                entry["configs"] = _config_entries(values, res.configuration_keys)
        elif res.resource_type == _BROKER:
            gate = await ctx.core(m.MetadataRequest([]))
            if gate.error_code:
                entry.update(error_code=kafka_code(gate.error_code), error_message=gate.error_message)
            else:
                values = {"broker.id": str(config.broker_id), "message.max.bytes": str(config.max_batch_bytes),
                          "auto.create.topics.enable": "true" if config.auto_create_topics else "false",
                          "num.partitions": str(config.num_partitions)}
                entry["configs"] = _config_entries(values, res.configuration_keys)
        else:
            entry.update(error_code=INVALID_REQUEST, error_message=f"resource type {res.resource_type} is not served")
        results.append(entry)
    return _response(header, {"results": results, "throttle_time": ctx.throttle_ms()})


def _config_entries(values: dict[str, str], keys: Any) -> list[dict[str, Any]]:
    return [{"name": k, "value": v, "read_only": True, "config_source": 5, "is_sensitive": False, "synonyms": [],
             "config_type": 2, "documentation": None}
            for k, v in sorted(values.items()) if keys is None or k in keys]


async def init_producer_id(ctx: Context, header: RequestHeader, req: Any) -> Any:
    """An idempotent producer's id: random 62 bits, as metaq's own producers draw theirs (no broker keeps a
    counter); the same id with the next epoch when the client asks to bump its epoch."""
    gate = await ctx.core(m.MetadataRequest([]))
    if gate.error_code:
        return _response(header, {"error_code": kafka_code(gate.error_code), "producer_id": -1, "producer_epoch": -1})
    if req.transactional_id is not None:
        return _response(header, {"error_code": UNSUPPORTED_VERSION, "producer_id": -1, "producer_epoch": -1})
    pid, epoch = getattr(req, "producer_id", -1), getattr(req, "producer_epoch", -1)
    if pid > 0 and 0 <= epoch < PRODUCER_EPOCH_MAX:
        return _response(header, {"error_code": 0, "producer_id": pid, "producer_epoch": epoch + 1})
    return _response(header, {"error_code": 0, "producer_id": secrets.randbits(62) + 1, "producer_epoch": 0,
                              "throttle_time": ctx.throttle_ms()})


# -- SASL ------------------------------------------------------------------------------------------------

async def sasl_handshake(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.SaslHandshakeRequest(req.mechanism))
    return _response(header, {"error_code": kafka_code(r.error_code), "mechanisms": r.mechanisms or ["SCRAM-SHA-256"]})


async def sasl_authenticate(ctx: Context, header: RequestHeader, req: Any) -> Any:
    r = await ctx.core(m.SaslAuthenticateRequest(req.auth_bytes))
    return _response(header, {"error_code": kafka_code(r.error_code), "error_message": r.error_message,
                              "auth_bytes": r.auth_bytes, "session_lifetime": 0})

