"""Encoding and decoding a declared message: the generated codec (:mod:`.codegen`) for input it takes whole, and
the field-by-field walk over ``FIELDS`` by the fields' own types (:mod:`.wire`), the reference that explains
what is wrong with the rest."""

from __future__ import annotations

import struct
from typing import Any

from metaq.errors import InvalidArgument, ProtocolError
from metaq.protocol.schema.codegen import CODECS, compiled
from metaq.protocol.schema.wire import Buffer, Field, active_fields


def encode(obj: Any, version: int, out: list[bytes] | None = None) -> list[bytes]:
    """Append the encoding of ``obj`` at ``version`` to ``out`` (a list of byte strings).

    A value the schema cannot carry is the caller's mistake, found before anything is sent:
    InvalidArgument, not ProtocolError (which means the peer sent bad bytes).

    The work is done by the class's generated encoder (:func:`.codegen.compiled`); when it fails (a value it
    cannot carry) what it appended is taken back and the field-by-field walk below runs, which raises the
    field's own error.
    """
    if out is None:
        out = []
    codecs = CODECS.get((type(obj), version))
    if codecs is None:
        codecs = compiled(type(obj), version)
    mark = len(out)
    try:
        codecs[0](obj, out)
        return out
    except Exception:
        del out[mark:]
    return encode_fields(obj, active_fields(type(obj), version), out)


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

    The class's generated decoder (:func:`.codegen.compiled`) does the work; input it does not take whole (cut
    off, a bad length, a bool that is not 0 or 1, bad UTF-8, trailing bytes) goes to the field-by-field
    walk, which says exactly what is wrong.
    """
    codecs = CODECS.get((cls, version))
    if codecs is None:
        codecs = compiled(cls, version)
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
        for f in active_fields(cls, version):
            kwargs[f.name], pos = f.type.decode(buf, pos)
    except ProtocolError:
        raise
    except (struct.error, ValueError, IndexError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"malformed {cls.__name__}: {exc}") from None
    if exact and pos != len(buf):
        raise ProtocolError(f"{cls.__name__} has {len(buf) - pos} unexpected trailing bytes")
    return cls(**kwargs)
