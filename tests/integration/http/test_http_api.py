"""The HTTP API (docs/http.md) against a real broker process with httpPort 0.

What a user of curl or of another language relies on: every endpoint's happy path (replies checked
against the served OpenAPI description), messages crossing between HTTP and the binary protocol with
their bytes, key, attribute and headers intact, long polls woken by an append, group offsets, and bad
input on every endpoint answered with a 4xx and a message that says what was wrong, the broker serving on.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_client import Reply, check_reply, request, schema_errors

from metaq.client import connect
from metaq.http.routes import ROUTES
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.ports import start_broker_on_a_taken_port
from metaq.testing.raw import RawClient
from metaq.types import Message

MAX_MESSAGE_BYTES = 64 * 1024
MAX_BATCH_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def http_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("http")) / "broker",
                         {"httpPort": 0, "numPartitions": 2, "unflushThreshold": 0,
                          "maxMessageSize": MAX_MESSAGE_BYTES, "maxBatchSize": MAX_BATCH_BYTES})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop_or_kill(15)


@pytest.fixture(scope="module")
def base(http_broker: BrokerProcess) -> str:
    assert http_broker.http_url is not None, http_broker.output()
    url = http_broker.http_url
    # topic h-json (2 partitions) exists for every test, whichever runs alone: one message in partition 0
    assert request(url, "POST", "/topics/h-json/partitions/0/messages", {"payload": "first"}).status == 200
    return url


@pytest.fixture(scope="module")
def doc(base: str) -> dict[str, Any]:
    reply = request(base, "GET", "/openapi.json")
    assert reply.status == 200
    return reply.json  # type: ignore[no-any-return]


def ok(reply: Reply, status: int = 200) -> Any:
    assert reply.status == status, reply
    return reply.json


def test_produce_json_and_fetch_back(base: str, doc: dict[str, Any]) -> None:
    reply = request(base, "POST", "/topics/h-json/partitions/1/messages",
                    {"payload": "héllo", "key": "k1", "attribute": "tag", "headers": {"trace": "abc"}})
    check_reply(doc, "POST", "/topics/{topic}/partitions/{partition}/messages", reply)
    sent = ok(reply)
    assert (sent["partition"], sent["partition_id"], sent["offset"], sent["count"]) == (1, "0-1", 0, 1)

    reply = request(base, "GET", "/topics/h-json/partitions/1/messages?offset=0")
    check_reply(doc, "GET", "/topics/{topic}/partitions/{partition}/messages", reply)
    got = ok(reply)
    assert got["next_offset"] == 1 and got["log_end_offset"] == 1
    [msg] = got["messages"]
    assert (msg["payload"], msg["key"], msg["attribute"], msg["headers"]) == ("héllo", "k1", "tag", [["trace", "abc"]])
    assert msg["id"] == sent["id"] and msg["encoding"] == "text"


def test_produce_batch_lands_in_one_partition_with_consecutive_offsets(base: str, doc: dict[str, Any]) -> None:
    batch = {"messages": [{"payload": f"m{i}"} for i in range(50)]}
    reply = request(base, "POST", "/topics/h-batch/messages", batch)
    check_reply(doc, "POST", "/topics/{topic}/messages", reply)
    sent = ok(reply)
    assert sent["count"] == 50 and [r["offset"] for r in sent["messages"]] == list(range(50))
    got = ok(request(base, "GET", f"/topics/h-batch/partitions/{sent['partition']}/messages?offset=10&max_messages=5"))
    assert [msg["payload"] for msg in got["messages"]] == ["m10", "m11", "m12", "m13", "m14"]
    assert got["next_offset"] == 15


def test_raw_body_with_key_attribute_and_headers(base: str) -> None:
    payload = bytes(range(256))
    sent = ok(request(base, "POST", "/topics/h-raw/partitions/0/messages?key=rk", raw=payload,
                      content_type="application/octet-stream",
                      headers={"X-Metaq-Attribute": "at", "X-Metaq-Header-Origin": "curl"}))
    got = ok(request(base, "GET", f"/topics/h-raw/partitions/0/messages?offset={sent['offset']}&format=text"))
    [msg] = got["messages"]
    assert msg["encoding"] == "base64"  # not UTF-8: written base64 even under format=text
    assert base64.b64decode(msg["payload"]) == payload
    assert base64.b64decode(msg["key"]) == b"rk" and msg["attribute"] == "at"
    assert [[n.lower(), base64.b64decode(v)] for n, v in msg["headers"]] == [["origin", b"curl"]]


def test_http_to_binary_and_back(http_broker: BrokerProcess, base: str) -> None:
    payload = b"\x00\xffbinary\x80"
    sent = ok(request(base, "POST", "/topics/h-cross/partitions/0/messages",
                      {"payload": base64.b64encode(payload).decode(), "encoding": "base64",
                       "key": base64.b64encode(b"\x01key").decode(), "attribute": "a1",
                       "headers": [["h1", base64.b64encode(b"\x02v").decode()], ["h1", "dg=="]]}))
    with connect(http_broker.servers) as session:
        with session.create_pull_consumer() as consumer:
            [msg] = consumer.get("h-cross", 0, sent["offset"])
        assert (bytes(msg.data), msg.key, msg.attribute) == (payload, b"\x01key", "a1")
        assert msg.headers == [("h1", b"\x02v"), ("h1", b"v")]
        assert f"{msg.id:032x}" == sent["id"]

        with session.create_producer() as producer:
            result = producer.send(Message("h-cross", b"\xfe\x00from binary", attribute="a2", key=b"bk",
                                           headers=[("x", b"\xff"), ("y", b"text")]))
    got = ok(request(base, "GET", f"/topics/h-cross/partitions/{result.partition}/messages"
                                  f"?offset={result.offset}&format=base64&max_messages=1"))
    [msg_json] = got["messages"]
    assert base64.b64decode(msg_json["payload"]) == b"\xfe\x00from binary"
    assert base64.b64decode(msg_json["key"]) == b"bk" and msg_json["attribute"] == "a2"
    assert [(n, base64.b64decode(v)) for n, v in msg_json["headers"]] == [("x", b"\xff"), ("y", b"text")]
    assert msg_json["id"] == f"{result.message_id:032x}"


def test_long_poll_wakes_when_a_message_arrives(http_broker: BrokerProcess, base: str) -> None:
    end = ok(request(base, "GET", "/topics/h-json/partitions/0/offsets"))["offset"]
    replies: list[Reply] = []
    poll = threading.Thread(target=lambda: replies.append(request(
        base, "GET", f"/topics/h-json/partitions/0/messages?offset={end}&max_wait_ms=120000", timeout_s=150)))
    poll.start()
    raw = RawClient.to(http_broker)
    try:
        wait_until(lambda: json.loads(raw.call(m.StatsRequest(None)).stats_json)["waiting_fetches"] >= 1,
                   message="the HTTP long poll to wait")
        reply = raw.call(m.ProduceRequest("h-json", 0, 1, 5000, encode_values([b"wake up"], 1)))  # binary
        assert reply.error_code == 0, reply.error_message
    finally:
        raw.close()
    poll.join(150)
    [got] = replies
    assert [msg["payload"] for msg in ok(got)["messages"]] == ["wake up"]


def test_offsets_and_topic_metadata(base: str, doc: dict[str, Any]) -> None:
    ok(request(base, "POST", "/topics/h-meta/partitions/0/messages",
               {"messages": [{"payload": "a"}, {"payload": "b"}]}))
    for when, expected in (("earliest", 0), ("latest", 2), ("0", 0)):
        reply = request(base, "GET", f"/topics/h-meta/partitions/0/offsets?time={when}")
        check_reply(doc, "GET", "/topics/{topic}/partitions/{partition}/offsets", reply)
        assert ok(reply)["offset"] == expected
    reply = request(base, "GET", "/topics/h-meta")
    check_reply(doc, "GET", "/topics/{topic}", reply)
    parts = ok(reply)["partitions"]
    assert [(p["partition_id"], p["log_end_offset"]) for p in parts] == [("0-0", 2), ("0-1", 0)]
    reply = request(base, "GET", "/topics")
    check_reply(doc, "GET", "/topics", reply)
    assert "h-meta" in [t["name"] for t in ok(reply)["topics"]]


def test_lookup_by_message_id(base: str, doc: dict[str, Any]) -> None:
    sent = ok(request(base, "POST", "/topics/h-lookup/messages", {"payload": "find me"}))
    reply = request(base, "GET", f"/messages/{sent['id']}")
    check_reply(doc, "GET", "/messages/{message_id}", reply)
    found = ok(reply)
    assert (found["topic"], found["partition"], found["offset"]) == ("h-lookup", sent["partition"], sent["offset"])
    assert found["message"]["payload"] == "find me"
    missing = request(base, "GET", "/messages/" + "0" * 31 + "1")
    assert missing.status == 404 and missing.json["error"]["name"] == "MESSAGE_NOT_FOUND"


def test_group_commit_and_resume(base: str, doc: dict[str, Any]) -> None:
    ok(request(base, "POST", "/topics/h-group/partitions/0/messages",
               {"messages": [{"payload": str(i)} for i in range(5)]}))
    first = ok(request(base, "GET", "/topics/h-group/partitions/0/messages?group=g1&max_messages=2"))
    assert [msg["payload"] for msg in first["messages"]] == ["0", "1"] and first["group"] == "g1"
    reply = request(base, "POST", "/groups/g1/offsets",
                    {"offsets": [{"topic": "h-group", "partition": 0, "offset": first["next_offset"]}]})
    check_reply(doc, "POST", "/groups/{group}/offsets", reply)
    reply = request(base, "GET", "/groups/g1/offsets?topic=h-group")
    check_reply(doc, "GET", "/groups/{group}/offsets", reply)
    assert [(o["partition_id"], o["offset"]) for o in ok(reply)["offsets"]] == [("0-0", 2)]
    resumed = ok(request(base, "GET", "/topics/h-group/partitions/0/messages?group=g1"))
    assert [msg["payload"] for msg in resumed["messages"]] == ["2", "3", "4"]
    latest = ok(request(base, "GET", "/topics/h-group/partitions/0/messages?group=never-committed&reset=latest"))
    assert latest["offset"] == 5 and latest["messages"] == []
    reply = request(base, "GET", "/groups")
    check_reply(doc, "GET", "/groups", reply)
    assert "g1" in ok(reply)["groups"]


def test_group_membership(base: str, doc: dict[str, Any]) -> None:
    ok(request(base, "POST", "/topics/h-members/messages", {"payload": "x"}))
    reply = request(base, "POST", "/groups/gm/members", {"topics": ["h-members"], "session_timeout_ms": 30000})
    check_reply(doc, "POST", "/groups/{group}/members", reply)
    joined = ok(reply)
    member, generation = joined["member_id"], joined["generation"]
    [assigned] = joined["assignment"]
    assert assigned["topic"] == "h-members" and len(assigned["partitions"]) == 2
    reply = request(base, "POST", f"/groups/gm/members/{member}/heartbeat", {"generation": generation})
    check_reply(doc, "POST", "/groups/{group}/members/{member_id}/heartbeat", reply)
    ok(reply)
    commit = request(base, "POST", "/groups/gm/offsets", {"generation": generation, "member_id": member,
                                                           "offsets": [{"topic": "h-members", "partition": 1,
                                                                        "offset": 0}]})
    ok(commit)
    outside = request(base, "POST", "/groups/gm/offsets", {"offsets": [{"topic": "h-members", "partition": 1,
                                                                         "offset": 0}]})
    assert outside.status == 409 and outside.json["error"]["name"] == "ILLEGAL_GENERATION"
    assert outside.json["error"]["retriable"] is True
    reply = request(base, "GET", "/groups/gm")
    check_reply(doc, "GET", "/groups/{group}", reply)
    assert [mem["member_id"] for mem in ok(reply)["members"]] == [member]
    reply = request(base, "DELETE", f"/groups/gm/members/{member}")
    check_reply(doc, "DELETE", "/groups/{group}/members/{member_id}", reply)
    ok(reply)
    assert ok(request(base, "GET", "/groups/gm"))["members"] == []


def test_limits_are_the_binary_protocols(base: str) -> None:
    too_big = request(base, "POST", "/topics/h-limits/partitions/0/messages", raw=b"x" * (MAX_MESSAGE_BYTES + 1),
                      content_type="application/octet-stream")
    assert too_big.status == 413 and too_big.json["error"]["name"] == "MESSAGE_TOO_LARGE"
    assert str(MAX_MESSAGE_BYTES) in too_big.json["error"]["message"]
    batch = {"messages": [{"payload": "y" * 60_000} for _ in range(6)]}  # each fits, the batch does not
    over = request(base, "POST", "/topics/h-limits/partitions/0/messages", batch)
    assert over.status == 413 and str(MAX_BATCH_BYTES) in over.json["error"]["message"]
    huge = request(base, "POST", "/topics/h-limits/messages", raw=b"z" * (2 * 1024 * 1024),
                   content_type="application/octet-stream")
    assert huge.status == 413 and huge.json["error"]["name"] == "MESSAGE_TOO_LARGE"


JSON = "application/json"
BAD_INPUT: list[tuple[str, str, dict[str, Any], int, str]] = [
    # (method, path, request kwargs, status, words the message must contain)
    ("POST", "/topics/bad/messages", {"raw": b'{"payload": ', "content_type": JSON}, 400, "not valid JSON"),
    ("POST", "/topics/bad/messages", {"raw": b"\xff\xfe", "content_type": JSON}, 400, "not valid JSON"),
    ("POST", "/topics/bad/messages", {"raw": b"[" * 100_000, "content_type": JSON}, 400, "JSON"),
    ("POST", "/topics/bad/messages", {"raw": b"hello", "content_type": "text/plain"}, 415, "Content-Type"),
    ("POST", "/topics/bad/messages", {"body": [1, 2]}, 400, "JSON object"),
    ("POST", "/topics/bad/messages", {"body": {"payload": 5}}, 400, "payload must be a string"),
    ("POST", "/topics/bad/messages", {"body": {"payload": "x", "encoding": "rot13"}}, 400, "encoding"),
    ("POST", "/topics/bad/messages", {"body": {"payload": "!!", "encoding": "base64"}}, 400, "base64"),
    ("POST", "/topics/bad/messages", {"body": {"payload": "x", "colour": "red"}}, 400, "colour"),
    ("POST", "/topics/bad/messages", {"body": {"messages": []}}, 400, "non-empty"),
    ("POST", "/topics/bad/messages", {"body": {"payload": "x", "headers": "h"}}, 400, "headers"),
    ("POST", "/topics/bad/messages", {"body": {"payload": "x", "attribute": "a" * 40_000}}, 400, "attribute"),
    ("POST", "/topics/bad/messages?partition=x", {"body": {"payload": "x"}}, 400, "partition"),
    ("POST", "/topics/bad/messages?partition=-7", {"body": {"payload": "x"}}, 400, "partition"),
    ("POST", "/topics/..%2Fetc/messages", {"body": {"payload": "x"}}, 400, "topic name"),
    ("POST", "/topics/a%00b/messages", {"body": {"payload": "x"}}, 400, "topic name"),
    ("POST", "/topics/" + "t" * 300 + "/messages", {"body": {"payload": "x"}}, 400, "at most 249"),
    ("POST", "/topics/h-json/partitions/99/messages", {"body": {"payload": "x"}}, 404, "partitions 0..1"),
    ("POST", "/topics/h-json/partitions/zero/messages", {"body": {"payload": "x"}}, 400, "partition"),
    ("GET", "/topics/h-json/partitions/0/messages", {}, 400, "offset is required"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=-1", {}, 400, "offset"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=1e9", {}, 400, "offset"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=999999", {}, 416, "out of range"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=0&max_wait_ms=99999999", {}, 400, "max_wait_ms"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=0&format=hex", {}, 400, "format"),
    ("GET", "/topics/h-json/partitions/0/messages?offset=0&group=../g", {}, 400, "group"),
    ("GET", "/topics/no-such/partitions/0/messages?offset=0", {}, 404, "does not exist"),
    ("GET", "/topics/h-json/partitions/7/messages?offset=0", {}, 404, "partitions 0..1"),
    ("GET", "/topics/no-such", {}, 404, "does not exist"),
    ("GET", "/topics/bad$name", {}, 400, "topic name"),
    ("GET", "/topics/h-json/partitions/0/offsets?time=yesterday", {}, 400, "time"),
    ("GET", "/topics/h-json/partitions/9/offsets", {}, 404, "partition"),
    ("GET", "/messages/not-hex", {}, 400, "hexadecimal"),
    ("GET", "/messages/" + "f" * 40, {}, 400, "128-bit"),
    ("GET", "/groups/g%20h", {}, 400, "group name"),
    ("GET", "/groups/..%2F/offsets", {}, 400, "group name"),
    ("POST", "/groups/g1/offsets", {"body": {"offsets": "all"}}, 400, "offsets"),
    ("POST", "/groups/g1/offsets", {"body": {"offsets": [{"topic": "h-group", "partition": 0, "offset": "x"}]}},
     400, "offset must be an integer"),
    ("POST", "/groups/g1/offsets", {"body": {"offsets": [{"topic": "../x", "partition": 0, "offset": 1}]}},
     400, "topic name"),
    ("POST", "/groups/g1/offsets", {"raw": b"offsets=1", "content_type": "application/x-www-form-urlencoded"},
     415, "Content-Type"),
    ("POST", "/groups/g1/members", {"body": {"topics": []}}, 400, "topics"),
    ("POST", "/groups/g1/members", {"body": {"topics": ["h-json"], "strategy": "coin"}}, 400, "strategy"),
    ("POST", "/groups/g1/members/nobody/heartbeat", {"body": {"generation": "one"}}, 400, "generation"),
    ("POST", "/groups/g1/members/nobody/heartbeat", {"body": {"generation": 3}}, 409, "nobody"),
    ("DELETE", "/groups/g1/members/nobody", {}, 409, "nobody"),
    ("PUT", "/topics", {}, 405, "allowed: GET"),
    ("GET", "/nothing/here", {}, 404, "no endpoint"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "words"), BAD_INPUT,
                         ids=[f"{b[0]} {b[1][:40]} {b[3]}" for b in BAD_INPUT])
def test_bad_input_gets_a_clear_4xx(base: str, doc: dict[str, Any], method: str, path: str, kwargs: dict[str, Any],
                                    status: int, words: str) -> None:
    reply = request(base, method, path, **kwargs)
    assert reply.status == status, reply
    error = reply.json["error"]
    assert error["status"] == status and words.lower() in error["message"].lower(), error
    assert not schema_errors(doc, {"$ref": "#/components/schemas/Error"}, reply.json)
    assert ok(request(base, "GET", "/topics"))["brokers"], "the broker keeps serving"


def test_openapi_describes_every_route_and_each_is_served(base: str, doc: dict[str, Any]) -> None:
    served = {(method.lower(), path) for method, path, _ in ROUTES} | {("get", "/openapi.json")}
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert described == served
    for method, path in described:  # nothing described answers "no such endpoint" or "method not allowed"
        concrete = path.replace("{topic}", "h-json").replace("{partition}", "0").replace("{group}", "g1") \
            .replace("{member_id}", "nobody").replace("{message_id}", "0" * 32)
        reply = request(base, method.upper(), concrete, raw=b"{}", content_type="application/json")
        assert reply.status not in (404, 405) or reply.json["error"]["name"] not in (
            "NO_SUCH_ENDPOINT", "METHOD_NOT_ALLOWED"), (method, path, reply)


def test_http_port_in_use_is_one_line_before_the_data_directory_is_created(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port, result = start_broker_on_a_taken_port(data, "httpPort")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"HTTP on 127.0.0.1:{port}" in line and "httpPort" in line
    assert not data.exists()


def test_off_by_default_and_a_stop_answers_waiting_long_polls(broker_factory: Any) -> None:
    plain = broker_factory({"numPartitions": 1})
    assert plain.http_url is None and not any("http" in line for line in plain.log_lines if "ready" in line)
    served = broker_factory({"httpPort": 0, "numPartitions": 1}, name="served")
    base = served.http_url
    ok(request(base, "POST", "/topics/stop/messages", {"payload": "x"}))
    replies: list[Reply] = []
    poll = threading.Thread(target=lambda: replies.append(request(
        base, "GET", "/topics/stop/partitions/0/messages?offset=1&max_wait_ms=120000", timeout_s=150)))
    poll.start()
    raw = RawClient.to(served)
    try:
        wait_until(lambda: json.loads(raw.call(m.StatsRequest(None)).stats_json)["waiting_fetches"] >= 1,
                   message="the HTTP long poll to wait")
    finally:
        raw.close()
    assert served.stop() == 0
    poll.join(150)
    [reply] = replies
    assert ok(reply)["messages"] == []  # answered by the drain, not left hanging until max_wait_ms


def test_a_client_that_hangs_up_gives_its_long_poll_slot_back(http_broker: BrokerProcess, base: str) -> None:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    raw = RawClient.to(http_broker)

    def waiting() -> int:
        return int(json.loads(raw.call(m.StatsRequest(None)).stats_json)["waiting_fetches"])

    try:
        before = waiting()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET /topics/h-json/partitions/1/messages?offset=999999999&max_wait_ms=600000 HTTP/1.1\r\n"
                         b"Host: x\r\n\r\n")
            sock.recv(1)  # 416: an offset past the end is refused at once, no slot taken
        end = ok(request(base, "GET", "/topics/h-json/partitions/1/offsets"))["offset"]
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"GET /topics/h-json/partitions/1/messages?offset={end}&max_wait_ms=600000 HTTP/1.1\r\n"
                         "Host: x\r\n\r\n".encode())
            wait_until(lambda: waiting() == before + 1, message="the long poll to wait")
        wait_until(lambda: waiting() == before, message="the slot to be given back when the client hung up")
    finally:
        raw.close()


def test_a_closed_partition_refuses_http_produce_as_binary_does(http_broker: BrokerProcess, base: str) -> None:
    ok(request(base, "POST", "/topics/h-closed/partitions/0/messages", {"payload": "before"}))
    raw = RawClient.to(http_broker)
    try:
        assert raw.call(m.PartitionStateRequest("h-closed", 0, False)).error_code == 0  # metaq topic close
        refused = request(base, "POST", "/topics/h-closed/partitions/0/messages", {"payload": "after"})
        assert refused.status == 403 and refused.json["error"]["name"] == "PARTITION_CLOSED"
        assert "closed" in refused.json["error"]["message"]
        other = ok(request(base, "POST", "/topics/h-closed/messages", {"payload": "elsewhere"}))
        assert other["partition"] == 1  # the broker's choice skips the closed partition
        got = ok(request(base, "GET", "/topics/h-closed/partitions/0/messages?offset=0"))
        assert [msg["payload"] for msg in got["messages"]] == ["before"]  # still readable
    finally:
        raw.close()


def test_the_404_docs_http_md_shows_is_the_one_the_broker_sends(base: str) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "http.md").read_text()
    example = doc.split("## Errors", 1)[1].split('    {"error"', 1)[1].split("\n\n", 1)[0]
    shown = json.loads('{"error"' + " ".join(line.strip() for line in example.splitlines()))
    reply = request(base, "GET", "/topics/nope/partitions/0/messages?offset=0")
    assert (reply.status, reply.json) == (404, shown)
    missing = request(base, "GET", "/no/such/path").json["error"]
    assert missing["name"] == "NO_SUCH_ENDPOINT" and "NO_SUCH_ENDPOINT` (no such path)" in doc
