"""How the controller runs Python's cyclic garbage collector and the C allocator under it.

A collection stops every thread of the process while it walks the objects of its generations; a full
one walks all of them, and they grow with the releases held in memory. With CPython's defaults
(``700, 10, 10``) a controller driving 500 releases spent seconds in full collections, each stalling every
pass and abort under way; freezing alone left most of them; the settings below leave one (the figures:
bench/README.md, "Garbage collection settings"). Almost nothing the controller allocates is in a
reference cycle: the watched objects are trees of dicts and lists, freed by reference counting when
replaced. So:

- the young generation is collected after 10,000 allocations rather than 700: the objects of a pass
  (responses, models, the plan) are mostly freed by reference counting before a collection finds them
  alive and moves them to an older generation, whose collections walk more; full collections then come
  only as the older generations grow by a quarter (CPython's own rule), not every few seconds;
- once started (modules, kopf, pydantic's schemas, the first lists), :func:`settle` freezes what exists:
  no collection walks it again;
- glibc's allocator keeps at most two arenas (as ``MALLOC_ARENA_MAX=2`` would, unless that is set): with
  one arena per busy thread (up to 8 per core), memory freed by one pass thread was not reused by the
  others (bench/README.md, "Garbage collection settings").

- once a burst of passes is over, glibc hands the memory it keeps free back to the system
  (``malloc_trim``, :class:`Trimmer`): a burst (a start with thousands of releases to enrol, a thousand
  releases at once) leaves most of the memory it used free but kept, and the resident memory stayed at
  the burst's peak for as long as the process ran (bench/README.md, "Lists in pages").

``GREYRELEASE_GC_THRESHOLDS`` (three integers, as ``gc.set_threshold``) overrides the thresholds.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

ENV = "GREYRELEASE_GC_THRESHOLDS"
THRESHOLDS = (10_000, 10, 10)
ARENAS = 2
M_ARENA_MAX = -8  # glibc's malloc.h

log = logging.getLogger("greyrelease")


def thresholds(text: str | None) -> tuple[int, int, int]:
    """The thresholds ``text`` names (``"10000,10,10"``), else :data:`THRESHOLDS`. Raises ValueError
    naming the variable when ``text`` is not three non-negative integers."""
    if not text:
        return THRESHOLDS
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise ValueError(f"{ENV}={text!r}: expected three non-negative integers, e.g. 10000,10,10")
    return values[0], values[1], values[2]


def limit_arenas() -> bool:
    """At most :data:`ARENAS` malloc arenas, on glibc, unless ``MALLOC_ARENA_MAX`` says otherwise (glibc
    reads it itself). Before any thread starts. True when set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its allocator, its defaults
        return False
    return bool(mallopt(M_ARENA_MAX, ARENAS))


def configure() -> None:
    """Set the collector's thresholds and the allocator's arenas (at the start of the process)."""
    gc.set_threshold(*thresholds(os.environ.get(ENV)))
    limit_arenas()


def settle() -> None:
    """Collect once and freeze what is left: the process has started and what it holds now lives on."""
    gc.collect()
    gc.freeze()
    log.debug(f"garbage collector: {gc.get_freeze_count()} objects frozen, thresholds {gc.get_threshold()}")


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to call
        return None
    return trim


class Trimmer:
    """Hands glibc's free memory back to the system after a burst of passes: when a pass ends with no other
    running, at least ``after`` passes since the last trim and ``every`` seconds after it. A release at
    rest makes a pass every resync period (15 minutes), so at rest it trims at most once every ``every``
    seconds, and not at all below ``after`` passes. On an allocator other than glibc's it does nothing."""

    def __init__(
        self,
        *,
        every: float = 60.0,
        after: int = 100,
        trim: Callable[[int], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.after, self._clock = every, after, clock
        self._trim = trim if trim is not None else _malloc_trim()
        self._lock = threading.Lock()
        self._passes = 0
        self._last = clock()
        self._trimming = False
        #: How many times the memory was handed back, and the seconds it took in all.
        self.trims = 0
        self.seconds = 0.0

    def passed(self, *, alone: bool) -> bool:
        """A pass ended (``alone``: no other is running). True when a trim is due now: the caller runs
        :meth:`trim`, off the event loop."""
        with self._lock:
            self._passes += 1
            due = (
                self._trim is not None
                and alone
                and not self._trimming
                and self._passes >= self.after
                and self._clock() - self._last >= self.every
            )
            if due:
                self._trimming = True
            return due

    def trim(self) -> None:
        if self._trim is None:
            return
        started = time.perf_counter()
        try:
            self._trim(0)
        finally:
            took = time.perf_counter() - started
            with self._lock:
                self._passes, self._last, self._trimming = 0, self._clock(), False
                self.trims += 1
                self.seconds += took
            log.debug(f"free memory handed back to the system in {took * 1000:.1f} ms")
