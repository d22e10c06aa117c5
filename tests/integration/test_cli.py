"""The `metaq` command line against real brokers: missing topics, Ctrl-C, wording of counts."""

from __future__ import annotations

from collections.abc import Callable

from cli_process import metaq

from metaq.testing.broker import BrokerProcess

# -- wording --------------------------------------------------------------------------------------

def test_counts_are_pluralised(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory({"numPartitions": 1})
    s = ["-s", broker.servers]
    assert metaq("topic", "create", "single", "-p", "1", *s).stdout == "created topic single with 1 partition\n"
    assert metaq("produce", "single", *s, input="only\n").stderr == "sent 1 message to single\n"
    assert metaq("produce", "single", *s, input="").stderr == "sent 0 messages to single\n"
    assert metaq("produce", "other", *s, input="a\nb\n").stderr == "sent 2 messages to other\n"
    assert metaq("topic", "list", *s).stdout == "other\t1 partition\nsingle\t1 partition\n"


