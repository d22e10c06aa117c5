"""Run a broker process: `metaq broker` and `python -m metaq.broker`.

The process around a :class:`~metaq.broker.service.BrokerService`: logging, the event loop, signals
(SIGTERM and SIGINT stop it cleanly, SIGHUP reloads server.ini), the ready line tests and launchers
wait for, and the exit codes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import stat
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from metaq.broker.cli_options import BrokerHelp, click_options, help_all_option, overrides_from_click
from metaq.errors import ConfigError

if TYPE_CHECKING:
    from metaq.broker.config import BrokerConfig
    from metaq.broker.replication.slave_config import SlaveConfig

# The broker core, its storage and transports are imported by the functions that run it, not here: `metaq
# broker --help` (and a configuration error) then answer without loading them.

log = logging.getLogger("metaq.broker")

SHUTDOWN_DRAIN_S = 10.0
EXIT_CANNOT_START = 1
"""A valid configuration that cannot be served: the port is taken, the data directory is unusable."""
EXIT_BAD_CONFIG = 2
"""The configuration is wrong (server.ini or flags), as for any usage error."""


def install_event_loop(kind: str) -> None:
    """'uvloop' (fast general I/O) or 'asyncio' (its selector loop has native sendfile)."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
            return
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, classes, the configuration, the opened logs and their
    indexes) out of the garbage collector's sight for good (``gc.freeze``).

    Python's full collection walks every tracked object: in a broker that is ~40,000 objects left by start-up
    alone, 10-30 ms with the event loop stopped, once in the first second of traffic and again whenever
    enough new objects have outlived the young generations. Those pauses were the e2e benchmark's p999
    (docs/benchmarks-history.md, "The p999: garbage collection pauses"). Frozen objects are never collected,
    which costs nothing here: what start-up built lives as long as the process, and the garbage made
    before the freeze is collected first."""
    gc.collect()
    gc.freeze()


async def serve(config: BrokerConfig, *, config_path: str | None = None,
                overrides: dict[str, str] | None = None, ready_line: bool = True,
                slave: SlaveConfig | None = None, replica: SlaveConfig | None = None) -> int:
    from metaq.broker.core import Broker
    from metaq.broker.handlers import REQUEST_HANDLERS
    from metaq.broker.service import BrokerService
    from metaq.protocol import messages as m

    loop = asyncio.get_running_loop()
    started = time.monotonic()
    broker = Broker(config, REQUEST_HANDLERS, config_path=config_path, overrides=overrides, slave=slave,
                    replica=replica)
    service = BrokerService(broker)
    await service.start()
    freeze_startup_objects()
    stop = asyncio.Event()

    def on_reload() -> None:
        broker.handle(m.ReloadRequest())  # as `metaq admin reload` does; what it did, or why not, is logged
        service.reload_tls()  # new TLS connections get the certificate files as they are now

    stopped_by: list[int] = []

    def on_stop(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, on_reload)
    n_parts = sum(s.num_partitions for s in broker.topics.values())
    role = f" as slave {slave.slave_id}" if slave is not None else ""
    log.info("broker %d%s serving %d topics / %d partitions from %s (opened in %.2fs)", config.broker_id, role,
             len(broker.topics), n_parts, config.data_path, time.monotonic() - started)
    if ready_line:
        if service.http is not None:
            http_host, http_port = service.http.address
            print(f"metaq http ready {service.http.scheme}://{http_host}:{http_port}", flush=True)
        if service.metrics is not None:
            print(f"metaq broker metrics {service.metrics.url}", flush=True)
        if service.tls_port is not None:
            print(f"metaq broker tls ready {broker.host}:{service.tls_port}", flush=True)
        if service.kafka is not None:
            for line in service.kafka.ready_lines():
                print(line, flush=True)
        print(f"metaq broker ready {broker.host}:{broker.port}", flush=True)
    await stop.wait()
    log.info("stopping: no new connections, finishing in-flight requests")
    await service.stop(SHUTDOWN_DRAIN_S)
    log.info("stopped cleanly")
    return 128 + signal.SIGINT if stopped_by[:1] == [signal.SIGINT] else 0  # Ctrl-C: 130, as a shell expects


def restrict_file_modes(config: BrokerConfig) -> None:
    """fileUmask: the process's umask, so that every file and directory the broker makes is denied what it
    says; and the same taken from dataPath and dataLogPath if they already exist (data written by an older
    broker with 0644 files in 0755 directories is then out of others' reach: a directory they cannot enter)."""
    os.umask(config.file_umask)
    for path in dict.fromkeys((config.data_path, config.tx_log_dir)):
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode & config.file_umask:
                os.chmod(path, mode & ~config.file_umask)
                log.info("%s: mode %04o -> %04o (fileUmask=%03o)", path, mode, mode & ~config.file_umask,
                         config.file_umask)
        except FileNotFoundError:
            continue
        except OSError as exc:  # not the broker's own directory: say so, the broker still starts
            log.warning("cannot restrict the permissions of %s (fileUmask=%03o): %s", path, config.file_umask,
                        exc.strerror or exc)


def run(config: BrokerConfig, *, config_path: str | None = None, overrides: dict[str, str] | None = None,
        event_loop: str = "uvloop", slave: SlaveConfig | None = None, replica: SlaveConfig | None = None) -> int:
    """Serve until SIGTERM; the exit code (0, or EXIT_CANNOT_START after one line on stderr)."""
    from metaq.broker.service import StartupError

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_event_loop(event_loop)
    restrict_file_modes(config)
    try:
        return asyncio.run(serve(config, config_path=config_path, overrides=overrides, slave=slave, replica=replica))
    except StartupError as exc:
        click.echo(f"Error: {exc}", err=True)
        return EXIT_CANNOT_START


@click.command("broker", cls=BrokerHelp, context_settings={"help_option_names": ["-h", "--help"]})
@help_all_option
@click.option("-f", "--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="MetaQ server.ini file ([system], [topic=NAME], [zookeeper] sections).")
@click.option("--event-loop", type=click.Choice(["uvloop", "asyncio"]), default="uvloop", show_default=True,
              help="uvloop is faster for small requests; asyncio's loop sends fetch replies with zero-copy sendfile.")
@click.option("--slave", "as_slave", is_flag=True, default=False,
              help="Run as an async slave of the master of this brokerId (MetaQ's `metaServer.sh start slave`); "
                   "needs ZooKeeper mode. See docs/replication.md.")
@click.option("--slave-config", "slave_config_file", type=click.Path(dir_okay=False), default=None,
              help="MetaQ's async_slave.properties (slaveId, slaveGroup, slaveMaxDelayInMills, "
                   "autoSyncMasterConfig); with --slave.")
@click.option("--slave-id", "slave_id", type=int, default=None,
              help="slaveId (overrides the properties file; default 0); with --slave.")
@click_options()
def broker_command(config_file: str | None, event_loop: str, as_slave: bool, slave_config_file: str | None,
                   slave_id: int | None, **flags: Any) -> None:
    """Run a metaq broker (MetaQ's metaServer). Every server.ini [system] key is also a flag.

    `metaq broker --dataPath ./data` serves on 127.0.0.1:8123; `-f server.ini` reads MetaQ's file (the flags
    given override it). Stop it with Ctrl-C or SIGTERM: it finishes what is in flight, flushes and exits 0.
    """
    from metaq.broker.ini import load_broker_config
    from metaq.broker.replication.slave_config import load_slave_config

    overrides = overrides_from_click(flags)
    slave: SlaveConfig | None = None
    replica: SlaveConfig | None = None
    try:
        config = load_broker_config(config_file, overrides)
        if (slave_config_file is not None or slave_id is not None) and not as_slave and not config.ha_mode:
            raise ConfigError("--slave-config and --slave-id only apply with --slave (or, as the master's replica "
                              "id, with syncReplication or autoFailover)")
        if as_slave or slave_config_file is not None or slave_id is not None:
            replica = load_slave_config(slave_config_file, slave_id)
        if as_slave:
            slave = replica
            if config.zookeeper is None or not config.zookeeper.enable:
                raise ConfigError("--slave needs ZooKeeper mode to find its master: add a [zookeeper] section "
                                  "with zk.zkConnect to server.ini (docs/replication.md)")
        if config.zookeeper is not None and config.zookeeper.enable:
            config.zookeeper.security()  # a ZooKeeper user without its password: one line, not a traceback
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    sys.exit(run(config, config_path=config_file, overrides=overrides, event_loop=event_loop, slave=slave,
                 replica=replica))


def main(argv: list[str] | None = None) -> Any:
    return broker_command.main(args=argv, prog_name="metaq broker")
