"""`metaq` — one command with subcommands, click conventions: --help everywhere.

Exit codes: 0 ok, 1 error (one line on stderr, no traceback), 2 usage, 130 interrupted (Ctrl-C,
SIGINT): Ctrl-C is the normal way to stop `consume --follow`, `produce` from a terminal, `bench` and
`broker`, so it ends the command quietly (no "Aborted!", no traceback) after it has cleaned up.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from metaq import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what a shell reports for a command stopped by Ctrl-C."""

COMMANDS: dict[str, tuple[str, str, str]] = {
    "acl": ("metaq.cli.acl_cmd", "acl_group",
            "ACLs (who may do what to which topic, group or the cluster) and users (SASL/SCRAM); docs/security.md."),
    "admin": ("metaq.cli.admin_cmd", "admin_group", "Broker administration."),
    "bench": ("metaq.cli.bench_cmd", "bench_group",
              "Measure metaq on this machine: each bench starts what it measures (a broker, a cluster, peers) unless "
              "told where it runs, and gives its figures beside a baseline measured in the same run."),
    "broker": ("metaq.broker.main", "broker_command", "Run a metaq broker (MetaQ's metaServer)."),
    "cluster": ("metaq.cli.cluster_cmd", "cluster_group", "A cluster of brokers registered in ZooKeeper."),
    "consume": ("metaq.cli.consume_cmd", "consume", "Print TOPIC's messages, partition by partition in offset order."),
    "group": ("metaq.cli.group_cmd", "group_group",
              "Consumer groups: members, assignments, committed offsets, lag; reset offsets (MetaQ's 回溯); "
              "dead letters."),
    "produce": ("metaq.cli.produce_cmd", "produce",
                "Send each line of standard input to TOPIC as one message (the newline is not sent)."),
    "stats": ("metaq.cli.stats_cmd", "stats",
              "Put/get counts, bytes and rates per topic and partition (MetaQ's stats), of every broker."),
    "topic": ("metaq.cli.topic_cmd", "topic_group", "Create, delete, list, describe, close and open topics."),
}
"""Command name -> (module, attribute, the short help ``metaq --help`` shows).

A command's module is imported only when that command runs (or its own --help is asked): ``metaq --version``
and ``metaq --help`` import none of them, and ``metaq produce`` not the broker. The short help is written here
for the same reason; tests/unit/cli/test_cli_startup.py keeps it equal to each command's own."""


class LazyGroup(click.Group):
    """A group whose subcommands are imported by name, on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2] if name in COMMANDS else self.commands[name].get_short_help_str(200))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="metaq")
def cli() -> None:
    """metaq: a persistent, pull-based message queue after Taobao's MetaQ.

    Start a broker with `metaq broker`, then produce and consume with `metaq produce TOPIC` and
    `metaq consume TOPIC`. Every command takes --help. Exit codes: 0 ok, 1 error, 2 usage, 130 Ctrl-C.
    """


def _interrupted(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return False


def _quiet_broken_pipe() -> None:
    """The reader of our stdout went away (`metaq consume t | head`): nothing more can be written."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: list[str] | None = None) -> Any:
    """Run the CLI with click's conventions, except that Ctrl-C exits 130 without "Aborted!"."""
    try:
        code = cli.main(args=argv, prog_name="metaq", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort as exc:
        if _interrupted(exc):
            sys.exit(EXIT_INTERRUPTED)
        click.echo("Aborted!", err=True)  # a confirmation answered no, or stdin closed at a prompt
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        _quiet_broken_pipe()
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)  # --help and --version return 0 here


if __name__ == "__main__":  # pragma: no cover
    main()
