"""`metaq bench security-paths`: what the quota and audit paths cost a request, on and off in the same run.

Three brokers side by side, each with authRequired and aclEnabled (alice may produce to and consume ``t``; bob may do
nothing): **off** (no quota, no audit log: the baseline), **quotas** (produce and fetch byte rates far above what the
run sends, so that every request goes through the quota checks and none is throttled), **audit** (``auditLog=true``,
to a file). Rounds interleave the three; per round and broker, over one connection each: ``requests`` produces of
one 100-byte message (acked after the write, unflushThreshold=0), as many fetches of the partition's head, and as many
produces bob is refused (each one an audit line when the log is on). The figure is the median time of a request of
each kind, per round and broker.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from metaq.bench.report import Report, each, markdown_table, median
from metaq.broker.launcher import BrokerLauncher
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.security.acl import ACL_FILE_NAME, AclEntry, AclFile
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import make_credential

PASSWORD = "a password"
VARIANTS: dict[str, dict[str, Any]] = {
    "off": {},
    "quotas": {"quotaProducerByteRate": "1g", "quotaConsumerByteRate": "1g", "quotaMaxConnections": 100},
    "audit": {"auditLog": True},
}
KINDS = ("produce", "fetch", "refused")


def _prepare(data: Path) -> None:
    users = UsersFile(data / USERS_FILE_NAME)
    for user in ("alice", "bob"):
        users.put(user, make_credential(PASSWORD))
    acls = AclFile(data / ACL_FILE_NAME)
    for op in ("produce", "consume", "create"):
        acls.update("add", AclEntry("User:alice", "topic", "t", op))


def _connect(broker: BrokerLauncher, user: str) -> BlockingConnection:
    return BlockingConnection.open((broker.host, broker.port), ConnectionSettings(
        "bench-security-paths", 10.0, 30.0, 4, 64 << 20, sasl_username=user, sasl_password=PASSWORD))


def _median_us(conn: BlockingConnection, request: object, n: int) -> float:
    """The median time, µs, of ``n`` calls one after the other."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        conn.call(request)
        times.append((time.perf_counter() - started) * 1e6)
    return round(statistics.median(times), 1)


def run(requests: int, rounds: int, report: Report, work_dir: str | None = None) -> dict[str, Any]:
    us: dict[str, dict[str, list[float]]] = {v: {k: [] for k in KINDS} for v in VARIANTS}
    base = {"authRequired": True, "aclEnabled": True, "numPartitions": 1, "unflushThreshold": 0}
    batch = encode_values([b"x" * 100], 1)
    with tempfile.TemporaryDirectory(prefix="metaq-bench-security-paths-", dir=work_dir) as tmp:
        launchers: dict[str, BrokerLauncher] = {}
        conns: dict[str, tuple[BlockingConnection, BlockingConnection]] = {}
        try:
            for name, extra in VARIANTS.items():
                data = Path(tmp) / name
                _prepare(data)
                options = {**base, **extra}
                if name == "audit":
                    options["auditLogFile"] = str(Path(tmp) / "audit.log")
                launchers[name] = BrokerLauncher(data, options).start()
            for name, broker in launchers.items():
                alice, bob = _connect(broker, "alice"), _connect(broker, "bob")
                conns[name] = (alice, bob)
                alice.call(m.ProduceRequest(topic="t", partition=0, records=batch))  # creates t
            for n in range(1, rounds + 1):
                for name, (alice, bob) in conns.items():
                    got = us[name]
                    got["produce"].append(_median_us(alice, m.ProduceRequest(topic="t", partition=0, records=batch),
                                                     requests))
                    got["fetch"].append(_median_us(alice, m.FetchRequest(topic="t", partition=0, offset=0,
                                                                         max_bytes=1024), requests))
                    got["refused"].append(_median_us(bob, m.ProduceRequest(topic="t", partition=0, records=batch),
                                                     requests))
                    report(f"round {n} {name}: " + ", ".join(f"{k} {got[k][-1]:.1f} µs" for k in KINDS))
        finally:
            for alice, bob in conns.values():
                alice.close()
                bob.close()
            for broker in launchers.values():
                broker.stop()
    return {"requests": requests, "rounds": rounds, "us_per_request": us}


def table(result: dict[str, Any]) -> str:
    rows = []
    for name, kinds in result["us_per_request"].items():
        label = "neither (the baseline)" if name == "off" else name
        rows.append([label, *(f"{median(kinds[k]):.1f} ({each(kinds[k], '{:.1f}')})" for k in KINDS)])
    return markdown_table(["broker", "produce µs, median (each round)", "fetch µs", "refused produce µs"], rows,
                          right=[1, 2, 3])
