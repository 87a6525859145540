"""The controller's own metrics: releases by phase, kept as phases change; garbage collection pauses."""

from __future__ import annotations

import gc

from greyrelease.api.release import GreyReleaseStatus, Phase
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Event, Plan
from greyrelease.reconcile import metrics
from prometheus_client import REGISTRY


def _count(phase: str) -> float | None:
    return REGISTRY.get_sample_value("greyrelease_releases", {"phase": phase})


def _plan(phase: Phase | None, *events: Event) -> Plan:
    return Plan(GreyReleaseStatus(phase=phase), events=events)


def test_releases_by_phase_follow_each_release() -> None:
    phases = metrics.Phases()
    phases.record(("a", "one"), _plan(Phase.PROGRESSING))
    phases.record(("a", "two"), _plan(Phase.PROGRESSING))
    phases.record(("b", "one"), _plan(None))
    assert (_count("Progressing"), _count("Pending")) == (2, 1)

    phases.record(("a", "one"), _plan(Phase.PROGRESSING))  # a pass that changes nothing counts nothing
    phases.record(("a", "one"), _plan(Phase.SUCCEEDED))
    phases.record(("b", "one"), _plan(Phase.PROGRESSING))
    assert (_count("Progressing"), _count("Succeeded"), _count("Pending")) == (2, 1, 0)

    phases.record(("a", "two"), None)  # gone
    phases.record(("b", "one"), None)
    phases.record(("b", "one"), None)  # gone twice: still counted once
    assert (_count("Progressing"), _count("Succeeded")) == (0, 1)


def test_transitions_and_rollbacks_are_counted_from_the_plans_events() -> None:
    phases = metrics.Phases()
    ready = REGISTRY.get_sample_value("greyrelease_batch_transitions_total") or 0.0
    aborted = REGISTRY.get_sample_value("greyrelease_rollbacks_total", {"reason": R.ABORTED}) or 0.0
    phases.record(("c", "one"), _plan(Phase.PROGRESSING, Event("Normal", R.BATCH_READY, "batch 1/2")))
    phases.record(("c", "one"), _plan(Phase.ROLLING_BACK, Event("Warning", R.ABORTED, "aborted")))
    assert REGISTRY.get_sample_value("greyrelease_batch_transitions_total") == ready + 1
    assert REGISTRY.get_sample_value("greyrelease_rollbacks_total", {"reason": R.ABORTED}) == aborted + 1


def test_garbage_collections_are_timed_by_generation() -> None:
    metrics.time_gc()
    metrics.time_gc()  # once a process, however often asked
    assert sum(isinstance(cb, metrics._GcClock) for cb in gc.callbacks) == 1
    before = REGISTRY.get_sample_value("greyrelease_gc_pause_seconds_count", {"generation": "2"}) or 0.0
    gc.collect(2)
    gc.collect(2)
    assert REGISTRY.get_sample_value("greyrelease_gc_pause_seconds_count", {"generation": "2"}) == before + 2
    assert (REGISTRY.get_sample_value("greyrelease_gc_pause_seconds_sum", {"generation": "2"}) or 0.0) > 0
