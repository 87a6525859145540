"""The threads that run reconcile passes, urgent passes first.

A pass mostly waits on the API server, so the controller runs many at once. When more are due than there
are threads (hundreds of pauses ending together, a burst of Deployment changes), the rest queue. A pass
asked for by a person (an abort, pause or promote annotation, a new spec, a deletion) is not put behind
that queue: it takes the next free thread. Among passes of one kind, the first asked for runs first.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

URGENT, ROUTINE, _STOP = 0, 1, 2


class PassPool:
    """A fixed set of threads taking work from one priority queue."""

    def __init__(self, threads: int, *, name: str = "reconcile") -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._queue: queue.PriorityQueue[tuple[int, int, Future[Any] | None, Callable[..., Any] | None, tuple[Any, ...]]] = (
            queue.PriorityQueue()
        )
        self._order = itertools.count()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        self._stopped = False
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], *args: Any, urgent: bool = False) -> Future[T]:
        if self._stopped:
            raise RuntimeError("the pool is stopped")
        future: Future[T] = Future()
        self._queue.put((URGENT if urgent else ROUTINE, next(self._order), future, fn, args))
        return future

    def queued(self) -> int:
        """Work waiting for a thread (an estimate, as any queue size)."""
        return self._queue.qsize()

    def stop(self, *, wait: bool = True) -> None:
        """Let the threads finish what is queued and end."""
        self._stopped = True
        for _ in self._threads:
            self._queue.put((_STOP, next(self._order), None, None, ()))
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        while True:
            _, _, future, fn, args = self._queue.get()
            if future is None or fn is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(err)
            else:
                future.set_result(result)
