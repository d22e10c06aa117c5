"""`metaq stats`: MetaQ's put/get statistics of every broker. Parsing and printing only."""

from __future__ import annotations

import json

import click

from metaq.cli.options import target_options
from metaq.cli.replication_text import replication_lines
from metaq.cli.session import holders, open_session, run_async
from metaq.cli.text import plural


@click.command("stats")
@target_options
@click.option("-t", "--topic", default=None, help="Only this topic.")
@click.option("-b", "--broker-id", type=click.IntRange(0), default=None,
              help="Only this broker (default: every broker of --servers).")
@click.option("--json", "as_json", is_flag=True, help="Print the brokers' JSON documents (a list, one per broker).")
@run_async
async def stats(servers: str, topic: str | None, broker_id: int | None, as_json: bool) -> None:
    """Put/get counts, bytes and rates per topic and partition (MetaQ's stats), of every broker."""
    async with await open_session(servers) as session:
        admin = session.admin()
        if broker_id is not None:
            brokers: list[int | None] = [broker_id]
        else:
            brokers = await holders(session, topic) if topic is not None else [*await admin.broker_ids()]
        docs = [await admin.stats(topic, broker_id=b) for b in brokers]
    if as_json:
        click.echo(json.dumps(docs, indent=2))
        return
    click.echo("topic\tpartition\tput_msgs\tput_bytes\tput_tps\tget_reqs\tget_bytes\tearliest\tlatest")
    for doc in docs:
        click.echo(f"# broker {doc.get('broker_id')} up {doc['uptime_s']:.0f}s, "
                   f"{plural(doc['connections'], 'connection')}")
        if (durability := doc.get("durability")) is not None:  # how its flushes are made durable (docs/storage.md)
            click.echo(f"# data directory on {durability['filesystem']}: syncfs "
                       f"{'used' if durability['syncfs'] else 'not used'}: {durability['syncfs_reason']}")
        stores = doc.get("stores") or {}
        if stores.get("damaged_records"):  # records of the stores beside the segments (the log names each)
            counts = ", ".join(f"{name} {n}" for name, n in sorted(stores["damaged_records"].items()))
            click.echo(f"# DAMAGED records skipped since the start: {counts}; the broker's ERRORs name each "
                       "(`metaq admin verify`)")
        for tname, t in sorted(doc["topics"].items()):
            for pname, p in sorted(t["partitions"].items(), key=lambda kv: int(kv[0])):
                click.echo("\t".join(str(x) for x in (
                    tname, f"{doc.get('broker_id')}-{pname}", p["put_messages"], p["put_bytes"], p["put_tps"],
                    p["get_requests"], p["get_bytes"], p.get("log_start_offset", "-"), p.get("log_end_offset", "-"))))
        for line in replication_lines(doc):  # a slave's replication section (docs/replication.md#lag)
            click.echo(line)

