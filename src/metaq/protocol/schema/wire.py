"""The wire types a message's ``FIELDS`` are declared with, and the declaration itself (:class:`Field`).

Each type encodes and decodes one value (``encode(value, out)`` appends bytes; ``decode(buf, pos)`` returns the
value and the next position, ProtocolError on malformed input): the reference the generated codecs
(:mod:`.codegen`) are held to. All integers are big-endian. STRING is an i16 length (-1 = null) + UTF-8; BYTES an
i32 length (-1 = null) + bytes; ARRAY an i32 count (-1 = null) + items; RECORDS an i32 length + raw record
batches, and must be the last field so a broker can ``sendfile`` it after the encoded head.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from operator import attrgetter
from typing import Any, ClassVar, Protocol

from metaq.errors import InvalidArgument, ProtocolError

Buffer = bytes | bytearray | memoryview


class WireType(Protocol):
    name: str

    def encode(self, value: Any, out: list[bytes]) -> None: ...

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]: ...


class Fixed:
    def __init__(self, name: str, fmt: str) -> None:
        self.name = name
        self._st = struct.Struct(">" + fmt)
        self.size = self._st.size

    def encode(self, value: Any, out: list[bytes]) -> None:
        out.append(self._st.pack(value))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + self.size > len(buf):
            raise ProtocolError(f"{self.name} field cut off")
        return self._st.unpack_from(buf, pos)[0], pos + self.size


class Bool(Fixed):
    def __init__(self) -> None:
        super().__init__("bool", "?")

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos >= len(buf):
            raise ProtocolError("bool field cut off")
        b = buf[pos]
        if b > 1:
            raise ProtocolError(f"bool field has value {b}")
        return b == 1, pos + 1


class UInt128:
    name = "uint128"
    _st = struct.Struct(">QQ")

    def encode(self, value: int, out: list[bytes]) -> None:
        if value < 0:
            value = (1 << 128) - 1  # -1 ("no id") travels as all ones
        out.append(self._st.pack(value >> 64, value & 0xFFFFFFFFFFFFFFFF))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 16 > len(buf):
            raise ProtocolError("uint128 field cut off")
        hi, lo = self._st.unpack_from(buf, pos)
        value = (hi << 64) | lo
        return (-1 if value == (1 << 128) - 1 else value), pos + 16


I16 = struct.Struct(">h")
I32 = struct.Struct(">i")


class String:
    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.name = "nullable_string" if nullable else "string"

    def encode(self, value: str | None, out: list[bytes]) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidArgument("non-nullable string field is None")
            out.append(I16.pack(-1))
            return
        raw = value.encode()
        if len(raw) > 0x7FFF:
            raise InvalidArgument(f"string of {len(raw)} bytes is longer than 32767")
        out.append(I16.pack(len(raw)))
        out.append(raw)

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 2 > len(buf):
            raise ProtocolError("string length cut off")
        (n,) = I16.unpack_from(buf, pos)
        pos += 2
        if n < 0:
            if n == -1 and self.nullable:
                return None, pos
            raise ProtocolError(f"string length {n}")
        if pos + n > len(buf):
            raise ProtocolError("string cut off")
        try:
            return bytes(buf[pos:pos + n]).decode(), pos + n
        except UnicodeDecodeError:
            raise ProtocolError("string is not UTF-8") from None


class Bytes:
    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.name = "nullable_bytes" if nullable else "bytes"

    def encode(self, value: Buffer | None, out: list[bytes]) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidArgument("non-nullable bytes field is None")
            out.append(I32.pack(-1))
            return
        out.append(I32.pack(len(value)))
        out.append(bytes(value))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("bytes length cut off")
        (n,) = I32.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            if n == -1 and self.nullable:
                return None, pos
            raise ProtocolError(f"bytes length {n}")
        if pos + n > len(buf):
            raise ProtocolError("bytes cut off")
        return bytes(buf[pos:pos + n]), pos + n


class Records:
    """Raw record batches, kept as bytes; always the last field of its message."""

    name = "records"

    def encode(self, value: Buffer | None, out: list[bytes]) -> None:
        if value is None:
            value = b""
        out.append(I32.pack(len(value)))
        out.append(value if isinstance(value, bytes) else bytes(value))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("records length cut off")
        (n,) = I32.unpack_from(buf, pos)
        pos += 4
        if n < 0 or pos + n > len(buf):
            raise ProtocolError(f"records length {n} does not fit the frame")
        return buf[pos:pos + n], pos + n


class Array:
    def __init__(self, item: WireType, nullable: bool = False) -> None:
        self.item = item
        self.nullable = nullable
        self.name = f"array[{item.name}]"

    def encode(self, value: list[Any] | None, out: list[bytes]) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidArgument("non-nullable array field is None")
            out.append(I32.pack(-1))
            return
        out.append(I32.pack(len(value)))
        enc = self.item.encode
        for v in value:
            enc(v, out)

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("array count cut off")
        (n,) = I32.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            if n == -1 and self.nullable:
                return None, pos
            raise ProtocolError(f"array count {n}")
        if n > len(buf) - pos:  # every item takes at least one byte: refuse absurd counts early
            raise ProtocolError(f"array count {n} exceeds the bytes left")
        dec = self.item.decode
        out = []
        for _ in range(n):
            v, pos = dec(buf, pos)
            out.append(v)
        return out, pos


class Struct:
    """A nested dataclass whose FIELDS are encoded inline (versionless: bump the outer message).

    Structs are the per-item cost of an array (a MultiFetch reply's partitions, a MultiProduce's
    batches), so each run of adjacent fixed-width fields (FetchedPartition's six int64s) is one
    ``struct`` pack/unpack: the same bytes, a few calls an item instead of one per field (a 4-entry
    MultiFetchResponse decodes in 7 µs instead of 12.5, docs/benchmarks-history.md). A run that does not fit
    (cut off, a value out of range) is done again field by field, so that the error is exactly the
    field's own.
    """

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.name = cls.__name__
        self._steps: tuple[tuple[struct.Struct | None, WireType, tuple[str, ...], Callable[[Any], Any]], ...] = ()
        self._positional = False
        """The dataclass takes the decoded values positionally (FIELDS are its first init fields, in order)."""

    def _compile(self) -> None:
        """The steps (a fused run, or one field) from FIELDS; done at first use, FIELDS complete by then."""
        steps: list[tuple[struct.Struct | None, WireType, tuple[str, ...], Callable[[Any], Any]]] = []
        run: list[Field] = []

        def flush() -> None:
            if len(run) == 1:
                steps.append((None, run[0].type, (run[0].name,), attrgetter(run[0].name)))
            elif run:
                names = tuple(f.name for f in run)
                fmt = ">" + "".join(f.type._st.format[1:] for f in run)  # type: ignore[attr-defined]
                steps.append((struct.Struct(fmt), _FusedRun(run), names, attrgetter(*names)))
            run.clear()

        for f in self.cls.FIELDS:
            if type(f.type) is Fixed:
                run.append(f)
                continue
            flush()
            steps.append((None, f.type, (f.name,), attrgetter(f.name)))
        flush()
        init = [f.name for f in fields(self.cls) if f.init]
        self._positional = init[:len(self.cls.FIELDS)] == [f.name for f in self.cls.FIELDS]
        self._steps = tuple(steps)

    def encode(self, value: Any, out: list[bytes]) -> None:
        if not self._steps:
            self._compile()
        for packer, wire, _names, get in self._steps:
            if packer is None:
                wire.encode(get(value), out)
                continue
            try:
                out.append(packer.pack(*get(value)))
            except (struct.error, TypeError, ValueError, OverflowError):
                wire.encode(value, out)  # field by field: raises that field's own error

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if not self._steps:
            self._compile()
        start = pos
        size = len(buf)
        values: list[Any] = []
        for packer, wire, _names, _get in self._steps:
            if packer is None:
                value, pos = wire.decode(buf, pos)
                values.append(value)
                continue
            end = pos + packer.size
            if end > size:
                return self._decode_fields(buf, start)  # raises the cut-off field's own error
            values += packer.unpack_from(buf, pos)
            pos = end
        if self._positional:
            return self.cls(*values), pos
        return self.cls(**dict(zip((n for step in self._steps for n in step[2]), values, strict=True))), pos

    def _decode_fields(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        """One field at a time, as the fields' own types do it (the reference the fused runs must equal)."""
        kwargs = {}
        for f in self.cls.FIELDS:
            kwargs[f.name], pos = f.type.decode(buf, pos)
        return self.cls(**kwargs), pos


class _FusedRun:
    """Adjacent fixed-width fields of a :class:`Struct`, encoded one by one: the fallback of a fused pack
    that failed, so that the error (and the field it names) is the one the field alone gives."""

    def __init__(self, run: list[Field]) -> None:
        self.fields = tuple(run)
        self.name = "+".join(f.type.name for f in run)

    def encode(self, value: Any, out: list[bytes]) -> None:
        for f in self.fields:
            f.type.encode(getattr(value, f.name), out)

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        raise AssertionError("a fused run is decoded by Struct.decode")  # never called


INT8 = Fixed("int8", "b")
INT16 = Fixed("int16", "h")
INT32 = Fixed("int32", "i")
INT64 = Fixed("int64", "q")
BOOL = Bool()
UINT128 = UInt128()
STRING = String(nullable=False)
NULLABLE_STRING = String(nullable=True)
BYTES = Bytes(nullable=False)
NULLABLE_BYTES = Bytes(nullable=True)
RECORDS = Records()


@dataclass(frozen=True)
class Field:
    name: str
    type: WireType
    since: int = 0
    """First API version that carries the field; older versions leave the dataclass default."""
    doc: str = ""


class Schema(Protocol):
    API_KEY: ClassVar[int]
    API_NAME: ClassVar[str]
    FIELDS: ClassVar[tuple[Field, ...]]
    VERSIONS: ClassVar[tuple[int, int]]


def active_fields(cls: Any, version: int) -> tuple[Field, ...]:
    """The fields ``cls`` carries at ``version`` (those whose ``since`` is at most it), cached per class."""
    cache = cls.__dict__.get("_FIELD_CACHE")
    if cache is None:
        cache = {}
        cls._FIELD_CACHE = cache
    got = cache.get(version)
    if got is None:
        got = tuple(f for f in cls.FIELDS if f.since <= version)
        cache[version] = got
    return got


def check_schema(cls: type) -> None:
    """Programmer-error check run at import: FIELDS match the dataclass and RECORDS come last."""
    assert is_dataclass(cls), cls
    names = {f.name for f in fields(cls)}
    declared = [f.name for f in cls.FIELDS]  # type: ignore[attr-defined]
    assert set(declared) <= names, (cls, set(declared) - names)
    for i, f in enumerate(cls.FIELDS):  # type: ignore[attr-defined]
        if f.type is RECORDS:
            assert i == len(cls.FIELDS) - 1, f"{cls.__name__}: RECORDS must be the last field"  # type: ignore[attr-defined]


def described(cls: type) -> list[tuple[str, str, int, str]]:
    """(name, type, since, doc) rows, for docs and tests."""
    return [(f.name, f.type.name, f.since, f.doc) for f in cls.FIELDS]  # type: ignore[attr-defined]
