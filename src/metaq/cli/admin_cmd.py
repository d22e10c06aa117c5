"""`metaq admin`: broker administration (reload, promote, lookup, find; `verify` lives in verify_cmd).
Parsing and printing only."""

from __future__ import annotations

import json

import click

from metaq.cli.options import target_options
from metaq.cli.session import open_session, run_async
from metaq.cli.text import iso_ms
from metaq.cli.values import time_ms
from metaq.types import format_message_id, partition_key


@click.group("admin")
def admin_group() -> None:
    """Broker administration."""


@admin_group.command("reload")
@target_options
@run_async
async def admin_reload(servers: str) -> None:
    """Re-read the broker's server.ini and apply [topic=...] changes and live options (as SIGHUP)."""
    async with await open_session(servers) as session:
        changed = await session.admin().reload()
    click.echo("reloaded; topics changed: " + (", ".join(changed) or "none"))
    if changed.restart_required:
        click.echo("not applied until the broker restarts: " + ", ".join(changed.restart_required), err=True)


@admin_group.command("promote")
@target_options
@click.option("--broker-id", "broker_id", type=int, default=None,
              help="The broker id whose master hands over (default: the broker --servers names; needed with "
                   "--zk-connect when there are several).")
@click.option("--replica", "replica_id", type=int, default=-1, show_default="any in-sync slave",
              help="The slaveId of the slave to become master.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds the master may wait for the slave to hold every message (writes are refused meanwhile).")
@run_async
async def admin_promote(servers: str, broker_id: int | None, replica_id: int, timeout_s: float) -> None:
    """Planned switchover: the master stops taking writes, waits until an in-sync slave holds every message,
    and hands over to it; the old master continues as its slave. No acked message is lost and nothing is
    written twice (syncReplication or autoFailover mode; docs/replication.md)."""
    async with await open_session(servers) as session:
        new_master, epoch = await session.admin().promote(broker_id=broker_id, replica_id=replica_id,
                                                          timeout_s=timeout_s)
    which = f"broker {broker_id}" if broker_id is not None else "the broker"
    click.echo(f"replica {new_master} is now the master of {which} (epoch {epoch})")


@admin_group.command("lookup")
@target_options
@click.argument("message_id")
@run_async
async def admin_lookup(servers: str, message_id: str) -> None:
    """Where MESSAGE_ID (32 hex digits) is stored: topic, partition (brokerId-partition), offset."""
    async with await open_session(servers) as session:
        loc = await session.admin().lookup_message(message_id)
    click.echo(f"{loc.topic}\t{loc.partition_id}\t{loc.offset}")


@admin_group.command("find")
@target_options
@click.option("--topic", "-t", required=True, help="The topic to search.")
@click.option("--key", "-k", default=None, help="Only messages with exactly this key (UTF-8).")
@click.option("--from", "from_text", default=None, metavar="ISO|MS",
              help="Only messages with a timestamp at or after this (ISO 8601, UTC when no zone; or ms).")
@click.option("--to", "to_text", default=None, metavar="ISO|MS",
              help="Only messages with a timestamp at or before this (ISO 8601, UTC when no zone; or ms).")
@click.option("--partition", "-p", default=None, help="Only this partition (brokerId-partition, or a number).")
@click.option("-n", "--limit", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="At most this many messages.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of tab-separated lines.")
@run_async
async def admin_find(servers: str, topic: str, key: str | None, from_text: str | None, to_text: str | None,
                     partition: str | None, limit: int, as_json: bool) -> None:
    """Find messages by key (each segment's key index) and/or time range. Prints one line per message:
    partition (brokerId-partition), offset, message id, timestamp, key; fetch from the offset to read it."""
    if key is None and from_text is None and to_text is None:
        raise click.UsageError("give --key, --from or --to (or several)")
    from_ms, to_ms = time_ms(from_text, "--from"), time_ms(to_text, "--to")
    if from_ms >= 0 and to_ms >= 0 and to_ms < from_ms:
        raise click.UsageError("--to is before --from")
    async with await open_session(servers) as session:
        result = await session.admin().find(topic, key=key, from_ms=from_ms, to_ms=to_ms, limit=limit,
                                            partition=partition_key(partition) if partition is not None else -1)
    if as_json:
        click.echo(json.dumps({
            "topic": topic, "truncated": result.truncated, "scanned_segments": result.scanned_segments,
            "problems": result.problems,
            "messages": [{"partition": str(f.partition_id), "offset": f.offset, "id": format_message_id(f.message_id),
                          "timestamp_ms": f.timestamp_ms,
                          "key": f.key.decode(errors="replace") if f.key is not None else None}
                         for f in result.messages]}))
        return
    for f in result.messages:
        shown = f.key.decode(errors="backslashreplace") if f.key is not None else "-"
        click.echo(f"{f.partition_id}\t{f.offset}\t{format_message_id(f.message_id)}\t{iso_ms(f.timestamp_ms)}\t{shown}")
    for problem in result.problems:
        click.echo(f"damaged, not searched: {problem}", err=True)
    if result.truncated:
        click.echo(f"(first {limit} shown; more match: narrow the range or raise -n)", err=True)
    if not result.messages:
        click.echo("no messages found", err=True)



def _add_subcommands() -> None:
    """`admin verify` and `admin transactions` live in their own modules (which import nothing of this one)."""
    from metaq.cli import transactions_cmd, verify_cmd

    verify_cmd.register(admin_group)
    transactions_cmd.register(admin_group)


_add_subcommands()
