"""One queue of passes for all the releases a runtime drives, in place of a task per release.

A release at rest (finished, or following a Deployment that does not change) needs nothing between two
changes but the fact that it is due again some day. An asyncio task per release, sleeping on a timer and
an event, kept that fact in a coroutine frame, two waiter tasks per sleep and kopf's handler state for
each of them: a cost paid by every standing release, all the time, for releases that do nothing.

:class:`Scheduler` keeps it as an entry in a heap instead: a key (namespace, name) and the time its next
pass is due. It works as controller-runtime's work queue does:

- **Keyed and deduplicated.** A key is queued once however often it is asked for; asked for sooner than
  it was due, it is due sooner (a timer never delays a wake-up).
- **One pass of a key at a time.** A key asked for while its pass runs is not run twice at once: it is
  marked, and run again as soon as that pass ends (the pass may have read the world before the change
  that asked for it).
- **Delayed adds.** A timer is a key due later; one loop timer (``call_at``) stands for the earliest of
  them, whatever the number of releases.
- **Priority.** A key asked for by a person (an abort, a new spec) goes ahead of routine keys among those
  due, here and again in the pass threads' own queue (:class:`~greyrelease.runtime.pool.PassPool`). A key
  asked for urgently while its routine pass is handed out but has not started is told to ``promote``,
  which moves that pass ahead in the threads' queue: otherwise the person's ask would wait for it there,
  behind every routine pass queued, or held back by aborts, before it.
- **Bounded.** At most ``in_flight`` routine passes are handed to the threads at once, and at most as many
  urgent ones; the rest wait here as keys (a controller started over 10,000 releases queues 10,000 keys, not
  10,000 tasks). The urgent ones have places of their own: while aborts come in, the pass threads hold the
  routine passes handed to them back (:class:`~greyrelease.runtime.pool.PassPool`), and routine passes
  holding every place would keep the next abort out until that hold ran out (``abort_hold_max``, 3 s).

A pass ends by saying when its key is due again (its plan's ``requeue_after``, the backoff after a failure)
or never. A person's ask that came in meanwhile wins over that.

Written here rather than taken from a package: no asyncio work queue on PyPI has all of keyed dedup,
one-at-a-time per key and delayed adds (``asyncio.PriorityQueue`` has none of the three), and the whole of
it is the hundred lines below.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger("greyrelease")

K = TypeVar("K", bound=Hashable)


class Scheduler(Generic[K]):
    """Passes of keys, each when it is due, one at a time per key, at most ``in_flight`` of each kind at once.

    ``run(key, urgent)`` is one pass; it returns the seconds after which the key is due again, or None
    (not due again until asked for). It must not raise: a pass that fails says when to try again. On the
    event loop's thread only."""

    def __init__(
        self,
        run: Callable[[K, bool], Awaitable[float | None]],
        *,
        in_flight: int = 256,
        promote: Callable[[K], None] | None = None,
    ) -> None:
        if in_flight < 1:
            raise ValueError("in_flight must be at least 1")
        self._run = run
        self._promote = promote  # told of a key asked for urgently while its routine pass runs
        self._in_flight = in_flight
        #: When each queued key is due (time.monotonic); the heap holds (due, key) pairs, and a pair whose due
        #: is no longer the key's (asked for sooner since, or run) is skipped when it comes up.
        self._due: dict[K, float] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0  # ties in the heap are broken by order of asking, never by comparing keys
        #: Keys due now and waiting for a free place, urgent ones first. The value says which deque the key
        #: is in; a key moved to the urgent one leaves a stale entry in the routine one, skipped later.
        self._ready: dict[K, bool] = {}
        self._urgent: deque[K] = deque()
        self._routine: deque[K] = deque()
        #: Keys whose pass runs, and of those, the ones asked for again meanwhile (the value: urgently).
        self._running: dict[K, asyncio.Task[None]] = {}
        self._running_urgent = 0  # of the passes running, the urgent ones (places of their own)
        self._again: dict[K, bool] = {}
        #: Keys whose passes are held off (another driver has them for a while, see :meth:`exclusive`).
        self._held: dict[K, asyncio.Event] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._stopped = False

    # --- asking ---------------------------------------------------------------------------------------

    def add(self, key: K, delay: float = 0.0, *, urgent: bool = False) -> None:
        """A pass of ``key`` within ``delay`` seconds (urgent: ahead of the routine ones due)."""
        if self._stopped:
            return
        if key in self._running:
            if delay <= 0:
                was = self._again.get(key, False)
                self._again[key] = was or urgent
                if urgent and not was and self._promote is not None:
                    self._promote(key)
            else:
                self._later(key, time.monotonic() + delay)
            return
        if delay <= 0 or key in self._ready:
            self._make_ready(key, urgent)
            self._fill()
            return
        self._later(key, time.monotonic() + delay)

    def forget(self, key: K) -> None:
        """Drop whatever is queued for ``key`` (the release is gone). A pass that runs ends as it will."""
        self._due.pop(key, None)
        self._ready.pop(key, None)
        self._again.pop(key, None)

    def due(self, key: K) -> float | None:
        """Seconds until ``key``'s next pass (0 if due or running again next), None if nothing is queued."""
        if key in self._ready or key in self._again:
            return 0.0
        at = self._due.get(key)
        return None if at is None else max(0.0, at - time.monotonic())

    def __len__(self) -> int:
        """Keys queued, due now or later (not those running)."""
        return len(self._due) + len(self._ready)

    @property
    def running(self) -> int:
        return len(self._running)

    def running_keys(self) -> list[K]:
        """The keys whose pass runs now."""
        return list(self._running)

    # --- another driver ------------------------------------------------------------------------------

    async def exclusive(self, key: K) -> Callable[[], None]:
        """Hold ``key``'s passes off and wait for the one running to end; call the function returned to let
        them go on (a key asked for meanwhile then runs). For a driver of its own: the deletion handler."""
        while key in self._held:  # another holder first
            await self._held[key].wait()
        self._held[key] = released = asyncio.Event()
        task = self._running.get(key)
        if task is not None:
            await asyncio.shield(asyncio.wait([task]))

        def release() -> None:
            if self._held.get(key) is released:
                del self._held[key]
            released.set()
            if key in self._ready or key in self._again:
                urgent = self._ready.pop(key, False) or self._again.pop(key, False)
                self._make_ready(key, urgent)
            self._fill()

        return release

    # --- stopping ------------------------------------------------------------------------------------

    async def stop(self, timeout: float = 10.0) -> None:
        """Start no more passes, and wait (at most ``timeout``) for the running ones to end."""
        self.halt()
        running = list(self._running.values())
        if running:
            _, late = await asyncio.wait(running, timeout=timeout)
            if late:
                log.warning(f"{len(late)} passes still running {timeout:g}s after the stop; not waiting for them")

    def halt(self) -> None:
        """Start no more passes, and drop what is queued (the running ones end as they will)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
        self._heap.clear()
        self._ready.clear()
        self._urgent.clear()
        self._routine.clear()
        self._again.clear()

    # --- inside --------------------------------------------------------------------------------------

    def _later(self, key: K, at: float) -> None:
        if key in self._ready:
            return  # due already
        if at >= self._due.get(key, float("inf")):
            return
        self._due[key] = at
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, key))
        if at < self._timer_at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # call_at is on the loop's clock, which is time.monotonic() on every loop asyncio ships.
        self._timer = loop.call_at(at, self._fire)
        self._timer_at = at

    def _fire(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        now = time.monotonic()
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, key = heapq.heappop(heap)
            if self._due.get(key) == at:
                del self._due[key]
                if key in self._running:
                    self._again.setdefault(key, False)
                else:
                    self._make_ready(key, False)
        # Pairs left behind by keys asked for sooner or forgotten are dropped once they make up most of the heap.
        if len(heap) > 64 and len(heap) > 2 * len(self._due):
            self._heap = heap = [entry for entry in heap if self._due.get(entry[2]) == entry[0]]
            heapq.heapify(heap)
        if heap:
            self._arm(heap[0][0])
        self._fill()

    def _make_ready(self, key: K, urgent: bool) -> None:
        self._due.pop(key, None)
        was = self._ready.get(key)
        if was is None or (urgent and not was):
            self._ready[key] = urgent
            (self._urgent if urgent else self._routine).append(key)

    def _take(self) -> tuple[K, bool] | None:
        """The next ready key that may run now (urgent first, each kind within its places), or None."""
        for queue, urgent in ((self._urgent, True), (self._routine, False)):
            running = self._running_urgent if urgent else len(self._running) - self._running_urgent
            if running >= self._in_flight:
                continue
            skipped: list[K] = []
            found: tuple[K, bool] | None = None
            while queue:
                key = queue.popleft()
                if self._ready.get(key) is not urgent:
                    continue  # a stale entry: moved to the urgent deque, run, or forgotten
                if key in self._held or key in self._running:
                    skipped.append(key)  # stays ready; it runs once let go
                    continue
                del self._ready[key]
                found = (key, urgent)
                break
            queue.extendleft(reversed(skipped))
            if found is not None:
                return found
        return None

    def _fill(self) -> None:
        while not self._stopped:
            taken = self._take()
            if taken is None:
                return
            key, urgent = taken
            self._running_urgent += urgent
            self._running[key] = asyncio.get_running_loop().create_task(self._pass(key, urgent))

    async def _pass(self, key: K, urgent: bool) -> None:
        after: float | None = None
        try:
            after = await self._run(key, urgent)
        except Exception:  # run() says when to try again; a raise is a bug, and the key is not lost for it
            log.exception(f"a pass of {key} raised; trying again in 10s")
            after = 10.0
        finally:
            del self._running[key]
            self._running_urgent -= urgent
        if self._stopped:
            return
        again = self._again.pop(key, None)
        if again is not None:
            self._make_ready(key, again)
        elif after is not None:
            if after <= 0:
                self._make_ready(key, False)
            else:
                self._later(key, time.monotonic() + after)
        self._fill()
