"""Where the controller's memory goes, for a profiling run: with ``GREYRELEASE_TRACEMALLOC=<file>`` in its
environment, the controller traces its Python allocations (tracemalloc, which slows it down: never in a
measured run) and, on SIGUSR1, writes the largest allocation sites to ``<file>``."""

from __future__ import annotations

import gc
import linecache
import os
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ENV = "GREYRELEASE_TRACEMALLOC"
FRAMES = 12


def report(limit: int = 40) -> str:
    """The allocation sites holding the most memory now, grouped by the innermost frame of ours (or of a
    library, when none of ours is on the stack), with the line of code."""
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
    )
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    lines = [f"traced: {total / 2**20:.1f} MiB", ""]
    for stat in snapshot.statistics("traceback")[:limit]:
        frames = list(stat.traceback)
        ours = [f for f in frames if "greyrelease" in f.filename]
        frame = ours[-1] if ours else frames[-1]
        code = linecache.getline(frame.filename, frame.lineno).strip()
        lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:8d} blocks  {frame.filename}:{frame.lineno}  {code}")
    return "\n".join([*lines, "", *tracked()]) + "\n"


def tracked(limit: int = 15) -> list[str]:
    """The objects the cyclic garbage collector walks in each full collection (its pauses grow with
    them), by type; frozen ones (gc.freeze) are not walked."""
    by_type = Counter(type(o).__name__ for o in gc.get_objects())
    head = f"tracked by the garbage collector: {sum(by_type.values())} objects ({gc.get_freeze_count()} frozen)"
    return [head, *(f"{n:10d}  {name}" for name, n in by_type.most_common(limit))]


def enable() -> None:
    """Start tracing when ``GREYRELEASE_TRACEMALLOC`` names a file; SIGUSR1 writes the report there."""
    target = os.environ.get(ENV)
    if not target:
        return
    tracemalloc.start(FRAMES)

    def dump(_signum: int, _frame: FrameType | None) -> None:
        Path(target).write_text(report())

    signal.signal(signal.SIGUSR1, dump)
