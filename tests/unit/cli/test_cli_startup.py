"""`metaq` starts by importing only what the command runs: `metaq --version` and `metaq --help` none of the
commands, a client command not the broker, `metaq broker --help` not the broker core. Before, every command
imported the broker core (about 2.6 s on a busy 2-core machine); the figures are in docs/benchmarks.md
("The command line", `metaq bench startup`). Which modules load is what a test can hold; how long they take
is measured, not asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from metaq.broker.cli_options import COMMON_FLAGS, FLAG_GROUPS
from metaq.broker.main import broker_command
from metaq.broker.options import SETTABLE
from metaq.cli.main import COMMANDS, cli

HEAVY = ("metaq.broker", "metaq.storage", "metaq.cluster", "metaq.spark", "pyspark", "kazoo", "aiohttp", "uvloop",
         "metaq.http", "metaq.kafka")
"""What no client command needs: the broker and its storage, ZooKeeper, Spark, the HTTP server."""


def _modules_after(*args: str) -> set[str]:
    """The modules loaded once ``metaq ARGS`` has run, in a fresh interpreter (its output discarded)."""
    code = ("import contextlib, io, json, sys\n"
            "from metaq.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            f"        main({list(args)!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(done.stdout))


def _loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_no_command(args: list[str]) -> None:
    modules = _modules_after(*args)
    assert _loaded(modules, (*HEAVY, "metaq.client", "metaq.protocol", "metaq.types", "asyncio", "metaq.cli.topic_cmd",
                             "metaq.cli.produce_cmd", "metaq.cli.consume_cmd")) == []


@pytest.mark.parametrize("command", ["produce", "consume", "topic", "group", "stats", "admin"])
def test_a_client_command_imports_neither_broker_nor_storage(command: str) -> None:
    assert _loaded(_modules_after(command, "--help"), HEAVY) == []


def test_broker_help_does_not_import_the_broker_core() -> None:
    assert _loaded(_modules_after("broker", "--help"), ("metaq.broker.core", "metaq.storage", "metaq.broker.service",
                                                         "metaq.protocol", "kazoo", "aiohttp")) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_short_help_metaq_help_shows_is_the_command_s_own(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert COMMANDS[name][2] == command.get_short_help_str(1000)


def test_broker_help_shows_the_common_flags_and_names_every_other_one() -> None:
    every = {opt for p in broker_command.params for opt in p.opts}
    named = {f"--{flag}" for flags in FLAG_GROUPS.values() for flag in flags}
    assert named - every == set(), "FLAG_GROUPS names flags the broker does not have"
    assert set(COMMON_FLAGS) - every == {"--help"}  # click's own
    short = broker_command.get_help(click.Context(broker_command, info_name="broker", terminal_width=80))
    assert len(short.splitlines()) < 100 and "--help-all" in short  # --help-all: 470 lines
    assert all(o.flag in short for o in SETTABLE.values()), "every server.ini key is still named in --help"
    full = subprocess.run([sys.executable, "-m", "metaq.cli.main", "broker", "--help-all"], capture_output=True,
                          text=True, timeout=120)
    assert full.returncode == 0 and all(f"{o.flag}," in full.stdout or f"{o.flag} " in full.stdout
                                        for o in SETTABLE.values())
    assert "[server.ini default:" in full.stdout and len(full.stdout.splitlines()) > 300
