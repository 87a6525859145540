"""Release governance, the pure rules: when a batch may start (release windows and freezes), where a
release stands in a queue, and whether the releases it comes after are done. Time is always passed in;
nothing here reads the clock or the cluster.

Windows and freezes come from several sources: the release's own ``spec.windows``/``spec.freezes`` and
every :class:`~greyrelease.api.release.GreyReleasePolicy` that governs it. A batch may start at an instant that
lies within a window of *every* source that has windows, and within no freeze of any source::

    spec.windows     Mon-Fri 09:00-17:00 Europe/Berlin        ─┐
    policy windows   Mon-Sun 06:00-20:00 UTC                   ├─ all open, no freeze: a batch may start
    freezes          2026-12-20 .. 2027-01-02 (any source)    ─┘

Local times are read in each window's zone: a window keeps its wall-clock hours across a daylight-saving
change, and a start that falls into the hour the clock skips opens when the clock jumps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from greyrelease.api.release import Freeze, Window

#: How far ahead :func:`Rules.next_start` looks before it says the windows never meet.
HORIZON = timedelta(days=366)
_ONE_SECOND = timedelta(seconds=1)


def instant(day: date, clock: time, zone: ZoneInfo) -> datetime:
    """The first instant (UTC) at which the local clock in ``zone`` shows ``clock`` on ``day`` or later.

    An ambiguous wall time (the hour repeated when clocks go back) is its first occurrence; one that does
    not exist (the hour skipped when clocks go forward) is the instant the clock jumps over it.
    """
    wall = datetime.combine(day, clock)
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        return first
    # In the gap. fold=1 reads the wall time with the offset after the change, which lands before the
    # jump; fold=0 with the offset before it, which lands after. The jump is in between: find it to the
    # second (a gap is at most a few hours: about 14 halvings).
    lo, hi = wall.replace(tzinfo=zone, fold=1).astimezone(UTC), first
    while hi - lo > _ONE_SECOND:
        mid = lo + (hi - lo) // 2
        if mid.astimezone(zone).replace(tzinfo=None) >= wall:
            hi = mid
        else:
            lo = mid
    return hi


def _clock(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def spans(window: Window, around: datetime) -> Iterable[tuple[datetime, datetime]]:
    """The window's open periods (UTC, ``[open, close)``) that start from the day before ``around`` to a
    week after it, in order."""
    zone = window.zone
    local_day = around.astimezone(zone).date()
    start, end = _clock(window.start), _clock(window.end)
    weekdays = window.weekdays
    for offset in range(-1, 9):
        day = local_day + timedelta(days=offset)
        if day.weekday() not in weekdays:
            continue
        close_day = day + timedelta(days=1) if end <= start else day
        yield instant(day, start, zone), instant(close_day, end, zone)


def open_at(windows: Sequence[Window], t: datetime) -> bool:
    """Whether ``t`` is within one of ``windows``."""
    return any(o <= t < c for w in windows for o, c in spans(w, t))


def next_open(windows: Sequence[Window], t: datetime) -> datetime:
    """``t`` if it is within one of ``windows``, else the next instant one opens (always within 8 days:
    a window opens at least once a week)."""
    best: datetime | None = None
    for w in windows:
        for o, c in spans(w, t):
            if o <= t < c:
                return t
            if o > t and (best is None or o < best):
                best = o
    assert best is not None, "a window with at least one day opens every week"
    return best


#: The name of a release's own rules (``spec.windows``, ``spec.freezes``) among its sources.
SPEC = "spec"


@dataclass(frozen=True)
class Source:
    """Where rules come from: ``spec`` or a policy, named as messages show it."""

    name: str
    windows: tuple[Window, ...] = ()
    freezes: tuple[Freeze, ...] = ()


@dataclass(frozen=True)
class Hold:
    """Why a batch may not start now, and when it may."""

    until: datetime | None  # None: no instant within HORIZON is allowed
    message: str


@dataclass(frozen=True)
class Rules:
    """Every source's windows and freezes for one release."""

    sources: tuple[Source, ...] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return any(s.windows or s.freezes for s in self.sources)

    def _freeze_at(self, t: datetime) -> tuple[Source, Freeze] | None:
        """The freeze around ``t`` that ends last (overlapping freezes are waited out together)."""
        found = [(s, f) for s in self.sources for f in s.freezes if f.from_ <= t < f.to]
        return max(found, key=lambda sf: sf[1].to) if found else None

    def next_start(self, t: datetime) -> datetime | None:
        """The first instant from ``t`` at which a batch may start; None when none within a year."""
        limit = t + HORIZON
        while t < limit:
            moved = t
            for s in self.sources:
                if s.windows:
                    moved = max(moved, next_open(s.windows, moved))
            frozen = self._freeze_at(moved)
            if frozen is not None:
                moved = frozen[1].to
            if moved == t:
                return t
            t = moved
        return None

    def hold(self, t: datetime) -> Hold | None:
        """None when a batch may start at ``t``; else why not and until when."""
        until = self.next_start(t)
        if until == t:
            return None
        frozen = self._freeze_at(t)
        never = "no time within a year is open in every window"
        if frozen is not None:
            source, freeze = frozen
            name = f"freeze {freeze.reason!r}" if freeze.reason else "a freeze"
            of = f" of {source.name}" if source.name != SPEC else ""
            after = never if until is None else f"next start {local_text(until, self.zone())}"
            return Hold(until, f"waiting for the end of {name}{of} ({after})")
        closed = [s.name for s in self.sources if s.windows and not open_at(s.windows, t) and s.name != SPEC]
        of = " of " + " and ".join(closed) if closed else ""
        opens = never if until is None else f"opens {local_text(until, self.zone())}"
        return Hold(until, f"waiting for release window{of} ({opens})")

    def zone(self) -> ZoneInfo | None:
        """The zone messages give times in: the first window's."""
        for s in self.sources:
            for w in s.windows:
                return w.zone
        return None

    def plus(self, source: Source) -> Rules:
        return Rules((source, *self.sources)) if source.windows or source.freezes else self


def local_text(t: datetime, zone: ZoneInfo | None) -> str:
    """``2026-12-07T09:00:00+01:00``: RFC 3339 in the zone people set the windows in (UTC without one)."""
    return t.astimezone(zone or UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def schedule(
    pauses: Sequence[float | None], rules: Rules, start: datetime
) -> tuple[list[datetime | None], datetime | None]:
    """When each batch would start at the earliest, from ``start``, and when the last one's pause would
    end (the earliest finish; the promotion after it is never held). ``pauses`` are in seconds (0: none);
    None is a wait for approval, after which nothing is known (None from there on). Rollout time is not
    counted: it depends on the pods."""
    t: datetime | None = start
    starts: list[datetime | None] = []
    for pause in pauses:
        t = rules.next_start(t) if t is not None else None
        starts.append(t)
        if t is not None:
            t = None if pause is None else t + timedelta(seconds=pause)
    return starts, t


# --- queues -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Queue:
    """A concurrency limit as one release sees it (built by the adapters from the slot Lease and the
    releases in the same queue)."""

    scope: str  # as messages show it: "namespace shop", "group payments"
    lease: str  # namespace/name of the Lease that holds the slots
    limit: int
    holders: tuple[str, ...]  # uids of the releases holding a slot (stale ones already left out)
    ahead: int  # releases waiting for a slot that were created before this one
    held: bool  # this release holds a slot
    stale: tuple[str, ...] = ()  # holders (uids) that ended or are gone: not counted, dropped when taking

    @property
    def free(self) -> int:
        return max(0, self.limit - len(self.holders))

    def may_take(self) -> bool:
        """A slot is free for this release: fewer releases wait ahead of it than slots are free."""
        return not self.held and self.ahead < self.free


def queue_order(created: datetime | None, namespace: str, name: str) -> tuple[datetime, str, str]:
    """Releases take slots in order of creation; ties (the API server stamps whole seconds) by namespace
    and name."""
    return (created or datetime.max.replace(tzinfo=UTC), namespace, name)


# --- ordered releases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Predecessor:
    """A release named in ``spec.after``, as found."""

    name: str
    found: bool = False
    succeeded: bool = False  # Succeeded for its current spec
    failed: bool = False  # ended without succeeding (Failed, Aborted, InvalidSpec) for its current spec
    phase: str = ""


def find_cycle(start: str, edges: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A cycle of ``after`` edges through ``start`` (``[a, b, a]``), or None."""
    path: list[str] = [start]
    seen: set[str] = set()

    def walk(node: str) -> list[str] | None:
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt in seen:
                continue
            seen.add(nxt)
            path.append(nxt)
            found = walk(nxt)
            if found:
                return found
            path.pop()
        return None

    return walk(start)
