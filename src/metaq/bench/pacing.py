"""The offered load of an end-to-end run: ``rate`` sends a second, in 1 ms bursts (``tick``) or one at a time
(``even``). `metaq bench e2e` and the peers of `metaq bench peers` offer the same load through it, so that both
meet the same shape."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


async def send_paced(send_one: Callable[[], None], rate: int, total: int, pacing: str = "tick",
                     end_tick: Callable[[], None] | None = None) -> None:
    """Call ``send_one`` ``total`` times at ``rate`` a second, as `bench e2e --pacing` offers its load (and the
    peers of `bench peers` offer theirs). ``tick``: every millisecond
    (the resolution of the loop's timers), the sends due since the last tick, together: at 5,000 msg/s bursts of
    five. ``even``: each send at its own time, start + i/rate. ``end_tick`` (if given) runs after each tick's
    sends (after every send with ``even``): where a client that sends a tick's messages as one request does so."""
    if pacing == "even":
        await _send_evenly(send_one if end_tick is None else _then(send_one, end_tick), rate, total)
        return
    if pacing != "tick":
        raise ValueError(f"unknown pacing {pacing!r} (tick or even)")
    sent = 0
    start = time.perf_counter()
    while sent < total:
        due = min(int((time.perf_counter() - start) * rate) + 1, total)
        if sent < due:
            while sent < due:
                send_one()
                sent += 1
            if end_tick is not None:
                end_tick()
        await asyncio.sleep(0.001)


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        second()
    return both


async def _send_evenly(send_one: Callable[[], None], rate: int, total: int) -> None:
    """Call ``send_one`` on the loop ``total`` times, the i-th at start + i/rate. The loop's own timers have
    millisecond resolution (epoll's timeout, libuv's timers), so a thread sleeps until each send is due
    (nanosleep) and hands it to the loop; sends the loop has not run yet when the next is due run in order."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()

    def pace() -> None:
        start = time.perf_counter()
        for i in range(total):
            if stop.is_set():
                return
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            loop.call_soon_threadsafe(send_one)
        loop.call_soon_threadsafe(finished.set_result, None)  # after the last send_one (callbacks run in order)

    thread = threading.Thread(target=pace, name="metaq-bench-pacer", daemon=True)
    thread.start()
    try:
        await finished
    finally:
        stop.set()
        thread.join()
