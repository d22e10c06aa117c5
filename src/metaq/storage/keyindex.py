"""Per-segment key index and the key/time search of one partition (``metaq admin find``).

``<base>.keyindex`` (derived data, like ``.index`` and ``.timeindex``)::

    header, 24 bytes, big-endian:
      0  4  magic           b"MQK2"
      4  4  covered_bytes   u32   the log bytes [0, covered_bytes) whose keyed records are listed
      8  4  entry_count     u32   entries that follow and are valid (bytes past them are ignored)
     12  4  flags           u32   bit 0: FULL, the bound was reached; the rest of the segment is not indexed
     16  4  entries_crc     u32   CRC-32 of those entries: a torn or damaged file is rebuilt
     20  4  header_crc      u32   CRC-32 of bytes [0, 20): a damaged count or bound is caught too (a flipped
                                  covered_bytes would otherwise skip records or list them twice)
    entries, 8 bytes each, in offset order:
      0  4  key_hash        u32   CRC-32 of the key
      4  4  relative_offset u32   record offset - segment base offset

The file is built from the log when a search first needs it and extended by later searches (the
active segment grows): entries are appended first, then the header is rewritten, so a crash between
the two leaves a header that covers fewer entries, never more. It is never on the append path. A hash
match is only a candidate: the record is read and its key compared, so there are no false positives.
The file is removed with its segment (retention, truncate_to, recovery) and also when recovery cuts
a segment's tail; a file that claims more bytes than its log holds is rebuilt.

Bounded: at most ``max_entries`` entries per segment (the default 1 Mi entries is 8 MiB). Past the
bound the FULL flag is set and the rest of that segment is scanned record by record at search time;
the search reports how many segments it had to scan.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from metaq.errors import CorruptRecordError
from metaq.protocol.records import BatchHeader, batch_columns
from metaq.storage.scan import iter_headers, pread_exact

KEYINDEX_SUFFIX = ".keyindex"
MAGIC = b"MQK2"
"""``MQK1`` files (no header checksum) are rebuilt: the index is derived data."""
HEADER = struct.Struct(">4sIIIII")
_HEADER_COVERED = 20
ENTRY_BYTES = 8
FLAG_FULL = 1
DEFAULT_MAX_ENTRIES = 1 << 20
_U32_MAX = (1 << 32) - 1
_CHUNK = 256 * 1024


def key_hash(key: bytes) -> int:
    return zlib.crc32(key) & 0xFFFFFFFF


def key_index_path(log_path: str) -> str:
    return log_path[: -len(".log")] + KEYINDEX_SUFFIX


Row = tuple[int, int, bytes | None, int]
"""(offset, message id, key, timestamp) of one record."""


def batch_rows(data: bytes | memoryview, header: BatchHeader, *, keyed_only: bool) -> list[Row]:
    """(offset, message id, key, timestamp) of the records (or only the keyed ones) of one whole batch, from its
    columns (no Message objects)."""
    _, cols = batch_columns(data, header, verify=False)
    base, base_id = header.base_offset, header.base_message_id
    if not cols.n:
        return []
    if cols.klens.count(-1) == cols.n:
        return [] if keyed_only else [(base + d, base_id + d, None, ts)
                                      for d, ts in zip(cols.deltas, cols.timestamps, strict=True)]
    raw = cols.body if isinstance(cols.body, bytes) else bytes(cols.body)
    out: list[Row] = []
    p = cols.keys_at
    for klen, delta, ts in zip(cols.klens, cols.deltas, cols.timestamps, strict=True):
        if klen >= 0:
            out.append((base + delta, base_id + delta, raw[p:p + klen], ts))
            p += klen
        elif not keyed_only:
            out.append((base + delta, base_id + delta, None, ts))
    return out


@dataclass
class KeyIndex:
    """The loaded key index of one segment."""

    covered_bytes: int = 0
    full: bool = False
    crc: int = 0
    """CRC-32 of the entries as stored (big-endian), continued as entries are appended."""
    hashes: array = field(default_factory=lambda: array("I"))
    relative_offsets: array = field(default_factory=lambda: array("I"))

    def __len__(self) -> int:
        return len(self.hashes)

    def matches(self, hash_value: int) -> list[int]:
        """Relative offsets whose key hash is ``hash_value``, in offset order."""
        rel = self.relative_offsets
        raw = self.hashes.tobytes()  # a memcpy; then the search runs at C speed (bytes.find)
        pattern = array("I", [hash_value]).tobytes()
        out = []
        i = raw.find(pattern)
        while i >= 0:
            if i % 4 == 0:
                out.append(rel[i // 4])
                i = raw.find(pattern, i + 4)
            else:  # straddles two entries
                i = raw.find(pattern, i + 1)
        return out


def read_key_index(path: str, log_size_bytes: int) -> KeyIndex | None:
    """The key index file at ``path``; None when missing, damaged or stale (then it is rebuilt)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < HEADER.size:
        return None
    magic, covered, count, flags, crc, header_crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC or zlib.crc32(data[:_HEADER_COVERED]) != header_crc:
        return None  # another version's, or damaged: rebuild
    if covered > log_size_bytes or len(data) < HEADER.size + count * ENTRY_BYTES:
        return None
    entries = data[HEADER.size:HEADER.size + count * ENTRY_BYTES]
    if zlib.crc32(entries) != crc:
        return None  # torn or damaged (the file is never fsynced): rebuild
    both = array("I")
    both.frombytes(entries)
    if sys.byteorder == "little":
        both.byteswap()
    return KeyIndex(covered, bool(flags & FLAG_FULL), crc, both[0::2], both[1::2])


def _write_entries(path: str, index: KeyIndex, start_entry: int) -> None:
    """Append entries from ``start_entry`` then rewrite the header (a fresh file when start_entry is 0)."""
    both = array("I", bytes(8 * (len(index) - start_entry)))
    both[0::2] = index.hashes[start_entry:]
    both[1::2] = index.relative_offsets[start_entry:]
    if sys.byteorder == "little":
        both.byteswap()
    flags = FLAG_FULL if index.full else 0
    entries = both.tobytes()
    index.crc = zlib.crc32(entries, index.crc if start_entry else 0)
    fields = HEADER.pack(MAGIC, index.covered_bytes, len(index), flags, index.crc, 0)[:_HEADER_COVERED]
    header = fields + struct.pack(">I", zlib.crc32(fields))
    if start_entry == 0:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(header + entries)
        os.replace(tmp, path)
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, entries, HEADER.size + start_entry * ENTRY_BYTES)
        os.pwrite(fd, header, 0)
    finally:
        os.close(fd)


def extend_key_index(path: str, fd: int, base_offset: int, size_limit: int,
                     max_entries: int) -> tuple[KeyIndex, str | None]:
    """Load the key index of a segment and bring it up to ``size_limit`` log bytes; (index, problem).

    ``problem`` names a damaged batch that stopped the indexing (the rest of the segment is then
    scanned by the search, which meets the same damage)."""
    index = read_key_index(path, size_limit)
    fresh = index is None
    if index is None:
        index = KeyIndex()
    start_entry = 0 if fresh else len(index)
    problem = None
    if not index.full and index.covered_bytes < size_limit:
        try:
            for position, header in iter_headers(fd, index.covered_bytes, size_limit, _CHUNK):
                keyed = batch_rows(pread_exact(fd, header.total_bytes, position), header, keyed_only=True)
                if len(index) + len(keyed) > max_entries:
                    index.full = True
                    break
                for offset, _, key, _ in keyed:
                    assert key is not None
                    index.hashes.append(key_hash(key))
                    index.relative_offsets.append(offset - base_offset)
                index.covered_bytes = position + header.total_bytes
        except CorruptRecordError as exc:
            problem = str(exc)
        if fresh or len(index) > start_entry or index.full:
            try:
                _write_entries(path, index, start_entry)
            except OSError:
                pass  # derived data: the next search rebuilds or extends it
        elif index.covered_bytes:
            try:
                _write_entries(path, index, len(index))  # only the header moves
            except OSError:
                pass
    return index, problem


def scan_rows(fd: int, position: int, size_limit: int, *, keyed_only: bool) -> Iterator[Row]:
    """(offset, message id, key, timestamp) of the records in ``[position, size_limit)``."""
    for at, header in iter_headers(fd, position, size_limit, _CHUNK):
        yield from batch_rows(pread_exact(fd, header.total_bytes, at), header, keyed_only=keyed_only)


def remove_key_index(path: str) -> None:
    for p in (path, path + ".tmp"):
        try:
            os.unlink(p)
        except OSError:
            pass  # gone already; or left behind: a stale file is detected and rebuilt


@dataclass
class FindResult:
    """What a search found: ``rows`` in offset order, whether more exist past ``limit`` (truncated),
    how many segments had to be scanned past a full (or damaged) key index, and problems met."""

    rows: list[Row] = field(default_factory=list)
    truncated: bool = False
    scanned_segments: int = 0
    problems: list[str] = field(default_factory=list)


def find_in_segment(result: FindResult, fd: int, log_path: str, base_offset: int, position: int, size_limit: int,
                    locate: Callable[[int], tuple[int, BatchHeader]], key: bytes | None, start_offset: int,
                    from_ms: int, to_ms: int, limit: int, max_key_entries: int) -> bool:
    """Add the segment's matching records to ``result``; True when ``limit`` is reached (stop).

    ``position`` is where the batch holding ``start_offset`` starts; ``locate(offset)`` gives the
    (position, header) of the batch holding an offset (through the sparse offset index).
    """

    def take(row: Row) -> bool:
        offset, _, row_key, ts = row
        if offset < start_offset or (from_ms >= 0 and ts < from_ms) or (to_ms >= 0 and ts > to_ms):
            return False
        if key is not None and row_key != key:
            return False
        if len(result.rows) >= limit:
            result.truncated = True
            return True
        result.rows.append(row)
        return False

    if key is None:
        return any(take(row) for row in scan_rows(fd, position, size_limit, keyed_only=False))
    index, problem = extend_key_index(key_index_path(log_path), fd, base_offset, size_limit, max_key_entries)
    wanted = key_hash(key)
    first_relative = start_offset - base_offset
    batch_end = -1
    rows: list[Row] = []
    for relative in index.matches(wanted):
        if relative < first_relative:
            continue
        offset = base_offset + relative
        if offset >= batch_end:  # read the batch holding it (once for all its candidates)
            at, header = locate(offset)
            rows = batch_rows(pread_exact(fd, header.total_bytes, at), header, keyed_only=True)
            batch_end = header.next_offset
        for row in rows:
            if row[0] == offset and take(row):
                return True
    if index.full or problem is not None:
        result.scanned_segments += 1
        if problem is not None:
            result.problems.append(f"{os.path.basename(log_path)}: key index stopped at damage: {problem}")
        start = max(index.covered_bytes, 0)
        return any(take(row) for row in scan_rows(fd, start, size_limit, keyed_only=True))
    return False

