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

``GREYRELEASE_GC_THRESHOLDS`` (three integers, as ``gc.set_threshold``) overrides the thresholds.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os

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
