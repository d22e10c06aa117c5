"""track_brokers blocks nest by identity, so a module-scoped fixture's broker reaches the session's block."""

from __future__ import annotations

from metaq.testing import broker as harness


def test_an_empty_inner_block_ending_leaves_the_outer_block_in_place() -> None:
    with harness.track_brokers() as outer:
        with harness.track_brokers():
            pass  # an empty block equal to the (empty) outer one: it must not take the outer one out
        assert harness._collectors[-1] is outer
    assert all(block is not outer for block in harness._collectors)
