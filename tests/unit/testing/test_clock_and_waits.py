"""metaq.testing's fake clock and waits: what the tests built on them rely on."""

from __future__ import annotations

import asyncio

import pytest

from metaq.testing import FakeClock, until, wait_until


def test_the_fake_clock_gives_seconds_and_milliseconds_of_one_time() -> None:
    clock = FakeClock(now_s=0.0)
    for _ in range(3):
        clock.advance_ms(1000 / 3)
    clock.advance_s(0.1)
    clock.advance_ms(7)
    assert clock() == clock.now_s == pytest.approx(1.107)
    assert clock.ms() == pytest.approx(1107)
    clock.now_s = 1_700_000_000.0
    clock.advance_ms(1)  # whole milliseconds stay exact, even at a wall-clock time
    assert clock.ms() == 1_700_000_000_001.0


def test_until_returns_the_value_and_fails_naming_what_it_waited_for() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        box: list[int] = []
        loop.call_later(0.05, box.append, 7)
        assert await until(lambda: box and box[0], 5, message="the box") == 7
        with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for nothing at all"):
            await until(lambda: False, 0.05, message="nothing at all")

    asyncio.run(main())
    with pytest.raises(AssertionError, match="waiting for never"):
        wait_until(lambda: None, 0.05, message="never")
