"""Compression of a batch's records region (attribute bits 0-2): none, lz4 or zstd, as a whole.

Inflating is bounded: a batch read from a peer or a disk may declare (or hold) far more than it should, and a tiny
bomb must not make the reader allocate gigabytes. Every codec stops past ``max_bytes`` and says so.
"""

from __future__ import annotations

from enum import IntEnum

import lz4.frame as _lz4
import zstandard as _zstd

from metaq.errors import CorruptRecordError, InvalidArgument


class Compression(IntEnum):
    """How a batch's records region is compressed, as a whole (the batch attribute's low bits)."""

    NONE = 0
    LZ4 = 1
    ZSTD = 2

    @classmethod
    def parse(cls, value: str | int | Compression | None) -> Compression:
        """From a name (``none``, ``lz4``, ``zstd``, any case), a code or None (none); InvalidArgument otherwise."""
        if value is None:
            return cls.NONE
        if isinstance(value, Compression):
            return value
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise InvalidArgument(f"unknown compression code {value}; use 0 (none), 1 (lz4), 2 (zstd)") from None
        try:
            return cls[value.strip().upper()]
        except KeyError:
            raise InvalidArgument(f"unknown compression {value!r}; use none, lz4 or zstd") from None


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.LZ4:
        return bytes(_lz4.compress(data))
    if codec == Compression.ZSTD:
        return bytes(_zstd.ZstdCompressor(level=3).compress(data))
    return data


def _lz4_decompress(data: bytes, max_bytes: int) -> bytes:
    """Inflate step by step, stopping past ``max_bytes`` (LZ4FrameDecompressor preallocates max_length)."""
    declared = _lz4.get_frame_info(data)["content_size"]  # 0 when the frame does not say
    if declared > max_bytes:
        raise CorruptRecordError(f"compressed batch declares {declared} bytes, more than {max_bytes}")
    # +1: a frame whose size is declared ends in one call; a lying size still moves in 64 KiB steps.
    step = max(declared + 1, 1 << 16)
    lz4 = _lz4.LZ4FrameDecompressor()
    parts: list[bytes] = []
    total = 0
    while True:
        piece = lz4.decompress(data, max_length=min(step, max_bytes + 1 - total))
        data = b""
        parts.append(piece)
        total += len(piece)
        if lz4.eof or total > max_bytes:
            return b"".join(parts)
        if lz4.needs_input or not piece:
            raise CorruptRecordError("lz4 frame of the record batch is cut off")


def decompress(codec: int, data: bytes | memoryview, max_bytes: int) -> bytes:
    """Inflate a batch body, never allocating much more than ``max_bytes`` (a tiny bomb must not OOM us)."""
    try:
        if codec == Compression.LZ4:
            out = _lz4_decompress(bytes(data), max_bytes)
        elif codec == Compression.ZSTD:
            # zstandard ignores max_output_size when the frame declares its size: check that first.
            declared = _zstd.frame_content_size(bytes(data))
            if declared > max_bytes:
                raise CorruptRecordError(f"compressed batch declares {declared} bytes, more than {max_bytes}")
            out = bytes(_zstd.ZstdDecompressor().decompress(bytes(data), max_output_size=max_bytes))
        else:
            raise CorruptRecordError(f"unknown compression codec {codec}")
    except CorruptRecordError:
        raise
    except Exception as exc:
        raise CorruptRecordError(f"cannot decompress record batch: {exc}") from None
    if len(out) > max_bytes:
        raise CorruptRecordError(f"decompressed batch has {len(out)} bytes, more than {max_bytes}")
    return out
