"""Checking a record batch's body: what the broker checks before it stores a batch, and what every reader checks
before it trusts one. The work is per batch: C-level operations over whole columns; only batches carrying headers
or non-ASCII attributes walk those sections. Payloads are never copied."""

from __future__ import annotations

from array import array

from metaq import _compiled
from metaq.errors import CorruptRecordError, InvalidArgument
from metaq.protocol.records.compression import decompress
from metaq.protocol.records.format import (
    HEADER_NAME,
    HEADER_VALUE,
    RECORD_OVERHEAD_BYTES,
    BatchHeader,
    check_attributes,
    compute_crc,
    deltas_column,
    read_column,
    read_header,
)

validate_plain = _compiled.speedups.validate_plain if _compiled.speedups is not None else None
"""metaq._speedups.validate_plain, or None: :func:`validate_batch` for what producers send (an uncompressed batch of
plain records) in one call, header, CRCs and columns: the same header, or None for anything else, which
validate_batch's Python code (its reference) then decides."""

plain_columns_ok_compiled = _compiled.speedups.plain_columns_ok if _compiled.speedups is not None else None
"""metaq._speedups.plain_columns_ok, or None: :func:`plain_columns_ok_py` in one pass over the columns."""


def validate_batch(batch: bytes | bytearray | memoryview, max_message_bytes: int,
                   max_batch_bytes: int) -> BatchHeader:
    """Check everything the broker must know before storing a batch; CorruptRecordError otherwise.

    Length, magic, CRC, count, offset deltas (exactly 0..n-1), and that the columns add up so that a
    stored batch always decodes. Raises InvalidArgument (not a protocol error) for a batch or message over the
    size limits. What producers send is checked in one compiled call when the module is there.
    """
    if validate_plain is not None:
        header: BatchHeader | None = validate_plain(batch, max_message_bytes, max_batch_bytes, BatchHeader)
        if header is not None:
            return header
    total = len(batch)
    if total > max_batch_bytes:
        raise InvalidArgument(f"record batch is {total} bytes; the limit is {max_batch_bytes} (the broker's "
                              "maxBatchSize)")
    header = read_header(batch)
    if header.total_bytes != total:
        raise CorruptRecordError(f"record batch length field says {header.total_bytes} bytes, got {total}")
    if header.crc != compute_crc(batch):
        raise CorruptRecordError("record batch CRC32C does not match its contents")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise CorruptRecordError(
            f"record batch count {header.record_count} and last offset delta {header.last_offset_delta} disagree")
    check_attributes(header)
    body = batch_body(batch, header, max_batch_bytes * 4)
    n = header.record_count
    # the compiled columns check of a compressed batch's inflated records (the Python check below is its reference)
    if plain_columns_ok_compiled is not None and plain_columns_ok_compiled(body, n, max_message_bytes):
        return header
    cols = Columns.parse(body, n, n - 1, producer=True)
    biggest = cols.max_record_bytes_bound()
    if biggest > max_message_bytes:
        exact = cols.record_bytes()
        worst = max(range(len(exact)), key=exact.__getitem__)
        if exact[worst] > max_message_bytes:
            raise InvalidArgument(
                f"message {worst} of the batch is {exact[worst]} bytes; the limit is {max_message_bytes} (the broker's "
                "maxMessageSize)")
    return header


def plain_columns_ok_py(region: bytes | memoryview, n: int, max_message_bytes: int) -> bool:
    """Whether the records region of an n-record produced batch is one a producer writes without attributes or
    headers (keys allowed), whole, and with no record over ``max_message_bytes``: what :meth:`Columns.parse`
    accepts with no attribute and no header in it. The reference of metaq._speedups.plain_columns_ok."""
    if not isinstance(n, int) or n < 1:
        return False
    try:
        cols = Columns.parse(region, n, n - 1, producer=True)
    except CorruptRecordError:
        return False
    return cols.no_attrs and cols.no_headers and max(cols.record_bytes()) <= max_message_bytes


def batch_body(batch: bytes | bytearray | memoryview, header: BatchHeader, max_bytes: int) -> bytes | memoryview:
    """The records region of a whole batch: a view of its own bytes, or the inflated bytes (at most ``max_bytes``)."""
    view = memoryview(batch)[header.records_start:header.total_bytes]
    if header.compression and header.record_count:
        return decompress(header.compression, view, max_bytes)
    return view


def _non_negative(column: memoryview, width: int) -> bool:
    """Whether every little-endian signed integer of ``width`` bytes in ``column`` is >= 0 (sign bytes only)."""
    return column[width - 1::width].tobytes().isascii()


class Columns:
    """The parsed, checked columns of one batch body (see the format's drawing for the layout)."""

    __slots__ = ("alens", "attrs_at", "body", "deltas", "dense", "hcounts", "headers_at", "keys_at", "klens", "n",
                 "no_attrs", "no_headers", "no_keys", "timestamps", "values_at", "vlens")
    body: bytes | memoryview
    n: int
    dense: bool
    """The offset deltas are 0, 1, ..., n-1 (every batch a producer wrote; not one a server-side filter thinned)."""
    deltas: array
    timestamps: array
    klens: array
    vlens: array
    alens: array
    hcounts: array
    keys_at: int
    values_at: int
    attrs_at: int
    headers_at: int
    no_keys: bool
    no_attrs: bool
    no_headers: bool

    def _read(self, body: bytes | memoryview, n: int) -> memoryview:
        view = memoryview(body)
        self.body = body
        self.n = n
        self.deltas = read_column("i", view[0:4 * n])
        self.timestamps = read_column("q", view[4 * n:12 * n])
        self.klens = read_column("i", view[12 * n:16 * n])
        self.vlens = read_column("i", view[16 * n:20 * n])
        self.alens = read_column("h", view[20 * n:22 * n])
        self.hcounts = read_column("h", view[22 * n:24 * n])
        return view

    @classmethod
    def plain(cls, body: memoryview, n: int) -> Columns:
        """The columns of a batch body the compiled check (``validate_plain``) accepted: n >= 1 records, offset
        deltas 0..n-1, no attributes or headers, keys and values filling the region: what :meth:`parse` finds
        there, without checking it again."""
        self = cls()
        self._read(body, n)
        self.dense = self.no_attrs = self.no_headers = True
        n_no_key = self.klens.count(-1)
        self.no_keys = n_no_key == n
        self.keys_at = fixed = RECORD_OVERHEAD_BYTES * n
        self.values_at = fixed if self.no_keys else fixed + sum(self.klens) + n_no_key
        self.attrs_at = self.headers_at = len(body)
        return self

    @classmethod
    def parse(cls, body: bytes | memoryview, n: int, last_offset_delta: int, *, producer: bool) -> Columns:
        """The columns of an n-record body, checked: CorruptRecordError unless they add up and every record is
        whole. ``producer``: offset deltas must be exactly 0..n-1 (a produced batch; a stored one may have been
        thinned by a server-side filter and needs only increasing deltas within ``last_offset_delta``)."""
        if n < 0:
            raise CorruptRecordError(f"record count {n} is negative")
        fixed = RECORD_OVERHEAD_BYTES * n
        size = len(body)
        if size < fixed:
            raise CorruptRecordError(f"records region has {size} bytes; {n} records need at least {fixed}")
        self = cls()
        view = self._read(body, n)
        if n == 0:
            if size:
                raise CorruptRecordError("an empty record batch has a non-empty records region")
            self.no_keys = self.no_attrs = self.no_headers = self.dense = True
            self.keys_at = self.values_at = self.attrs_at = self.headers_at = 0
            return self
        dense = self.dense = view[0:4 * n] == deltas_column(n)  # 0..n-1: every produced (unfiltered) batch
        if producer:
            if not dense:
                raise CorruptRecordError("offset deltas of a produced batch must be 0, 1, ..., n-1")
        elif not dense and (self.deltas[0] < 0 or self.deltas[-1] > last_offset_delta or (
                n > 1 and not all(map(int.__lt__, self.deltas, self.deltas[1:])))):
            raise CorruptRecordError("offset deltas must increase and stay within the batch")
        # sign bytes first (C speed): only a column holding a negative value needs an element-wise look
        if not _non_negative(view[16 * n:20 * n], 4) or not _non_negative(view[22 * n:24 * n], 2):
            raise CorruptRecordError("a record has a negative value length or header count")
        if (not _non_negative(view[12 * n:16 * n], 4) and min(self.klens) < -1) or (
                not _non_negative(view[20 * n:22 * n], 2) and min(self.alens) < -1):
            raise CorruptRecordError("a record has a key or attribute length below -1")
        n_no_key = self.klens.count(-1)
        n_no_attr = self.alens.count(-1)
        self.no_keys = n_no_key == n
        self.no_attrs = n_no_attr == n
        keys_len = 0 if self.no_keys else sum(self.klens) + n_no_key  # (no sum over a column of -1s)
        values_len = sum(self.vlens)
        attrs_len = 0 if self.no_attrs else sum(self.alens) + n_no_attr
        self.keys_at = fixed
        self.values_at = fixed + keys_len
        self.attrs_at = self.values_at + values_len
        self.headers_at = self.attrs_at + attrs_len
        if self.headers_at > size:
            raise CorruptRecordError("record columns claim more bytes than the records region holds")
        # all-zero header counts: one C-level byte count instead of a sum over the column
        n_headers = 0 if view[22 * n:24 * n].tobytes().count(0) == 2 * n else sum(self.hcounts)
        self.no_headers = n_headers == 0
        if self.no_headers:
            if self.headers_at != size:
                raise CorruptRecordError(f"records region has {size - self.headers_at} bytes after its columns")
        else:
            self._check_headers(view, n_headers)
        if attrs_len and not bytes(view[self.attrs_at:self.headers_at]).isascii():
            self._check_attrs(view)
        return self

    def _check_headers(self, view: memoryview, n_headers: int) -> None:
        p, end = self.headers_at, len(view)
        for _ in range(n_headers):
            if p + 2 > end:
                raise CorruptRecordError("record headers are cut off")
            (nlen,) = HEADER_NAME.unpack_from(view, p)
            if p + 6 + nlen > end:
                raise CorruptRecordError("record header is cut off")
            try:
                bytes(view[p + 2:p + 2 + nlen]).decode()
            except UnicodeDecodeError:
                raise CorruptRecordError("a record header name is not UTF-8") from None
            (hlen,) = HEADER_VALUE.unpack_from(view, p + 2 + nlen)
            if hlen < 0 or p + 6 + nlen + hlen > end:
                raise CorruptRecordError("a record header value runs past the batch")
            p += 6 + nlen + hlen
        if p != end:
            raise CorruptRecordError(f"records region has {end - p} bytes after its headers")

    def _check_attrs(self, view: memoryview) -> None:
        p = self.attrs_at
        for alen in self.alens:
            if alen > 0:
                try:
                    bytes(view[p:p + alen]).decode()
                except UnicodeDecodeError:
                    raise CorruptRecordError("a record attribute is not UTF-8") from None
                p += alen

    def max_record_bytes_bound(self) -> int:
        """An upper bound of the largest record's encoded size (exact when one record dominates)."""
        if not self.n:
            return 0
        return (RECORD_OVERHEAD_BYTES + max(max(self.klens), 0) + max(self.vlens) + max(max(self.alens), 0)
                + (len(self.body) - self.headers_at))

    def record_bytes(self) -> list[int]:
        """Each record's encoded size (column entries + key + value + attribute + its headers)."""
        sizes = [RECORD_OVERHEAD_BYTES + max(k, 0) + v + max(a, 0)
                 for k, v, a in zip(self.klens, self.vlens, self.alens, strict=True)]
        if not self.no_headers:
            for i, hblob in enumerate(self.header_blobs()):
                sizes[i] += len(hblob)
        return sizes

    def header_blobs(self) -> list[bytes]:
        view = memoryview(self.body)
        out, p = [], self.headers_at
        for count in self.hcounts:
            start = p
            for _ in range(count):
                (nlen,) = HEADER_NAME.unpack_from(view, p)
                (hlen,) = HEADER_VALUE.unpack_from(view, p + 2 + nlen)
                p += 6 + nlen + hlen
            out.append(bytes(view[start:p]))
        return out
