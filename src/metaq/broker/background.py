"""A running broker's background jobs: deleteWhen retention, stats windows, the verify after an unclean start.

Each job is a coroutine function of the broker core that runs until cancelled; :class:`BrokerService
<metaq.broker.service.BrokerService>` starts them once the broker serves and cancels them when it stops.
Blocking file work runs in worker threads; a job that fails once logs it and goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from metaq.broker.config import BrokerConfig
from metaq.broker.core import Broker
from metaq.broker.cron import next_run_ms
from metaq.errors import StorageError

log = logging.getLogger("metaq.broker")

Job = Callable[[Broker], Coroutine[Any, Any, None]]

STATS_WINDOW_S = 10.0
RETENTION_RESCHEDULE_S = 1.0
"""How often the retention loop looks for new topics and changed schedules (a dict walk: cheap)."""


def default_jobs(config: BrokerConfig) -> list[Job]:
    """What `metaq broker` runs beside serving requests."""
    jobs: list[Job] = [roll_stats, schedule_retention]
    if config.verify_after_unclean_start:
        jobs.append(verify_unclean)
    jobs.append(transaction_timers)
    if config.acl_enabled:
        from metaq.broker.security_sources import refresh_acls

        jobs.append(refresh_acls)
    return jobs


async def roll_stats(broker: Broker) -> None:
    while True:
        await asyncio.sleep(STATS_WINDOW_S)
        broker.stats.roll_window()


async def verify_unclean(broker: Broker) -> None:
    """Scrub, one at a time in a worker thread, the partitions this start recovered from an unclean stop.

    Recovery checks the newest segment of each; damage elsewhere (a bad sector, a flipped bit) would
    otherwise wait for a consumer to reach it. Damage found is logged by the log and shown in stats.
    """
    loop = asyncio.get_running_loop()
    targets = [plog for plog in broker.logs.logs() if not plog.recovery.clean]
    if not targets:
        return
    started = time.monotonic()
    log.info("verifying %d partitions recovered from an unclean stop, in the background", len(targets))
    damaged = 0
    notes = 0
    for plog in targets:
        if broker.stopping:
            return
        try:
            report = await loop.run_in_executor(None, plog.verify)
        except StorageError as exc:  # closed or deleted meanwhile
            log.info("verify of %s-%d skipped: %s", plog.topic, plog.partition, exc)
            continue
        damaged += not report.ok
        notes += len(report.index_notes)
    rebuilt = f"; {notes} index files missing or torn, rebuilt on first use (not damage)" if notes else ""
    log.info("verified %d partitions after the unclean stop in %.1fs: %s%s", len(targets), time.monotonic() - started,
             f"{damaged} with damage (see the errors above, `metaq stats`)" if damaged else "all intact", rebuilt)


async def schedule_retention(broker: Broker) -> None:
    """Apply each topic's deletePolicy on its own deleteWhen cron schedule ([topic=...] may override it).

    A run is the storage's :meth:`~metaq.storage.LogManager.run_retention` for the topics due, in a
    worker thread; it logs the partitions that fail, and this loop one line per run. Re-reads the
    schedule at least every RETENTION_RESCHEDULE_S so reloads and new topics are picked up.
    """
    loop = asyncio.get_running_loop()
    next_due: dict[str, int] = {}
    while True:
        now_ms = int(time.time() * 1000)
        by_expr: dict[str, list[str]] = {}
        for topic, state in list(broker.topics.items()):
            by_expr.setdefault(state.settings.delete_when, []).append(topic)
        for expr in list(next_due):
            if expr not in by_expr:
                del next_due[expr]
        for expr in by_expr:
            if expr not in next_due:
                next_due[expr] = next_run_ms(expr, now_ms)
        for expr, due_ms in list(next_due.items()):
            if due_ms > now_ms:
                continue
            topics = by_expr[expr]
            try:
                outcome = await loop.run_in_executor(None, broker.logs.run_retention, topics)
                log.info("retention (%s) on %d topics removed %s%s", expr, len(topics), outcome.removed or "nothing",
                         f"; {len(outcome.failures)} partition(s) failed" if outcome.failures else "")
            except Exception:  # retention failing must not stop the broker
                log.exception("retention run failed")
            next_due[expr] = next_run_ms(expr, int(time.time() * 1000))
        wait_ms = min([d - int(time.time() * 1000) for d in next_due.values()], default=RETENTION_RESCHEDULE_S * 1000)
        await asyncio.sleep(max(0.0, min(wait_ms / 1000, RETENTION_RESCHEDULE_S)))


TRANSACTION_TICK_S = 0.5


async def transaction_timers(broker: Broker) -> None:
    """Roll back transactions past their timeout, fsync the transaction log once a second with
    flushTxLogAtCommit=2, checkpoint it when due (docs/transactions.md). Nothing until the log exists."""
    loop = asyncio.get_running_loop()
    last_sync = time.monotonic()
    while True:
        await asyncio.sleep(TRANSACTION_TICK_S)
        coordinator = broker.transactions
        if coordinator is None:
            continue
        try:
            coordinator.expire()
            coordinator.offer_checks()
            if coordinator.flush_at_commit == 2 and time.monotonic() - last_sync >= 1.0:
                last_sync = time.monotonic()
                await loop.run_in_executor(None, coordinator.txlog.sync)
            if coordinator.checkpoint_due():
                coordinator.checkpoint()  # on the loop: the log must not change meanwhile (rare, small)
        except StorageError as exc:
            log.error("transaction log: %s", exc)
