"""What the quota and audit paths cost a request (docs/benchmarks.md): the same run, on and off.

Three brokers side by side, each with authRequired and aclEnabled (alice may produce to and consume ``t``;
bob may do nothing): **off** (no quota, no audit log), **quotas** (produce and fetch byte rates far above
what the run sends, so every request goes through the quota checks and is never throttled), **audit**
(``auditLog=true``, to a file). Rounds interleave the three; per round and broker, over one connection:
``--requests`` produces of one 100-byte message (acks after the write: unflushThreshold=0), as many fetches of
the partition's head, and as many produces bob is refused (each one an audit line with the log on). Prints
the median per-request time (us) of each kind per broker, over the rounds.

    PYTHONPATH=src .venv/bin/python scripts/bench_security_paths.py --requests 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from metaq.broker.launcher import BrokerLauncher
from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.protocol import messages as m
from metaq.protocol.records import encode_values
from metaq.security.acl import ACL_FILE_NAME, AclEntry, AclFile
from metaq.security.credentials import USERS_FILE_NAME, UsersFile
from metaq.security.scram import make_credential

PASSWORD = "a password"


def prepare(data: Path) -> None:
    users = UsersFile(data / USERS_FILE_NAME)
    for user in ("alice", "bob"):
        users.put(user, make_credential(PASSWORD))
    acls = AclFile(data / ACL_FILE_NAME)
    for op in ("produce", "consume", "create"):
        acls.update("add", AclEntry("User:alice", "topic", "t", op))


def timed(conn: BlockingConnection, request: object, n: int) -> float:
    """Median us of ``n`` sequential calls."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        conn.call(request)
        times.append((time.perf_counter() - started) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = {"authRequired": True, "aclEnabled": True, "numPartitions": 1, "unflushThreshold": 0}
    variants = {"off": {}, "quotas": {"quotaProducerByteRate": "1g", "quotaConsumerByteRate": "1g",
                                      "quotaMaxConnections": 100},
                "audit": {"auditLog": True}}
    results: dict[str, dict[str, list[float]]] = {v: {"produce": [], "fetch": [], "refused": []} for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench-sec-") as tmp:
        launchers = {}
        for name, extra in variants.items():
            data = Path(tmp) / name
            prepare(data)
            options = {**base, **extra}
            if name == "audit":
                options["auditLogFile"] = str(Path(tmp) / "audit.log")
            launchers[name] = BrokerLauncher(data, options).start()
        try:
            conns = {}
            for name, broker in launchers.items():
                settings = ConnectionSettings("bench-sec", 10.0, 30.0, 4, 64 << 20, sasl_username="alice",
                                              sasl_password=PASSWORD)
                alice = BlockingConnection.open((broker.host, broker.port), settings)
                bob = BlockingConnection.open((broker.host, broker.port), ConnectionSettings(
                    "bench-sec", 10.0, 30.0, 4, 64 << 20, sasl_username="bob", sasl_password=PASSWORD))
                alice.call(m.ProduceRequest(topic="t", partition=0, records=encode_values([b"x" * 100], 1)))
                conns[name] = (alice, bob)
            batch = encode_values([b"x" * 100], 1)
            for _ in range(args.rounds):
                for name, (alice, bob) in conns.items():
                    results[name]["produce"].append(timed(alice, m.ProduceRequest(topic="t", partition=0,
                                                                                  records=batch), args.requests))
                    results[name]["fetch"].append(timed(alice, m.FetchRequest(topic="t", partition=0, offset=0,
                                                                              max_bytes=1024), args.requests))
                    results[name]["refused"].append(timed(bob, m.ProduceRequest(topic="t", partition=0,
                                                                                records=batch), args.requests))
        finally:
            for broker in launchers.values():
                broker.stop()
    for name, kinds in results.items():
        print(f"{name:7s} " + "  ".join(f"{kind} {statistics.median(v):7.1f} us" for kind, v in kinds.items()),
              flush=True)


if __name__ == "__main__":
    main()
