"""Where the controller's memory goes, for a profiling run: with ``GREYRELEASE_TRACEMALLOC=<file>`` in its
environment, the controller traces its Python allocations (tracemalloc, which slows it down: never in a
measured run) and, on SIGUSR1, writes the largest allocation sites to ``<file>``.

It also keeps the run's peak: each time the traced total reaches a new high (10 % above the last one kept),
the allocations are saved to ``<file>.peak`` as they are (a tracemalloc snapshot), and
``python -m greyrelease.runtime.memprofile <file>.peak`` reads them later. Only saved in the process: grouping a
peak of millions of blocks takes minutes of Python that would hold the controller back while it is measured.
"""

from __future__ import annotations

import gc
import linecache
import os
import signal
import sys
import threading
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ENV = "GREYRELEASE_TRACEMALLOC"
#: Frames kept per allocation; ``GREYRELEASE_TRACEMALLOC_FRAMES=0`` traces nothing (no slowdown) and
#: SIGUSR1 then writes the census of objects alone.
FRAMES_ENV = "GREYRELEASE_TRACEMALLOC_FRAMES"
FRAMES = 12
#: How often the traced total is looked at for a new high, and how far above the last one kept it must be.
PEAK_EVERY = 5.0
PEAK_STEP = 1.1
#: Not the profiler's own allocations, nor the imports' code objects.
IGNORED = [
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
]


def report(snapshot: tracemalloc.Snapshot | None = None, limit: int = 40) -> str:
    """The allocation sites holding the most memory (now, or in ``snapshot``), each counted at the innermost
    frame of ours on its stack (of a library, when none of ours is there), with the line of code."""
    snapshot = (snapshot or tracemalloc.take_snapshot()).filter_traces(IGNORED)
    size: Counter[tuple[str, int]] = Counter()
    blocks: Counter[tuple[str, int]] = Counter()
    for trace in snapshot.traces:
        frames = list(trace.traceback)
        ours = [f for f in frames if "greyrelease" in f.filename]
        frame = (ours or frames)[-1]  # tracemalloc lists the innermost frame last
        size[frame.filename, frame.lineno] += trace.size
        blocks[frame.filename, frame.lineno] += 1
    lines = [f"traced: {sum(size.values()) / 2**20:.1f} MiB", ""]
    for (filename, lineno), held in size.most_common(limit):
        code = linecache.getline(filename, lineno).strip()
        lines.append(f"{held / 2**20:8.2f} MiB {blocks[filename, lineno]:8d} blocks  {filename}:{lineno}  {code}")
    return "\n".join(lines) + "\n"


def tracked(limit: int = 25) -> list[str]:
    """The objects the cyclic garbage collector walks in each full collection (its pauses grow with
    them), by type; frozen ones (gc.freeze) are not walked. Then what they hold that it does not walk:
    the strings in dicts and lists (counted once each), and the tuples by length."""
    objects = gc.get_objects()
    by_type = Counter(type(o).__name__ for o in objects)
    head = f"tracked by the garbage collector: {sum(by_type.values())} objects ({gc.get_freeze_count()} frozen)"
    seen: set[int] = set()
    strings = 0
    for o in objects:
        items = o.items() if type(o) is dict else ((s, None) for s in o) if type(o) is list else ()
        for pair in items:
            for s in pair:
                if type(s) is str and id(s) not in seen:
                    seen.add(id(s))
                    strings += sys.getsizeof(s)
    tuples = Counter(len(o) for o in objects if type(o) is tuple)
    return [
        head,
        *(f"{n:10d}  {name}" for name, n in by_type.most_common(limit)),
        f"strings in those dicts and lists: {len(seen)} ({strings / 2**20:.1f} MiB)",
        "tuples by length: " + ", ".join(f"{k}: {n}" for k, n in tuples.most_common(6)),
    ]


def enable() -> None:
    """Start tracing when ``GREYRELEASE_TRACEMALLOC`` names a file; SIGUSR1 writes the report there."""
    target = os.environ.get(ENV)
    if not target:
        return
    try:
        frames = int(os.environ.get(FRAMES_ENV) or FRAMES)
    except ValueError:
        sys.exit(
            f"error: {FRAMES_ENV} must be a whole number of frames (0: no tracing), not {os.environ[FRAMES_ENV]!r}"
        )

    def dump(_signum: int, _frame: FrameType | None) -> None:
        sites = report() + "\n" if tracemalloc.is_tracing() else ""
        Path(target).write_text(sites + "\n".join(tracked()) + "\n")

    signal.signal(signal.SIGUSR1, dump)
    if frames > 0:
        tracemalloc.start(frames)
        threading.Thread(target=watch_peak, args=(Path(target + ".peak"),), name="memprofile", daemon=True).start()


def watch_peak(out: Path, every: float = PEAK_EVERY, stop: threading.Event | None = None) -> None:
    """Save the allocations to ``out`` whenever the traced total passes the last one kept by PEAK_STEP."""
    stop = stop or threading.Event()
    kept = 0
    while not stop.wait(every) and tracemalloc.is_tracing():
        current = tracemalloc.get_traced_memory()[0]
        if current > kept * PEAK_STEP:
            partial = out.with_name(out.name + ".tmp")
            tracemalloc.take_snapshot().dump(str(partial))
            partial.replace(out)  # whole snapshots only, for whoever reads one meanwhile
            kept = current


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m greyrelease.runtime.memprofile <file>.peak")
    print(report(tracemalloc.Snapshot.load(sys.argv[1])), end="")
