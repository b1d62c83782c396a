"""Small helpers the desktop tests share for driving the app on its qasync loop (tests/app/conftest.py)."""
from __future__ import annotations

import asyncio
import time


def run(loop, coro, timeout: float = 60):
    """Run coro on the loop (the app's server and window run meanwhile), at most timeout seconds."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def until(pred, timeout: float = 30.0) -> None:
    """Wait, with the loop running, until pred() holds; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def next_signal(signal, pred=lambda *a: True) -> asyncio.Future:
    """A future resolved with the arguments of the next emission of signal matching pred."""
    fut = asyncio.get_event_loop().create_future()

    def on(*args):
        if pred(*args) and not fut.done():
            fut.set_result(args)
    signal.connect(on)
    fut.add_done_callback(lambda _: signal.disconnect(on))
    return fut
