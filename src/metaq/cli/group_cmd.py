"""`metaq group`: consumer groups (members, assignments, offsets, lag), offset resets and dead letters.
Parsing and printing only."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from metaq.cli.options import (
    PARTITION,
    Target,
    client_security_options,
    servers_option,
    zk_connect_option,
    zk_root_option,
)
from metaq.cli.session import open_session, run_async
from metaq.cli.text import iso_ms, plural
from metaq.cli.values import parse_offset
from metaq.client import MessageSessionFactory
from metaq.types import PartitionId

_group_zk_connect = zk_connect_option(None, "ZooKeeper, host:port[,host:port] (env METAQ_ZK_CONNECT). Cluster mode: "
                                            "the groups MetaQ keeps in ZooKeeper; --servers is then not used.")


async def _group_session(servers: str, zk_connect: str | None, zk_root: str) -> MessageSessionFactory:
    """A standalone session on --servers, or a cluster-mode one on ZooKeeper (its groups live there)."""
    if zk_connect:
        return await MessageSessionFactory.connect(zk_connect=zk_connect, zk_root=zk_root,
                                                   zk_connection_timeout_ms=10_000,
                                                   **getattr(servers, "client_options", {}))
    return await open_session(servers)


def _with_security(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The security flags (:func:`metaq.cli.options.client_security_options`: TLS, SASL, ZooKeeper's) on a
    command taking a plain ``servers`` and its own ``--zk-connect``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, servers: str, client_options: dict[str, Any], **kwargs: Any) -> Any:
        return fn(*args, servers=Target(servers, client_options=client_options), **kwargs)

    return client_security_options(wrapper)


@click.group("group")
def group_group() -> None:
    """Consumer groups: members, assignments, committed offsets, lag; reset offsets (MetaQ's 回溯); dead letters."""


@group_group.command("list")
@servers_option
@_group_zk_connect
@zk_root_option
@_with_security
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
@_with_security
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
    for server in desc.unreachable:
        click.echo(f"  not answering (its members, owners and offsets are missing): {server}")
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
@_with_security
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

    target: str | int = parse_offset(to)
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
@_with_security
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
                       f"{iso_ms(int(when)) if when and when.isdigit() else '-'}\t{error}\t{key}\t{others or '-'}")
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
@_with_security
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

