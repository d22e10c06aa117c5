"""HTTP status codes and JSON error bodies, from the one error table of :mod:`metaq.errors`.

The broker core answers every failure with a wire code (:mod:`metaq.broker.error_mapping`); here each
code gets the HTTP status a client of any language understands, and the body carries the same code,
name, message and flags the binary protocol's clients see::

    {"error": {"status": 404, "code": 3, "name": "UNKNOWN_TOPIC", "message": "topic 'x' does not exist ...",
               "retriable": false, "hint": "..."}}

Input the HTTP layer refuses before the core sees it (malformed JSON, a wrong content type, an offset
that is not a number) is :class:`HttpInputError`: 400 (or the status it names) with the wire name
``INVALID_REQUEST``, as the core would answer a request whose fields are not valid.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from metaq import errors as e

STATUS_BY_CODE: dict[int, int] = {
    e.UnknownServerError.code: 500,
    e.CorruptMessageError.code: 400,
    e.UnknownTopicError.code: 404,
    e.UnknownPartitionError.code: 404,
    e.OffsetOutOfRangeError.code: 416,
    e.NotMasterError.code: 409,
    e.MessageTooLargeError.code: 413,
    e.InvalidTopicError.code: 400,
    e.InvalidRequestError.code: 400,
    e.UnsupportedVersionError.code: 400,
    e.TopicExistsError.code: 409,
    e.PartitionClosedError.code: 403,
    e.BrokerStoppingError.code: 503,
    e.TooManyRequestsError.code: 429,
    e.StorageFailureError.code: 503,
    e.UnknownGroupError.code: 404,
    e.UnknownMemberError.code: 409,
    e.RebalanceInProgressError.code: 409,
    e.IllegalGenerationError.code: 409,
    e.NotCoordinatorError.code: 503,
    e.MessageNotFoundError.code: 404,
    e.StoredDataCorruptError.code: 500,
    e.DiskFullError.code: 507,
    e.TooManyConnectionsError.code: 503,
    e.NotEnoughReplicasError.code: 503,
    e.NotEnoughReplicasAfterAppendError.code: 503,
    e.FencedEpochError.code: 409,
    e.DelayTooLongError.code: 400,
    e.OutOfOrderSequenceError.code: 409,
    e.DuplicateSequenceError.code: 409,
    e.InvalidProducerEpochError.code: 409,
    e.UnknownProducerIdError.code: 409,
    e.InvalidTxnStateError.code: 409,
    e.InvalidTransactionTimeoutError.code: 400,
    e.ConcurrentTransactionsError.code: 503,
    e.SaslAuthenticationError.code: 401,
    e.TopicAuthorizationError.code: 403,
    e.GroupAuthorizationError.code: 403,
    e.ClusterAuthorizationError.code: 403,
    e.TransactionAuthorizationError.code: 403,
    e.UnsupportedSaslMechanismError.code: 400,
    e.IllegalSaslStateError.code: 400,
}
"""Wire error code -> HTTP status. Every code of :func:`metaq.errors.all_error_classes` has a row (a unit
test checks); a code missing here would answer 500."""

RETRY_AFTER_S = 1
"""The Retry-After header sent with a retriable 429/503."""


class HttpInputError(Exception):
    """A request the HTTP layer refuses before the broker core sees it (bad JSON, a field of the wrong
    type, a wrong content type): a 4xx with a message naming the field and what it should be."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def status_for(code: int) -> int:
    return STATUS_BY_CODE.get(code, 500)


def error_body(status: int, code: int | None, name: str, message: str, *, retriable: bool = False,
               hint: str = "", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"status": status, "code": code, "name": name, "message": message,
                            "retriable": retriable}
    if hint:
        body["hint"] = hint
    body.update(extra)
    return {"error": body}


def json_error(status: int, body: dict[str, Any]) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if body["error"].get("retriable") and status in (429, 503) else None
    return web.json_response(body, status=status, headers=headers)


def wire_error_response(code: int, message: str | None, **extra: Any) -> web.Response:
    """The HTTP reply for a core response carrying wire error ``code``."""
    cls = e.error_class(code)
    status = status_for(code)
    body = error_body(status, code, cls.name if code == cls.code else f"CODE_{code}", message or cls.hint or cls.name,
                      retriable=cls.retriable, hint=cls.hint if message else "", **extra)
    return json_error(status, body)


def input_error_response(exc: HttpInputError) -> web.Response:
    name = "MESSAGE_TOO_LARGE" if exc.status == 413 else e.InvalidRequestError.name
    code = e.MessageTooLargeError.code if exc.status == 413 else e.InvalidRequestError.code
    return json_error(exc.status, error_body(exc.status, code, name, exc.message))


def http_error_response(exc: web.HTTPException, message: str) -> web.Response:
    """aiohttp's own refusals (no such route, method not allowed, body over the limit) as JSON errors."""
    status = exc.status
    names = {404: "NO_SUCH_ENDPOINT", 405: "METHOD_NOT_ALLOWED", 413: "MESSAGE_TOO_LARGE"}
    code = e.MessageTooLargeError.code if status == 413 else None
    return json_error(status, error_body(status, code, names.get(status, exc.reason.upper().replace(" ", "_")),
                                         message))


class WireError(Exception):
    """A core response that carries an error: answered by :func:`wire_error_response` (``extra``: fields
    of the response worth passing on, such as a partition's valid offsets with OFFSET_OUT_OF_RANGE)."""

    def __init__(self, code: int, message: str | None, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra
