"""The ``servers`` string every metaq client takes, parsed in one place.

Form: ``host:port[,host:port...]`` -- the asyncio client (``connect``), the blocking client, the Spark
source's ``servers`` option, the CLI's ``--servers``/``METAQ_SERVERS``, ``MetaqHandler`` and the demo all
take it. Whitespace around an entry and empty entries (a trailing comma) are ignored. The port is
required, as docs/client.md has always written it. An IPv6 address goes in brackets: ``[::1]:8123``.

Anything else is an :class:`~metaq.errors.InvalidArgument` that quotes the entry and says what is
wrong with it. :func:`format_address` is the inverse of one entry, :func:`format_servers` of a list.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Final, NoReturn

from metaq.errors import InvalidArgument
from metaq.types import DEFAULT_PORT

Address = tuple[str, int]
"""(host, port): an IPv6 host without its brackets."""

DEFAULT_SERVERS: Final = f"127.0.0.1:{DEFAULT_PORT}"
"""What the CLI, the blocking client and the Spark source use when given no servers."""

PORT_MAX: Final = 65535
HOST_CHARS_MAX: Final = 253
_HOST_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_FORM: Final = f"the form is host:port[,host:port...], e.g. 127.0.0.1:{DEFAULT_PORT} or [::1]:{DEFAULT_PORT}"


def parse_servers(servers: str | Sequence[str]) -> list[Address]:
    """``"h1:p1,h2:p2"`` (or a sequence of such strings) as a list of (host, port), in the order given."""
    if isinstance(servers, str):
        items = servers.split(",")
    elif isinstance(servers, Sequence) and all(isinstance(s, str) for s in servers):
        items = [part for s in servers for part in s.split(",")]
    else:
        raise InvalidArgument(f"servers must be a string host:port[,host:port...], not {servers!r}")
    out = [_parse_entry(item.strip()) for item in items if item.strip()]
    if not out:
        raise InvalidArgument(f"servers {servers!r} names no server; {_FORM}")
    return out


def format_address(address: Address) -> str:
    """``host:port``, with an IPv6 host in brackets: what :func:`parse_servers` reads back."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def format_servers(addresses: Sequence[Address]) -> str:
    """A ``servers`` string: :func:`format_address` of each, comma-separated."""
    return ",".join(format_address(a) for a in addresses)


def _parse_entry(item: str) -> Address:
    if "://" in item:
        _bad(item, "give host:port without a scheme (a MetaQ url meta://host:port is written host:port here)")
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket:
            _bad(item, "the '[' of an IPv6 address has no ']'")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            _bad(item, f"{host!r} in brackets is not an IPv6 address")
        if not rest:
            _bad(item, f"it has no port: write [{host}]:{DEFAULT_PORT} for the broker's default port")
        if not rest.startswith(":"):
            _bad(item, "after ']' comes ':port'")
        port_text = rest[1:]
    else:
        host, colon, port_text = item.partition(":")
        if ":" in port_text:
            _bad(item, f"an IPv6 address goes in brackets, as in [::1]:{DEFAULT_PORT}")
        if not host:
            _bad(item, "the host is missing")
        if not colon:
            _bad(item, f"it has no port: write {host}:{DEFAULT_PORT} for the broker's default port")
        if len(host) > HOST_CHARS_MAX or not _HOST_RE.fullmatch(host):
            _bad(item, f"{host!r} is not a host name or an IP address")
    if not (port_text.isascii() and port_text.isdigit()):
        _bad(item, f"the port {port_text!r} is not a number")
    port = int(port_text)
    if not 0 < port <= PORT_MAX:
        _bad(item, f"the port {port} is outside 1..{PORT_MAX}")
    return host, port


def _bad(item: str, why: str) -> NoReturn:
    raise InvalidArgument(f"servers entry {item!r}: {why}; {_FORM}")
