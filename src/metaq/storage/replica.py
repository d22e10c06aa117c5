"""Checking batches a follower copies from its master before they are stored byte for byte.

A follower (an async slave today; an in-sync replica later) never stamps anything: the master already
assigned the offsets, message ids and append times, and the follower's log must hold exactly the
master's bytes so offsets and ids stay valid after a failover. What the follower must be sure of
before it writes is that the bytes are whole batches of this partition, undamaged, and that they
continue its log exactly where it ends -- no gap (a lost fetch reply) and no overlap (a reply to a
stale request, or a master that lost its tail). Anything else is a clear error and nothing is written.

Checked per batch: the header (magic, header CRC, a length that fits), the body CRC32C, that the
stamped id names this replica group's broker id, this partition's tag and the batch's own base
offset, that ``record_count`` and ``last_offset_delta`` agree, and offset continuity from the log end.
The column structure is not re-validated: the master did that at produce time and the body CRC
proves these are the bytes it validated.
"""

from __future__ import annotations

from typing import NamedTuple

from metaq.errors import CorruptRecordError, StorageError
from metaq.protocol.records import HEADER_BYTES, BatchHeader, crc_ok, read_header
from metaq.storage.scan import belongs_here

_BROKER_SHIFT = 112


class ReplicaGap(StorageError):
    """Replicated batches do not continue the follower's log: a gap or an overlap.

    ``expected`` is the follower's log end offset; ``got`` is the first offset offered.
    """

    def __init__(self, where: str, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        kind = "a gap" if got > expected else "an overlap"
        super().__init__(f"{where}: replicated batch starts at offset {got} but the log ends at {expected} "
                         f"({kind}); nothing was written. Fetch again from offset {expected}")


class CheckedBatches(NamedTuple):
    """Whole batches found in a replicated buffer: where each starts and its header."""

    batches: list[tuple[int, BatchHeader]]
    next_offset: int
    size_bytes: int
    record_count: int


def check_replicated(data: bytes | memoryview, expected_offset: int, broker_id: int, tag: int,
                     where: str) -> CheckedBatches:
    """Check every batch in ``data`` (whole batches only, back to back) as described above.

    Raises :class:`ReplicaGap` for a discontinuity and ``CorruptRecordError`` for anything damaged or
    foreign; in both cases nothing is to be written.
    """
    view = memoryview(data)
    found: list[tuple[int, BatchHeader]] = []
    position = 0
    expected = expected_offset
    records = 0
    while position < view.nbytes:
        if view.nbytes - position < HEADER_BYTES:
            raise CorruptRecordError(f"{where}: {view.nbytes - position} bytes after the last whole batch "
                                     f"at byte {position} (a cut-off batch is not replicated)")
        try:
            header = read_header(view, position)
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"{where}: replicated batch at byte {position}: {exc}") from None
        end = position + header.total_bytes
        if end > view.nbytes:
            raise CorruptRecordError(f"{where}: replicated batch at byte {position} needs {header.total_bytes} "
                                     f"bytes, {view.nbytes - position} arrived")
        if header.base_offset != expected:
            raise ReplicaGap(where, expected, header.base_offset)
        if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
            raise CorruptRecordError(f"{where}: replicated batch at offset {header.base_offset} has "
                                     f"{header.record_count} records but last offset delta "
                                     f"{header.last_offset_delta}")
        if not belongs_here(header, tag) or header.base_message_id >> _BROKER_SHIFT != broker_id:
            raise CorruptRecordError(f"{where}: replicated batch at offset {header.base_offset} carries message "
                                     f"id {header.base_message_id:032x}, which is not broker {broker_id}'s id "
                                     "for this partition and offset (a master of another broker id?)")
        if not crc_ok(view[position:end], header):
            raise CorruptRecordError(f"{where}: replicated batch at offset {header.base_offset} fails its "
                                     "body CRC32C check")
        found.append((position, header))
        records += header.record_count
        expected = header.next_offset
        position = end
    return CheckedBatches(found, expected, position, records)
