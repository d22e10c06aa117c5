"""`metaq consume`: print a topic's messages, partition by partition. Parsing and printing only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
from typing import Any, BinaryIO

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
              help="Where to start: earliest, latest or an offset number. With --group: where a partition the "
                   "group has no committed offset for starts (earliest or latest); the others resume at theirs.")
@click.option("--from-beginning", is_flag=True, help="The same as --offset earliest (kafka-console-consumer's name).")
@click.option("-g", "--group", default=None,
              help="Consume as a member of this consumer group: the group's partitions are shared with its other "
                   "members (start more in other shells to see them split), and the offsets of what was printed "
                   "are committed, so the group resumes there. Without --follow it stops once it has caught up "
                   "with the partitions it owns. `metaq group describe GROUP` shows the members and their lag.")
@click.option("-n", "--max", "max_messages", type=click.IntRange(1), default=None, help="Stop after N messages.")
@click.option("-f", "--follow", is_flag=True, help="Keep waiting for new messages (long polling) instead of "
                                                  "stopping at the end; a topic that does not exist yet is "
                                                  "waited for. Stop with Ctrl-C (a count on stderr, exit code "
                                                  "130).")
@click.option("--format", "fmt", type=click.Choice(["payload", "json", "value"]), default="payload",
              show_default=True,
              help="payload: the payload as a line; json: one JSON object per message with its metadata "
                   "(partition, offset, id, timestamp_ms, attribute, key, headers as [name, value] pairs, payload, "
                   "encoding: base64 when a value is not UTF-8 text). 'value' is the former name of 'payload'.")
@click.option("--read-from", type=click.Choice(READ_FROM_CHOICES), default="master", show_default=True,
              help="Read each partition from its master, only from a live slave, or from a slave when one is "
                   "live (prefer-slave). Slaves need --zk-connect (docs/replication.md).")
@run_async
async def consume(servers: str, topic: str, partition: tuple[PartitionId | int, ...], offset: str,
                  from_beginning: bool, group: str | None, max_messages: int | None, follow: bool, fmt: str,
                  read_from: str) -> None:
    """Print TOPIC's messages, partition by partition in offset order.

    A TOPIC that does not exist is an error (exit code 1); with --follow, a notice on stderr, and the
    command waits until it is created.

    With --group, as a member of a consumer group: it gets a share of the partitions and commits what it
    printed (`metaq consume orders --group billing --follow` in two shells splits the partitions).

    Ctrl-C stops it (the normal way to end --follow): what was received is printed, then a count on
    stderr, and the exit code is 130, as for produce, bench and broker.
    """
    start = "earliest" if from_beginning else parse_offset(offset)
    if read_from != "master" and getattr(servers, "zk_connect", None) is None:
        raise click.UsageError(f"--read-from {read_from} needs --zk-connect: slaves are found in ZooKeeper")
    if group is not None:
        if partition:
            raise click.UsageError("--group shares the topic's partitions among its members: no --partition")
        if isinstance(start, int):
            raise click.UsageError("--group resumes at the group's committed offsets: --offset takes earliest or "
                                   "latest (for a partition with none); move them with `metaq group reset`")
        await _consume_group(servers, topic, group, start, max_messages, follow, fmt, read_from)
        return
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
                _print(out, msg, fmt)
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

def _print(out: BinaryIO, msg: Message, fmt: str) -> None:
    """One message on stdout: its payload as a line, or (json) a JSON object with its metadata."""
    if fmt != "json":
        out.write(bytes(msg.data) + b"\n")
        return
    fields = [bytes(msg.data), *([msg.key] if msg.key is not None else []), *(bytes(v) for _, v in msg.headers or ())]
    try:
        for value in fields:
            value.decode()
        encoding = "text"
    except UnicodeDecodeError:  # as the HTTP API writes it: every bytes field base64, never a lossy replacement
        encoding = "base64"

    def text(value: bytes) -> str:
        return value.decode() if encoding == "text" else base64.b64encode(value).decode()

    payload = text(bytes(msg.data))
    out.write(json.dumps({
        "partition": str(msg.partition_id), "offset": msg.offset, "id": format_message_id(msg.id),
        "timestamp_ms": msg.timestamp_ms, "attribute": msg.attribute,
        "key": text(msg.key) if msg.key is not None else None,
        "headers": [[name, text(bytes(value))] for name, value in msg.headers or ()],
        "encoding": encoding, "payload": payload, "value": payload}).encode() + b"\n")


async def _consume_group(servers: str, topic: str, group: str, start: str, max_messages: int | None, follow: bool,
                         fmt: str, read_from: str) -> None:
    """``consume --group``: a group member printing what its listener gets, acknowledging each message once it
    is written (so a commit never covers a message that was not printed)."""
    from metaq.client.group import ConsumerConfig, PartitionContext

    out = sys.stdout.buffer
    printed = 0
    enough = asyncio.Event()
    progress = asyncio.Event()

    async def listener(msg: Message, ctx: PartitionContext) -> None:
        nonlocal printed
        ctx.set_auto_ack(False)  # what is not printed (past --max) stays unacknowledged: the group reads it again
        if enough.is_set():
            return
        _print(out, msg, fmt)
        if follow:
            out.flush()
        printed += 1
        ctx.ack()
        progress.set()
        if max_messages is not None and printed >= max_messages:
            enough.set()

    interrupted = False
    async with await open_session(servers, read_from=read_from) as session:
        await _topic_partitions(session, topic, servers, follow)
        consumer = session.create_consumer(ConsumerConfig(group=group, consume_from_max_offset=start == "latest"))
        consumer.subscribe(topic, 1024 * 1024, listener)
        try:
            await consumer.complete_subscribe()
            if follow:
                await enough.wait()
            else:
                await _caught_up(session, consumer, enough, progress)
        except asyncio.CancelledError:  # Ctrl-C
            interrupted = True
            uncancel()
        finally:
            await consumer.close()  # commits what was printed, leaves the group
            out.flush()
    if interrupted:
        click.echo(f"consumed {plural(printed, 'message')} from {topic} as group {group}; interrupted", err=True)
        raise asyncio.CancelledError


CAUGHT_UP_CHECK_S = 0.2
"""How often ``consume --group`` (without --follow) looks again at a changed assignment while nothing arrives."""


async def _caught_up(session: MessageSessionFactory, consumer: Any, enough: asyncio.Event,
                     progress: asyncio.Event) -> None:
    """Return once every partition the member owns is acknowledged up to the end it had when first owned (or
    --max is reached). The end is taken once per partition, so a busy topic still ends."""
    await consumer.assigned.wait()
    pull = session.create_pull_consumer()
    ends: dict[Any, int] = {}
    while not enough.is_set():
        owned = consumer.assignment()
        for tp in owned:
            if tp not in ends:
                ends[tp] = (await pull.offsets(tp.topic, tp.partition))[1]
        acked = consumer.positions()
        if consumer.assigned.is_set() and all(tp in acked and acked[tp][1] >= ends[tp] for tp in owned):
            return
        progress.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(progress.wait(), CAUGHT_UP_CHECK_S)


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

