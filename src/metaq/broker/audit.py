"""The audit log: one line per security decision that matters (docs/security.md#audit-log).

Kafka's authorizer log, for metaq: a logger of its own, ``metaq.audit``, written only when ``auditLog`` is
on (a reload turns it on or off), to the broker's log or to ``auditLogFile``. A line is ``key=value``
pairs, values quoted when they hold a space or a quote, always in this order::

    metaq.audit principal=User:bob operation=produce resource=topic:orders result=denied client=10.0.0.9:51234

=============  ====================================================================================
field          what
=============  ====================================================================================
principal      who (``User:NAME``); the name a failed login tried (``User:mallory``), ``-`` when none
operation      ``produce``, ``consume``, ``describe``, ``admin``, ``create``, ``authenticate``,
               ``create-topic``, ``delete-topic``, ``acl-add``, ``acl-remove``, ``user-add``,
               ``user-remove``, ``user-change``, ``connection``
resource       ``topic:NAME``, ``group:NAME``, ``transaction:ID``, ``cluster``, ``user:NAME``, ``acl``
result         ``denied``, ``failed`` (a login), ``allowed``/``done`` (a change), ``closed``
client         the peer address (``HOST:PORT``), ``-`` for changes the broker noticed in its stores
detail         (optional) why, in words
=============  ====================================================================================

What is logged: every refusal (an ACL check, an over-quota connection, a transaction of another principal),
every failed login (SASL and HTTP Basic, naming the user tried), topic creation (CreateTopic and
auto-create) and deletion, ACL and user changes (as the broker notices them in its ACL and user stores: they
are written by ``metaq acl``, not through a broker), and connections closed because their user was removed
or its password changed. Allowed requests are not logged (a line per produce would cost more than the
produce); the figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from metaq.broker.config import BrokerConfig

log = logging.getLogger("metaq.audit")
log.propagate = True

DENIED: Final = "denied"
FAILED: Final = "failed"
DONE: Final = "done"
CLOSED: Final = "closed"


def _value(text: str) -> str:
    if not text:
        return "-"
    if any(c in text for c in ' "=\n\r\t'):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
        return f'"{escaped}"'
    return text


def line(principal: str | None, operation: str, resource: str, result: str, client: str | None,
         detail: str = "") -> str:
    """One audit line (without the logger's prefix)."""
    text = (f"principal={_value(principal or '')} operation={_value(operation)} resource={_value(resource)} "
            f"result={_value(result)} client={_value(client or '')}")
    return f"{text} detail={_value(detail[:500])}" if detail else text


class Audit:
    """Writes audit lines when ``auditLog`` is on. ``config`` gives the configuration in force (a reload
    replaces it), so turning the log on or off needs no restart."""

    def __init__(self, config: Callable[[], BrokerConfig]) -> None:
        self._config = config
        self._file_handler: logging.Handler | None = None
        self._file: Path | None = None

    @property
    def enabled(self) -> bool:
        return self._config().audit_log

    def __call__(self, principal: str | None, operation: str, resource: str, result: str, client: str | None,
                 detail: str = "") -> None:
        config = self._config()
        if not config.audit_log:
            return
        self._route(config.audit_log_file)
        log.info("%s", line(principal, operation, resource, result, client, detail))

    def _route(self, path: Path | None) -> None:
        """Lines go to ``auditLogFile`` (only there) when it is set, else to the broker's log."""
        if path == self._file:
            return
        if self._file_handler is not None:
            log.removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None
        self._file = path
        if path is None:
            log.propagate = True
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
        self._file_handler = handler

    def close(self) -> None:
        if self._file_handler is not None:
            log.removeHandler(self._file_handler)
            self._file_handler.close()
            self._file_handler = None
            self._file = None
            log.propagate = True
