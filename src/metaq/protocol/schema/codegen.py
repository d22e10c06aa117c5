"""The generated codecs: one encoder and one decoder per message class and version, made from ``FIELDS``.

The walk over ``FIELDS`` (:mod:`.walk`: a method call per field, a tuple per decoded value) is the reference.
For each message class and version that is encoded or decoded, one encoder and one decoder are generated from
FIELDS, the way ``dataclasses`` generates ``__init__``: straight-line code where adjacent fixed-width fields,
and the length or count that follows them, are one ``struct`` call, strings and arrays are read in place, and
the items of an array of structs are built in the loop. The generated code only takes what is well formed;
anything else raises, and :func:`.walk.encode` / :func:`.walk.decode` run the reference walk, which raises
the field's own error. Tests hold every API's generated codec to the walk's bytes and objects.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from metaq.protocol.schema.wire import (
    I16,
    I32,
    Array,
    Bool,
    Buffer,
    Bytes,
    Field,
    Fixed,
    Records,
    String,
    Struct,
    UInt128,
    active_fields,
)

CODECS: dict[tuple[Any, int], tuple[Callable[[Any, list[bytes]], None], Callable[[Buffer, int], tuple[Any, int]]]] = {}
"""(encoder, decoder) per (message class, version), generated at first use by :func:`compiled`."""


class _Refused(Exception):
    """Raised by generated code for a value or input that the reference walk must explain."""


def compiled(cls: Any, version: int) -> tuple[Callable[[Any, list[bytes]], None],
                                                Callable[[Buffer, int], tuple[Any, int]]]:
    active = active_fields(cls, version)
    codecs = (_CodeGen().encoder(cls, active), _CodeGen().decoder(cls, active))
    CODECS[(cls, version)] = codecs
    return codecs


def _length_format(wire: Any) -> str | None:
    """The struct format of the length or count that begins a variable-size field, or None."""
    if isinstance(wire, String):
        return "h"
    if isinstance(wire, (Bytes, Records, Array)):
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
                                      "_range": range, "_isinstance": isinstance, "I16": I16, "I32": I32}
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
            if type(wire) is Fixed:
                values.append(self.fresh("v"))
                run.append((values[-1], "fixed", wire._st.format[1:]))
                continue
            if isinstance(wire, UInt128):
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
        if isinstance(wire, String):
            self.emit(depth, f"{value} = _str(buf[pos:{end}], 'utf-8')")
        elif isinstance(wire, Bytes):
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
        if isinstance(wire, Bool):
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
            if isinstance(wire, Fixed):  # BOOL too: it packs as "?", as its own encode does
                value = self.fresh("v")
                self.emit(depth, f"{value} = {obj}.{f.name}")
                run.append((value, wire._st.format[1:]))
                continue
            if isinstance(wire, UInt128):
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
        if isinstance(wire, Records):
            self.emit(depth, f"if {value} is None:")
            self.emit(depth + 1, f"{value} = b''")
            self.emit(depth, f"_a(I32.pack(_len({value})))")
            self.emit(depth, f"_a({value} if _isinstance({value}, _bytes) else _bytes({value}))")
            return
        if isinstance(wire, (String, Bytes, Array)):
            self.emit(depth, f"if {value} is None:")
            if nullable:
                null = I16.pack(-1) if isinstance(wire, String) else I32.pack(-1)
                self.emit(depth + 1, f"_a({null!r})")
            else:
                self.emit(depth + 1, "raise _Refused")
            self.emit(depth, "else:")
            depth += 1
            if isinstance(wire, String):
                raw = self.fresh("r")
                self.emit(depth, f"{raw} = {value}.encode()")
                self.emit(depth, f"if _len({raw}) > 32767:")
                self.emit(depth + 1, "raise _Refused")
                self.emit(depth, f"_a(I16.pack(_len({raw})))")
                self.emit(depth, f"_a({raw})")
            elif isinstance(wire, Bytes):
                self.emit(depth, f"_a(I32.pack(_len({value})))")
                self.emit(depth, f"_a(_bytes({value}))")
            else:
                self.emit(depth, f"_a(I32.pack(_len({value})))")
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
