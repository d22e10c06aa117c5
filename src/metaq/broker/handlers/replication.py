"""Replication administration: Promote (a planned switchover, ``metaq admin promote``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from metaq.broker.session import Session
from metaq.errors import InvalidRequestError, NotMasterError
from metaq.protocol import messages as m

if TYPE_CHECKING:
    from metaq.broker.core import Broker, Handler

PROMOTE_TIMEOUT_MAX_MS = 600_000


def handle_promote(broker: Broker, req: m.PromoteRequest, session: Session | None) -> Any:
    if broker.ha is None:
        raise NotMasterError("this broker does not run replication with epochs (syncReplication or autoFailover); "
                             "a switchover needs them (docs/replication.md)")
    if not 0 < req.timeout_ms <= PROMOTE_TIMEOUT_MAX_MS:
        raise InvalidRequestError(f"timeout_ms must be 1..{PROMOTE_TIMEOUT_MAX_MS}; got {req.timeout_ms}")
    return _promote(broker, req)


async def _promote(broker: Broker, req: m.PromoteRequest) -> m.PromoteResponse:
    assert broker.ha is not None
    new_master, epoch = await broker.ha.hand_over(req.replica_id, req.timeout_ms / 1000)
    return m.PromoteResponse(new_master=new_master, epoch=epoch)


HANDLERS: dict[type, Handler] = {m.PromoteRequest: handle_promote}
