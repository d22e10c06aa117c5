"""Run a broker process: `metaq broker` and `python -m metaq.broker`."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import sys
import time
from typing import Any

import click

from metaq.broker.cli_options import click_options, overrides_from_click
from metaq.broker.config import BrokerConfig
from metaq.broker.cron import next_run_ms
from metaq.broker.ini import load_broker_config
from metaq.broker.server import (
    Broker,
    BrokerProtocol,
    ConnectionLimits,
    ConnectionRegistry,
)
from metaq.errors import ConfigError, StorageError

log = logging.getLogger("metaq.broker")

SHUTDOWN_DRAIN_S = 10.0
STATS_WINDOW_S = 10.0
RETENTION_RESCHEDULE_S = 1.0
"""How often the retention loop looks for new topics and changed schedules (a dict walk: cheap)."""


def install_event_loop(kind: str) -> None:
    """'uvloop' (fast general I/O) or 'asyncio' (its selector loop has native sendfile)."""
    if kind == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed; using asyncio's event loop")
            return
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


class StartupError(Exception):
    """The broker cannot start with a valid configuration (port taken, data directory unusable).

    Its message is the one line the broker prints before exiting with :data:`EXIT_CANNOT_START`.
    """


EXIT_CANNOT_START = 1
"""A valid configuration that cannot be served: the port is taken, the data directory is unusable."""
EXIT_BAD_CONFIG = 2
"""The configuration is wrong (server.ini or flags), as for any usage error."""


async def _listen(broker: Broker, registry: ConnectionRegistry, config: BrokerConfig) -> asyncio.Server:
    """Bind the port (not serving yet): a port in use is found before the data directory is touched."""
    loop = asyncio.get_running_loop()
    where = f"{config.host_name}:{config.server_port}"
    try:
        return await loop.create_server(lambda: BrokerProtocol(broker, registry), config.host_name,
                                        config.server_port, backlog=4096, reuse_address=True,
                                        start_serving=False)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            reason = "the address is already in use (another broker? choose another serverPort)"
        raise StartupError(f"cannot listen on {where}: {reason}") from None


def _open_data(broker: Broker, config: BrokerConfig) -> None:
    """Create or open the data directory and everything in it (blocking: run in an executor)."""
    path = config.data_path
    if path.exists() and not path.is_dir():
        raise StartupError(f"dataPath {path} is not a directory")
    try:
        broker.open()
    except (OSError, StorageError, ConfigError) as exc:
        if isinstance(exc, OSError):
            detail = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        else:
            detail = str(exc)
        raise StartupError(f"cannot open dataPath {path}: {detail}") from None


async def serve(config: BrokerConfig, *, config_path: str | None = None,
                overrides: dict[str, str] | None = None, ready_line: bool = True) -> int:
    loop = asyncio.get_running_loop()
    broker = Broker(config, config_path=config_path)
    broker.cli_overrides = dict(overrides or {})
    started = time.monotonic()
    registry = ConnectionRegistry(ConnectionLimits.from_config(config), broker.stats)
    server = await _listen(broker, registry, config)
    try:
        await loop.run_in_executor(None, _open_data, broker, config)
    except BaseException:
        server.close()
        raise
    await server.start_serving()
    sock = server.sockets[0]
    broker.host, broker.port = sock.getsockname()[:2]
    stop = asyncio.Event()

    def on_reload() -> None:
        if not config_path:
            log.warning("SIGHUP ignored: the broker was started without -f server.ini")
            return
        try:
            changed = broker.reload(load_broker_config(config_path, broker.cli_overrides))
            log.info("reloaded %s: topics changed: %s", config_path, ", ".join(changed) or "none")
        except Exception as exc:
            log.error("reload of %s refused: %s", config_path, exc)

    stopped_by: list[int] = []

    def on_stop(sig: int) -> None:
        stopped_by.append(sig)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, on_reload)
    tasks = [loop.create_task(_roll_stats(broker)), loop.create_task(_retention(broker)),
             loop.create_task(registry.run_sweeper())]
    if config.verify_after_unclean_start:
        tasks.append(loop.create_task(_verify_unclean(broker)))
    n_parts = sum(s.num_partitions for s in broker.topics.values())
    log.info("broker %d serving %d topics / %d partitions from %s (opened in %.2fs)", config.broker_id,
             len(broker.topics), n_parts, config.data_path, time.monotonic() - started)
    if ready_line:
        print(f"metaq broker ready {broker.host}:{broker.port}", flush=True)
    await stop.wait()
    log.info("stopping: no new connections, finishing in-flight requests")
    server.close()
    await broker.drain(SHUTDOWN_DRAIN_S)
    for t in tasks:
        t.cancel()
    await loop.run_in_executor(None, broker.close)
    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 1.0)
    log.info("stopped cleanly")
    return 128 + signal.SIGINT if stopped_by[:1] == [signal.SIGINT] else 0  # Ctrl-C: 130, as a shell expects


async def _roll_stats(broker: Broker) -> None:
    while True:
        await asyncio.sleep(STATS_WINDOW_S)
        broker.stats.roll_window()


async def _verify_unclean(broker: Broker) -> None:
    """Scrub, one at a time in a worker thread, the partitions this start recovered from an unclean stop.

    Recovery checks the newest segment of each; damage elsewhere (a bad sector, a flipped bit) would
    otherwise wait for a consumer to reach it. Damage found is logged by the log and shown in stats.
    """
    loop = asyncio.get_running_loop()
    targets = [plog for plog in broker.logs.logs() if not plog.recovery.clean]
    if not targets:
        return
    started = time.monotonic()
    log.info("verifying %d partitions recovered from an unclean stop, in the background", len(targets))
    damaged = 0
    for plog in targets:
        if broker.stopping:
            return
        try:
            report = await loop.run_in_executor(None, plog.verify)
        except StorageError as exc:  # closed or deleted meanwhile
            log.info("verify of %s-%d skipped: %s", plog.topic, plog.partition, exc)
            continue
        damaged += not report.ok
    log.info("verified %d partitions after the unclean stop in %.1fs: %s", len(targets), time.monotonic() - started,
             f"{damaged} with damage (see the errors above, `metaq stats`)" if damaged else "all intact")


async def _retention(broker: Broker) -> None:
    """Apply each topic's deletePolicy on its own deleteWhen cron schedule ([topic=...] may override it).

    Re-reads the schedule at least every RETENTION_RESCHEDULE_S so reloads and new topics are picked up.
    """
    loop = asyncio.get_running_loop()
    next_due: dict[str, int] = {}
    while True:
        now_ms = int(time.time() * 1000)
        by_expr: dict[str, list[str]] = {}
        for topic, state in list(broker.topics.items()):
            by_expr.setdefault(state.settings.delete_when, []).append(topic)
        for expr in list(next_due):
            if expr not in by_expr:
                del next_due[expr]
        for expr in by_expr:
            if expr not in next_due:
                next_due[expr] = next_run_ms(expr, now_ms)
        for expr, due_ms in list(next_due.items()):
            if due_ms > now_ms:
                continue
            topics = by_expr[expr]
            try:
                outcome = await loop.run_in_executor(None, broker.apply_retention, topics)
                log.info("retention (%s) on %d topics removed %s%s", expr, len(topics), outcome.removed or "nothing",
                         f"; {len(outcome.failures)} partition(s) failed" if outcome.failures else "")
            except Exception:  # retention failing must not stop the broker
                log.exception("retention run failed")
            next_due[expr] = next_run_ms(expr, int(time.time() * 1000))
        wait_ms = min([d - int(time.time() * 1000) for d in next_due.values()], default=RETENTION_RESCHEDULE_S * 1000)
        await asyncio.sleep(max(0.0, min(wait_ms / 1000, RETENTION_RESCHEDULE_S)))


def run(config: BrokerConfig, *, config_path: str | None = None, overrides: dict[str, str] | None = None,
        event_loop: str = "uvloop") -> int:
    """Serve until SIGTERM; the exit code (0, or EXIT_CANNOT_START after one line on stderr)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_event_loop(event_loop)
    try:
        return asyncio.run(serve(config, config_path=config_path, overrides=overrides))
    except StartupError as exc:
        click.echo(f"Error: {exc}", err=True)
        return EXIT_CANNOT_START


@click.command("broker", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-f", "--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="MetaQ server.ini file ([system], [topic=NAME], [zookeeper] sections).")
@click.option("--event-loop", type=click.Choice(["uvloop", "asyncio"]), default="uvloop", show_default=True,
              help="uvloop is faster for small requests; asyncio's loop sends fetch replies with zero-copy sendfile.")
@click_options()
def broker_command(config_file: str | None, event_loop: str, **flags: Any) -> None:
    """Run a metaq broker (MetaQ's metaServer). Every server.ini [system] key is also a flag."""
    overrides = overrides_from_click(flags)
    try:
        config = load_broker_config(config_file, overrides)
    except ConfigError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    for warning in config.warnings:
        click.echo(f"warning: {warning}", err=True)
    sys.exit(run(config, config_path=config_file, overrides=overrides, event_loop=event_loop))


def main(argv: list[str] | None = None) -> Any:
    return broker_command.main(args=argv, prog_name="metaq broker")
