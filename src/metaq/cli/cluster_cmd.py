"""`metaq cluster` (what ZooKeeper says of a cluster) and `metaq cluster up` (a local dev cluster in the
foreground). Parsing and printing only: :mod:`metaq.client.cluster_status` reads the cluster,
:class:`metaq.devcluster.DevCluster` runs one."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from metaq.cli.options import (
    DEFAULT_ZK_PORT,
    broker_tls,
    client_security_options,
    zk_connect_option,
    zk_root_option,
    zk_security_of,
)
from metaq.cli.text import plural

if TYPE_CHECKING:
    from metaq.client.cluster_status import ClusterStatus
    from metaq.devcluster import DevCluster

DEFAULT_CLUSTER_DIR = "metaq-cluster"
DEFAULT_BROKER_PORT = 8123


@click.group("cluster", invoke_without_command=True)
@zk_connect_option(f"127.0.0.1:{DEFAULT_ZK_PORT}")
@zk_root_option
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1), default=10.0, show_default=True,
              help="Seconds to wait for ZooKeeper and for each broker.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@client_security_options
@click.pass_context
def cluster_group(ctx: click.Context, zk_connect: str, zk_root: str, timeout_s: float, as_json: bool,
                  client_options: dict[str, Any]) -> None:
    """A cluster of brokers registered in ZooKeeper. Without a command: what ZooKeeper says of it.

    Brokers and their roles, topics with their partitions per broker, consumer groups with their
    members, the owner of each partition and its lag (log end offset, asked of the partition's
    broker, minus the group's committed offset). `metaq cluster up` runs a cluster on this machine.
    """
    ctx.obj = _ClusterTarget(zk_connect, zk_root, timeout_s, client_options)
    if ctx.invoked_subcommand is not None:
        return
    from metaq.client.cluster_status import read_cluster_status
    from metaq.errors import MetaqError

    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # its reconnection chatter; failures are ours to say
    try:
        status = read_cluster_status(zk_connect, zk_root, timeout_s=timeout_s,
                                     username=client_options.get("sasl_username"),
                                     password=client_options.get("sasl_password"), tls=broker_tls(client_options),
                                     zk_security=zk_security_of(client_options))
    except MetaqError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(status.to_json()))
    else:
        _print_status(status)
    for problem in status.problems:
        click.echo(f"warning: {problem}", err=True)


@dataclass(frozen=True)
class _ClusterTarget:
    """What ``metaq cluster``'s own options say, for its subcommands (``secure``)."""

    zk_connect: str
    zk_root: str
    timeout_s: float
    client_options: dict[str, Any]


def _print_status(status: ClusterStatus) -> None:
    click.echo(f"ZooKeeper {status.zk_connect}, root {status.zk_root}")
    click.echo("")
    if not status.brokers:
        click.echo(f"no broker is registered under {status.zk_root}")
    else:
        click.echo(f"{plural(len(status.brokers), 'broker')}")
        rows = [[str(b.broker_id), "master", b.master or "(none)"] for b in status.brokers]
        rows += [[str(b.broker_id), f"slave{s}", a] for b in status.brokers for s, a in b.slaves.items()]
        _table(["id", "role", "address"], sorted(rows, key=lambda r: (int(r[0]), r[1] != "master", r[1])))
    if status.replication:
        click.echo("")
        _print_replication(status)
    click.echo("")
    click.echo(f"{plural(len(status.topics), 'topic')}" + (" (partitions per broker: publish/subscribe)"
                                                          if status.topics else ""))
    if status.topics:
        ids = sorted({b for t in status.topics for b in (*t.publish, *t.subscribe)})
        _table(["topic", "partitions", *(f"broker {b}" for b in ids)],
               [[t.topic, str(t.partitions), *(f"{t.publish.get(b, '-')}/{t.subscribe.get(b, '-')}"
                                                if b in t.publish or b in t.subscribe else "" for b in ids)]
                for t in status.topics])
    click.echo("")
    click.echo(f"{plural(len(status.groups), 'consumer group')}")
    for g in status.groups:
        click.echo("")
        click.echo(f"group {g.group}: {plural(len(g.members), 'member')}, lag {g.lag:,}")
        for member, topics in g.members.items():
            click.echo(f"  member {member}  ({', '.join(topics) or 'no topics'})")
        if g.partitions:
            _table(["topic", "partition", "owner", "committed", "log end", "lag"],
                   [[p.topic, str(p.partition), p.owner or "-", _num(p.committed), _num(p.log_end), _num(p.lag)]
                    for p in g.partitions], indent="  ")


def _print_replication(status: ClusterStatus) -> None:
    """Each replica group's master and slaves, and per slave its lag per partition (as the slave says)."""
    click.echo(f"{plural(len(status.replication), 'replica group')} (lag as each slave last heard from its master)")
    for group in status.replication:
        master = group.master or "(none: the master is gone; its slaves serve reads only)"
        ha = ""
        if group.ha is not None:
            in_sync = ", ".join(f"slave{r}" for r in sorted(group.ha.isr)) or "none"
            ha = f" (HA: replica {group.ha.master} is master, epoch {group.ha.epoch}, in sync: {in_sync})"
        click.echo(f"  broker {group.broker_id}: master {master}, {plural(len(group.slaves), 'slave')}{ha}")
        for slave in group.slaves:
            if slave.error is not None:
                click.echo(f"    slave{slave.slave_id} {slave.address}: lag unknown ({slave.error})")
                continue
            following = slave.following or "(no master found yet)"
            if group.master is None:
                following = "no master (it is gone)"
            stalled = sum(1 for r in slave.partitions if r.stalled)
            click.echo(f"    slave{slave.slave_id} {slave.address}: follows {following}, max lag "
                       f"{_num(slave.max_lag_messages)} messages, {_num(slave.max_lag_ms)} ms"
                       + (f", {stalled} stalled" if stalled else ""))
            if slave.partitions:
                _table(["topic", "partition", "slave end", "master end", "lag", "lag ms", "state"],
                       [[r.topic, str(r.partition), _num(r.log_end), _num(r.master_end), _num(r.lag_messages),
                         _num(r.lag_ms), "stalled" if r.stalled else ("caught up" if r.lag_messages == 0 else
                                                                     "behind" if r.lag_messages else "waiting")]
                        for r in slave.partitions], indent="      ")


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _table(header: list[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> None:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=True)]
    for row in [header, *rows]:
        click.echo(indent + "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())


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
@click.option("--secure", is_flag=True,
              help="ZooKeeper with SASL and the brokers with ZooKeeper ACLs (zk.zkSaslUser=metaq, zk.zkSetAcl): "
                   "anonymous ZooKeeper clients can read but change nothing of metaq's. The brokers' ZooKeeper "
                   "password is kept in DIR/zookeeper/metaq.password.")
def cluster_up(brokers: int, directory: str, clean: bool, port: int, zk_port: int, zk_root: str, partitions: int,
               topics: tuple[str, ...], secure: bool) -> None:
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
                             topics=sections, secure=secure)
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


@cluster_group.command("secure")
@click.option("--group-owner", default=None, metavar="ZK_USER",
              help="Also give consumer groups' nodes to this ZooKeeper user (the consumers' --zk-user); without "
                   "it they are left as they are.")
@click.option("--dry-run", is_flag=True, help="Print what would change; change nothing.")
@click.pass_obj
def cluster_secure(target: _ClusterTarget, group_owner: str | None, dry_run: bool) -> None:
    """Put ZooKeeper ACLs on every metaq znode under --zk-root that exists now (for a cluster that ran without
    zk.zkSetAcl): the --zk-user (the brokers' ZooKeeper user) may change them, anyone may read them but the
    users' credentials and the ACLs, which only it may read. Run it as the brokers' user, once the brokers
    have zk.zkSaslUser and zk.zkSetAcl set. docs/security.md#zookeeper."""
    from metaq.cluster.registry import RegistryError
    from metaq.cluster.zk_security import describe_acl
    from metaq.cluster.zookeeper import ZooKeeperRegistry

    security = zk_security_of(target.client_options)
    if security.sasl_user is None:
        raise click.UsageError("give the brokers' ZooKeeper user: --zk-user (env METAQ_ZK_USER) and METAQ_ZK_PASSWORD")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    registry = ZooKeeperRegistry(target.zk_connect, target.zk_root, connection_timeout_ms=int(target.timeout_s * 1000),
                                 watch_cluster=False, read_only=True, security=security)
    try:
        registry.start()
        report = registry.secure(group_owner=group_owner, dry_run=dry_run)
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        registry.close()
    for path, before, after in report.changed:
        click.echo(f"{path}\t{describe_acl(before)} -> {describe_acl(after)}")
    verb = "would set" if dry_run else "set"
    click.echo(f"{verb} the ACL of {plural(len(report.changed), 'node')}; {report.unchanged} already had it"
               + (f"; {plural(len(report.left_open), 'consumer group node')} left as they are (--group-owner)"
                  if report.left_open else ""), err=True)
    for path, why in report.failed:
        click.echo(f"error: {path}: {why}", err=True)
    if report.failed:
        raise click.exceptions.Exit(1)


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
    if cluster.secure:
        password_file = _shown(cluster.zookeeper.directory / "metaq.password")
        click.echo(f"  export METAQ_ZK_USER=metaq METAQ_ZK_PASSWORD=$(cat {password_file})   # ZooKeeper's ACLs: "
                   "only this user changes metaq's znodes")
    if not topics:
        click.echo(f"  for b in {ids}; do metaq topic create {topic} -b $b; done   # {topic} on every broker")
    click.echo(f"  seq 1000 | metaq produce {topic}      # round robin over every broker's partitions")
    click.echo("  metaq cluster                        # brokers, topics and groups, from ZooKeeper")
    click.echo("Ctrl-C stops the brokers, then ZooKeeper.")
    sys.stdout.flush()

