"""Can a principal get more than its byte-rate quota? Issue 39's quota attacks, measured (docs/benchmarks.md).

One broker with authRequired, aclEnabled and per-principal quotas: ``bob`` may read topic ``audit`` with a
fetch quota (``--fetch-quota``, default 50 KiB/s), ``alice`` may write ``orders`` with a produce quota
(``--produce-quota``, default 100 KiB/s), every principal may hold ``--connections`` connections (default 6).
Each attack runs ``--seconds`` and prints the bytes it got per second (KiB/s) and that figure over the quota:

- ``fetch-1``: bob fetches with 1 MiB ``max_bytes`` on one connection, honouring ``throttle_time_ms`` as
  metaq's clients do; ``fetch-5``: the same on 5 connections at once;
- ``http-fetch-8``: bob's 8 parallel HTTP fetches (1 MiB each);
- ``produce-4m``: alice's 4 MB batches on one connection; ``produce-4m-4``: on 4 connections;
  ``multi-produce``: alice's MultiProduce of 8 batches of 512 KiB;
- ``http-connections``: 12 of bob's long polls at once over HTTP (the connection quota is 6): how many were
  being served together.

A rate is counted up to the moment the principal may send again: the end of the last throttle the broker
told, and the answer to one last small request of the same principal (so a quota debt is not hidden by
stopping right after an oversized request). The same script runs
against another checkout with ``PYTHONPATH=/that/checkout/src``.

    PYTHONPATH=src .venv/bin/python scripts/bench_quotas.py --seconds 20
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.client.blocking import BlockingClient
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values

METAQ = str(Path(sys.executable).with_name("metaq"))
READERS = ("bob1", "bob2", "bob3")
"""One reader per fetch attack, so that no attack starts with the quota debt of the one before."""
WRITERS = ("alice1", "alice2", "alice3")
PASSWORDS = {name: f"{name} pw" for name in ("root", *READERS, *WRITERS)}
KIB = 1024


def cli(*args: str, password: str | None = None) -> None:
    env = {**os.environ, **({"METAQ_PASSWORD": password} if password else {})}
    subprocess.run([METAQ, *args], check=True, capture_output=True, env=env)


def settings(user: str) -> ConnectionSettings:
    return ConnectionSettings("bench-quotas", 30.0, 600.0, 16, 64 << 20, sasl_username=user,
                              sasl_password=PASSWORDS[user])


def one_call(address: tuple[str, int], user: str, request: object) -> None:
    conn = BlockingConnection.open(address, settings(user))
    try:
        conn.call(request)
    finally:
        conn.close()


class Meter:
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


def run_threads(count: int, seconds: float, body: Callable[[int, float, Meter], None],
                last: Callable[[], None] | None = None) -> float:
    """The bytes per second ``count`` threads of ``body`` got in ``seconds``, counted up to the moment the
    principal may send again: the end of the last throttle it was told, and the answer to ``last()``, one small
    request of the same principal (a broker that makes requests in debt wait answers it once the debt is paid)."""
    meter = Meter()
    start = time.monotonic()
    deadline = start + seconds
    with ThreadPoolExecutor(count) as pool:
        for f in [pool.submit(body, i, deadline, meter) for i in range(count)]:
            f.result()
    if last is not None:
        last()
    return meter.rate(start, time.monotonic())


def fetch_attack(address: tuple[str, int], user: str, connections: int, seconds: float) -> float:
    def body(i: int, deadline: float, meter: Meter) -> None:
        conn = BlockingConnection.open(address, settings(user))
        offset = 0
        try:
            while time.monotonic() < deadline:
                reply = conn.call(m.FetchRequest(topic="audit", partition=0, offset=offset, max_bytes=1 << 20))
                got = len(reply.records)
                meter.add(got, getattr(reply, "throttle_time_ms", 0))
                offset = 0 if not got or offset > 20_000 else offset + max(1, got // 1100)
        finally:
            conn.close()

    def last() -> None:
        one_call(address, user, m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1))

    return run_threads(connections, seconds, body, last)


def produce_attack(address: tuple[str, int], user: str, connections: int, seconds: float, batch_bytes: int,
                   multi: int = 0) -> float:
    values = [b"p" * 1000] * (batch_bytes // 1024)
    batch = encode_values(values, 1)

    def body(i: int, deadline: float, meter: Meter) -> None:
        conn = BlockingConnection.open(address, settings(user))
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
                assert not reply.error_code, reply.error_message
                meter.add(sent, getattr(reply, "throttle_time_ms", 0))
        finally:
            conn.close()

    def last() -> None:
        one_call(address, user, m.ProduceRequest(topic="orders", partition=0, acks=1, records=encode_values([b"x"], 1)))

    return run_threads(connections, seconds, body, last)


def http_get(url: str, user: str, timeout_s: float = 120.0) -> tuple[int, bytes, dict[str, str]]:
    token = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def http_fetch_attack(http: str, address: tuple[str, int], user: str, parallel: int, seconds: float) -> float:
    def body(i: int, deadline: float, meter: Meter) -> None:
        offset = i * 1000
        while time.monotonic() < deadline:
            status, data, _ = http_get(f"{http}/topics/audit/partitions/0/messages?offset={offset}"
                                       f"&max_bytes={1 << 20}&format=base64", user)
            if status != 200:
                continue
            doc = json.loads(data)
            meter.add(sum(len(base64.b64decode(x["payload"])) for x in doc["messages"]), 0)
            offset = doc["next_offset"] if doc["next_offset"] < 20_000 else 0

    def last() -> None:
        one_call(address, user, m.FetchRequest(topic="audit", partition=0, offset=0, max_bytes=1))

    return run_threads(parallel, seconds, body, last)


def http_connections_attack(http: str, user: str, parallel: int) -> tuple[int, int]:
    """(requests served, requests refused) of ``parallel`` simultaneous 3 s long polls of one principal."""
    lock = threading.Lock()
    refused = [0]

    def one(i: int) -> None:
        status, _, _ = http_get(f"{http}/topics/audit/partitions/0/messages?offset=24000&max_wait_ms=3000", user)
        with lock:
            if status in (429, 503):
                refused[0] += 1

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(parallel)))
    return parallel - refused[0], refused[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--fetch-quota", type=int, default=50 * KIB)
    parser.add_argument("--produce-quota", type=int, default=100 * KIB)
    parser.add_argument("--connections", type=int, default=6)
    parser.add_argument("--only", action="append", help="run only these attacks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-quotas-") as tmp:
        data = Path(tmp) / "broker"
        where = ["--data-path", str(data)]
        for user, pw in PASSWORDS.items():
            cli("acl", "user", "add", user, *where, password=pw)
        for user in READERS:
            cli("acl", "add", "--principal", f"User:{user}", "--topic", "audit", "-o", "consume", *where)
        for user in WRITERS:
            cli("acl", "add", "--principal", f"User:{user}", "--topic", "orders", "-o", "produce", *where)
        options = {"authRequired": True, "aclEnabled": True, "superUsers": "User:root", "numPartitions": 1,
                   "unflushThreshold": 0, "httpPort": 0, "httpBasicAuthOverPlaintext": True,
                   "quotaMaxConnections": args.connections, "quotaConsumerByteRate": args.fetch_quota,
                   "quotaProducerByteRate": args.produce_quota,
                   "quotaOverrides": "User:root=produce:0,fetch:0,connections:0"}
        with BrokerLauncher(data, options) as broker:
            address = (broker.host, broker.port)
            with BlockingClient(broker.servers, username="root", password=PASSWORDS["root"]) as root:
                root.request(m.CreateTopicRequest("audit", 1, []))
                root.request(m.CreateTopicRequest("orders", 1, []))
                for _ in range(24):  # ~24 MiB to read, 1 KiB messages
                    root.produce("audit", "0-0", encode_values([b"a" * 1000] * 1000, 1))
            attacks: dict[str, Callable[[], float]] = {
                "fetch-1": lambda: fetch_attack(address, "bob1", 1, args.seconds),
                "fetch-5": lambda: fetch_attack(address, "bob2", 5, args.seconds),
                "http-fetch-8": lambda: http_fetch_attack(str(broker.http_url), address, "bob3", 8, args.seconds),
                "produce-4m": lambda: produce_attack(address, "alice1", 1, args.seconds, 4_000_000),
                "produce-4m-4": lambda: produce_attack(address, "alice2", 4, args.seconds, 4_000_000),
                "multi-produce": lambda: produce_attack(address, "alice3", 1, args.seconds, 512 * KIB, multi=8),
            }
            for name, attack in attacks.items():
                if args.only and name not in args.only:
                    continue
                quota = args.fetch_quota if "fetch" in name else args.produce_quota
                rate = attack()
                print(f"{name:15s} {rate / KIB:9.1f} KiB/s  {rate / quota:5.2f} x the quota of {quota // KIB} KiB/s",
                      flush=True)
            if not args.only or "http-connections" in args.only:
                served, refused = http_connections_attack(str(broker.http_url), "bob1", 2 * args.connections)
                print(f"http-connections {served} of {2 * args.connections} concurrent requests served, {refused} "
                      f"refused (quotaMaxConnections={args.connections})", flush=True)


if __name__ == "__main__":
    main()
