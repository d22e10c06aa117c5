"""Every error metaq raises.

One table of wire error codes shared by broker and clients: a code travels in a response, the client
turns it back into the same class with :func:`error_for_code`. An unknown code becomes
:class:`UnknownServerError`, never a ``KeyError``. Local misuse (:class:`ConfigError`,
:class:`InvalidArgument`) and remote misbehaviour (:class:`ProtocolError`) are separate classes,
because the caller fixes them in different places.
"""

from __future__ import annotations

import textwrap
from typing import Any, ClassVar


class MetaqError(Exception):
    """Root of every metaq error.

    ``maybe_stored``: for a produce (a send's result) that failed with this error, whether the message may have
    been stored anyway. False: it certainly was not, so sending it again cannot store it twice.
    """

    maybe_stored: bool = False


class ProtocolError(MetaqError):
    """Bytes that do not follow the wire or record format (a peer bug, garbage, or a corrupt file).

    The only exception the decoders raise on bad input.
    """


class CorruptRecordError(ProtocolError):
    """A record batch whose checksum or structure is wrong.

    When it comes from reading a partition, ``offset`` is where the damage starts (-1 if unknown) and
    ``resume_offset`` the first offset after it known to be intact (-1 if unknown): messages before
    ``offset`` were delivered, and skipping to ``resume_offset`` loses the ones in between.
    """

    def __init__(self, message: str = "", *, offset: int = -1, resume_offset: int = -1) -> None:
        super().__init__(message)
        self.offset = offset
        self.resume_offset = resume_offset


class ConfigError(MetaqError):
    """A configuration file, option or flag is wrong. The message names the file, line and key."""


class DuplicateBrokerIdError(ConfigError):
    """Two of the servers a client was given answered with one broker id.

    Standalone brokers left at the default ``brokerId=0`` look like one broker to a client, which would
    then read one and silently miss the other (or write where it then cannot read). A client refuses to
    go on instead; the message names both addresses.
    """

    def __init__(self, broker_id: int, first: str, second: str) -> None:
        self.broker_id = broker_id
        self.addresses = (first, second)
        super().__init__(
            f"servers {first} and {second} both answer as broker id {broker_id}: a client cannot tell their "
            f"partitions apart. Give each broker its own brokerId (server.ini [system] brokerId=N, or "
            f"--brokerId N), or list one broker only once")


class InvalidArgument(MetaqError, ValueError):
    """A caller passed a value the API refuses (local misuse, found before anything is sent)."""


class StorageError(MetaqError):
    """The log on disk cannot do what was asked (closed, out of space, I/O error)."""


class ConnectionClosedError(MetaqError):
    """The connection to a broker closed or failed; in-flight requests may or may not have been applied."""

    retriable = True
    maybe_stored = True


class BufferFullError(MetaqError):
    """The producer already holds ``max_buffered_bytes`` of unsent or unacknowledged messages.

    Only the non-waiting calls (``send_async``, ``send_oneway``) report it; ``send`` and
    ``send_batch`` wait for room instead. Retriable once earlier sends complete.
    """

    retriable = True


class ClientClosedError(MetaqError):
    """The producer, consumer or session was closed; create a new one."""


class RequestTimeoutError(MetaqError):
    """No reply came within the request timeout; the request may still be applied by the broker."""

    retriable = True
    maybe_stored = True


class DeliveryTimeoutError(MetaqError):
    """A send did not end within the producer's ``delivery_timeout_ms`` (waiting for a master, a connection, a
    partition to open, resends). ``maybe_stored`` says whether an attempt may have stored it; ``cause`` is the
    last failure met on the way, if any."""

    retriable = True

    def __init__(self, message: str, *, maybe_stored: bool, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.maybe_stored = maybe_stored
        self.cause = cause


class WouldReorderError(MetaqError):
    """A batch the broker refused could not be sent again without being stored behind a later batch of the same
    producer and partition (that one was stored, or may have been): it was not stored, and was not sent again.
    ``cause`` is the refusal."""

    retriable = True

    def __init__(self, message: str, *, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class BrokerError(MetaqError):
    """An error reported by a broker with a wire code. Subclasses are registered in one table."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False
    refresh_metadata: ClassVar[bool] = False
    hint: ClassVar[str] = ""
    maybe_stored: bool = False
    """A broker's answer to a produce is a refusal made before the append, unless the class says otherwise."""

    def __init__(self, message: str = "", response: Any = None) -> None:
        self.message = message or self.hint or self.name
        self.response = response
        """The response that carried the error, when it came from a broker (its other fields may help:
        a FetchResponse's log range, for instance)."""
        super().__init__(f"[{self.name}] {self.message}")


_BY_CODE: dict[int, type[BrokerError]] = {}


def _register(cls: type[BrokerError]) -> type[BrokerError]:
    if cls.code in _BY_CODE:
        raise AssertionError(f"error code {cls.code} registered twice")
    _BY_CODE[cls.code] = cls
    cls.__doc__ = _wire_docstring(cls)
    return cls


def _wire_docstring(cls: type[BrokerError]) -> str:
    """The class's docstring (or its hint) and a line from the table: its code, whether a retry may succeed and
    whether the client refreshes its metadata first. The API reference shows it: one table, no second copy."""
    own = vars(cls).get("__doc__")
    first, _, rest = (own or "").partition("\n")
    if own:
        text = f"{first.strip()}\n{textwrap.dedent(rest)}".strip()
    else:
        text = cls.hint[:1].upper() + cls.hint[1:] + "." if cls.hint else ""
    flags = "".join(["; retriable" if cls.retriable else "",
                     "; the client refreshes its metadata" if cls.refresh_metadata else ""])
    return f"{text}\n\nWire code {cls.code}, ``{cls.name}``{flags}.".lstrip()


@_register
class UnknownServerError(BrokerError):
    code = -1
    name = "UNKNOWN_SERVER_ERROR"
    hint = "the broker failed in an unexpected way; see its log"
    maybe_stored = True


@_register
class CorruptMessageError(BrokerError):
    code = 2
    name = "CORRUPT_MESSAGE"
    hint = "the record batch checksum or layout is wrong; the batch was not stored"


@_register
class UnknownTopicError(BrokerError):
    code = 3
    name = "UNKNOWN_TOPIC"
    refresh_metadata = True
    hint = "no such topic on this broker; create it or enable dynamic topics"


@_register
class UnknownPartitionError(BrokerError):
    code = 4
    name = "UNKNOWN_PARTITION"
    refresh_metadata = True
    hint = "no such partition for this topic on this broker"


@_register
class OffsetOutOfRangeError(BrokerError):
    code = 1
    name = "OFFSET_OUT_OF_RANGE"
    hint = "the offset is outside the partition's [earliest, latest] range"

    def __init__(self, message: str = "", response: Any = None) -> None:
        super().__init__(message, response)
        self.earliest: int = getattr(response, "log_start_offset", -1)
        """The partition's earliest offset when known (-1 otherwise)."""
        self.latest: int = getattr(response, "log_end_offset", -1)
        """The partition's next offset to be written when known (-1 otherwise)."""


@_register
class NotMasterError(BrokerError):
    """A write sent to a slave (docs/replication.md): only the master of a broker id takes produces."""

    code = 6
    name = "NOT_MASTER"
    retriable = True
    refresh_metadata = True
    hint = "this broker is a slave: it serves fetches but takes no writes; send to the master of its broker id"


@_register
class NotEnoughReplicasError(BrokerError):
    """Sync replication: fewer in-sync slaves than ``minInSyncSlaves``; the batch was not stored."""

    code = 19
    name = "NOT_ENOUGH_REPLICAS"
    retriable = True
    hint = ("too few in-sync slaves for a sync-replicated topic (minInSyncSlaves); nothing was stored; retry once "
            "a slave has caught up (docs/replication.md)")


@_register
class NotEnoughReplicasAfterAppendError(BrokerError):
    """Sync replication: the batch was stored on the master, but the in-sync slaves did not all confirm it
    in time. It was not acknowledged: it may or may not be read later (a retry may duplicate it)."""

    code = 20
    name = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True
    maybe_stored = True
    hint = ("the batch was written on the master but not confirmed by the in-sync slaves in time; it is not "
            "acknowledged (a retry may store it twice)")


@_register
class FencedEpochError(BrokerError):
    """A replica of an older master epoch (a deposed master, or a slave that has not seen the new one)."""

    code = 75
    name = "FENCED_EPOCH"
    retriable = True
    refresh_metadata = True
    hint = "the master epoch changed (a failover); refresh the cluster view and follow the new master"


@_register
class OutOfOrderSequenceError(BrokerError):
    """Idempotent producer: the batch's first sequence number skips past the next one this partition expects
    (an earlier batch of the producer is not stored yet). Nothing was stored; resend after the earlier one."""

    code = 45
    name = "OUT_OF_ORDER_SEQUENCE_NUMBER"
    retriable = True
    hint = "an earlier batch of this idempotent producer is missing; nothing was stored (resend in order)"


@_register
class DuplicateSequenceError(BrokerError):
    """Idempotent producer: the batch was stored before, too long ago for its offsets to be remembered.
    Nothing was stored again; the producer counts it as sent, without offsets."""

    code = 46
    name = "DUPLICATE_SEQUENCE_NUMBER"
    hint = "this batch of the idempotent producer was stored before; it was not stored again"


@_register
class InvalidProducerEpochError(BrokerError):
    """Idempotent producer: the batch comes from an epoch older than one the partition already has (the
    producer restarted its sequence since). Nothing was stored."""

    code = 47
    name = "INVALID_PRODUCER_EPOCH"
    hint = "the producer's sequence was restarted with a newer epoch; this older batch was not stored"


@_register
class UnknownProducerIdError(BrokerError):
    """Idempotent producer: the partition knows nothing of this producer (new, forgotten after a day without a
    batch, or its batches were cut) and the batch does not start its sequence at 0. Nothing was stored; the
    producer starts a new epoch at sequence 0 and resends (Kafka's UNKNOWN_PRODUCER_ID)."""

    code = 59
    name = "UNKNOWN_PRODUCER_ID"
    retriable = True
    hint = "this partition does not know the idempotent producer; nothing was stored (it restarts its sequence)"


@_register
class InvalidTxnStateError(BrokerError):
    """A transaction request that does not fit the transaction's state: unknown (never begun, or lost with a
    broker restart before it was prepared), already finished, timed out and rolled back. The message says
    which."""

    code = 48
    name = "INVALID_TXN_STATE"
    hint = "the transaction is unknown, finished, or was rolled back (timeout, broker restart)"


@_register
class InvalidTransactionTimeoutError(BrokerError):
    code = 50
    name = "INVALID_TRANSACTION_TIMEOUT"
    hint = "the transaction timeout is over the broker's maxTxTimeoutInSeconds (or negative)"


@_register
class ConcurrentTransactionsError(BrokerError):
    code = 51
    name = "CONCURRENT_TRANSACTIONS"
    retriable = True
    hint = "the broker holds maxTxTimeoutTimerCapacity open transactions; retry once some have finished"


@_register
class MessageTooLargeError(BrokerError):
    code = 10
    name = "MESSAGE_TOO_LARGE"
    hint = "a message or batch is larger than the broker accepts (maxMessageSize / maxBatchSize)"


@_register
class InvalidTopicError(BrokerError):
    code = 17
    name = "INVALID_TOPIC"
    hint = "topic names are 1-249 characters of letters, digits, '-', '_' and '.', and not '.' or '..'"


@_register
class InvalidRequestError(BrokerError):
    code = 42
    name = "INVALID_REQUEST"
    hint = "the request's fields are not valid"


@_register
class UnsupportedVersionError(BrokerError):
    code = 35
    name = "UNSUPPORTED_VERSION"
    hint = "the broker does not support this API version; upgrade the client or broker"


@_register
class TopicExistsError(BrokerError):
    """CreateTopic of a topic the broker already has."""

    code = 36
    name = "TOPIC_ALREADY_EXISTS"


@_register
class PartitionClosedError(BrokerError):
    """MetaQ's 403 Forbidden: the partition (or topic) is closed for publishing or subscribing."""

    code = 403
    name = "PARTITION_CLOSED"
    refresh_metadata = True
    hint = "the partition is closed (metaq topic open, or acceptPublish/acceptSubscribe)"


@_register
class BrokerStoppingError(BrokerError):
    code = 503
    name = "BROKER_STOPPING"
    retriable = True
    refresh_metadata = True
    hint = "the broker is shutting down; retry against another broker or after restart"


@_register
class TooManyRequestsError(BrokerError):
    code = 429
    name = "TOO_MANY_REQUESTS"
    retriable = True
    hint = "a broker limit (waiting fetches, in-flight requests) was hit; back off and retry"


@_register
class StorageFailureError(BrokerError):
    code = 56
    name = "KAFKA_STORAGE_ERROR"
    retriable = True
    maybe_stored = True
    hint = "the broker could not write or read its log"


@_register
class UnknownGroupError(BrokerError):
    """The broker has no such consumer group (no members, no committed offsets)."""

    code = 69
    name = "UNKNOWN_GROUP"


@_register
class UnknownMemberError(BrokerError):
    code = 25
    name = "UNKNOWN_MEMBER_ID"
    retriable = True
    hint = "the member's session expired or it was removed; join again"


@_register
class RebalanceInProgressError(BrokerError):
    code = 27
    name = "REBALANCE_IN_PROGRESS"
    retriable = True
    hint = "the group is rebalancing; join again to get the new assignment"


@_register
class IllegalGenerationError(BrokerError):
    code = 22
    name = "ILLEGAL_GENERATION"
    retriable = True
    hint = "the group moved to a newer generation; join again"


@_register
class NotCoordinatorError(BrokerError):
    """A group request sent to a broker that does not coordinate this group; the client finds the right one."""

    code = 16
    name = "NOT_COORDINATOR"
    retriable = True
    refresh_metadata = True


@_register
class TopicAuthorizationError(BrokerError):
    """The principal has no ACL allowing this operation on this topic (or one denies it)."""

    code = 29
    name = "TOPIC_AUTHORIZATION_FAILED"
    hint = "ask an administrator for an ACL (metaq acl add; docs/security.md)"


@_register
class GroupAuthorizationError(BrokerError):
    code = 30
    name = "GROUP_AUTHORIZATION_FAILED"
    hint = "ask an administrator for an ACL on the group (metaq acl add --group; docs/security.md)"


@_register
class ClusterAuthorizationError(BrokerError):
    code = 31
    name = "CLUSTER_AUTHORIZATION_FAILED"
    hint = "cluster operations (reload, verify, promote, stats) need a cluster ACL (metaq acl add --cluster)"


@_register
class TransactionAuthorizationError(BrokerError):
    """The principal may not use this transaction id (no ``produce`` on it, or another principal began it)."""

    code = 53
    name = "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    hint = ("ask an administrator for an ACL on the transaction id (metaq acl add --transaction; "
            "docs/security.md); a transaction is ended by the principal that began it")


@_register
class SaslAuthenticationError(BrokerError):
    """Authentication failed, or a request came before it on a broker that requires it (authRequired).

    The broker closes the connection after this reply."""

    code = 58
    name = "SASL_AUTHENTICATION_FAILED"
    hint = ("authenticate first: set the user and password (sasl_username/sasl_password, METAQ_USER and "
            "METAQ_PASSWORD for the CLI) or connect with a client certificate (docs/security.md)")


@_register
class UnsupportedSaslMechanismError(BrokerError):
    code = 33
    name = "UNSUPPORTED_SASL_MECHANISM"
    hint = "this broker accepts SCRAM-SHA-256"


@_register
class IllegalSaslStateError(BrokerError):
    code = 34
    name = "ILLEGAL_SASL_STATE"
    hint = "SaslHandshake first, then SaslAuthenticate with the client's first and final SCRAM messages"


@_register
class MessageNotFoundError(BrokerError):
    code = 404
    name = "MESSAGE_NOT_FOUND"
    hint = "no message with this id on this broker (expired by retention, or another broker's id)"


@_register
class StoredDataCorruptError(BrokerError, CorruptRecordError):
    """A stored batch failed its checks when the broker read it: its copy is damaged (the disk, not the
    producer). A CorruptRecordError too, so one ``except`` covers damage found by broker or client.

    ``offset`` is where the damage starts and ``resume_offset`` the first offset after it that is intact
    (-1 when unknown); skipping to ``resume_offset`` loses ``resume_offset - offset`` messages.
    """

    code = 74
    name = "STORED_DATA_CORRUPT"
    hint = ("a stored record batch is damaged; `metaq admin verify` lists damaged ranges, and a consumer "
            "may skip to the next intact offset (docs/operations.md)")

    def __init__(self, message: str = "", response: Any = None, *, offset: int = -1,
                 resume_offset: int = -1) -> None:
        super().__init__(message, response)
        self.offset = getattr(response, "damaged_offset", offset) if response is not None else offset
        self.resume_offset = getattr(response, "resume_offset", resume_offset) if response is not None \
            else resume_offset


@_register
class DiskFullError(BrokerError):
    code = 507
    name = "DISK_FULL"
    retriable = True
    hint = "the broker's disk is full: it serves reads but refuses writes until space is freed"


@_register
class TooManyConnectionsError(BrokerError):
    code = 431
    name = "TOO_MANY_CONNECTIONS"
    retriable = True
    hint = "the broker has maxConnections connections open; close idle ones or retry later"


@_register
class DelayTooLongError(BrokerError):
    code = 90
    name = "DELAY_TOO_LONG"
    hint = ("a delayed message is due later than the broker's maxDelayInSeconds allows; send it with a shorter "
            "delay (or raise maxDelayInSeconds); nothing of the batch was stored")


def error_for_code(code: int, message: str = "", response: Any = None) -> BrokerError:
    """The exception instance for a wire code; unknown codes become UnknownServerError."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownServerError(f"code {code}: {message}", response)
    return cls(message, response)


def error_class(code: int) -> type[BrokerError]:
    """The exception class for a wire code; unknown codes map to UnknownServerError."""
    return _BY_CODE.get(code, UnknownServerError)


def all_error_classes() -> list[type[BrokerError]]:
    """Every registered wire error, by code (the error table of docs/protocol.md)."""
    return sorted(_BY_CODE.values(), key=lambda c: c.code)


NONE = 0
"""The wire code for success."""
