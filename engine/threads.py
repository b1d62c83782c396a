"""Priorities of the engine's compute threads."""
from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager

log = logging.getLogger("llamadesk.engine")
COMPUTE_NICE = 5  # niceness of every compute thread (Linux, per thread)


def lower_priority(nice: int = COMPUTE_NICE) -> None:
    """Make this compute thread (and the threads it starts later, which inherit it) yield to the event
    loop. With llama.cpp on every core, an equal-priority loop thread waits for CPU time slices and the
    window and HTTP replies stutter; every compute thread (LLM scheduler, speech workers) gets the same
    niceness so that none of them starves another."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError as e:
        log.debug("cannot lower this thread's priority: %s", e)


class ComputeShare:
    """Shares the cores between llama.cpp and speech jobs.

    llama.cpp's OpenMP threads meet at a barrier after every graph node: when another busy thread takes
    one of their cores, each barrier waits whole scheduler time slices (measured: an LLM tick that began
    just before a 0.12 s ASR job lasted the whole job). So a speech job first waits for the decode in
    flight to finish, and the LLM decodes with one thread fewer for as long as speech jobs run.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.speech = 0  # speech jobs computing now
        self._decoding = False

    @contextmanager
    def speech_job(self):
        with self._cond:
            self.speech += 1
            self._cond.wait_for(lambda: not self._decoding, timeout=0.5)
        try:
            yield
        finally:
            with self._cond:
                self.speech -= 1

    def begin_decode(self, threads: int) -> int:
        """Threads the next llama_decode may use (call end_decode after it)."""
        with self._cond:
            self._decoding = True
            return max(1, threads - self.speech)

    def end_decode(self) -> None:
        with self._cond:
            self._decoding = False
            self._cond.notify_all()


compute = ComputeShare()
