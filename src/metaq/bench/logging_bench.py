"""`metaq bench logging`: what a logging call costs the application with metaq.logging.MetaqHandler, the broker up
and the broker down.

``count`` times ``log.info("request %d served", i, extra={...})`` from one thread through a MetaqHandler (JSON
formatter, two extra fields), timed from the first call to the last one returning; the handler's own thread sends
meanwhile. "Broker up": an embedded broker (group commit), and how long until it acknowledged the last record.
"Broker down": nothing listens on the port; every record stays queued (the queue bound is raised to the count,
so none is dropped), and the call costs no more, because emit() never touches the network.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

from metaq.bench.processes import free_port
from metaq.bench.report import BenchError, Report, markdown_table
from metaq.broker.launcher import BrokerLauncher
from metaq.logging import MetaqHandler

ACK_TIMEOUT_S = 600.0


def log_records(servers: str, count: int, *, wait_for_acks: bool) -> dict[str, Any]:
    handler = MetaqHandler(servers, "bench-logging", max_buffered_records=count, error_interval_s=3600)
    quiet, logging.raiseExceptions = logging.raiseExceptions, False  # no reports of the broker being down
    log = logging.getLogger(f"metaq-bench-logging-{time.monotonic_ns()}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        started = time.perf_counter()
        for i in range(count):
            log.info("request %d served", i, extra={"seq": i, "path": f"/api/orders/{i % 7}"})
        emitted = time.perf_counter() - started
        acked: float | None = None
        if wait_for_acks:
            if not handler.drain(ACK_TIMEOUT_S):
                raise BenchError(f"the broker at {servers} did not acknowledge the records in {ACK_TIMEOUT_S:.0f} s")
            acked = time.perf_counter() - started
        stats = handler.stats()
    finally:
        log.removeHandler(handler)
        handler.close(timeout=0 if not wait_for_acks else None)
        logging.raiseExceptions = quiet
    return {"emit_us": round(emitted / count * 1e6, 2), "records_per_s": round(count / emitted),
            "acked_s": None if acked is None else round(acked, 3), "pending": stats.pending, "dropped": stats.dropped}


def run(servers: str | None, count: int, report: Report) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="metaq-bench-logging-") as tmp:
        broker = None if servers else BrokerLauncher(f"{tmp}/data", {"numPartitions": 4,
                                                                     "unflushThreshold": 0}).start()
        try:
            up = log_records(servers or (broker.servers if broker else ""), count, wait_for_acks=True)
        finally:
            if broker is not None:
                broker.stop()
    report(f"broker up: emit {up['emit_us']:.1f} µs a record, all acknowledged {up['acked_s']:.2f} s after the first")
    down = log_records(f"127.0.0.1:{free_port()}", count, wait_for_acks=False)
    report(f"broker down: emit {down['emit_us']:.1f} µs a record, {down['pending']:,} pending")
    return {"records": count, "broker_up": up, "broker_down": down}


def table(result: dict[str, Any]) -> str:
    up, down = result["broker_up"], result["broker_down"]
    return (f"MetaqHandler, {result['records']:,} records logged from one thread (JSON, two extra fields):\n\n"
            + markdown_table(["case", "emit µs a record", "records/s from one thread", ""], [
                ["broker up", f"{up['emit_us']:.1f}", f"{up['records_per_s']:,}",
                 f"all acknowledged {up['acked_s']:.2f} s after the first call"],
                ["broker down", f"{down['emit_us']:.1f}", f"{down['records_per_s']:,}",
                 f"{down['pending']:,} pending, {down['dropped']} dropped"]], right=[1, 2]))
