"""`metaq` — one command with subcommands, click conventions: --help everywhere.

Exit codes: 0 ok, 1 error (one line on stderr, no traceback), 2 usage, 130 interrupted (Ctrl-C,
SIGINT): Ctrl-C is the normal way to stop `consume --follow`, `produce` from a terminal, `bench` and
`broker`, so it ends the command quietly (no "Aborted!", no traceback) after it has cleaned up.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from metaq import __version__
from metaq.broker.main import broker_command

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what a shell reports for a command stopped by Ctrl-C."""


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="metaq")
def cli() -> None:
    """metaq: a persistent, pull-based message queue after Taobao's MetaQ.

    Start a broker with `metaq broker`, then produce and consume with `metaq produce TOPIC` and
    `metaq consume TOPIC`. Every command takes --help. Exit codes: 0 ok, 1 error, 2 usage, 130 Ctrl-C.
    """


cli.add_command(broker_command, "broker")


def _register_client_commands() -> None:
    from metaq.cli import (
        acl_cmd,
        admin_cmd,
        bench_cmd,
        cluster_cmd,
        consume_cmd,
        group_cmd,
        produce_cmd,
        stats_cmd,
        topic_cmd,
        transactions_cmd,
        verify_cmd,
    )

    for module in (topic_cmd, produce_cmd, consume_cmd, stats_cmd, admin_cmd, group_cmd):
        module.register(cli)
    verify_cmd.register(admin_cmd.admin_group)
    transactions_cmd.register(admin_cmd.admin_group)
    bench_cmd.register(cli)
    cluster_cmd.register(cli)
    acl_cmd.register(cli)


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
    _register_client_commands()
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
