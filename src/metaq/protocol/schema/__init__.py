"""Declared, versioned wire schemas.

A message class declares its fields once, as data::

    @message(api_key=5, name="Fetch")
    @dataclass
    class FetchRequest:
        topic: str = ""
        ...
    FetchRequest.FIELDS = (Field("topic", STRING), Field("group", STRING, since=1), ...)

and :func:`encode` / :func:`decode` turn it into bytes and back for any version. No other code packs fields by
hand, so a schema change is one line and the fuzzer covers every frame.

- :mod:`.wire`: the wire types (INT8 ... RECORDS, :class:`Array`, :class:`Struct`), :class:`Field`, the fields
  a class carries at a version, and the declaration check;
- :mod:`.walk`: :func:`encode` / :func:`decode`, and the field-by-field walk that is their reference and says
  what is wrong with malformed input;
- :mod:`.codegen`: the encoder and decoder generated per class and version, which do the work.

The names below are the package's interface; the modules' other names are theirs.
"""

from metaq.protocol.schema.walk import decode, decode_fields, encode, encode_fields
from metaq.protocol.schema.wire import (
    BOOL,
    BYTES,
    INT8,
    INT16,
    INT32,
    INT64,
    NULLABLE_BYTES,
    NULLABLE_STRING,
    RECORDS,
    STRING,
    UINT128,
    Array,
    Buffer,
    Field,
    Schema,
    Struct,
    WireType,
    active_fields,
    check_schema,
    described,
)

__all__ = [
    "BOOL",
    "BYTES",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "NULLABLE_BYTES",
    "NULLABLE_STRING",
    "RECORDS",
    "STRING",
    "UINT128",
    "Array",
    "Buffer",
    "Field",
    "Schema",
    "Struct",
    "WireType",
    "active_fields",
    "check_schema",
    "decode",
    "decode_fields",
    "described",
    "encode",
    "encode_fields",
]
