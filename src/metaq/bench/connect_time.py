"""How long opening one connection takes: plaintext, TLS, and TLS with SCRAM-SHA-256 (docs/benchmarks.md).

    python -m metaq.bench.connect_time PLAIN_HOST:PORT TLS_HOST:PORT CA_FILE [USER] [-n 200]

Each connection is opened (TCP connect, the TLS handshake, ApiVersions, the SASL exchange when a user is
given, its password from METAQ_PASSWORD) and closed, ``-n`` times per kind; prints p50 and p99.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from metaq.net.blocking import BlockingConnection
from metaq.net.codec import ConnectionSettings
from metaq.net.servers import parse_servers
from metaq.net.tls import client_context


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m metaq.bench.connect_time")
    parser.add_argument("plain")
    parser.add_argument("tls")
    parser.add_argument("ca_file")
    parser.add_argument("user", nargs="?")
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args(argv)
    context = client_context(args.ca_file)
    kinds = {"plaintext": (args.plain, ConnectionSettings("bench", 10, 10, 1, 1 << 20)),
             "TLS": (args.tls, ConnectionSettings("bench", 10, 10, 1, 1 << 20, ssl_context=context))}
    if args.user:
        kinds["TLS + SCRAM-SHA-256"] = (args.tls, ConnectionSettings(
            "bench", 10, 10, 1, 1 << 20, ssl_context=context, sasl_username=args.user,
            sasl_password=os.environ.get("METAQ_PASSWORD", "")))
    for name, (server, settings) in kinds.items():
        address = parse_servers(server)[0]
        times = []
        for _ in range(args.n):
            started = time.perf_counter()
            BlockingConnection.open(address, settings).close()
            times.append((time.perf_counter() - started) * 1000)
        times.sort()
        print(f"{name}: p50 {statistics.median(times):.2f} ms, p99 {times[int(len(times) * 0.99) - 1]:.2f} ms")


if __name__ == "__main__":
    main()
