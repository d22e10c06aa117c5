"""One global transaction of the XA tests, in a process of its own so that it can die at a chosen step.

    python xa_worker.py CONNINFO SERVERS LOG_PATH ORDER CRASH_STEP

Inserts order ORDER into PostgreSQL and sends ``order-ORDER`` to topic ``xa`` in one XA transaction; at
CRASH_STEP (a step name of metaq.client.xa, or "none") the process exits at once with code 9, as a kill -9.
"""

from __future__ import annotations

import os
import sys

import psycopg

from metaq.client import connect
from metaq.client.xa import XACoordinator
from metaq.types import Message


def main() -> None:
    conninfo, servers, log_path, order, crash = sys.argv[1:6]

    def hook(step: str) -> None:
        if step == crash:
            os._exit(9)

    with psycopg.connect(conninfo) as db, connect(servers) as session:
        producer = session.create_producer()
        coordinator = XACoordinator(log_path, {"db": db, "mq": producer}, crash_hook=hook)
        with coordinator.transaction():
            db.execute("INSERT INTO orders (id) VALUES (%s)", (int(order),))
            producer.send(Message("xa", b"order-" + order.encode()))


if __name__ == "__main__":
    main()
