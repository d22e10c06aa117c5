"""`metaq bench quotas`: can a principal get more than its byte-rate quota? Each attack measured against the quota
it meets.

One broker with authRequired, aclEnabled and per-principal quotas: readers may read topic ``audit`` under a fetch
quota (``fetch_quota`` bytes/s), writers may write ``orders`` under a produce quota (``produce_quota``), every
principal may hold ``connections`` connections. ``audit`` holds ``fill_mb`` times 1,000 messages of 1,000 bytes. Each
attack runs ``seconds`` as a principal of its own (so that none starts with the quota debt of the one before) and
gives the bytes it got per second, and that rate over the quota:

- ``fetch-1``: 1 MiB fetches on one connection, honouring ``throttle_time_ms`` as metaq's clients do; ``fetch-5``:
  the same on 5 connections at once;
- ``http-fetch-8``: 8 parallel HTTP fetches of 1 MiB;
- ``produce-4m``: 4 MB batches on one connection; ``produce-4m-4``: on 4 connections; ``multi-produce``:
  MultiProduce requests of 8 batches of 512 KiB;
- ``http-connections``: twice ``connections`` long polls of one principal at once over HTTP: how many were served
  together, how many refused.

A rate is counted up to the moment the principal may send again: the end of the last throttle the broker told, and
the answer to one last small request of the same principal (a quota debt is not hidden by stopping right after an
oversized request).
"""

from __future__ import annotations

import base64
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from metaq.bench.report import Report, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.client.blocking import BlockingClient
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.security.acl import ACL_FILE_NAME, AclEntry, AclFile
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import make_credential

READERS = {"fetch-1": "bob1", "fetch-5": "bob2", "http-fetch-8": "bob3", "http-connections": "bob1"}
WRITERS = {"produce-4m": "alice1", "produce-4m-4": "alice2", "multi-produce": "alice3"}
PASSWORDS = {name: f"{name} pw" for name in ("root", *READERS.values(), *WRITERS.values())}
KIB = 1024


def _settings(user: str) -> ConnectionSettings:
    return ConnectionSettings("bench-quotas", 30.0, 600.0, 16, 64 << 20, sasl_username=user,
                              sasl_password=PASSWORDS[user])


def _one_call(address: tuple[str, int], user: str, request: object) -> None:
    conn = BlockingConnection.open(address, _settings(user))
    try:
        conn.call(request)
    finally:
        conn.close()


class _Meter:
    """Bytes served to an attacker and the last moment it may send again (the end of its last throttle)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bytes = 0
        self.free_at = 0.0

    def add(self, nbytes: int, throttle_ms: int) -> None:
        with self.lock:
            self.bytes += nbytes
            self.free_at = max(self.free_at, time.monotonic() + throttle_ms / 1000)

    def rate(self, start: float, end: float) -> float:
        return self.bytes / (max(end, self.free_at) - start)


def _run_threads(count: int, seconds: float, body: Callable[[int, float, _Meter], None],
                 last: Callable[[], None]) -> float:
    """The bytes per second ``count`` threads of ``body`` got in ``seconds``, counted up to the moment the principal
    may send again: the end of the last throttle it was told, and the answer to ``last()``, one small request of the
    same principal (a broker that makes requests in debt wait answers it once the debt is paid)."""
    meter = _Meter()
    start = time.monotonic()
    deadline = start + seconds
    with ThreadPoolExecutor(count) as pool:
        for f in [pool.submit(body, i, deadline, meter) for i in range(count)]:
            f.result()
    last()
    return meter.rate(start, time.monotonic())


class _Attacks:
    """The attacks on one broker whose ``audit`` topic holds ``messages`` messages."""

    def __init__(self, broker: BrokerLauncher, messages: int, seconds: float) -> None:
        self.address = (broker.host, broker.port)
        self.http = str(broker.http_url)
        self.messages = messages
        self.wrap = messages * 5 // 6
        """Readers start again from offset 0 past this one: every read finds data."""
        self.seconds = seconds

    def fetch(self, user: str, connections: int) -> float:
        def body(i: int, deadline: float, meter: _Meter) -> None:
            conn = BlockingConnection.open(self.address, _settings(user))
            offset = 0
            try:
                while time.monotonic() < deadline:
                    reply = conn.call(m.FetchRequest(topic="audit", partition=0, offset=offset, max_bytes=1 << 20))
                    got = len(reply.records)
                    meter.add(got, getattr(reply, "throttle_time_ms", 0))
                    offset = 0 if not got or offset > self.wrap else offset + max(1, got // 1100)
            finally:
                conn.close()

        return _run_threads(connections, self.seconds, body, lambda: _one_call(
            self.address, user, m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1)))

    def produce(self, user: str, connections: int, batch_bytes: int, multi: int = 0) -> float:
        batch = encode_values([b"p" * 1000] * (batch_bytes // 1024), 1)

        def body(i: int, deadline: float, meter: _Meter) -> None:
            conn = BlockingConnection.open(self.address, _settings(user))
            try:
                while time.monotonic() < deadline:
                    if multi:
                        req: object = m.MultiProduceRequest(acks=1, timeout_ms=30_000, partitions=[
                            m.ProducePartition("orders", 0, batch) for _ in range(multi)])
                        sent = len(batch) * multi
                    else:
                        req = m.ProduceRequest(topic="orders", partition=0, acks=1, records=batch)
                        sent = len(batch)
                    reply = conn.call(req)
                    if reply.error_code:
                        raise RuntimeError(f"{user}'s produce refused: {reply.error_message}")
                    meter.add(sent, getattr(reply, "throttle_time_ms", 0))
            finally:
                conn.close()

        small = m.ProduceRequest(topic="orders", partition=0, acks=1, records=encode_values([b"x"], 1))
        return _run_threads(connections, self.seconds, body, lambda: _one_call(self.address, user, small))

    def _get(self, path: str, user: str, timeout_s: float = 120.0) -> tuple[int, bytes]:
        token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
        req = urllib.request.Request(self.http + path, headers={"Authorization": f"Basic {token}"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def http_fetch(self, user: str, parallel: int) -> float:
        def body(i: int, deadline: float, meter: _Meter) -> None:
            offset = i * self.messages // 24
            while time.monotonic() < deadline:
                status, data = self._get(f"/topics/audit/partitions/0/messages?offset={offset}&max_bytes={1 << 20}"
                                         "&format=base64", user)
                if status != 200:
                    continue
                doc = json.loads(data)
                meter.add(sum(len(base64.b64decode(x["payload"])) for x in doc["messages"]), 0)
                offset = doc["next_offset"] if doc["next_offset"] < self.wrap else 0

        return _run_threads(parallel, self.seconds, body, lambda: _one_call(
            self.address, user, m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1)))

    def http_connections(self, user: str, parallel: int) -> tuple[int, int]:
        """(served, refused) of ``parallel`` simultaneous 3 s long polls of one principal at the end of ``audit``."""
        lock = threading.Lock()
        refused = [0]

        def one(i: int) -> None:
            status, _ = self._get(f"/topics/audit/partitions/0/messages?offset={self.messages}&max_wait_ms=3000", user)
            with lock:
                if status in (429, 503):
                    refused[0] += 1

        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, range(parallel)))
        return parallel - refused[0], refused[0]


def _prepare(data: Path) -> None:
    users = UsersFile(data / USERS_FILE_NAME)
    for user, password in PASSWORDS.items():
        users.put(user, make_credential(password))
    acls = AclFile(data / ACL_FILE_NAME)
    for user in set(READERS.values()):
        acls.update("add", AclEntry(f"User:{user}", "topic", "audit", "consume"))
    for user in WRITERS.values():
        acls.update("add", AclEntry(f"User:{user}", "topic", "orders", "produce"))


def run(seconds: float, fetch_quota: int, produce_quota: int, connections: int, fill_mb: int, attacks: list[str],
        report: Report, work_dir: str | None = None) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"seconds": seconds, "fetch_quota": fetch_quota, "produce_quota": produce_quota,
                              "connections": connections, "attacks": rows}
    with tempfile.TemporaryDirectory(prefix="metaq-bench-quotas-", dir=work_dir) as tmp:
        data = Path(tmp) / "broker"
        _prepare(data)
        options = {"authRequired": True, "aclEnabled": True, "superUsers": "User:root", "numPartitions": 1,
                   "unflushThreshold": 0, "httpPort": 0, "httpBasicAuthOverPlaintext": True,
                   "quotaMaxConnections": connections, "quotaConsumerByteRate": fetch_quota,
                   "quotaProducerByteRate": produce_quota,
                   "quotaOverrides": "User:root=produce:0,fetch:0,connections:0"}
        with BrokerLauncher(data, options) as broker:
            with BlockingClient(broker.servers, username="root", password=PASSWORDS["root"]) as root:
                root.request(m.CreateTopicRequest("audit", 1, []))
                root.request(m.CreateTopicRequest("orders", 1, []))
                for _ in range(fill_mb):
                    root.produce("audit", "0-0", encode_values([b"a" * 1000] * 1000, 1))
            on = _Attacks(broker, 1000 * fill_mb, seconds)
            runs: dict[str, Callable[[], float]] = {
                "fetch-1": lambda: on.fetch(READERS["fetch-1"], 1),
                "fetch-5": lambda: on.fetch(READERS["fetch-5"], 5),
                "http-fetch-8": lambda: on.http_fetch(READERS["http-fetch-8"], 8),
                "produce-4m": lambda: on.produce(WRITERS["produce-4m"], 1, 4_000_000),
                "produce-4m-4": lambda: on.produce(WRITERS["produce-4m-4"], 4, 4_000_000),
                "multi-produce": lambda: on.produce(WRITERS["multi-produce"], 1, 512 * KIB, multi=8),
            }
            for name in attacks:
                if name == "http-connections":
                    served, refused = on.http_connections(READERS[name], 2 * connections)
                    result["http_connections"] = {"parallel": 2 * connections, "served": served, "refused": refused}
                    report(f"{name}: {served} of {2 * connections} concurrent long polls served, {refused} refused "
                           f"(quotaMaxConnections={connections})")
                    continue
                quota = fetch_quota if "fetch" in name else produce_quota
                rate = runs[name]()
                rows.append({"attack": name, "quota_bytes_per_s": quota, "bytes_per_s": round(rate),
                             "times_quota": round(rate / quota, 3)})
                report(f"{name}: {rate / KIB:,.1f} KiB/s, {rate / quota:.2f} x the quota of {quota / KIB:g} KiB/s")
    return result


def table(result: dict[str, Any]) -> str:
    rows = [[row["attack"], f"{row['bytes_per_s'] / KIB:,.1f}", f"{row['quota_bytes_per_s'] / KIB:g}",
             f"{row['times_quota']:.2f}x"] for row in result["attacks"]]
    text = markdown_table(["attack", "KiB/s got", "quota KiB/s", "over the quota"], rows, right=[1, 2, 3])
    held = result.get("http_connections")
    if held:
        text += (f"\n\nhttp-connections: {held['served']} of {held['parallel']} concurrent long polls served, "
                 f"{held['refused']} refused (quotaMaxConnections={result['connections']})")
    return text
