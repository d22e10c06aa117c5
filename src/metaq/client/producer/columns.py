"""An open batch's plain columns: what a record joins (docs/producer.md, "The compiled seam").

Every record of a :class:`~metaq.client.producer.batches.ProducerBatch` has a payload, a timestamp and a waiter (an
asyncio future, None for one-way, or an int naming a ``send_async_many`` call's message); the batch counts its
records and its bytes. :class:`PlainColumnsPy` owns those columns and is the only place a record joins them:
:meth:`~PlainColumnsPy.append` (one record) or :meth:`~PlainColumnsPy.extend` (a run). The encoder
(``encode_columns``) and the results (``resolve_successes``) read the lists it hands out (``values``,
``timestamps``, ``waiters``); :meth:`~PlainColumnsPy.drop_payloads` lets the payloads go once the batch is encoded.

:class:`PlainColumnsPy` is the reference, written to be read; ``metaq._speedups.PlainColumns`` is its compiled twin
(selected through :mod:`metaq._compiled`). ``ProducerBatch`` is a subclass of the one in use: a plain send joins its
batch in one C call, and ``count`` and ``size_bytes`` are the type's own fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from metaq import _compiled


class PlainColumnsPy:
    """Payloads, timestamps and waiters of a batch's records, their count and the batch's bytes.

    ``PlainColumns(created_ms, size_bytes)``: empty columns of a batch created at ``created_ms`` (the timestamp of
    a record sent without one) whose frame takes ``size_bytes`` before its records (its header).
    """

    __slots__ = ("count", "created_ms", "size_bytes", "timestamps", "values", "waiters")

    def __init__(self, created_ms: int, size_bytes: int) -> None:
        if type(created_ms) is not int or type(size_bytes) is not int:
            raise TypeError("PlainColumns(created_ms: int, size_bytes: int)")
        self.created_ms = created_ms
        self.size_bytes = size_bytes
        self.count = 0
        self.values: list[bytes] = []
        self.timestamps: list[int] = []
        self.waiters: list[Any] = []

    def append(self, timestamp_ms: int, value: bytes, waiter: Any, size: int) -> None:
        """One record of ``size`` bytes; a negative ``timestamp_ms`` means "now": the batch's creation time (read
        once per batch instead of once per message)."""
        if type(timestamp_ms) is not int or type(size) is not int:
            raise TypeError("PlainColumns.append(timestamp_ms: int, value, waiter, size: int)")
        self.values.append(value)
        self.timestamps.append(timestamp_ms if timestamp_ms >= 0 else self.created_ms)
        self.waiters.append(waiter)
        self.count += 1
        self.size_bytes += size

    def extend(self, values: Sequence[bytes], timestamps: Sequence[int] | None, waiters: Sequence[Any],
               size: int) -> None:
        """A run of records of ``size`` bytes in all, in order; ``timestamps`` None: each takes the batch's
        creation time, as a negative one does. The three sequences are of one length (ValueError otherwise:
        nothing joins)."""
        if type(size) is not int:
            raise TypeError("PlainColumns.extend(values, timestamps, waiters, size: int)")
        values, waiters = list(values), list(waiters)
        created = self.created_ms
        if timestamps is None:
            stamps = [created] * len(values)
        else:
            stamps = list(timestamps)
            if any(type(t) is not int for t in stamps):
                raise TypeError("PlainColumns.extend: a timestamp is not an int")
            stamps = [t if t >= 0 else created for t in stamps]
        if not len(values) == len(stamps) == len(waiters):
            raise ValueError("PlainColumns.extend: values, timestamps and waiters of different lengths")
        self.values.extend(values)
        self.timestamps.extend(stamps)
        self.waiters.extend(waiters)
        self.count += len(values)
        self.size_bytes += size

    def drop_payloads(self) -> None:
        """Let the payloads and timestamps go (the batch is encoded); the waiters and counts stay."""
        self.values = []
        self.timestamps = []


if TYPE_CHECKING:  # one API: the reference's (ProducerBatch subclasses whichever is in use)
    PlainColumns = PlainColumnsPy
else:
    PlainColumns = _compiled.speedups.PlainColumns if _compiled.speedups is not None else PlainColumnsPy
    """The compiled columns when the module is in use (metaq._compiled), else the reference."""
