"""Which of the servers a client was given answers as which broker id: the bookkeeping, without I/O.

Standalone brokers (no ZooKeeper) know nothing of each other, so a client finds a broker id only by
connecting to the servers it was given: the handshake says the id of the broker behind each. Both
pools keep a :class:`ServerBook` of what they learnt and walk the servers the same way
(:meth:`metaq.net.pool.ConnectionPool.first_answering` / ``reach``, and the blocking
:class:`metaq.net.blocking.BlockingPool`'s):

- the *first answering* server, in the order given, is where a client starts; a server that cannot be
  reached, does not answer or refuses the connection is passed over, and when none answers the error names every
  server with its reason -- :class:`~metaq.errors.TooManyConnectionsError` when every one of them
  refused for being full (a busy cluster, not a network problem), else
  :class:`~metaq.errors.ConnectionClosedError`;
- a broker id not known yet is looked for among the servers not reached so far (:meth:`ServerBook.unreached`);
- two servers that answer with one broker id are refused (:class:`~metaq.errors.DuplicateBrokerIdError`,
  naming both): a broker id names a partition's home, so two standalone brokers left at ``brokerId=0``
  would make a client read one of them and silently miss the other, depending on the order of
  ``servers``. The connection that answered second is closed and the error raised to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

from metaq.errors import (
    BrokerError,
    ConnectionClosedError,
    DuplicateBrokerIdError,
    MetaqError,
    RequestTimeoutError,
    TooManyConnectionsError,
)
from metaq.net.servers import Address, format_address, format_servers

WALK_ERRORS = (ConnectionClosedError, RequestTimeoutError, BrokerError)
"""What passes a server over during a walk: it cannot be reached, does not answer the handshake in
time, or refuses the connection. Anything else (local misuse, a closed client, a cancel) stops the walk."""


class ServerBook:
    """The servers in the order given, and the broker id each one answered with (once it has)."""

    def __init__(self, servers: Sequence[Address]) -> None:
        self.servers: list[Address] = list(servers)
        self._server_set = frozenset(self.servers)
        self.text = format_servers(self.servers)
        """The servers as a ``servers`` string, for messages."""
        self._ids: dict[Address, int] = {}
        self._addresses: dict[int, Address] = {}

    def learn(self, address: Address, broker_id: int) -> None:
        """``address`` answered as ``broker_id`` (ignored unless it is one of the servers and the id is >= 0).

        DuplicateBrokerIdError (nothing learnt) when another of the servers answers as that id.
        """
        if broker_id < 0 or address not in self._server_set:
            return
        holder = self._addresses.get(broker_id)
        if holder is not None and holder != address and self._ids.get(holder) == broker_id:
            raise DuplicateBrokerIdError(broker_id, format_address(holder), format_address(address))
        old = self._ids.get(address)
        if old is not None and old != broker_id and self._addresses.get(old) == address:
            del self._addresses[old]  # restarted with another id
        self._ids[address] = broker_id
        self._addresses[broker_id] = address

    def broker_id(self, address: Address) -> int | None:
        return self._ids.get(address)

    def address(self, broker_id: int) -> Address | None:
        """The server ``broker_id`` last answered at, if it has."""
        return self._addresses.get(broker_id)

    @property
    def ids(self) -> dict[Address, int]:
        """Each server that has answered -> its broker id (a copy)."""
        return dict(self._ids)

    def unreached(self) -> list[Address]:
        """The servers that have not answered yet, in the order given."""
        return [a for a in self.servers if a not in self._ids]


class WalkFailures:
    """Why each server of a walk was passed over, and the one error that reports them all."""

    def __init__(self, servers_text: str) -> None:
        self.servers_text = servers_text
        self.reasons: list[str] = []
        self._refusals = 0

    def add(self, exc: MetaqError) -> None:
        self.reasons.append(str(exc))
        self._refusals += isinstance(exc, TooManyConnectionsError)

    def error(self) -> MetaqError:
        """TooManyConnectionsError when every server refused for being full, else ConnectionClosedError."""
        if self.reasons and self._refusals == len(self.reasons):
            return TooManyConnectionsError(f"every metaq broker in servers={self.servers_text!r} refused the "
                                           f"connection: {'; '.join(self.reasons)}")
        return ConnectionClosedError(f"cannot reach any metaq broker in servers={self.servers_text!r}: "
                                     f"{'; '.join(self.reasons) or 'no server to try'}")
