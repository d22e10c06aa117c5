"""`metaq` — one command with subcommands, click conventions: --help everywhere; exit 0 ok, 1 error, 2 usage."""

from __future__ import annotations

import sys
from typing import Any

import click

from metaq import __version__
from metaq.broker.main import broker_command

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="metaq")
def cli() -> None:
    """metaq: a persistent, pull-based message queue after Taobao's MetaQ.

    Start a broker with `metaq broker`, then produce and consume with `metaq produce TOPIC` and
    `metaq consume TOPIC`. Every command takes --help.
    """


cli.add_command(broker_command, "broker")


def _register_client_commands() -> None:
    from metaq.cli import bench_cmd, client_cmds, verify_cmd

    client_cmds.register(cli)
    verify_cmd.register(client_cmds.admin_group)
    bench_cmd.register(cli)


def main(argv: list[str] | None = None) -> Any:
    _register_client_commands()
    try:
        return cli.main(args=argv, prog_name="metaq", standalone_mode=True)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
