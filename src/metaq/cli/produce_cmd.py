"""`metaq produce`: standard input to a topic, one message a line. Parsing and printing only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import click

from metaq.cli.options import PARTITION, target_options
from metaq.cli.session import open_session, resolve_partition_option, run_async, uncancel
from metaq.cli.text import plural
from metaq.cli.values import duration_ms, time_ms
from metaq.client import Message
from metaq.errors import InvalidArgument, PartitionClosedError
from metaq.types import DEFAULT_MAX_MESSAGE_BYTES, PartitionId, format_message_id

STDIN_CHUNK_BYTES = 1 << 16
DRAIN_EVERY_MESSAGES = 10_000


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
@click.option("--max-message-bytes", type=click.IntRange(1), default=DEFAULT_MAX_MESSAGE_BYTES, show_default=True,
              help="Largest message (a line, encoded) the producer sends; the broker's own limit is its "
                   "maxMessageSize (server.ini), which must be raised with it.")
@click.option("--delivery-timeout-ms", type=click.FloatRange(min=1), default=120_000.0, show_default=True,
              help="How long a message may wait for its broker or the next master before it fails "
                   "(docs/producer.md).")
@click.option("--idempotent", is_flag=True,
              help="Stamp batches so that a resend is stored once (docs/transactions.md).")
@run_async
async def produce(servers: str, topic: str, key: str | None, attribute: str | None,
                  header_specs: list[tuple[str, bytes]], partition: PartitionId | int | None,
                  print_ids: bool, delay_text: str | None, deliver_at_text: str | None,
                  max_message_bytes: int, delivery_timeout_ms: float, idempotent: bool) -> None:
    """Send each line of standard input to TOPIC as one message (the newline is not sent).

    A TOPIC that does not exist is created by the broker if it allows it (autoCreateTopics), except
    with --partition or --key, which need the topic's partitions: then it is an error.

    Ctrl-C stops reading: the lines already read are sent and acknowledged, the count is printed and
    the exit code is 130.
    """
    from metaq.client.selectors import KeyHashSelector

    if delay_text is not None and deliver_at_text is not None:
        raise click.UsageError("give --delay or --deliver-at, not both")
    delay_ms = duration_ms(delay_text, "--delay") if delay_text is not None else None
    deliver_at = time_ms(deliver_at_text, "--deliver-at") if deliver_at_text is not None else None
    target: PartitionId | None = None

    def fixed(_topic: str, partitions: Any, _message: Message) -> Any:
        for p in partitions:
            if p == target:
                return p
        raise PartitionClosedError(f"partition {target} of {topic} is no longer in its metadata")

    selector: Any = fixed if partition is not None else (KeyHashSelector() if key is not None else None)
    tally = _Tally()
    interrupted = False
    async with await open_session(servers) as session:
        parts = await session.partitions(topic) if selector is not None else []
        if selector is not None and not parts:
            # before the topic exists the broker places each batch itself: -p and -k would be ignored
            option = "--partition" if partition is not None else "--key"
            raise click.ClickException(f"topic {topic!r} does not exist on {servers}; {option} needs its "
                                       f"partitions: create it first (metaq topic create {topic})")
        if partition is not None:
            target = resolve_partition_option(topic, parts, partition)
        producer = session.create_producer(selector=selector, max_message_bytes=max_message_bytes,
                                           delivery_timeout_ms=delivery_timeout_ms, enable_idempotence=idempotent)
        futures: deque[asyncio.Future[Any]] = deque()
        try:
            async for data in _stdin_lines():
                msg = Message(topic, data, attribute=attribute, key=key.encode() if key is not None else None,
                              headers=list(header_specs) or None, deliver_at=deliver_at, delay_ms=delay_ms)
                try:
                    futures.append(producer.send_async(msg))
                except InvalidArgument as exc:  # the producer's own limit: name the flag that sets it here
                    raise click.ClickException(str(exc).replace("max_message_bytes", "--max-message-bytes")) from None
                if len(futures) >= DRAIN_EVERY_MESSAGES:
                    await _drain(futures, print_ids, tally)
        except asyncio.CancelledError:  # Ctrl-C: what was handed to the producer is still sent
            interrupted = True
            uncancel()
        await _drain(futures, print_ids, tally)
        await producer.close()
    click.echo(f"sent {plural(tally.sent, 'message')} to {topic}" + (f", {tally.failed} failed" if tally.failed else "")
               + ("; interrupted" if interrupted else ""), err=True)
    if interrupted:
        raise asyncio.CancelledError  # asyncio.run turns it back into KeyboardInterrupt: exit 130
    if tally.failed:
        sys.exit(1)


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

