"""Every Event exactly once: a controller killed at each point between a pass's actions, its Events and its
status write, and the next pass reading a world that moved in the meantime in each way the real API server
and the controller's store can move it.

What may differ between the pass that was killed and the one that repeats its transition:

- nothing (the same reads again);
- a metadata-only change by another client (kopf's bookkeeping annotation, a finalizer, a label);
- a user annotation that asks for nothing (``greyrelease.io/pause: "false"``);
- a spec edit that moves no batch (a new ``metadata.generation``);
- the store a watch event behind: the next pass reads the Deployments and Services as they were before
  the killed pass wrote them;
- a pass in between on that lagging view, which records a status of its own before the repeat.

Whatever happened, each Event of the clean run is posted once (same reason, same message), and none twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import Conflict, path
from greyrelease.reconcile.reconciler import Reconciler

from tests.support.builders import EVENTS, NS, RELEASE, T0, cluster, roll_out, status_of
from tests.support.faults import Crash, Lagging, crash_before_write

ROUTED = {"trafficRouting": {"service": {"name": "web"}}}


def _annotate(kube: MemoryKube, annotations: dict[str, str], **meta: Any) -> None:
    release = kube.get(RELEASE) or {}
    release["metadata"].setdefault("annotations", {}).update(annotations)
    for k, v in meta.items():
        release["metadata"][k] = v
    kube.put(release)


def bookkeeping(kube: MemoryKube) -> None:
    _annotate(
        kube,
        {"greyrelease.io/touch-dummy": "2026-01-01T12:00:01Z"},
        finalizers=["greyrelease.io/finalizer"],
        labels={"team": "shop"},
    )


def noop_request(kube: MemoryKube) -> None:
    _annotate(kube, {"greyrelease.io/pause": "false"})


def spec_edit(kube: MemoryKube) -> None:
    """A spec change that moves no batch (a new generation): a longer progress deadline."""
    kube.patch(RELEASE, {"spec": {"progressDeadlineSeconds": 900}})


#: What happens between the killed pass and the next one: (name, change of the cluster, passes on the
#: lagging view before the next pass on the fresh one).
CHANGES: list[tuple[str, Callable[[MemoryKube], None] | None, int]] = [
    ("nothing", None, 0),
    ("metadata-only change", bookkeeping, 0),
    ("user annotation asking nothing", noop_request, 0),
    ("spec edit moving no batch", spec_edit, 0),
    ("store a watch event behind", None, 1),
    ("a pass in between on a lagging store", None, 2),
]


def run_killed(spec: Obj, at: int | None, change: Callable[[MemoryKube], None] | None, lagging: int) -> MemoryKube:
    """A release run to its end, the controller killed before its ``at``-th write (never when None);
    after the kill, ``change`` is made, and then ``lagging`` passes read the Deployments and Services as
    they were before the killed pass."""
    kube = cluster(**spec)
    view = Lagging(kube)
    if at is not None:
        crash_before_write(kube, at)
    reconciler, now = Reconciler(view), T0
    stale_passes = 0
    for _ in range(80):
        if not view.lag:
            view.freeze()
        try:
            reconciler.reconcile(NS, "web", now=now)
        except Crash:
            reconciler = Reconciler(view)  # a new controller, with nothing in memory
            if change is not None:
                change(kube)
            view.lag, stale_passes = lagging > 0, lagging
            continue
        except Conflict:  # e.g. a create of what the lagging store does not show yet: the pass is retried
            reconciler = Reconciler(view)
        if view.lag:
            stale_passes -= 1
            view.lag = stale_passes > 0
        if status_of(kube).get("phase") == "Succeeded":
            return kube
        roll_out(kube)
        now += timedelta(seconds=1)
    raise AssertionError(f"never succeeded: {status_of(kube)}")


def posted(kube: MemoryKube) -> Counter[tuple[str, str]]:
    return Counter((e["reason"], e["message"]) for e in kube.objects(EVENTS))


@pytest.mark.parametrize("routing", [{}, ROUTED], ids=["replicas", "service"])
@pytest.mark.parametrize(("what", "change", "lagging"), CHANGES, ids=[c[0] for c in CHANGES])
def test_each_event_is_posted_once_whatever_the_next_pass_reads(
    routing: Obj, what: str, change: Callable[[MemoryKube], None] | None, lagging: int
) -> None:
    clean = run_killed(routing, None, None, 0)
    expected = posted(clean)
    assert expected and set(expected.values()) == {1}, expected
    writes = len(clean.writes)
    for at in range(writes):
        kube = run_killed(routing, at, change, lagging)
        got = posted(kube)
        twice = {k: n for k, n in got.items() if n > 1}
        assert not twice, f"killed before write {at} of {writes}, then {what}: posted more than once: {twice}"
        assert set(got) >= set(expected), (
            f"killed before write {at} of {writes}, then {what}: lost {set(expected) - set(got)}"
        )


def test_a_pass_that_posts_events_records_a_new_status() -> None:
    """The Events of a transition are named after the number of transitions recorded so far: every pass
    that posts any records the next number (so the next transition's Events get names of their own)."""
    kube = cluster(**ROUTED)
    reconciler, now, numbers = Reconciler(kube), T0, []
    while status_of(kube).get("phase") != "Succeeded":
        before = len(kube.objects(EVENTS))
        reconciler.reconcile(NS, "web", now=now)
        if len(kube.objects(EVENTS)) > before:
            numbers.append(status_of(kube)["transitions"])
        roll_out(kube)
        now += timedelta(seconds=1)
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 5
    events = kube.objects(path("", "v1", "events", NS))
    assert len({e["metadata"]["name"] for e in events}) == len(events)


def test_an_abort_landing_between_a_killed_pass_and_its_repeat_posts_nothing_twice() -> None:
    """The end-to-end crash test's case: a pass posts ReleaseStarted and is killed before its status
    write; the abort annotation lands; the repeat plans the start again (the canary is there already, so
    the abort is taken on the pass after) and must not post it again."""
    clean = run_killed(ROUTED, None, None, 0)
    for at in range(len(clean.writes)):
        kube = cluster(**ROUTED)
        crash_before_write(kube, at)
        reconciler, now, aborted = Reconciler(kube), T0, False
        for _ in range(80):
            try:
                reconciler.reconcile(NS, "web", now=now)
            except Crash:
                reconciler = Reconciler(kube)
                _annotate(kube, {"greyrelease.io/abort": "true"})
                aborted = True
                continue
            if status_of(kube).get("phase") in ("Aborted", "Succeeded"):
                break
            roll_out(kube)
            now += timedelta(seconds=1)
        assert aborted and status_of(kube).get("phase") in ("Aborted", "Succeeded"), (at, status_of(kube))
        twice = {k: n for k, n in posted(kube).items() if n > 1}
        assert not twice, f"killed before write {at}, then aborted: posted more than once: {twice}"
