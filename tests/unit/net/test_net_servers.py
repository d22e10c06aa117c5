"""metaq.net.servers: the one ``servers`` parser every client uses, and its inverse."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metaq.errors import InvalidArgument
from metaq.net.servers import DEFAULT_SERVERS, format_address, parse_servers


def test_host_port_lists_in_the_order_given() -> None:
    assert parse_servers("127.0.0.1:8123") == [("127.0.0.1", 8123)]
    assert parse_servers("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_servers(" 127.0.0.1:8123 , host-b:9000,") == [("127.0.0.1", 8123), ("host-b", 9000)]
    assert parse_servers("b.example.com:65535,a_1:1") == [("b.example.com", 65535), ("a_1", 1)]
    assert parse_servers(DEFAULT_SERVERS) == [("127.0.0.1", 8123)]


def test_ipv6_in_brackets() -> None:
    assert parse_servers("[::1]:8123") == [("::1", 8123)]
    assert parse_servers("[fe80::1%eth0]:9000,h:1") == [("fe80::1%eth0", 9000), ("h", 1)]


def test_a_sequence_of_strings() -> None:
    assert parse_servers(["[::1]:8123"]) == [("::1", 8123)]
    assert parse_servers(("a:1", "b:2,c:3")) == [("a", 1), ("b", 2), ("c", 3)]


@pytest.mark.parametrize(("servers", "message"), [
    ("", "names no server"),
    (" , ", "names no server"),
    ([], "names no server"),
    ("localhost", "'localhost': it has no port: write localhost:8123"),
    ("a:1,host", "'host': it has no port"),
    ("h:x", "'h:x': the port 'x' is not a number"),
    ("h:", "'h:': the port '' is not a number"),
    ("h:+5", "the port '+5' is not a number"),
    ("h:0", "'h:0': the port 0 is outside 1..65535"),
    ("h:70000", "the port 70000 is outside 1..65535"),
    (":8123", "':8123': the host is missing"),
    ("::1:8123", "an IPv6 address goes in brackets"),
    ("[::1]", "it has no port: write [::1]:8123"),
    ("[::1:8123", "has no ']'"),
    ("[nope]:1", "'nope' in brackets is not an IPv6 address"),
    ("[::1]8123", "after ']' comes ':port'"),
    ("meta://h:8123", "without a scheme"),
    ("a b:1", "'a b' is not a host name or an IP address"),
    ("-h:1", "is not a host name"),
    (12, "must be a string"),
    ([1], "must be a string"),
])
def test_bad_strings_name_the_entry_and_the_form(servers: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match="host:port") as info:
        parse_servers(servers)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_format_address() -> None:
    assert format_address(("127.0.0.1", 8123)) == "127.0.0.1:8123"
    assert format_address(("::1", 8123)) == "[::1]:8123"


_label = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,20}", fullmatch=True)
_names = st.lists(_label, min_size=1, max_size=4).map(".".join)
_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(lambda a: str(ipaddress.IPv6Address(a)))
addresses = st.tuples(st.one_of(_names, _ipv4, _ipv6), st.integers(1, 65535))


@given(st.lists(addresses, min_size=1, max_size=5))
def test_format_then_parse_round_trip(addrs: list[tuple[str, int]]) -> None:
    assert parse_servers(",".join(format_address(a) for a in addrs)) == addrs
    assert parse_servers([format_address(a) for a in addrs]) == addrs
