"""Client-side commands: topic, produce, consume, stats, admin. Parsing and printing only."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import json
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Literal, TypeVar

import click

from metaq.cli.options import (
    Target,
    servers_option,
    target_options,
    tls_config,
    tls_options,
    zk_connect_option,
    zk_root_option,
)
from metaq.cli.replication_text import replication_lines
from metaq.cli.text import plural
from metaq.client import Message, MessageSessionFactory
from metaq.client.metadata import resolve_partition
from metaq.client.replicas import READ_FROM_CHOICES
from metaq.errors import MetaqError, PartitionClosedError
from metaq.types import PartitionId, format_message_id, partition_key

T = TypeVar("T")


class PartitionType(click.ParamType):
    """A partition argument: ``brokerId-partition`` (``1-3``), or a bare number, accepted where only one
    broker has a partition with that number (checked against the topic's partitions when used)."""

    name = "brokerId-partition"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> PartitionId | int:
        if isinstance(value, (PartitionId, int)):
            return value
        try:
            return partition_key(str(value))
        except MetaqError:
            self.fail(f"{value!r} is not brokerId-partition (e.g. 1-3) or a partition number", param, ctx)


PARTITION = PartitionType()
broker_id_option = click.option("-b", "--broker-id", type=click.IntRange(0), default=None,
                                help="The broker to do it on (default: the first server that answers).")


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body; a metaq error becomes a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except MetaqError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


async def _session(servers: str, **config: Any) -> MessageSessionFactory:
    """A session on ``--servers``, or on the cluster in ZooKeeper (a :class:`Target` with ``zk_connect``);
    ``config``: more ClientConfig options."""
    zk_connect = getattr(servers, "zk_connect", None)
    config = {**getattr(servers, "client_options", {}), **config}
    if zk_connect is None:
        return await MessageSessionFactory.connect(servers, **config)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # its reconnection chatter; failures are ours to say
    assert isinstance(servers, Target)
    return await MessageSessionFactory.connect(zk_connect=zk_connect, zk_root=servers.zk_root,
                                               zk_connection_timeout_ms=10_000, **config)


# -- topic --------------------------------------------------------------------------------------


@click.group("topic")
def topic_group() -> None:
    """Create, list, describe, close and open topics."""


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
    async with await _session(servers) as session:
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
    """Delete TOPIC and all its messages."""
    if not yes and not click.confirm(f"delete topic {topic} and all its messages?", default=False):
        raise click.Abort()
    async with await _session(servers) as session:
        for b in [broker_id] if broker_id is not None else await _holders(session, topic):
            await session.admin().delete_topic(topic, broker_id=b)
        click.echo(f"deleted topic {topic}" + (f" on broker {broker_id}" if broker_id is not None else ""))


@topic_group.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@run_async
async def topic_list(servers: str, as_json: bool) -> None:
    """List topics and their partition counts."""
    async with await _session(servers) as session:
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
    async with await _session(servers) as session:
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
        async with await _session(servers) as session:
            admin = session.admin()
            key: PartitionId | int = -1
            if partition is not None:
                key = _resolve_option(topic, await session.partitions(topic), partition)
            await (admin.open_partition(topic, key) if open_ else admin.close_partition(topic, key))
        which = "every partition" if key == -1 else f"partition {key}"
        click.echo(f"{'opened' if open_ else 'closed'} {which} of {topic} for publishing")

    command.help = (f"{'Open' if open_ else 'Close'} partitions of TOPIC for publishing "
                    f"({'undoes close' if open_ else 'producers get PARTITION_CLOSED, as MetaQ'}).")
    return command


topic_group.add_command(_state_command("close", False))
topic_group.add_command(_state_command("open", True))


# -- produce / consume --------------------------------------------------------------------------


STDIN_CHUNK_BYTES = 1 << 16
DRAIN_EVERY_MESSAGES = 10_000
TOPIC_POLL_S = 1.0
"""How often `consume --follow` asks whether a missing topic exists yet."""


def _parse_headers(ctx: click.Context, param: click.Parameter, specs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """``--header NAME=VALUE`` options as (name, value bytes), in the order given."""
    headers = []
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{spec!r} is not NAME=VALUE (e.g. --header trace-id=abc123)")
        headers.append((name, value.encode()))
    return headers


@click.command("produce")
@target_options
@click.argument("topic")
@click.option("-k", "--key", default=None, help="Key of every message (with the key-hash selector: one partition).")
@click.option("-a", "--attribute", default=None, help="MetaQ attribute string of every message.")
@click.option("-H", "--header", "header_specs", multiple=True, metavar="NAME=VALUE", callback=_parse_headers,
              help="A header of every message (repeatable; the value is sent as UTF-8 bytes).")
@click.option("-p", "--partition", type=PARTITION, default=None,
              help="Send every message to this partition: brokerId-partition (a bare number if only one broker "
                   "has it).")
@click.option("--print-ids", is_flag=True, help="Print partition (brokerId-partition), offset and message id of "
                                                "each message.")
@click.option("--delay", "delay_text", default=None, metavar="DURATION",
              help="Delayed delivery (docs/delayed.md): consumers see each message this long after it is sent "
                   "(500ms, 10s, 5m, 2h, 1d; a bare number is seconds).")
@click.option("--deliver-at", "deliver_at_text", default=None, metavar="ISO|MS",
              help="Delayed delivery at this time: ISO 8601 (without a zone: UTC) or ms since the epoch.")
@click.option("--delivery-timeout-ms", type=click.FloatRange(min=1), default=120_000.0, show_default=True,
              help="How long a message may wait for its broker or the next master before it fails "
                   "(docs/producer.md).")
@click.option("--idempotent", is_flag=True,
              help="Stamp batches so that a resend is stored once (docs/transactions.md).")
@run_async
async def produce(servers: str, topic: str, key: str | None, attribute: str | None,
                  header_specs: list[tuple[str, bytes]], partition: PartitionId | int | None,
                  print_ids: bool, delay_text: str | None, deliver_at_text: str | None,
                  delivery_timeout_ms: float, idempotent: bool) -> None:
    """Send each line of standard input to TOPIC as one message (the newline is not sent).

    A TOPIC that does not exist is created by the broker if it allows it (autoCreateTopics), except
    with --partition or --key, which need the topic's partitions: then it is an error.

    Ctrl-C stops reading: the lines already read are sent and acknowledged, the count is printed and
    the exit code is 130.
    """
    from metaq.client.selectors import KeyHashSelector

    if delay_text is not None and deliver_at_text is not None:
        raise click.UsageError("give --delay or --deliver-at, not both")
    delay_ms = _duration_ms(delay_text, "--delay") if delay_text is not None else None
    deliver_at = _time_ms(deliver_at_text, "--deliver-at") if deliver_at_text is not None else None
    target: PartitionId | None = None

    def fixed(_topic: str, partitions: Any, _message: Message) -> Any:
        for p in partitions:
            if p == target:
                return p
        raise PartitionClosedError(f"partition {target} of {topic} is no longer in its metadata")

    selector: Any = fixed if partition is not None else (KeyHashSelector() if key is not None else None)
    tally = _Tally()
    interrupted = False
    async with await _session(servers) as session:
        parts = await session.partitions(topic) if selector is not None else []
        if selector is not None and not parts:
            # before the topic exists the broker places each batch itself: -p and -k would be ignored
            option = "--partition" if partition is not None else "--key"
            raise click.ClickException(f"topic {topic!r} does not exist on {servers}; {option} needs its "
                                       f"partitions: create it first (metaq topic create {topic})")
        if partition is not None:
            target = _resolve_option(topic, parts, partition)
        producer = session.create_producer(selector=selector, delivery_timeout_ms=delivery_timeout_ms,
                                           enable_idempotence=idempotent)
        futures: deque[asyncio.Future[Any]] = deque()
        try:
            async for data in _stdin_lines():
                msg = Message(topic, data, attribute=attribute, key=key.encode() if key is not None else None,
                              headers=list(header_specs) or None, deliver_at=deliver_at, delay_ms=delay_ms)
                futures.append(producer.send_async(msg))
                if len(futures) >= DRAIN_EVERY_MESSAGES:
                    await _drain(futures, print_ids, tally)
        except asyncio.CancelledError:  # Ctrl-C: what was handed to the producer is still sent
            interrupted = True
            _uncancel()
        await _drain(futures, print_ids, tally)
        await producer.close()
    click.echo(f"sent {plural(tally.sent, 'message')} to {topic}" + (f", {tally.failed} failed" if tally.failed else "")
               + ("; interrupted" if interrupted else ""), err=True)
    if interrupted:
        raise asyncio.CancelledError  # asyncio.run turns it back into KeyboardInterrupt: exit 130
    if tally.failed:
        sys.exit(1)


def _uncancel() -> None:
    """Carry on after asyncio.run's Ctrl-C cancel (timeouts inside work again); a second Ctrl-C still ends it."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class _Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.failed = 0
        self.errors_shown: set[str] = set()


ERRORS_SHOWN_MAX = 10
"""Different send errors printed; a repeated one is only counted (a missing topic fails every message)."""


async def _drain(futures: deque[asyncio.Future[Any]], print_ids: bool, tally: _Tally) -> None:
    """Await the sends in order, counting and printing them; an interrupt leaves the rest queued."""
    while futures:
        r = await asyncio.shield(futures[0])  # shielded: Ctrl-C must not cancel a send already made
        futures.popleft()
        if r.success:
            tally.sent += 1
            if print_ids:
                mid = format_message_id(r.message_id) if r.message_id >= 0 else "-1 (delayed: assigned at delivery)"
                click.echo(f"{r.partition_id}\t{r.offset}\t{mid}")
        else:
            tally.failed += 1
            text = str(r.error) + (" (it may have been stored)" if getattr(r.error, "maybe_stored", False) else "")
            if text not in tally.errors_shown and len(tally.errors_shown) < ERRORS_SHOWN_MAX:
                tally.errors_shown.add(text)
                click.echo(f"error: {text}", err=True)


async def _stdin_lines() -> AsyncIterator[bytes]:
    """Standard input line by line, read by a daemon thread so that Ctrl-C never waits for a line.

    os.read, not sys.stdin: a thread blocked inside the buffered reader holds its lock, and the
    interpreter needs that lock to shut down.
    """
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)

    def read() -> None:
        try:
            fd = sys.stdin.fileno()
            while True:
                chunk = os.read(fd, STDIN_CHUNK_BYTES)
                asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
                if not chunk:
                    return
        except BaseException:  # the loop is gone (interrupted) or stdin is unreadable: end quietly
            with contextlib.suppress(BaseException):
                loop.call_soon_threadsafe(chunks.put_nowait, b"")

    threading.Thread(target=read, name="metaq-produce-stdin", daemon=True).start()
    rest = b""
    while True:
        chunk = await chunks.get()
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line
    if rest:
        yield rest


def _parse_offset(value: str) -> Literal["earliest", "latest"] | int:
    if value == "earliest":
        return "earliest"
    if value == "latest":
        return "latest"
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter("use earliest, latest or a number >= 0") from None
    if n < 0:
        raise click.BadParameter("use earliest, latest or a number >= 0")
    return n


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
    start = _parse_offset(offset)
    if read_from != "master" and getattr(servers, "zk_connect", None) is None:
        raise click.UsageError(f"--read-from {read_from} needs --zk-connect: slaves are found in ZooKeeper")
    async with await _session(servers, read_from=read_from) as session:
        parts: list[PartitionId] = [p.id for p in await _topic_partitions(session, topic, servers, follow)]
        if partition:
            parts = sorted({_resolve_option(topic, parts, key) for key in partition})
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
            _uncancel()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            out.flush()
    if interrupted:
        click.echo(f"consumed {plural(printed, 'message')} from {topic}; interrupted", err=True)
        raise asyncio.CancelledError  # asyncio.run turns it back into KeyboardInterrupt: exit 130


def _resolve_option(topic: str, partitions: list[Any], partition: PartitionId | int) -> PartitionId:
    """The partition a --partition names among the topic's (a usage error when none or several match)."""
    try:
        found = resolve_partition(topic, partitions, partition)
    except MetaqError as exc:  # a number several brokers have
        raise click.BadParameter(str(exc), param_hint="--partition") from None
    if found is None:
        raise click.BadParameter(f"{topic} has partitions {', '.join(str(p) for p in partitions)}; no {partition}",
                                 param_hint="--partition")
    return found.id


async def _holders(session: MessageSessionFactory, topic: str) -> list[int | None]:
    """The brokers holding ``topic`` (its partitions' broker ids), or [None] (the default broker, which
    then says the topic does not exist)."""
    owners = sorted({p.broker_id for p in await session.partitions(topic)})
    return [*owners] if owners else [None]


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


# -- stats / admin ------------------------------------------------------------------------------


@click.command("stats")
@target_options
@click.option("-t", "--topic", default=None, help="Only this topic.")
@click.option("-b", "--broker-id", type=click.IntRange(0), default=None,
              help="Only this broker (default: every broker of --servers).")
@click.option("--json", "as_json", is_flag=True, help="Print the brokers' JSON documents (a list, one per broker).")
@run_async
async def stats(servers: str, topic: str | None, broker_id: int | None, as_json: bool) -> None:
    """Put/get counts, bytes and rates per topic and partition (MetaQ's stats), of every broker."""
    async with await _session(servers) as session:
        admin = session.admin()
        if broker_id is not None:
            brokers: list[int | None] = [broker_id]
        else:
            brokers = await _holders(session, topic) if topic is not None else [*await admin.broker_ids()]
        docs = [await admin.stats(topic, broker_id=b) for b in brokers]
    if as_json:
        click.echo(json.dumps(docs, indent=2))
        return
    click.echo("topic\tpartition\tput_msgs\tput_bytes\tput_tps\tget_reqs\tget_bytes\tearliest\tlatest")
    for doc in docs:
        click.echo(f"# broker {doc.get('broker_id')} up {doc['uptime_s']:.0f}s, {doc['connections']} connections")
        for tname, t in sorted(doc["topics"].items()):
            for pname, p in sorted(t["partitions"].items(), key=lambda kv: int(kv[0])):
                click.echo("\t".join(str(x) for x in (
                    tname, f"{doc.get('broker_id')}-{pname}", p["put_messages"], p["put_bytes"], p["put_tps"],
                    p["get_requests"], p["get_bytes"], p.get("log_start_offset", "-"), p.get("log_end_offset", "-"))))
        for line in replication_lines(doc):  # a slave's replication section (docs/replication.md#lag)
            click.echo(line)


@click.group("admin")
def admin_group() -> None:
    """Broker administration."""


@admin_group.command("reload")
@target_options
@run_async
async def admin_reload(servers: str) -> None:
    """Re-read the broker's server.ini and apply [topic=...] changes live (as SIGHUP)."""
    async with await _session(servers) as session:
        changed = await session.admin().reload()
    click.echo("reloaded; topics changed: " + (", ".join(changed) or "none"))


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
    async with await _session(servers) as session:
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
    async with await _session(servers) as session:
        loc = await session.admin().lookup_message(message_id)
    click.echo(f"{loc.topic}\t{loc.partition_id}\t{loc.offset}")


def _time_ms(text: str | None, what: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (without a zone: UTC); None -> -1 (open)."""
    if text is None:
        return -1
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither milliseconds since the epoch nor an ISO 8601 time "
                                 "(2026-11-23T13:00:00, 2026-11-23 13:00:00+01:00)", param_hint=what) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(text: str, what: str) -> int:
    """``500ms``, ``10s``, ``5m``, ``2h``, ``1d``; a bare number is seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*(ms|s|m|h|d)?\s*", text)
    if match is None:
        raise click.BadParameter(f"{text!r} is not a duration (500ms, 10s, 5m, 2h, 1d)", param_hint=what)
    return int(match.group(1)) * _DURATION_UNITS_MS[match.group(2) or "s"]


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")


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
    from_ms, to_ms = _time_ms(from_text, "--from"), _time_ms(to_text, "--to")
    if from_ms >= 0 and to_ms >= 0 and to_ms < from_ms:
        raise click.UsageError("--to is before --from")
    async with await _session(servers) as session:
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
        click.echo(f"{f.partition_id}\t{f.offset}\t{format_message_id(f.message_id)}\t{_iso(f.timestamp_ms)}\t{shown}")
    for problem in result.problems:
        click.echo(f"damaged, not searched: {problem}", err=True)
    if result.truncated:
        click.echo(f"(first {limit} shown; more match: narrow the range or raise -n)", err=True)
    if not result.messages:
        click.echo("no messages found", err=True)


# -- group ---------------------------------------------------------------------------------------

_group_zk_connect = zk_connect_option(None, "ZooKeeper, host:port[,host:port] (env METAQ_ZK_CONNECT). Cluster mode: "
                                            "the groups MetaQ keeps in ZooKeeper; --servers is then not used.")


async def _group_session(servers: str, zk_connect: str | None, zk_root: str) -> MessageSessionFactory:
    """A standalone session on --servers, or a cluster-mode one on ZooKeeper (its groups live there)."""
    if zk_connect:
        return await MessageSessionFactory.connect(zk_connect=zk_connect, zk_root=zk_root,
                                                   zk_connection_timeout_ms=10_000,
                                                   **getattr(servers, "client_options", {}))
    return await _session(servers)


def _with_tls(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The TLS flags (:func:`metaq.cli.options.tls_options`) on a command taking a plain ``servers``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, servers: str, tls: bool, ca_file: str | None, cert_file: str | None,
                key_file: str | None, **kwargs: Any) -> Any:
        options = tls_config(tls, ca_file, cert_file, key_file)
        return fn(*args, servers=Target(servers, client_options=options), **kwargs)

    return tls_options(wrapper)


@click.group("group")
def group_group() -> None:
    """Consumer groups: members, assignments, committed offsets, lag; reset offsets (MetaQ's 回溯); dead letters."""


@group_group.command("list")
@servers_option
@_group_zk_connect
@zk_root_option
@_with_tls
@run_async
async def group_list(servers: str, zk_connect: str | None, zk_root: str) -> None:
    """Groups with members or committed offsets."""
    from metaq.client.group.admin import list_groups

    async with await _group_session(servers, zk_connect, zk_root) as session:
        for name in sorted(await list_groups(session)):
            click.echo(name)


@group_group.command("describe")
@servers_option
@_group_zk_connect
@zk_root_option
@_with_tls
@click.argument("group")
@click.option("-t", "--topic", "topics", multiple=True, help="Only these topics (default: those the group has).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@run_async
async def group_describe(servers: str, zk_connect: str | None, zk_root: str, group: str, topics: tuple[str, ...],
                         as_json: bool) -> None:
    """Members and their assignments, and per partition: owner, committed offset, log end, lag."""
    from metaq.client.group.admin import describe_group

    async with await _group_session(servers, zk_connect, zk_root) as session:
        desc = await describe_group(session, group, list(topics) or None)
    if as_json:
        click.echo(json.dumps(desc.as_dict()))
        return
    click.echo(f"group {desc.group}: {desc.state}, generation {desc.generation}, strategy {desc.strategy}, "
               f"{plural(len(desc.members), 'member')}, total lag {desc.total_lag}")
    for mb in desc.members:
        owned = "; ".join(f"{t}: {', '.join(str(p) for p in ps)}" for t, ps in sorted(mb.assignment.items()))
        click.echo(f"  member {mb.member_id} ({mb.client_id}): {owned or 'nothing'}")
    click.echo("topic\tpartition\towner\tcommitted\tlog_end\tlag")
    for pl in desc.partitions:
        click.echo(f"{pl.topic}\t{pl.partition}\t{pl.owner or '-'}\t{pl.committed}\t{pl.log_end}\t{pl.lag}")


@group_group.command("reset")
@servers_option
@_group_zk_connect
@zk_root_option
@_with_tls
@click.argument("group")
@click.argument("topic")
@click.option("--to", "to", default="earliest", show_default=True,
              help="earliest, latest, or an offset number.")
@click.option("--timestamp-ms", type=click.IntRange(0), default=None,
              help="Instead of --to: the first offset at or after this time (ms since the epoch).")
@click.option("-p", "--partition", "partitions", type=PARTITION, multiple=True,
              help="Only these partitions, brokerId-partition (a bare number if only one broker has it); "
                   "default all.")
@click.option("--dry-run", is_flag=True, help="Show what would change without committing.")
@run_async
async def group_reset(servers: str, zk_connect: str | None, zk_root: str, group: str, topic: str, to: str,
                      timestamp_ms: int | None, partitions: tuple[PartitionId | int, ...], dry_run: bool) -> None:
    """Move GROUP's committed offsets on TOPIC (the group must have no active members)."""
    from metaq.client.group.admin import reset_offsets

    target: str | int = _parse_offset(to)
    async with await _group_session(servers, zk_connect, zk_root) as session:
        moved = await reset_offsets(session, group, topic, target, timestamp_ms=timestamp_ms,
                                    partitions=list(partitions) or None, dry_run=dry_run)
    for partition, (old, new) in sorted(moved.items()):
        click.echo(f"{topic}\t{partition}\t{old} -> {new}")
    click.echo(("would reset" if dry_run else "reset")
               + f" {plural(len(moved), 'partition')} of {topic} for group {group}", err=True)


@group_group.command("dlq")
@servers_option
@_group_zk_connect
@zk_root_option
@click.argument("group")
@click.option("-t", "--topic", default=None, help="Only messages dead-lettered from this topic.")
@click.option("-n", "--limit", type=click.IntRange(1), default=None, help="At most this many.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document per line (headers as an object).")
@run_async
async def group_dlq(servers: str, zk_connect: str | None, zk_root: str, group: str, topic: str | None,
                    limit: int | None, as_json: bool) -> None:
    """List GROUP's dead letters (the topic %DLQ%GROUP): where each came from, its deliveries, the last error,
    when, and its other headers. Reads only."""
    from metaq.client.group import dead_letter as dl

    count = 0
    async with await _group_session(servers, zk_connect, zk_root) as session:
        if not as_json:
            click.echo("partition\toffset\ttopic\tfrom\tdeliveries\tdead_lettered\terror\tkey\theaders")
        async for letter in dl.dead_letters(session, group, topic=topic, limit=limit):
            count += 1
            if as_json:
                click.echo(json.dumps(letter.as_dict()))
                continue
            msg = letter.message
            when = letter.header(dl.H_TIME)
            error = f"{letter.header(dl.H_ERROR_TYPE)}: {letter.header(dl.H_ERROR_MESSAGE) or ''}"
            error = error.replace("\n", "\\n").replace("\t", " ")
            if len(error) > 200:
                error = error[:197] + "..."
            others = " ".join(f"{k}={bytes(v).decode(errors='backslashreplace')}" for k, v in letter.original_headers)
            key = msg.key.decode(errors="backslashreplace") if msg.key is not None else "-"
            click.echo(f"{msg.partition_id}\t{msg.offset}\t{letter.original_topic or '-'}\t"
                       f"{letter.header(dl.H_PARTITION) or '-'}@{letter.header(dl.H_OFFSET) or '-'}\t"
                       f"{letter.header(dl.H_DELIVERIES) or '-'}\t"
                       f"{_iso(int(when)) if when and when.isdigit() else '-'}\t{error}\t{key}\t{others or '-'}")
    if not count:
        click.echo(f"no dead letters in {dl.dead_letter_topic(group)}" + (f" from {topic}" if topic else ""),
                   err=True)


class _RedriveProgress:
    """A transient progress bar on stderr while a redrive runs (as ``metaq bench`` shows one), only on a
    terminal and never with --json or --no-progress."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._task: Any = None

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("redrive"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 transient=True, console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("redrive", total=total)
        self._bar.update(self._task, completed=min(done, total), total=total)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@group_group.command("redrive")
@servers_option
@_group_zk_connect
@zk_root_option
@click.argument("group")
@click.option("-t", "--topic", default=None,
              help="Only messages dead-lettered from this topic (the others are passed over for good).")
@click.option("-n", "--limit", type=click.IntRange(1), default=None, help="Send back at most this many.")
@click.option("--dry-run", is_flag=True, help="Count what would be sent back; send and commit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@run_async
async def group_redrive(servers: str, zk_connect: str | None, zk_root: str, group: str, topic: str | None,
                        limit: int | None, dry_run: bool, as_json: bool, no_progress: bool) -> None:
    """Send GROUP's dead letters (%DLQ%GROUP) back to their original topics: same key, payload, attribute and
    headers, the dlq-* headers removed, metaq-redrive-count added. Progress is committed as the group
    GROUP@dlq-redrive, so running it again sends only what was dead-lettered since."""
    from metaq.client.group.dead_letter import dead_letter_topic, redrive, redrive_group

    bar = _RedriveProgress(not (as_json or no_progress))
    try:
        async with await _group_session(servers, zk_connect, zk_root) as session:
            result = await redrive(session, group, topic=topic, limit=limit, dry_run=dry_run, progress=bar.update)
    finally:
        bar.stop()
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        for name, count in sorted(result.redriven.items()):
            click.echo(f"{name}\t{count}")
        verb = "would send back" if dry_run else "sent back"
        extra = [f"{result.skipped} of other topics passed over"] if result.skipped else []
        if result.remaining:
            extra.append(f"{result.remaining} left for the next run")
        click.echo(f"{verb} {plural(result.total, 'message')} from {dead_letter_topic(group)}"
                   + (f" ({'; '.join(extra)})" if extra else "")
                   + ("" if dry_run else f"; progress committed as group {redrive_group(group)}"), err=True)
        for error in result.errors:
            click.echo(f"error: {error}", err=True)
    if result.errors:
        raise click.exceptions.Exit(1)


def register(cli: click.Group) -> None:
    for command in (topic_group, produce, consume, stats, admin_group, group_group):
        cli.add_command(command)
