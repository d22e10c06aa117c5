"""The whole cluster, as ``metaq cluster`` shows it, for the dashboard of a ZooKeeper-mode broker.

:func:`metaq.client.cluster_status.read_cluster_status` does the work (brokers, slaves, topics, every
group's members, owners and lag per partition, replica groups): it opens a read-only ZooKeeper session
and asks each broker for its log ends, which blocks, so it runs in a worker thread, at most one at a
time, and its answer is kept for :data:`CACHE_S`: however many browsers poll, ZooKeeper and the brokers
see one read every few seconds. A standalone broker has no cluster to read: it answers its own mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from metaq.client.cluster_status import read_cluster_status

if TYPE_CHECKING:
    from metaq.broker.core import Broker

log = logging.getLogger("metaq.broker.dashboard")

CACHE_S = 3.0
"""How long one read of the cluster is served before the next one is started."""
READ_TIMEOUT_S = 5.0
"""How long a read waits for ZooKeeper to connect."""


class ClusterView:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._doc: dict[str, Any] | None = None
        self._read_at = -CACHE_S
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, Any]:
        zk = self.broker.config.zookeeper
        if getattr(self.broker.cluster, "mode", "") != "zookeeper" or zk is None:
            return {"mode": getattr(self.broker.cluster, "mode", "standalone"),
                    "note": "standalone: this broker knows only itself; the other views show it"}
        async with self._lock:  # one read at a time; the others wait for it and share its answer
            if self._doc is None or time.monotonic() - self._read_at >= CACHE_S:
                loop = asyncio.get_running_loop()
                try:
                    status = await loop.run_in_executor(
                        None, lambda: read_cluster_status(zk.connect, zk.root, timeout_s=READ_TIMEOUT_S))
                    doc = {"mode": "zookeeper", **status.to_json(), "error": None}
                except Exception as exc:  # ZooKeeper unreachable: keep showing the last view, say why
                    log.warning("dashboard: cannot read the cluster from ZooKeeper: %s", exc)
                    doc = {**(self._doc or {"mode": "zookeeper", "brokers": [], "topics": [], "groups": [],
                                            "replication": [], "problems": []}),
                           "error": f"cannot read the cluster from ZooKeeper {zk.connect}: {exc}"}
                self._doc, self._read_at = doc, time.monotonic()
                self._doc["read_at_ms"] = int(time.time() * 1000)
            return self._doc
