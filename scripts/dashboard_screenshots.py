"""Screenshots of the broker dashboard for docs/operations.md, taken in a real headless Chromium.

Starts a broker (``dashboardHttpPort`` on a free port, 4 partitions, group commit) in a temporary
directory, puts a paced produce load on topic ``orders`` while group ``billing`` consumes it and group
``audit`` (stopped) falls behind, closes partition ``0-3`` as an operator would, lets the charts fill for
``--seconds``, then saves the Overview, Topics and Groups views as PNGs::

    .venv/bin/python scripts/dashboard_screenshots.py --out docs/img --seconds 40

Needs Debian's chromium and chromium-driver (scripts/system-deps.sh) and the test extra (selenium).
Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from metaq.client import connect
from metaq.client.group import ConsumerConfig
from metaq.testing import BrokerProcess, wait_until
from metaq.testing.browser import dashboard_url, headless_chromium

VIEWS = ("overview", "topics", "groups")
MESSAGES_MAX = 200_000
"""A bound on the load, whatever --seconds says."""


def produce(servers: str, stop: threading.Event) -> None:
    """Bursts of varying size, so that the charts have a shape."""
    sent, i = 0, 0
    with connect(servers) as session:
        producer = session.create_producer()
        while not stop.is_set() and sent < MESSAGES_MAX:
            n = 20 + (i * 37) % 80
            producer.send_batch("orders", [b"order %d" % (sent + k) for k in range(n)])  # 0-3 closed: refused there
            sent += n
            i += 1
            stop.wait(0.05)


def post(base: str, path: str, body: dict[str, object] | None = None) -> None:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the charts fill before the shots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="metaq-shots-") as tmp:
        broker = BrokerProcess(Path(tmp) / "broker", {"numPartitions": 4, "unflushThreshold": 0,
                                                      "dashboardHttpPort": 0}).start()
        stop = threading.Event()
        try:
            base = dashboard_url(broker)
            with connect(broker.servers) as session:
                session.admin().create_topic("orders", 4)
                session.admin().create_topic("audit-log", 2)
                assert session.create_producer().send_batch("audit-log", [b"entry"] * 500).success
                post(base, "/api/groups/audit/reset", {"topic": "orders", "to": "earliest"})
                post(base, "/api/groups/archivers/reset", {"topic": "audit-log", "to": 120})
                loader = threading.Thread(target=produce, args=(broker.servers, stop), daemon=True)
                loader.start()
                config = ConsumerConfig(group="billing", session_timeout_ms=6000, commit_offset_period_ms=500)
                with session.create_consumer(config) as consumer:
                    consumer.subscribe("orders", 256 * 1024, lambda message: None)
                    consumer.complete_subscribe()
                    with headless_chromium(width=1280, height=900) as driver:
                        driver.get(base + "/#overview")
                        time.sleep(args.seconds / 2)  # the charts fill: this is the picture, not a synchronisation
                        post(base, "/api/topics/orders/partitions/0-3/close")
                        time.sleep(args.seconds / 2)
                        for view in VIEWS:
                            driver.execute_script("location.hash = arguments[0]", view)
                            wait_until(lambda v=view: driver.execute_script(
                                "return !document.getElementById('view-' + arguments[0]).hidden", v), 10, 0.05)
                            updated = driver.execute_script("return document.body.dataset.updated")
                            wait_until(lambda u=updated: driver.execute_script(
                                "return document.body.dataset.updated") != u, 10, 0.05, "a fresh update")
                            path = args.out / f"dashboard-{view}.png"
                            driver.save_screenshot(str(path))
                            print(f"{path}: {path.stat().st_size} bytes")
        finally:
            stop.set()
            broker.stop_or_kill(15)


if __name__ == "__main__":
    main()
