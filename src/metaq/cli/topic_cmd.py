"""`metaq topic`: create, delete, list, describe, close and open topics. Parsing and printing only."""

from __future__ import annotations

import json
import sys

import click

from metaq.cli.options import PARTITION, broker_id_option, target_options
from metaq.cli.session import holders, open_session, resolve_partition_option, run_async
from metaq.cli.text import plural
from metaq.types import PartitionId


@click.group("topic")
def topic_group() -> None:
    """Create, delete, list, describe, close and open topics."""


@topic_group.command("create")
@target_options
@click.argument("topic")
@click.option("-p", "--partitions", type=click.IntRange(-1, 10_000), default=-1, show_default=True,
              help="Number of partitions (-1: the broker's numPartitions).")
@broker_id_option
@run_async
async def topic_create(servers: str, topic: str, partitions: int, broker_id: int | None) -> None:
    """Create TOPIC on a broker (each broker of a topic space holds its own partitions of a topic:
    create it on every broker that should have some)."""
    async with await open_session(servers) as session:
        n = await session.admin().create_topic(topic, partitions, broker_id=broker_id)
        where = f" on broker {broker_id}" if broker_id is not None else ""
        click.echo(f"created topic {topic} with {plural(n, 'partition')}{where}")


@topic_group.command("delete")
@target_options
@click.argument("topic")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("-b", "--broker-id", type=click.IntRange(0), default=None,
              help="Only on this broker (default: every broker that has the topic).")
@run_async
async def topic_delete(servers: str, topic: str, yes: bool, broker_id: int | None) -> None:
    """Delete TOPIC and all its messages (asks first, unless --yes)."""
    if not yes:
        if not sys.stdin.isatty():  # nobody to answer the question: say what to do instead of "Aborted!"
            raise click.UsageError(f"deleting topic {topic} needs a confirmation: add --yes (no terminal to ask on)")
        if not click.confirm(f"delete topic {topic} and all its messages?", default=False):
            click.echo(f"topic {topic} not deleted", err=True)
            raise click.exceptions.Exit(1)
    async with await open_session(servers) as session:
        for b in [broker_id] if broker_id is not None else await holders(session, topic):
            await session.admin().delete_topic(topic, broker_id=b)
        click.echo(f"deleted topic {topic}" + (f" on broker {broker_id}" if broker_id is not None else ""))


@topic_group.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@run_async
async def topic_list(servers: str, as_json: bool) -> None:
    """List topics and their partition counts."""
    async with await open_session(servers) as session:
        topics = await session.admin().list_topics()
    if as_json:
        click.echo(json.dumps({t: len(ps) for t, ps in sorted(topics.items())}))
        return
    for name, parts in sorted(topics.items()):
        click.echo(f"{name}\t{plural(len(parts), 'partition')}")


@topic_group.command("describe")
@target_options
@click.argument("topic")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@run_async
async def topic_describe(servers: str, topic: str, as_json: bool) -> None:
    """Show TOPIC's partitions: broker, earliest and latest offsets, open or closed."""
    async with await open_session(servers) as session:
        desc = await session.admin().describe_topic(topic)
    rows = [{"partition": str(d.partition), "earliest": d.earliest,
             "latest": d.latest, "messages": d.latest - d.earliest,
             "publish": "open" if d.partition.accept_publish else "closed",
             "subscribe": "open" if d.partition.accept_subscribe else "closed"} for d in desc.partitions]
    if as_json:
        click.echo(json.dumps({"topic": topic, "partitions": rows}))
        return
    click.echo(f"topic {topic}")
    click.echo("partition\tearliest\tlatest\tmessages\tpublish\tsubscribe")
    for r in rows:
        click.echo("\t".join(str(r[k]) for k in ("partition", "earliest", "latest", "messages", "publish",
                                                 "subscribe")))


def _state_command(name: str, open_: bool) -> click.Command:
    @click.command(name)
    @target_options
    @click.argument("topic")
    @click.option("-p", "--partition", type=PARTITION, default=None,
                  help="Partition to change, brokerId-partition (a bare number if only one broker has it); "
                       "default: every partition of the topic, on every broker.")
    @run_async
    async def command(servers: str, topic: str, partition: PartitionId | int | None) -> None:
        async with await open_session(servers) as session:
            admin = session.admin()
            key: PartitionId | int = -1
            if partition is not None:
                key = resolve_partition_option(topic, await session.partitions(topic), partition)
            await (admin.open_partition(topic, key) if open_ else admin.close_partition(topic, key))
        which = "every partition" if key == -1 else f"partition {key}"
        click.echo(f"{'opened' if open_ else 'closed'} {which} of {topic} for publishing")

    command.help = (f"{'Open' if open_ else 'Close'} partitions of TOPIC for publishing "
                    f"({'undoes close' if open_ else 'producers get PARTITION_CLOSED, as MetaQ'}).")
    return command


topic_group.add_command(_state_command("close", False))
topic_group.add_command(_state_command("open", True))

