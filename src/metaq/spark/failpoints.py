"""Named places where the exactly-once sink can be told to stop and wait to be killed (fault tests).

``METAQ_SPARK_FAILPOINT=<name>:<batch id>`` and ``METAQ_SPARK_FAILPOINT_DIR=<directory>`` in the
environment of a Spark driver (its executors and Python workers inherit it): the first time the sink
reaches ``<name>`` for that batch it creates ``<directory>/<name>-<batch id>`` and then waits, until the
test SIGKILLs the driver exactly there, or creates ``<directory>/<name>-<batch id>.release`` to let it go
on (after restarting a broker, say). Without the variables (always, outside tests) :func:`reach`
returns at once.

Names: ``write`` (a task has put its first batch into its transaction and not prepared it),
``commit`` (every task prepared; the driver has not committed any transaction of the batch),
``mid-commit`` (the driver committed the batch's first transaction, not the others).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "METAQ_SPARK_FAILPOINT"
ENV_DIR = "METAQ_SPARK_FAILPOINT_DIR"
RELEASE_POLL_S = 0.02


def reach(name: str, batch_id: int) -> None:
    wanted, directory = os.environ.get(ENV), os.environ.get(ENV_DIR)
    if not wanted or not directory or wanted != f"{name}:{batch_id}":
        return
    marker = Path(directory) / f"{name}-{batch_id}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return  # reached before (another task): only the first one stops
    os.close(fd)
    release = marker.with_name(marker.name + ".release")
    while not release.exists():  # until the test lets it go, or kills the process
        time.sleep(RELEASE_POLL_S)
