"""What every `metaq bench` subcommand shares: how it prints (the machine and the command, a line per case as it
ends, then a Markdown table; or one JSON document with ``--json``) and the options several of them take."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

import click

from metaq.bench.report import BenchError, Report, finish_machine, machine, machine_line

json_option = click.option(
    "--json", "as_json", is_flag=True,
    help="Print one JSON document (the machine, the command and every run, whole) instead of the table; the "
         "progress lines go to stderr.")
work_dir_option = click.option(
    "--work-dir", type=click.Path(file_okay=False), default=None,
    help="Where the bench's data directories go (default: the system's temporary directory): the disk measured.")


def command_line() -> str:
    """The command as the user typed it (``metaq bench ...``), for the figures' record."""
    return "metaq " + " ".join(shlex.quote(arg) for arg in sys.argv[1:])


def run_and_print(as_json: bool, run: Callable[[Report], dict[str, Any]],
                  table: Callable[[dict[str, Any]], str]) -> None:
    """Run a bench: ``run(report)`` gives its result, ``table(result)`` the Markdown shown without ``--json``."""
    info = machine()
    progress: Report = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    try:
        result = run(progress)
    except BenchError as exc:
        raise click.ClickException(str(exc)) from None
    info = finish_machine(info)
    if as_json:
        click.echo(json.dumps({"command": command_line(), "machine": info, **result}))
        return
    click.echo(f"\n{machine_line(info)}\n    {command_line()}\n")
    click.echo(table(result))


def name_value_pairs(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """``--broker-option NAME=VALUE`` (repeatable) as a dict, as the broker's command line takes them."""
    pairs: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"wants NAME=VALUE, not {item!r}")
        pairs[name] = value
    return pairs


broker_option = click.option(
    "--broker-option", "broker_options", multiple=True, metavar="NAME=VALUE", callback=name_value_pairs,
    help="A further option of the brokers the bench starts (a server.ini key, e.g. maxOpenFiles=15000); repeatable.")


def comma_list(choices: tuple[str, ...] | None = None) -> Callable[[click.Context, click.Parameter, str], list[str]]:
    """A comma-separated option's values, each one of ``choices`` (when given)."""
    def parse(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
        items = [item.strip() for item in value.split(",") if item.strip()]
        unknown = [item for item in items if choices is not None and item not in choices]
        if unknown or not items:
            raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(choices or ())}"
                                     if unknown else "give at least one")
        return items
    return parse
