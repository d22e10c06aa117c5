"""Kafka's recovery test: damage a random byte of the newest segment, reopen, and exactly the batches
wholly before the damage survive.

Every byte of a stored batch is covered by a checksum (the header CRC covers bytes [0, 41) -- the
stamped offset, id, append time, length, magic and the body CRC -- and the body CRC the rest), so any
position may be damaged: none is left out.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import make_batch, no_sync

from metaq.protocol.records import HEADER_BYTES, iter_batches
from metaq.storage import LogConfig, PartitionLog


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_damage_keeps_exactly_the_batches_before_it(tmp_path_factory, data):
    directory = tmp_path_factory.mktemp("c") / "t-0"
    config = LogConfig(unflush_threshold=1000, index_interval_bytes=data.draw(st.sampled_from([0, 100, 4096])))
    log = PartitionLog.open(directory, "t", 0, config, 1, sync=no_sync)
    for _ in range(data.draw(st.integers(1, 25), label="batches")):
        count = data.draw(st.integers(1, 6))
        size = data.draw(st.integers(0, 60))
        log.append(make_batch(count=count, size=size)[0])
    log.abandon()  # a crash: no clean-shutdown record
    path = directory / "00000000000000000000.log"
    content = bytearray(path.read_bytes())
    batches = list(iter_batches(content))
    position = data.draw(st.integers(0, len(content) - 1), label="position")
    content[position] ^= data.draw(st.integers(1, 255), label="xor")
    path.write_bytes(bytes(content))

    damaged = next(i for i, (pos, h) in enumerate(batches) if pos <= position < pos + h.total_bytes)
    survivors = batches[:damaged]
    log = PartitionLog.open(directory, "t", 0, config, 1, sync=no_sync)
    try:
        expected_end = survivors[-1][1].next_offset if survivors else 0
        assert log.log_end_offset == expected_end
        assert log.size_bytes == sum(h.total_bytes for _, h in survivors)
        if survivors:
            assert log.read_bytes(0, 1 << 20) == bytes(content[:log.size_bytes])
        # The log is writable again right after the cut.
        assert log.append(make_batch()[0]).base_offset == expected_end
    finally:
        log.close()


def test_damage_in_an_older_part_of_the_newest_segment_is_found(tmp_path):
    """Even before the last index entry: an unclean open checks the whole newest segment."""
    directory = tmp_path / "t-0"
    config = LogConfig(unflush_threshold=1000, index_interval_bytes=50)
    log = PartitionLog.open(directory, "t", 0, config, 1, sync=no_sync)
    for _ in range(30):
        log.append(make_batch()[0])
    log.abandon()
    path = directory / "00000000000000000000.log"
    batches = list(iter_batches(path.read_bytes()))
    position = batches[3][0] + HEADER_BYTES + 5  # in the records: the header stays intact
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 1]))
    log = PartitionLog.open(directory, "t", 0, config, 1, sync=no_sync)
    assert log.log_end_offset == batches[3][1].base_offset
    assert os.path.getsize(path) == batches[3][0]
    # the cut is reported: every byte, and the messages of every batch whose header is intact (the
    # damaged batch's own count included: only its records were hit)
    assert log.recovery.truncated_bytes == sum(h.total_bytes for _, h in batches[3:])
    assert log.recovery.truncated_messages == sum(h.record_count for _, h in batches[3:])
    log.close()
