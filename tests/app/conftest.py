"""The desktop tests' event loop: qasync's, with Qt's events pumped only while asyncio sees that loop running.

A Qt event processed while the loop is stopped can step an asyncio task (qasync's timers are Qt timers); asyncio
then sees no running loop and whatever the task asks of it fails (aiohttp's proxy lookup through asyncio.to_thread:
"no running event loop"). Two places did that between the tests' loop runs: qasync's run_until_complete(), which
processes events once more after its loop stopped, and pytest-qt, which processes events around every test phase.
"""
from __future__ import annotations

import asyncio

import pytest

try:
    import pytestqt.plugin
    import qasync
except ImportError:  # PySide6 is a dependency (always installed by `make test`); the CLI tests need none of it
    qasync = None

if qasync is not None:
    class RunningLoop(qasync.QEventLoop):
        """qasync's loop, whose events are all handled inside run_forever(): what is pending when a run ends waits
        for the next run."""

        current: RunningLoop | None = None

        def __init__(self, app):
            super().__init__(app)
            RunningLoop.current = self

        def run_until_complete(self, future):
            """Run until future is done; unlike qasync's, no event is handled after the loop has stopped."""
            future = asyncio.ensure_future(future, loop=self)
            future.add_done_callback(self._stop_after)
            try:
                self.run_forever()
            finally:
                future.remove_done_callback(self._stop_after)
            if not future.done():
                raise RuntimeError("Event loop stopped before Future completed.")
            return future.result()

        def _stop_after(self, _future) -> None:
            self.stop()

        def pump(self, seconds: float = 0.0) -> None:
            """Handle the pending Qt events (and asyncio callbacks) with the loop running, for seconds at least."""
            self.run_until_complete(asyncio.sleep(seconds))

        def close(self) -> None:
            if RunningLoop.current is self:
                RunningLoop.current = None
            super().close()

    _process_events = pytestqt.plugin._process_events

    def _process_events_in_the_loop() -> None:
        """pytest-qt's pumping around each test phase, done through the tests' loop while one is open."""
        loop = RunningLoop.current
        if loop is not None and not loop.is_closed() and not loop.is_running():
            loop.pump()
        else:
            _process_events()

    pytestqt.plugin._process_events = _process_events_in_the_loop

    @pytest.fixture(scope="module")
    def loop(qapp):
        """The module's qasync loop, set as the current event loop."""
        loop = RunningLoop(qapp)
        asyncio.set_event_loop(loop)
        yield loop
        loop.close()
        asyncio.set_event_loop(None)
