"""The replica fetcher's pure parts: trimming a fetch reply to whole batches, and the lag it reports."""

from __future__ import annotations

from metaq.broker.replication.fetcher import FollowerState, whole_batches
from metaq.protocol.records import encode_values, iter_batches


def test_whole_batches_drops_only_a_cut_off_tail() -> None:
    batches = [encode_values([f"v{i}".encode()] * (i + 1), 1000) for i in range(3)]
    reply = b"".join(batches)
    assert bytes(whole_batches(reply)) == reply
    for cut in range(1, len(batches[-1])):
        assert bytes(whole_batches(reply[:-cut])) == b"".join(batches[:2])
    assert bytes(whole_batches(reply[:5])) == b""
    assert bytes(whole_batches(b"")) == b""
    assert len(list(iter_batches(bytes(whole_batches(reply[:-1]))))) == 2


def test_lag_ms_counts_from_the_last_time_the_slave_was_caught_up() -> None:
    state = FollowerState(caught_up_at=100.0)
    assert state.lag_ms(101.0) == -1, "no reply from the master yet"
    state.lag_messages = 5
    assert state.lag_ms(101.5) == 1500
    state.lag_messages = 0
    assert state.lag_ms(200.0) == 0
