"""The HTTP layer's pure parts: the status of every wire error, the OpenAPI description against the
application's real router, and the JSON codecs (what a produce body may hold, how messages are written)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from metaq.broker.core import Broker
from metaq.broker.handlers import REQUEST_HANDLERS
from metaq.broker.ini import load_broker_config
from metaq.errors import all_error_classes
from metaq.http.codecs import message_from_raw, message_to_json, messages_from_json
from metaq.http.errors import STATUS_BY_CODE, HttpInputError
from metaq.http.listener import body_bytes_max, make_app
from metaq.http.openapi import openapi_document
from metaq.types import Message


def test_every_wire_error_has_an_http_status_and_retriable_ones_are_not_4xx_client_mistakes() -> None:
    for cls in all_error_classes():
        assert cls.code in STATUS_BY_CODE, cls.name
        status = STATUS_BY_CODE[cls.code]
        assert 400 <= status < 600
        if cls.retriable:
            assert status in (409, 429, 503, 507), (cls.name, status)
    assert STATUS_BY_CODE[3] == STATUS_BY_CODE[4] == 404  # unknown topic / partition
    assert STATUS_BY_CODE[10] == 413 and STATUS_BY_CODE[42] == 400 and STATUS_BY_CODE[503] == 503


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    return Broker(load_broker_config(None, {"dataPath": str(tmp_path / "data"), "maxBatchSize": "1m"}),
                  REQUEST_HANDLERS)


def test_openapi_describes_exactly_the_routes_the_application_serves(broker: Broker) -> None:
    app = make_app(broker)
    served = {(route.method.lower(), route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD" and route.resource is not None}
    doc = openapi_document(broker)
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert served == described
    for path, ops in doc["paths"].items():
        for op in ops.values():
            named = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert named == {part[1:-1] for part in path.split("/") if part.startswith("{")}, path
    refs = {ref for ref in _refs(doc)}
    assert refs <= {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref"] + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_body_limit_leaves_room_for_a_whole_batch_in_base64(broker: Broker) -> None:
    assert body_bytes_max(broker) >= broker.config.max_batch_bytes * 4 // 3


def test_a_single_message_body_and_a_batch() -> None:
    [one], partition = messages_from_json({"payload": "hi", "key": "k", "headers": {"a": "b"}, "partition": 2})
    assert (one.payload, one.key, one.headers, partition) == (b"hi", b"k", [("a", b"b")], 2)
    batch, partition = messages_from_json({"encoding": "base64", "messages": [
        {"payload": base64.b64encode(b"\xff").decode()},
        {"payload": "plain", "encoding": "text", "headers": [["h", "v"], ["h", "w"]]}]})
    assert [m.payload for m in batch] == [b"\xff", b"plain"] and partition is None
    assert batch[1].headers == [("h", b"v"), ("h", b"w")]


@pytest.mark.parametrize("body", [None, 3, "x", [], {"messages": {}}, {"messages": [3]}, {"payload": None},
                                  {"payload": "\ud800"}, {"payload": "x", "timestamp_ms": -5},
                                  {"payload": "x", "headers": [["only-name"]]}, {"payload": "x", "key": 1},
                                  {"messages": [{"payload": "x"}], "extra": 1}])
def test_malformed_bodies_are_refused_with_a_message(body: object) -> None:
    with pytest.raises(HttpInputError) as info:
        messages_from_json(body)
    assert info.value.status == 400 and info.value.message


def test_raw_body_takes_key_attribute_and_headers_from_the_request() -> None:
    msg = message_from_raw(b"\x00", {"key": "k"}, {"X-Metaq-Attribute": "a", "X-Metaq-Header-Trace": "t",
                                                   "Content-Type": "application/octet-stream"})
    assert (msg.payload, msg.key, msg.attribute, msg.headers) == (b"\x00", b"k", "a", [("Trace", b"t")])


def test_messages_are_written_as_text_unless_a_byte_is_not_utf8() -> None:
    text = message_to_json(Message("t", b"caf\xc3\xa9", key=b"k", headers=[("h", b"v")], offset=3, id=7), "text")
    assert (text["encoding"], text["payload"], text["key"], text["headers"]) == ("text", "café", "k", [["h", "v"]])
    mixed = message_to_json(Message("t", b"ok", headers=[("h", b"\xff")]), "text")
    assert mixed["encoding"] == "base64" and base64.b64decode(mixed["payload"]) == b"ok"
    assert base64.b64decode(mixed["headers"][0][1]) == b"\xff"
    assert message_to_json(Message("t", b"x"), "base64")["payload"] == "eA=="
