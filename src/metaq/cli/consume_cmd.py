"""`metaq consume`: print a topic's messages, partition by partition. Parsing and printing only."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click

from metaq.cli.options import PARTITION, target_options
from metaq.cli.session import open_session, resolve_partition_option, run_async, uncancel
from metaq.cli.text import plural
from metaq.cli.values import parse_offset
from metaq.client import Message, MessageSessionFactory
from metaq.client.replicas import READ_FROM_CHOICES
from metaq.types import PartitionId, format_message_id

TOPIC_POLL_S = 1.0
"""How often `consume --follow` asks whether a missing topic exists yet."""

@click.command("consume")
@target_options
@click.argument("topic")
@click.option("-p", "--partition", type=PARTITION, multiple=True,
              help="Partition(s) to read, brokerId-partition (a bare number if only one broker has it); default all.")
@click.option("-o", "--offset", default="earliest", show_default=True,
              help="Where to start: earliest, latest or an offset number.")
@click.option("-n", "--max", "max_messages", type=click.IntRange(1), default=None, help="Stop after N messages.")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new messages (long polling) instead of "
                                                  "stopping at the end; a topic that does not exist yet is "
                                                  "waited for. Stop with Ctrl-C (a count on stderr, exit code "
                                                  "130).")
@click.option("--format", "fmt", type=click.Choice(["value", "json"]), default="value", show_default=True,
              help="value: the payload as a line; json: one JSON object per message with its metadata "
                   "(partition, offset, id, timestamp_ms, attribute, key, headers as [name, value] pairs, value).")
@click.option("--read-from", type=click.Choice(READ_FROM_CHOICES), default="master", show_default=True,
              help="Read each partition from its master, only from a live slave, or from a slave when one is "
                   "live (prefer-slave). Slaves need --zk-connect (docs/replication.md).")
@run_async
async def consume(servers: str, topic: str, partition: tuple[PartitionId | int, ...], offset: str,
                  max_messages: int | None, follow: bool, fmt: str, read_from: str) -> None:
    """Print TOPIC's messages, partition by partition in offset order.

    A TOPIC that does not exist is an error (exit code 1); with --follow, a notice on stderr, and the
    command waits until it is created.

    Ctrl-C stops it (the normal way to end --follow): what was received is printed, then a count on
    stderr, and the exit code is 130, as for produce, bench and broker.
    """
    start = parse_offset(offset)
    if read_from != "master" and getattr(servers, "zk_connect", None) is None:
        raise click.UsageError(f"--read-from {read_from} needs --zk-connect: slaves are found in ZooKeeper")
    async with await open_session(servers, read_from=read_from) as session:
        parts: list[PartitionId] = [p.id for p in await _topic_partitions(session, topic, servers, follow)]
        if partition:
            parts = sorted({resolve_partition_option(topic, parts, key) for key in partition})
        consumer = session.create_pull_consumer()
        queue: asyncio.Queue[Message | BaseException | None] = asyncio.Queue(maxsize=10_000)

        async def pump(p: PartitionId) -> None:
            try:
                async for msg in consumer.iterate(topic, p, start, stop_at_end=not follow):
                    await queue.put(msg)
            except asyncio.CancelledError:
                raise  # the reader is gone: nobody waits for an end marker
            except Exception as exc:
                await queue.put(exc)
                return
            await queue.put(None)

        tasks = [asyncio.create_task(pump(p)) for p in parts]
        done = printed = 0
        interrupted = False
        out = sys.stdout.buffer
        try:
            while done < len(tasks):
                msg = await queue.get()
                if msg is None:
                    done += 1
                    continue
                if isinstance(msg, BaseException):
                    raise msg
                if fmt == "json":
                    out.write(json.dumps({
                        "partition": str(msg.partition_id), "offset": msg.offset, "id": format_message_id(msg.id),
                        "timestamp_ms": msg.timestamp_ms, "attribute": msg.attribute,
                        "key": msg.key.decode(errors="replace") if msg.key is not None else None,
                        "headers": [[name, bytes(value).decode(errors="replace")] for name, value in msg.headers or ()],
                        "value": bytes(msg.data).decode(errors="replace")}).encode() + b"\n")
                else:
                    out.write(bytes(msg.data) + b"\n")
                printed += 1
                if follow:
                    out.flush()
                if max_messages is not None and printed >= max_messages:
                    break
        except asyncio.CancelledError:  # Ctrl-C
            interrupted = True
            uncancel()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            out.flush()
    if interrupted:
        click.echo(f"consumed {plural(printed, 'message')} from {topic}; interrupted", err=True)
        raise asyncio.CancelledError  # asyncio.run turns it back into KeyboardInterrupt: exit 130

async def _topic_partitions(session: MessageSessionFactory, topic: str, servers: str, follow: bool) -> list[Any]:
    """The topic's partitions; a missing topic is an error, or with --follow waited for."""
    parts = await session.partitions(topic)
    if parts:
        return parts
    if not follow:
        raise click.ClickException(f"topic {topic!r} does not exist on {servers}")
    click.echo(f"topic {topic!r} does not exist on {servers} yet; waiting for it to be created "
               "(Ctrl-C to stop)", err=True)
    while not parts:
        await asyncio.sleep(TOPIC_POLL_S)
        parts = await session.partitions(topic)
    return parts


def register(cli: click.Group) -> None:
    cli.add_command(consume)
