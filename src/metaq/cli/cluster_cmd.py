"""`metaq cluster up`: a local dev cluster in the foreground. Parsing and printing only; the
orchestration is :class:`metaq.devcluster.DevCluster`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from metaq.cli.text import plural

if TYPE_CHECKING:
    from metaq.devcluster import DevCluster

DEFAULT_CLUSTER_DIR = "metaq-cluster"
DEFAULT_ZK_PORT = 2181
DEFAULT_BROKER_PORT = 8123


@click.group("cluster", invoke_without_command=True)
@click.pass_context
def cluster_group(ctx: click.Context) -> None:
    """A cluster of brokers registered in ZooKeeper: `metaq cluster up` runs one on this machine."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@cluster_group.command("up")
@click.option("-n", "--brokers", type=click.IntRange(1, 16), default=3, show_default=True,
              help="Broker processes (brokerId 1..N).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=DEFAULT_CLUSTER_DIR, show_default=True,
              help="Where ZooKeeper and the brokers keep their data, configs and logs (kept across runs).")
@click.option("--clean", is_flag=True, help="Delete --dir first: start with no topics and no messages.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_BROKER_PORT, show_default=True,
              help="Port of broker 1; broker N gets PORT+N-1 (0: ports the kernel picks).")
@click.option("--zk-port", type=click.IntRange(0, 65535), default=DEFAULT_ZK_PORT, show_default=True,
              help="ZooKeeper's port (0: a port the kernel picks).")
@click.option("--zk-root", default="/meta", show_default=True, help="ZooKeeper path the cluster registers under.")
@click.option("-p", "--partitions", type=click.IntRange(1, 10_000), default=2, show_default=True,
              help="numPartitions of every broker: a topic's partitions on each broker.")
@click.option("-t", "--topic", "topics", multiple=True,
              help="Create this topic on every broker at start, with --partitions on each (repeatable).")
def cluster_up(brokers: int, directory: str, clean: bool, port: int, zk_port: int, zk_root: str, partitions: int,
               topics: tuple[str, ...]) -> None:
    """Run ZooKeeper and N brokers in ZooKeeper mode on 127.0.0.1, in the foreground.

    Prints what runs and how to reach it; Ctrl-C (or SIGTERM) stops the brokers, then ZooKeeper.
    """
    from metaq.devcluster import DevCluster, DevClusterError, ZooKeeperUnavailable
    from metaq.errors import InvalidArgument
    from metaq.types import validate_topic

    for topic in topics:
        try:
            validate_topic(topic)
        except InvalidArgument as exc:
            raise click.BadParameter(str(exc), param_hint="--topic") from None
    if clean:
        shutil.rmtree(directory, ignore_errors=True)
    sections = "".join(f"[topic={t}]\nnumPartitions={partitions}\n\n" for t in topics)
    try:
        cluster = DevCluster(directory, brokers, port=port, zk_port=zk_port, zk_root=zk_root, partitions=partitions,
                             topics=sections)
    except DevClusterError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"starting ZooKeeper and {plural(brokers, 'broker')} under {_shown(cluster.directory)}/ ...")
    try:
        cluster.start()
    except ZooKeeperUnavailable as exc:
        raise click.ClickException(f"{exc}. `metaq cluster up` runs a real ZooKeeper: install it "
                                   "(Debian/Ubuntu: apt-get install zookeeper; this repository: "
                                   "bash scripts/system-deps.sh)") from None
    except DevClusterError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        _print_running(cluster, topics)
        code = cluster.serve(lambda line: click.echo(line, err=True))
    finally:
        cluster.stop()
    sys.exit(code)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _print_running(cluster: DevCluster, topics: tuple[str, ...]) -> None:
    zk = cluster.zookeeper
    assert zk.proc is not None
    click.echo(f"ZooKeeper   {zk.connect_string:<21} pid {zk.proc.pid:<8} {_shown(zk.directory)}/ "
               f"(log {_shown(zk.log_path)})")
    for b in cluster.info():
        click.echo(f"broker {b.broker_id:<4} {b.address:<21} pid {b.pid:<8} {_shown(b.data_dir)}/ "
                   f"(config {_shown(b.config_path)}, log {_shown(b.log_path)})")
    click.echo("")
    click.echo(f"servers     {cluster.servers}")
    click.echo(f"zk_connect  {cluster.zk_connect}   (zk root {cluster.zk_root})")
    click.echo("")
    ids = " ".join(str(b) for b in cluster.brokers)
    topic = topics[0] if topics else "orders"
    click.echo("Try it from another shell:")
    click.echo(f"  export METAQ_SERVERS={cluster.servers} METAQ_ZK_CONNECT={cluster.zk_connect}"
               + (f" METAQ_ZK_ROOT={cluster.zk_root}" if cluster.zk_root != "/meta" else ""))
    if not topics:
        click.echo(f"  for b in {ids}; do metaq topic create {topic} -b $b; done   # {topic} on every broker")
    click.echo(f"  seq 1000 | metaq produce {topic}      # round robin over every broker's partitions")
    click.echo("  metaq cluster                        # brokers, topics and groups, from ZooKeeper")
    click.echo("Ctrl-C stops the brokers, then ZooKeeper.")
    sys.stdout.flush()


def register(cli: click.Group) -> None:
    cli.add_command(cluster_group)
