"""One global transaction of the XA tests, in a process of its own so that it can die at a chosen step.

    python xa_worker.py CONNINFO SERVERS LOG_PATH ORDER CRASH_STEP

Inserts order ORDER into PostgreSQL and sends ``order-ORDER`` to topic ``xa`` in one XA transaction; at
CRASH_STEP (a step name of metaq.client.xa, or "none") the process exits at once with code 9, as a kill -9.
CRASH_STEP ``pause:DIR`` instead stops after both branches are prepared (before the decision): it creates
``DIR/paused`` and goes on once ``DIR/go`` exists. An XAError exits 3 with its message on stderr.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg

from metaq.client import connect
from metaq.client.xa import XACoordinator, XAError
from metaq.types import Message


def main() -> None:
    conninfo, servers, log_path, order, crash = sys.argv[1:6]

    def hook(step: str) -> None:
        if step == crash:
            os._exit(9)
        if crash.startswith("pause:") and step == "prepared:mq":
            where = Path(crash.split(":", 1)[1])
            (where / "paused").touch()
            deadline = time.monotonic() + 120
            while not (where / "go").exists():  # the test's signal; a bounded wait on a file, polled
                if time.monotonic() > deadline:
                    os._exit(8)
                time.sleep(0.01)

    with psycopg.connect(conninfo) as db, connect(servers) as session:
        producer = session.create_producer()
        try:
            with XACoordinator(log_path, {"db": db, "mq": producer}, crash_hook=hook) as coordinator, \
                    coordinator.transaction():
                db.execute("INSERT INTO orders (id) VALUES (%s)", (int(order),))
                producer.send(Message("xa", b"order-" + order.encode()))
        except XAError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            sys.exit(3)


if __name__ == "__main__":
    main()
