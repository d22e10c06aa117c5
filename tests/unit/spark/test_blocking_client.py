"""The blocking client's own logic, no broker needed (tests/integration/spark has it against a broker)."""

from __future__ import annotations

import pytest

from metaq.client.blocking import BlockingClient, parse_servers
from metaq.errors import ConnectionClosedError, InvalidArgument
from metaq.testing.ports import unused_port


def test_parse_servers() -> None:
    assert parse_servers("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_servers("host") == [("host", 8123)]
    for bad in ("", " , ", "a:x", "a:0", ":5"):
        with pytest.raises(InvalidArgument):
            parse_servers(bad)


def test_connection_refused_names_servers() -> None:
    port = unused_port()
    servers = f"127.0.0.1:{port}"
    with pytest.raises(ConnectionClosedError, match=f"servers='{servers}'"):
        BlockingClient(servers, timeout_s=2)
