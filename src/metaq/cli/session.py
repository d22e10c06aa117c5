"""What the client commands share: running an async command body, the session it talks through, and
the partitions a ``--partition`` names. Parsing and printing stay in each command's module."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from metaq.cli.options import Target
from metaq.client import MessageSessionFactory
from metaq.client.metadata import resolve_partition
from metaq.errors import MetaqError
from metaq.types import PartitionId

T = TypeVar("T")


def run_async(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command body; a metaq error becomes a one-line message and exit code 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except MetaqError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


async def open_session(servers: str, **config: Any) -> MessageSessionFactory:
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


def resolve_partition_option(topic: str, partitions: list[Any], partition: PartitionId | int) -> PartitionId:
    """The partition a --partition names among the topic's (a usage error when none or several match)."""
    try:
        found = resolve_partition(topic, partitions, partition)
    except MetaqError as exc:  # a number several brokers have
        raise click.BadParameter(str(exc), param_hint="--partition") from None
    if found is None:
        raise click.BadParameter(f"{topic} has partitions {', '.join(str(p) for p in partitions)}; no {partition}",
                                 param_hint="--partition")
    return found.id


async def holders(session: MessageSessionFactory, topic: str) -> list[int | None]:
    """The brokers holding ``topic`` (its partitions' broker ids), or [None] (the default broker, which
    then says the topic does not exist)."""
    owners = sorted({p.broker_id for p in await session.partitions(topic)})
    return [*owners] if owners else [None]


def uncancel() -> None:
    """Carry on after asyncio.run's Ctrl-C cancel (timeouts inside work again); a second Ctrl-C still ends it."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
