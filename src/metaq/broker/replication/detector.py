"""A slave's evidence that its master is dead, and the other in-sync slaves' vote on it.

docs/replication.md#detecting-a-dead-master. A slave in HA mode keeps, for the master it follows (its
address and epoch), what its replica connections have seen:

* **refused**: since the last reply, a connection to the master's address was refused (nothing listens
  there: the process died or exited). Enough on its own.
* **silent**: no reply for ``masterLeaseMs``. A healthy master answers every long poll within a third of
  that; a paused or cut-off one, or a slave whose own link broke, looks like this. It needs the other
  in-sync slaves' vote (:func:`ask_other_slaves`): any of them that heard from the master within half the
  lease vetoes it.

The slave's promise that makes the master's lease sound (docs/replication.md#the-masters-lease) is kept here
too: :meth:`MasterWatch.last_contact` is the last reply received, and a takeover on silence happens only once
it is at least a lease old.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from metaq.cluster.registry import Address
from metaq.errors import BrokerError, ConnectionClosedError, RequestTimeoutError
from metaq.net.codec import ConnectionSettings, raise_for_error
from metaq.net.connection import BrokerConnection
from metaq.protocol import messages as m

log = logging.getLogger("metaq.broker.replication")

REFUSED = "refused"
SILENT = "silent"
VETO_FRACTION = 0.5
"""Another in-sync slave that heard from the master within this fraction of the lease vetoes a takeover."""


@dataclass(slots=True)
class MasterWatch:
    """What a slave's replica connections have seen of one master (``address`` in ``epoch``)."""

    lease_s: float
    address: Address | None = None
    epoch: int = -1
    since: float = 0.0
    """time.monotonic() when following this master began (its silence counts from there at first)."""
    last_reply_at: float = -1.0
    """time.monotonic() of the last successful replica fetch reply from it (-1: none yet)."""
    refused_at: float = -1.0
    refused_why: str = ""

    def follow(self, address: Address | None, epoch: int, now: float) -> bool:
        """Watch ``address`` in ``epoch`` from now (a new master, or a new epoch, starts afresh). True when
        that is a change."""
        if address == self.address and epoch == self.epoch:
            return False
        self.address, self.epoch, self.since = address, epoch, now
        self.last_reply_at = self.refused_at = -1.0
        self.refused_why = ""
        return True

    def reply(self, address: Address, now: float) -> None:
        if address == self.address:
            self.last_reply_at = now

    def refused(self, address: Address, why: str, now: float) -> None:
        if address == self.address:
            self.refused_at, self.refused_why = now, why

    def last_contact(self) -> float:
        return max(self.since, self.last_reply_at)

    def silent_s(self, now: float) -> float:
        return now - self.last_contact()

    def evidence(self, now: float) -> str | None:
        """REFUSED, SILENT or None (the master looks alive)."""
        if self.address is None:
            return None
        if self.refused_at > self.last_reply_at:
            return REFUSED
        if self.silent_s(now) >= self.lease_s:
            return SILENT
        return None

    def describe(self, now: float) -> dict[str, object]:
        """What another slave asking for a vote reads (the ``replica_group`` part of Stats)."""
        return {"watching": str(self.address) if self.address is not None else None, "watching_epoch": self.epoch,
                "master_silent_ms": int(self.silent_s(now) * 1000) if self.address is not None else None,
                "master_evidence": self.evidence(now)}


@dataclass(slots=True)
class Vote:
    """The other in-sync slaves' answers: ``veto`` names one that heard from the master lately, ``unknown``
    the ones that could not be asked (the question stays open); both empty: the silence is confirmed."""

    veto: str = ""
    unknown: tuple[str, ...] = ()

    @property
    def confirmed(self) -> bool:
        return not self.veto and not self.unknown


async def ask_other_slaves(slaves: Iterable[tuple[int, Address]], epoch: int, lease_s: float,
                           settings: ConnectionSettings) -> Vote:
    """Ask each slave (replica id, address) how long it has not heard from the master of ``epoch``: any that
    heard from it within half the lease vetoes; one whose connection is refused is dead and has no vote; one
    that does not answer within a third of the lease leaves the question open."""
    asked = list(slaves)
    if not asked:
        return Vote()
    answers = await asyncio.gather(*(_ask(address, lease_s / 3, settings) for _, address in asked))
    veto = ""
    unknown = []
    for (replica, address), answer in zip(asked, answers, strict=True):
        if isinstance(answer, str):
            if answer:
                unknown.append(f"slave {replica} at {address}: {answer}")
            continue
        if answer is None:
            continue  # dead or not a slave of ours any more: no vote
        watching_epoch, silent_ms = answer
        if watching_epoch > epoch:
            veto = veto or f"slave {replica} follows a newer epoch ({watching_epoch})"
        elif watching_epoch == epoch and silent_ms is not None and silent_ms < lease_s * VETO_FRACTION * 1000:
            veto = veto or f"slave {replica} at {address} heard from the master {silent_ms} ms ago"
    return Vote(veto, tuple(unknown))


async def _ask(address: Address, timeout_s: float, settings: ConnectionSettings) -> tuple[int, int | None] | str | None:
    """(epoch it follows, ms it has not heard from that master); None: it cannot vote (refused: dead; an error
    answer: it cannot say); a text: no answer in time (why)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            conn = await BrokerConnection.open((address.host, address.port), settings)
            try:
                reply = raise_for_error(await conn.request(m.StatsRequest(topic=None), timeout_s))
            finally:
                conn.close()
    except TimeoutError:
        return f"no answer within {timeout_s:.2f}s"
    except ConnectionClosedError as exc:
        if isinstance(exc.__cause__, ConnectionRefusedError):
            return None
        return str(exc)
    except RequestTimeoutError as exc:
        return str(exc)
    except BrokerError as exc:  # it answered, but not with its view (an ACL, say): no vote
        log.info("slave at %s does not say how long it has not heard from the master (%s)", address, exc)
        return None
    try:
        doc = json.loads(reply.stats_json)
        group = doc["replica_group"]
        if group.get("role") != "slave":
            return None
        silent = group.get("master_silent_ms")
        return int(group.get("watching_epoch", -1)), (int(silent) if silent is not None else None)
    except (ValueError, KeyError, TypeError):
        log.info("slave at %s answered Stats without its view of the master (%.0f ms)", address,
                 (time.monotonic() - started) * 1000)
        return None


__all__ = ["REFUSED", "SILENT", "MasterWatch", "Vote", "ask_other_slaves"]
