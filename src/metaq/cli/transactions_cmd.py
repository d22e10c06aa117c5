"""`metaq admin transactions`: the transactions each broker holds, and the last ones it decided by itself."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import click

from metaq.cli.options import target_options
from metaq.cli.session import open_session, run_async
from metaq.protocol import messages as m


def _when(ms: int, now_ms: int) -> str:
    if ms < 0:
        return "never"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))
    delta = (ms - now_ms) / 1000
    return f"{stamp} ({'in ' if delta >= 0 else ''}{abs(delta):.0f}s{'' if delta >= 0 else ' ago'})"


def _line(info: m.TransactionInfo, now_ms: int, live: bool) -> str:
    parts = [info.transaction_id, info.state]
    if info.producer_group:
        parts.append(f"group {info.producer_group!r}")
    if info.xid and info.xid != info.transaction_id:
        parts.append(f"xid {info.xid}")
    where = ", ".join(info.partitions) or "no partition yet"
    parts.append(f"{info.messages} message(s) in {where}")
    parts.append(f"begun {_when(info.begun_ms, now_ms)}")
    if live:
        if info.next_check_ms >= 0:
            parts.append(f"{info.checks} check(s) so far, next due {_when(info.next_check_ms, now_ms)}")
        if info.deadline_ms >= 0:
            parts.append(f"rolled back by timeout {_when(info.deadline_ms, now_ms)}")
    else:
        parts.append(f"ended {_when(info.ended_ms, now_ms)}")
    return "  " + "; ".join(parts)


@click.command("transactions")
@target_options
@click.option("-g", "--group", "producer_group", default="", help="Only this producer group's transactions.")
@click.option("--limit", type=click.IntRange(1, m.CHECK_TRANSACTIONS_MAX), default=1000, show_default=True,
              help="At most this many of each list per broker.")
@click.option("--json", "as_json", is_flag=True, help="Print each broker's lists as JSON.")
@run_async
async def admin_transactions(servers: str, producer_group: str, limit: int, as_json: bool) -> None:
    """List the transactions each broker holds (open, prepared, committing) and the last ones it rolled
    back by itself: past maxTxTimeoutInSeconds, or half messages whose transactionCheckMax checks were
    used up. Those are also logged by the broker at ERROR and counted in metaq_transactions_timed_out_total.
    """
    async with await open_session(servers) as session:
        admin = session.admin()
        listings = [(broker_id, await admin.list_transactions(producer_group, broker_id=broker_id, limit=limit))
                    for broker_id in await admin.broker_ids()]
    if as_json:
        doc: list[dict[str, Any]] = [{"broker_id": broker_id, "live": [asdict(t) for t in resp.live],
                                      "timed_out": [asdict(t) for t in resp.timed_out], "checkers": resp.checkers}
                                     for broker_id, resp in listings]
        click.echo(json.dumps(doc, indent=2))
        return
    now_ms = int(time.time() * 1000)
    for broker_id, resp in listings:
        checkers = ", ".join(repr(g) for g in resp.checkers) or "none"
        click.echo(f"broker {broker_id}: {len(resp.live)} live, {len(resp.timed_out)} rolled back by the broker; "
                   f"checkers asking: {checkers}")
        if resp.live:
            click.echo(" live:")
            for info in resp.live:
                click.echo(_line(info, now_ms, live=True))
        if resp.timed_out:
            click.echo(" rolled back by the broker (timeout, or checks used up):")
            for info in resp.timed_out:
                click.echo(_line(info, now_ms, live=False))


def register(admin_group: click.Group) -> None:
    admin_group.add_command(admin_transactions)
