"""Callers that ask for the same thing at once share one run of it.

Probe on the LVM backend runs an lvm2 report.  A CO's liveness checks and a
client retrying on a short deadline can ask again before the previous report
has returned; on a slow machine each would start one more report, each
slowing the others, until none returns within any deadline.  With
:class:`SingleFlight` they all wait for the report already running.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """``run(fn)`` runs ``fn`` unless a run is in progress, whose outcome it then shares."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Future | None = None
        self._followers = 0

    @property
    def followers(self) -> int:
        """How many callers are waiting for a run they did not start."""
        with self._lock:
            return self._followers

    def run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = Future()
                leader = True
            else:
                leader = False
                self._followers += 1
        if not leader:
            try:
                return running.result()
            finally:
                with self._lock:
                    self._followers -= 1
        try:
            result = fn()
        except BaseException as exc:
            running.set_exception(exc)
            raise
        else:
            running.set_result(result)
            return result
        finally:
            with self._lock:
                self._running = None
