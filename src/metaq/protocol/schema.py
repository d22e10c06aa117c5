"""Declared, versioned wire schemas.

A message class declares its fields once, as data::

    @message(api_key=5, name="Fetch")
    @dataclass
    class FetchRequest:
        topic: str = ""
        ...
    FetchRequest.FIELDS = (Field("topic", STRING), Field("group", STRING, since=1), ...)

and :func:`encode` / :func:`decode` walk that declaration for any version. No other code packs
fields by hand, so a schema change is one line and the fuzzer covers every frame.

All integers are big-endian. STRING is an i16 length (-1 = null) + UTF-8; BYTES an i32 length
(-1 = null) + bytes; ARRAY an i32 count (-1 = null) + items; RECORDS an i32 length + raw record
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


class _Fixed:
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


class _Bool(_Fixed):
    def __init__(self) -> None:
        super().__init__("bool", "?")

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos >= len(buf):
            raise ProtocolError("bool field cut off")
        b = buf[pos]
        if b > 1:
            raise ProtocolError(f"bool field has value {b}")
        return b == 1, pos + 1


class _UInt128:
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


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _String:
    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.name = "nullable_string" if nullable else "string"

    def encode(self, value: str | None, out: list[bytes]) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidArgument("non-nullable string field is None")
            out.append(_I16.pack(-1))
            return
        raw = value.encode()
        if len(raw) > 0x7FFF:
            raise InvalidArgument(f"string of {len(raw)} bytes is longer than 32767")
        out.append(_I16.pack(len(raw)))
        out.append(raw)

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 2 > len(buf):
            raise ProtocolError("string length cut off")
        (n,) = _I16.unpack_from(buf, pos)
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


class _Bytes:
    def __init__(self, nullable: bool) -> None:
        self.nullable = nullable
        self.name = "nullable_bytes" if nullable else "bytes"

    def encode(self, value: Buffer | None, out: list[bytes]) -> None:
        if value is None:
            if not self.nullable:
                raise InvalidArgument("non-nullable bytes field is None")
            out.append(_I32.pack(-1))
            return
        out.append(_I32.pack(len(value)))
        out.append(bytes(value))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("bytes length cut off")
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
        if n < 0:
            if n == -1 and self.nullable:
                return None, pos
            raise ProtocolError(f"bytes length {n}")
        if pos + n > len(buf):
            raise ProtocolError("bytes cut off")
        return bytes(buf[pos:pos + n]), pos + n


class _Records:
    """Raw record batches, kept as bytes; always the last field of its message."""

    name = "records"

    def encode(self, value: Buffer | None, out: list[bytes]) -> None:
        if value is None:
            value = b""
        out.append(_I32.pack(len(value)))
        out.append(value if isinstance(value, bytes) else bytes(value))

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("records length cut off")
        (n,) = _I32.unpack_from(buf, pos)
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
            out.append(_I32.pack(-1))
            return
        out.append(_I32.pack(len(value)))
        enc = self.item.encode
        for v in value:
            enc(v, out)

    def decode(self, buf: Buffer, pos: int) -> tuple[Any, int]:
        if pos + 4 > len(buf):
            raise ProtocolError("array count cut off")
        (n,) = _I32.unpack_from(buf, pos)
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
            if type(f.type) is _Fixed:
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


INT8 = _Fixed("int8", "b")
INT16 = _Fixed("int16", "h")
INT32 = _Fixed("int32", "i")
INT64 = _Fixed("int64", "q")
BOOL = _Bool()
UINT128 = _UInt128()
STRING = _String(nullable=False)
NULLABLE_STRING = _String(nullable=True)
BYTES = _Bytes(nullable=False)
NULLABLE_BYTES = _Bytes(nullable=True)
RECORDS = _Records()


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


def _active(cls: Any, version: int) -> tuple[Field, ...]:
    cache = cls.__dict__.get("_FIELD_CACHE")
    if cache is None:
        cache = {}
        cls._FIELD_CACHE = cache
    got = cache.get(version)
    if got is None:
        got = tuple(f for f in cls.FIELDS if f.since <= version)
        cache[version] = got
    return got


def encode(obj: Any, version: int, out: list[bytes] | None = None) -> list[bytes]:
    """Append the encoding of ``obj`` at ``version`` to ``out`` (a list of byte strings).

    A value the schema cannot carry is the caller's mistake, found before anything is sent:
    InvalidArgument, not ProtocolError (which means the peer sent bad bytes).

    The work is done by the class's generated encoder (:func:`_compiled`); when it fails (a value it
    cannot carry) what it appended is taken back and the field-by-field walk below runs, which raises the
    field's own error.
    """
    if out is None:
        out = []
    codecs = _CODECS.get((type(obj), version))
    if codecs is None:
        codecs = _compiled(type(obj), version)
    mark = len(out)
    try:
        codecs[0](obj, out)
        return out
    except Exception:
        del out[mark:]
    return encode_fields(obj, _active(type(obj), version), out)


def encode_fields(obj: Any, active: tuple[Field, ...], out: list[bytes]) -> list[bytes]:
    """Encode the given fields of ``obj``; shared by :func:`encode` and the sendfile head of a response."""
    for f in active:
        try:
            f.type.encode(getattr(obj, f.name), out)
        except InvalidArgument:
            raise
        except (struct.error, TypeError, AttributeError, ValueError, OverflowError) as exc:
            raise InvalidArgument(f"cannot encode {type(obj).__name__}.{f.name}: {exc}") from None
    return out


def decode(cls: Any, version: int, buf: Buffer, pos: int = 0, *, exact: bool = True) -> Any:
    """Decode a ``cls`` at ``version`` from ``buf[pos:]``; ProtocolError on any malformed input.

    The class's generated decoder (:func:`_compiled`) does the work; input it does not take whole (cut
    off, a bad length, a bool that is not 0 or 1, bad UTF-8, trailing bytes) goes to the field-by-field
    walk, which says exactly what is wrong.
    """
    codecs = _CODECS.get((cls, version))
    if codecs is None:
        codecs = _compiled(cls, version)
    try:
        obj, end = codecs[1](buf, pos)
    except Exception:
        return decode_fields(cls, version, buf, pos, exact=exact)
    if exact and end != len(buf):
        return decode_fields(cls, version, buf, pos, exact=exact)
    return obj


def decode_fields(cls: Any, version: int, buf: Buffer, pos: int = 0, *, exact: bool = True) -> Any:
    """:func:`decode` one field at a time, by the fields' own types: the reference the generated decoders
    must equal, and what explains malformed input."""
    kwargs: dict[str, Any] = {}
    try:
        for f in _active(cls, version):
            kwargs[f.name], pos = f.type.decode(buf, pos)
    except ProtocolError:
        raise
    except (struct.error, ValueError, IndexError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None
    if exact and pos != len(buf):
        raise ProtocolError(f"{cls.__name__} has {len(buf) - pos} unexpected trailing bytes")
    return cls(**kwargs)


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


FieldDecl = Callable[[type], type]


# -- generated codecs ---------------------------------------------------------------------------------
#
# The walk above (a method call per field, a tuple per decoded value) is the reference. For each message
# class and version that is encoded or decoded, one encoder and one decoder are generated from FIELDS, the
# way ``dataclasses`` generates ``__init__``: straight-line code where adjacent fixed-width fields, and the
# length or count that follows them, are one ``struct`` call, strings and arrays are read in place, and the
# items of an array of structs are built in the loop. The generated code only takes what is well formed;
# anything else raises, and :func:`encode` / :func:`decode` run the reference walk, which raises the field's
# own error. Tests hold every API's generated codec to the walk's bytes and objects.

_CODECS: dict[tuple[Any, int], tuple[Callable[[Any, list[bytes]], None], Callable[[Buffer, int], tuple[Any, int]]]] = {}
"""(encoder, decoder) per (message class, version), generated at first use by :func:`_compiled`."""


class _Refused(Exception):
    """Raised by generated code for a value or input that the reference walk must explain."""


def _compiled(cls: Any, version: int) -> tuple[Callable[[Any, list[bytes]], None],
                                                Callable[[Buffer, int], tuple[Any, int]]]:
    active = _active(cls, version)
    codecs = (_CodeGen().encoder(cls, active), _CodeGen().decoder(cls, active))
    _CODECS[(cls, version)] = codecs
    return codecs


def _length_format(wire: Any) -> str | None:
    """The struct format of the length or count that begins a variable-size field, or None."""
    if isinstance(wire, _String):
        return "h"
    if isinstance(wire, (_Bytes, _Records, Array)):
        return "i"
    return None


def _constructor(cls: Any, names: list[str], values: list[str]) -> str:
    """The expression that builds ``cls`` from the variables ``values`` of the fields ``names``: positional
    when they are the dataclass's first init fields in order, else by keyword."""
    init = [f.name for f in fields(cls) if f.init]
    if init[:len(names)] == names:
        return f"{{cls}}({', '.join(values)})"
    return f"{{cls}}({', '.join(f'{n}={v}' for n, v in zip(names, values, strict=True))})"


class _CodeGen:
    """The source of one generated encoder or decoder, and the names it uses."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {"_Refused": _Refused, "_str": str, "_bytes": bytes, "_len": len,
                                      "_range": range, "_isinstance": isinstance, "_I16": _I16, "_I32": _I32}
        self.count = 0

    def fresh(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, value: Any, stem: str) -> str:
        for name, known in self.names.items():
            if known is value:
                return name
        name = self.fresh("_" + stem)
        self.names[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def build(self, name: str, cls: Any) -> Any:
        source = "\n".join(self.lines)
        namespace = dict(self.names)
        exec(compile(source, f"<metaq.protocol.schema {name} of {cls.__name__}>", "exec"), namespace)
        function = namespace[name]
        function.__source__ = source  # for reading (and debugging) what was generated
        return function

    # -- decoding

    def decoder(self, cls: Any, active: tuple[Field, ...]) -> Callable[[Buffer, int], tuple[Any, int]]:
        self.emit(0, "def decode(buf, pos):")
        self.emit(1, "size = _len(buf)")
        values = self.read_fields(active, 1)
        make = _constructor(cls, [f.name for f in active], values).format(cls=self.const(cls, cls.__name__))
        self.emit(1, f"return {make}, pos")
        return self.build("decode", cls)

    def read_fields(self, active: tuple[Field, ...] | list[Field], depth: int) -> list[str]:
        """Code that reads ``active`` at ``pos`` (advancing it); the variables that hold their values."""
        values: list[str] = []
        run: list[tuple[str, str, str]] = []  # (variable, kind, struct format) read by one unpack
        for f in active:
            wire = f.type
            if type(wire) is _Fixed:
                values.append(self.fresh("v"))
                run.append((values[-1], "fixed", wire._st.format[1:]))
                continue
            if isinstance(wire, _UInt128):
                values.append(self.fresh("v"))
                run.append((values[-1], "uint128", "QQ"))
                continue
            length = _length_format(wire)
            if length is not None:  # its length or count joins the run: one unpack for both
                n = self.fresh("n")
                run.append((n, "length", length))
                self.unpack(run, depth)
                values.append(self.fresh("v"))
                self.read_sized(wire, n, values[-1], depth)
                continue
            self.unpack(run, depth)
            values.append(self.fresh("v"))
            self.read_other(wire, values[-1], depth)
        self.unpack(run, depth)
        return values

    def unpack(self, run: list[tuple[str, str, str]], depth: int) -> None:
        if not run:
            return
        packer = struct.Struct(">" + "".join(fmt for _v, _k, fmt in run))
        targets: list[str] = []
        for variable, kind, _fmt in run:
            targets += [variable + "_hi", variable + "_lo"] if kind == "uint128" else [variable]
        self.emit(depth, f"{', '.join(targets)}, = {self.const(packer, 'S')}.unpack_from(buf, pos)")
        self.emit(depth, f"pos += {packer.size}")
        for variable, kind, _fmt in run:
            if kind == "uint128":
                self.emit(depth, f"{variable} = ({variable}_hi << 64) | {variable}_lo")
                self.emit(depth, f"if {variable} == {(1 << 128) - 1}:")
                self.emit(depth + 1, f"{variable} = -1")
        run.clear()

    def read_sized(self, wire: Any, n: str, value: str, depth: int) -> None:
        """The body of a variable-size field whose length or count ``n`` was just read."""
        nullable = getattr(wire, "nullable", False)
        self.emit(depth, f"if {n} < 0:")
        if nullable:
            self.emit(depth + 1, f"if {n} != -1:")
            self.emit(depth + 2, "raise _Refused")
            self.emit(depth + 1, f"{value} = None")
        else:
            self.emit(depth + 1, "raise _Refused")
        self.emit(depth, "else:")
        depth += 1
        if isinstance(wire, Array):
            self.emit(depth, f"if {n} > size - pos:")  # every item takes at least one byte
            self.emit(depth + 1, "raise _Refused")
            self.emit(depth, f"{value} = []")
            self.emit(depth, f"for _ in _range({n}):")
            item = self.read_item(wire.item, depth + 1)
            self.emit(depth + 1, f"{value}.append({item})")
            return
        end = self.fresh("e")
        self.emit(depth, f"{end} = pos + {n}")
        self.emit(depth, f"if {end} > size:")
        self.emit(depth + 1, "raise _Refused")
        if isinstance(wire, _String):
            self.emit(depth, f"{value} = _str(buf[pos:{end}], 'utf-8')")
        elif isinstance(wire, _Bytes):
            self.emit(depth, f"{value} = _bytes(buf[pos:{end}])")
        else:  # RECORDS: a slice of the frame, as the reference gives it
            self.emit(depth, f"{value} = buf[pos:{end}]")
        self.emit(depth, f"pos = {end}")

    def read_item(self, wire: Any, depth: int) -> str:
        if isinstance(wire, Struct):
            names = [f.name for f in wire.cls.FIELDS]
            values = self.read_fields(wire.cls.FIELDS, depth)
            item = self.fresh("item")
            make = _constructor(wire.cls, names, values).format(cls=self.const(wire.cls, wire.cls.__name__))
            self.emit(depth, f"{item} = {make}")
            return item
        return self.read_fields([Field("item", wire)], depth)[0]

    def read_other(self, wire: Any, value: str, depth: int) -> None:
        if isinstance(wire, _Bool):
            self.emit(depth, f"{value} = buf[pos]")
            self.emit(depth, f"if {value} > 1:")
            self.emit(depth + 1, "raise _Refused")
            self.emit(depth, f"{value} = {value} == 1")
            self.emit(depth, "pos += 1")
        elif isinstance(wire, Struct):
            item = self.read_item(wire, depth)
            self.emit(depth, f"{value} = {item}")
        else:  # a wire type this generator does not know: its own decode
            self.emit(depth, f"{value}, pos = {self.const(wire, 'T')}.decode(buf, pos)")

    # -- encoding

    def encoder(self, cls: Any, active: tuple[Field, ...]) -> Callable[[Any, list[bytes]], None]:
        self.emit(0, "def encode(obj, out):")
        self.emit(1, "_a = out.append")
        self.write_fields(active, "obj", 1)
        self.emit(1, "return None")
        return self.build("encode", cls)

    def write_fields(self, active: tuple[Field, ...] | list[Field], obj: str, depth: int) -> None:
        run: list[tuple[str, str]] = []  # (expression, struct format) packed by one call
        for f in active:
            wire = f.type
            if isinstance(wire, _Fixed):  # BOOL too: it packs as "?", as its own encode does
                value = self.fresh("v")
                self.emit(depth, f"{value} = {obj}.{f.name}")
                run.append((value, wire._st.format[1:]))
                continue
            if isinstance(wire, _UInt128):
                value = self.fresh("v")
                self.emit(depth, f"{value} = {obj}.{f.name}")
                self.emit(depth, f"if {value} < 0:")  # -1 ("no id") travels as all ones
                self.emit(depth + 1, f"{value} = {(1 << 128) - 1}")
                run += [(f"{value} >> 64", "Q"), (f"{value} & {(1 << 64) - 1}", "Q")]
                continue
            self.pack(run, depth)
            value = self.fresh("v")
            self.emit(depth, f"{value} = {obj}.{f.name}")
            self.write_value(wire, value, depth)
        self.pack(run, depth)

    def pack(self, run: list[tuple[str, str]], depth: int) -> None:
        if not run:
            return
        packer = struct.Struct(">" + "".join(fmt for _e, fmt in run))
        self.emit(depth, f"_a({self.const(packer, 'S')}.pack({', '.join(e for e, _f in run)}))")
        run.clear()

    def write_value(self, wire: Any, value: str, depth: int) -> None:
        nullable = getattr(wire, "nullable", False)
        if isinstance(wire, _Records):
            self.emit(depth, f"if {value} is None:")
            self.emit(depth + 1, f"{value} = b''")
            self.emit(depth, f"_a(_I32.pack(_len({value})))")
            self.emit(depth, f"_a({value} if _isinstance({value}, _bytes) else _bytes({value}))")
            return
        if isinstance(wire, (_String, _Bytes, Array)):
            self.emit(depth, f"if {value} is None:")
            if nullable:
                null = _I16.pack(-1) if isinstance(wire, _String) else _I32.pack(-1)
                self.emit(depth + 1, f"_a({null!r})")
            else:
                self.emit(depth + 1, "raise _Refused")
            self.emit(depth, "else:")
            depth += 1
            if isinstance(wire, _String):
                raw = self.fresh("r")
                self.emit(depth, f"{raw} = {value}.encode()")
                self.emit(depth, f"if _len({raw}) > 32767:")
                self.emit(depth + 1, "raise _Refused")
                self.emit(depth, f"_a(_I16.pack(_len({raw})))")
                self.emit(depth, f"_a({raw})")
            elif isinstance(wire, _Bytes):
                self.emit(depth, f"_a(_I32.pack(_len({value})))")
                self.emit(depth, f"_a(_bytes({value}))")
            else:
                self.emit(depth, f"_a(_I32.pack(_len({value})))")
                item = self.fresh("it")
                self.emit(depth, f"for {item} in {value}:")
                self.write_item(wire.item, item, depth + 1)
            return
        if isinstance(wire, Struct):
            self.write_fields(wire.cls.FIELDS, value, depth)
            return
        self.emit(depth, f"{self.const(wire, 'T')}.encode({value}, out)")

    def write_item(self, wire: Any, item: str, depth: int) -> None:
        if isinstance(wire, Struct):
            self.write_fields(wire.cls.FIELDS, item, depth)
        else:  # a string, bytes, an array; a fixed-width item by its type's own encode
            self.write_value(wire, item, depth)
