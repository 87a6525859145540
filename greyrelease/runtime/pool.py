"""The threads that run reconcile passes, urgent passes first.

A pass mostly waits on the API server, so the controller runs many at once. When more are due than there
are threads (hundreds of pauses ending together, a burst of Deployment changes), the rest queue. A pass
asked for by a person (an abort, pause or promote annotation, a new spec, a deletion) is not put behind
that queue: it takes the next free thread. Among passes of one kind, the first asked for runs first.

Some urgent passes also hold routine ones back (`holds_routine`, the passes that cut traffic for an
abort): in a burst of aborts, the passes that restore capacity and move other releases along would
otherwise share the API server with the writes that cut traffic. A routine pass then waits until no such
pass is queued or running and the last one ended `hold` seconds ago, and never longer than `hold_max`
after it was asked for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class _Work:
    future: Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    at: float  # when it was asked for (time.monotonic)
    urgent: bool
    holds_routine: bool


class PassPool:
    """A fixed set of threads taking work from two queues, urgent first."""

    def __init__(
        self,
        threads: int,
        *,
        name: str = "reconcile",
        hold: float = 0.0,
        hold_max: float = 0.0,
        waited: Callable[[bool, float], None] | None = None,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if hold < 0 or hold_max < 0:
            raise ValueError("hold and hold_max must not be negative")
        self._hold, self._hold_max = hold, hold_max
        self._waited = waited  # told (urgent, seconds) as each pass starts
        self._cond = threading.Condition()
        self._urgent: deque[_Work] = deque()
        self._routine: deque[_Work] = deque()
        self._holding = 0  # passes that hold routine ones back, queued or running
        self._last_hold = float("-inf")  # when one was last asked for or finished
        self._stopped = False
        # While routine passes are held, one idle thread waits for the time the next may start, and the
        # others wait to be woken: were they all to wait for that time, each held pass would wake them all.
        self._timer_at = float("inf")
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, urgent: bool = False, holds_routine: bool = False) -> Future[T]:
        """Queue a pass. ``holds_routine`` makes it urgent, and routine passes wait for it (see above)."""
        future: Future[T] = Future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the pool is stopped")
            now = time.monotonic()
            work = _Work(future, fn, args, now, urgent or holds_routine, holds_routine)
            if holds_routine:
                self._holding += 1
                self._last_hold = now
            if work.urgent:
                self._urgent.append(work)
            else:
                self._routine.append(work)
            self._cond.notify()
        return future

    def promote(self, future: Future[Any], *, holds_routine: bool = False) -> bool:
        """A routine pass still queued becomes urgent (someone asked for its release meanwhile: the pass reads
        the release when it starts, so it sees what was asked); ``holds_routine`` as in :meth:`submit`. False
        when it is not queued as routine (urgent already, running or done)."""
        with self._cond:
            # A scan: queued routine passes are at most the scheduler's places, and a person's ask is rare.
            for i, work in enumerate(self._routine):
                if work.future is not future:
                    continue
                del self._routine[i]
                work.urgent = True
                if holds_routine:
                    work.holds_routine = True
                    self._holding += 1
                    self._last_hold = time.monotonic()
                self._urgent.append(work)
                self._cond.notify()
                return True
            return False

    def queued(self) -> int:
        """Work waiting for a thread."""
        with self._cond:
            return len(self._urgent) + len(self._routine)

    def stop(self, *, wait: bool = True) -> None:
        """Let the threads finish what is queued (holding nothing back) and end."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _routine_free_at(self) -> float:
        """When the oldest routine pass may start (the caller holds the lock and there is one)."""
        oldest = self._routine[0].at
        if self._stopped or self._hold_max <= 0 or self._last_hold == float("-inf"):
            return oldest
        quiet = self._last_hold + self._hold if self._holding == 0 else float("inf")
        return max(oldest, min(quiet, oldest + self._hold_max))

    def _next(self) -> _Work | None:
        """Wait for the next pass this thread may run; None once the pool is stopped and empty."""
        with self._cond:
            while True:
                if self._urgent:
                    return self._pass_on(self._urgent.popleft())
                if self._routine:
                    free_at = self._routine_free_at()
                    now = time.monotonic()
                    if free_at <= now:
                        return self._pass_on(self._routine.popleft())
                    if free_at < self._timer_at:
                        # No idle thread is waiting for that time yet: this one does.
                        self._timer_at = free_at
                        try:
                            self._cond.wait(free_at - now)
                        finally:
                            if self._timer_at == free_at:
                                self._timer_at = float("inf")
                        continue
                elif self._stopped:
                    return None
                self._cond.wait()

    def _pass_on(self, work: _Work) -> _Work:
        """Wake one more thread if work is left: one wake-up per pass taken, not one per thread."""
        if self._urgent or self._routine:
            self._cond.notify()
        return work

    def _work(self) -> None:
        while (work := self._next()) is not None:
            try:
                self._run(work)
            finally:
                if work.holds_routine:
                    with self._cond:
                        self._holding -= 1
                        self._last_hold = time.monotonic()
                        # The routine passes held for it may start sooner now: one thread looks again.
                        self._cond.notify()
            # Nothing of the pass is kept while the thread waits for the next one: its future holds the
            # pass's outcome (the plan and its status models) or its failure (and the frames of its
            # traceback), and every idle thread kept its last one (bench/README.md, "What an idle thread
            # keeps").
            del work

    def _run(self, work: _Work) -> None:
        if not work.future.set_running_or_notify_cancel():
            return
        if self._waited is not None:
            try:
                self._waited(work.urgent, time.monotonic() - work.at)
            except Exception:  # a failed report must not cost the pass or the thread
                log.exception("reporting a pass's wait failed")
        try:
            result = work.fn(*work.args)
        except BaseException as err:  # handed to whoever waits on the future
            work.future.set_exception(err)
            # This frame is in the failure's traceback: without ``work`` it holds no path back to the failure
            # (no reference cycle, which only a full garbage collection would free).
            del work
        else:
            work.future.set_result(result)
