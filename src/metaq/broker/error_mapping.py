"""One mapping from exceptions to wire errors, for every request a broker answers.

Handlers raise; they do not build error responses. A :class:`~metaq.errors.BrokerError` carries its own
code and message. The storage's and the codec's exceptions are translated by :data:`WIRE_ERRORS`, the
first matching row winning. Anything else is a bug: ``UNKNOWN_SERVER_ERROR``, logged with its
traceback. Where an exception means something more precise in a handler's context (a produced batch
that fails validation is ``MESSAGE_TOO_LARGE``, a message id the storage cannot resolve is
``MESSAGE_NOT_FOUND``), the handler raises the BrokerError it means instead.

The broker core (:meth:`metaq.broker.core.Broker.handle`), the group coordinator and the transports
all answer failures through :func:`error_response` (or :func:`wire_error`, for a response that carries
more than the error, such as a fetch error with the partition's valid range).
"""

from __future__ import annotations

import logging
from typing import Any

from metaq.errors import (
    BrokerError,
    ConfigError,
    CorruptMessageError,
    DiskFullError,
    InvalidArgument,
    InvalidRequestError,
    OffsetOutOfRangeError,
    ProtocolError,
    StorageError,
    StorageFailureError,
    StoredDataCorruptError,
    UnknownServerError,
)
from metaq.protocol import messages as m
from metaq.storage.errors import DamagedData, DiskFull, OffsetOutOfRange

log = logging.getLogger("metaq.broker")

WIRE_ERRORS: tuple[tuple[type[Exception], type[BrokerError]], ...] = (
    (OffsetOutOfRange, OffsetOutOfRangeError),
    (DamagedData, StoredDataCorruptError),
    (DiskFull, DiskFullError),
    (InvalidArgument, InvalidRequestError),
    (ConfigError, InvalidRequestError),
    (ProtocolError, CorruptMessageError),
    (StorageError, StorageFailureError),
)
"""Exception class -> the wire error it is answered with (its message is ``str(exc)``); rows are
tried in order, so a subclass comes before its base (StorageError last)."""


def wire_error(exc: BaseException, api_name: str) -> tuple[int, str]:
    """(code, message) answering ``exc`` raised while handling an ``api_name`` request."""
    if isinstance(exc, BrokerError):
        return exc.code, exc.message
    for kind, error in WIRE_ERRORS:
        if isinstance(exc, kind):
            return error.code, str(exc)
    log.error("unexpected error handling %s", api_name, exc_info=exc)
    return UnknownServerError.code, f"{type(exc).__name__}: {exc}"


def error_response(api_key: int, exc: BaseException) -> Any:
    """The API's own response type carrying only the wire error of ``exc``."""
    spec = m.APIS.get(api_key)
    code, message = wire_error(exc, spec.name if spec is not None else f"api key {api_key}")
    return m.error_response(api_key, code, message)
