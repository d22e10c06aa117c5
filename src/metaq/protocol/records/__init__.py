"""Record batches: the unit a producer sends, the broker stores with one write, and a fetch returns.

- :mod:`.format`: the byte layout (drawn at its top), the header, the producer block, stamping;
- :mod:`.compression`: the records region compressed as a whole (lz4, zstd), inflated within a bound;
- :mod:`.encode`: building batches (the producer's side);
- :mod:`.validate`: checking a batch's body (what the broker checks before it stores one, and readers before they
  trust one);
- :mod:`.decode`: reading batches (columns, Messages, a fetch reply walked batch by batch).

The names below are the package's interface; the modules' other names are theirs.
"""

from metaq.protocol.records.compression import Compression
from metaq.protocol.records.decode import (
    MessageBatch,
    batch_columns,
    damaged_batch_error,
    decode_batch,
    decode_fetched,
    decode_fetched_batches,
    fetched_batches,
    is_protocol_error,
    iter_batches,
    message_batch,
)
from metaq.protocol.records.encode import (
    BatchBuilder,
    assemble_batch,
    encode_columns,
    encode_messages,
    encode_record,
    encode_values,
    rebuild_batch,
    record_batch_bytes,
)
from metaq.protocol.records.format import (
    ATTR_DELAYED,
    HEADER_BYTES,
    HEADER_CRC_COVERS,
    LENGTH_PREFIX_BYTES,
    MAGIC,
    OLD_MAGICS,
    PRODUCER_BLOCK_BYTES,
    PRODUCER_STAMPED,
    RECORD_OVERHEAD_BYTES,
    SEQUENCE_LIMIT,
    STAMPED_BYTES,
    BatchHeader,
    ProducerStamp,
    compute_crc,
    crc_ok,
    peek_length,
    producer_stamp,
    read_header,
    stamp,
    stamp_prefix,
    with_producer_stamp,
)
from metaq.protocol.records.validate import validate_batch

__all__ = [
    "ATTR_DELAYED",
    "HEADER_BYTES",
    "HEADER_CRC_COVERS",
    "LENGTH_PREFIX_BYTES",
    "MAGIC",
    "OLD_MAGICS",
    "PRODUCER_BLOCK_BYTES",
    "PRODUCER_STAMPED",
    "RECORD_OVERHEAD_BYTES",
    "SEQUENCE_LIMIT",
    "STAMPED_BYTES",
    "BatchBuilder",
    "BatchHeader",
    "Compression",
    "MessageBatch",
    "ProducerStamp",
    "assemble_batch",
    "batch_columns",
    "compute_crc",
    "crc_ok",
    "damaged_batch_error",
    "decode_batch",
    "decode_fetched",
    "decode_fetched_batches",
    "encode_columns",
    "encode_messages",
    "encode_record",
    "encode_values",
    "fetched_batches",
    "is_protocol_error",
    "iter_batches",
    "message_batch",
    "peek_length",
    "producer_stamp",
    "read_header",
    "rebuild_batch",
    "record_batch_bytes",
    "stamp",
    "stamp_prefix",
    "validate_batch",
    "with_producer_stamp",
]
