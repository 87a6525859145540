"""How the controller runs Python's cyclic garbage collector.

A collection stops every thread of the process while it walks the objects of its generations; a full
one walks all of them, and they grow with the releases held in memory. With CPython's defaults
(``700, 10, 10``) a controller driving 500 releases on the local cluster was inside collections for
10.5 s of a 131 s run (34.4 s of CPU), 4.6 s of it in 11 full ones of 0.42 s on average, each stalling
every pass and abort under way; the transition lag p99 was 0.37 s. With the settings below: 2.7 s, one
full collection (the one at start), lag p99 0.07 s (bench/README.md, "Reshaping"). Almost nothing the
controller allocates is in a reference cycle: the watched objects are trees of dicts and lists, freed
by reference counting when replaced. So:

- the young generation is collected after 50,000 allocations rather than 700, which gives the objects
  of a pass (responses, models, the plan) time to be freed by reference counting before a collection
  finds them alive and moves them to an older generation, where only a full collection frees them;
- once started (modules, kopf, pydantic's schemas, the first lists), :func:`settle` freezes what exists:
  no collection walks it again.

``GREYRELEASE_GC_THRESHOLDS`` (three integers, as ``gc.set_threshold``) overrides the thresholds.
"""

from __future__ import annotations

import gc
import logging
import os

ENV = "GREYRELEASE_GC_THRESHOLDS"
THRESHOLDS = (50_000, 20, 100)

log = logging.getLogger("greyrelease")


def thresholds(text: str | None) -> tuple[int, int, int]:
    """The thresholds ``text`` names (``"50000,20,100"``), else :data:`THRESHOLDS`. Raises ValueError
    naming the variable when ``text`` is not three non-negative integers."""
    if not text:
        return THRESHOLDS
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise ValueError(f"{ENV}={text!r}: expected three non-negative integers, e.g. 50000,20,100")
    return values[0], values[1], values[2]


def configure() -> None:
    """Set the collector's thresholds (at the start of the process)."""
    gc.set_threshold(*thresholds(os.environ.get(ENV)))


def settle() -> None:
    """Collect once and freeze what is left: the process has started and what it holds now lives on."""
    gc.collect()
    gc.freeze()
    log.debug(f"garbage collector: {gc.get_freeze_count()} objects frozen, thresholds {gc.get_threshold()}")
