"""Ordered releases (``spec.after``): a release waits until every predecessor succeeded on its current
spec, the predecessors as read from the cluster, and a cycle of them is invalid and named."""

from __future__ import annotations

from dataclasses import replace

import pytest
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, Obj, Phase
from greyrelease.kube.memory import MemoryKube
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import PrepareRouting
from greyrelease.planner.governance import Predecessor, find_cycle
from greyrelease.planner.machine import INVALID_POLL
from greyrelease.reconcile.policies import Governing, observe_governance, read_cycle, read_predecessors

from tests.support.builders import NS
from tests.support.governance import GovWorld, gr, reasons
from tests.support.world import spec


@pytest.mark.parametrize(
    ("pred", "text"),
    [
        (Predecessor("api"), "waiting for GreyRelease 'api' to succeed (it does not exist)"),
        (Predecessor("api", found=True), "waiting for GreyRelease 'api' to succeed (now not started)"),
        (
            Predecessor("api", found=True, phase="Progressing"),
            "waiting for GreyRelease 'api' to succeed (now Progressing)",
        ),
        (
            Predecessor("api", found=True, failed=True, phase="Aborted"),
            "waiting for GreyRelease 'api', which ended Aborted: retry or fix it first",
        ),
    ],
    ids=["missing", "not-started", "pending", "aborted"],
)
def test_a_release_waits_for_its_predecessor(pred: Predecessor, text: str) -> None:
    w = GovWorld(spec(after=[{"name": "api"}]), predecessors=(pred,))
    plan = w.step()
    assert (plan.status.phase, plan.status.message) == (Phase.WAITING, text)
    assert plan.actions == ()
    assert reasons(plan) == [R.WAITING]
    assert plan.requeue_after == INVALID_POLL
    again = w.step()
    assert again.status == plan.status and again.events == ()


def test_a_release_starts_once_every_predecessor_succeeded() -> None:
    ok = Predecessor("api", found=True, succeeded=True, phase="Succeeded")
    pending = Predecessor("db", found=True, phase="Progressing")
    w = GovWorld(spec(after=[{"name": "api"}, {"name": "db"}]), predecessors=(ok, pending))
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and "'db'" in plan.status.message
    w.predecessors = (ok, replace(pending, succeeded=True, phase="Succeeded"))
    started = w.step()
    assert started.status.phase == Phase.PROGRESSING and started.actions[0] == PrepareRouting()


def predecessors_from(*objects: Obj) -> tuple[Predecessor, ...]:
    kube = MemoryKube(*objects)
    return read_predecessors(kube, NS, GreyReleaseSpec.model_validate(gr("web", after=["api"])["spec"]))


def succeeded(generation: int) -> Obj:
    return {"phase": "Succeeded", "observedGeneration": generation}


@pytest.mark.parametrize(
    ("objects", "starts", "text"),
    [
        ((), False, "it does not exist"),
        ((gr("api", status={"phase": "Progressing", "observedGeneration": 1}),), False, "now Progressing"),
        ((gr("api", status={"phase": "Aborted", "observedGeneration": 1}),), False, "ended Aborted"),
        ((gr("api", status={"phase": "Failed", "observedGeneration": 1}),), False, "ended Failed"),
        ((gr("api", generation=2, status=succeeded(2)),), True, ""),
        ((gr("api", generation=2, status=succeeded(1)),), False, "'api'"),
    ],
    ids=["missing", "pending", "aborted", "failed", "succeeded-current-spec", "succeeded-older-spec"],
)
def test_predecessors_read_from_the_cluster(objects: tuple[Obj, ...], starts: bool, text: str) -> None:
    found = predecessors_from(*objects)
    assert [p.name for p in found] == ["api"]
    plan = GovWorld(spec(after=[{"name": "api"}]), predecessors=found).step()
    if starts:
        assert plan.status.phase == Phase.PROGRESSING
    else:
        assert plan.status.phase == Phase.WAITING and plan.actions == ()
        assert "GreyRelease 'api'" in plan.status.message and text in plan.status.message


def test_a_cycle_of_predecessors_is_invalid_and_named() -> None:
    a, b = gr("a", after=["b"]), gr("b", after=["a"])
    kube = MemoryKube(a, b, gr("c", after=["a"]))
    spec_a = GreyReleaseSpec.model_validate(a["spec"])
    assert read_cycle(kube, a, spec_a) == ("a", "b", "a")
    seen = observe_governance(kube, a, spec_a, GreyReleaseStatus(), {}, Governing())
    assert seen.cycle == ("a", "b", "a")
    plan = GovWorld(spec(after=[{"name": "b"}]), cycle=seen.cycle, predecessors=seen.predecessors).step()
    assert plan.status.phase == Phase.INVALID_SPEC
    assert plan.status.message.startswith("spec.after:")
    assert "a -> b -> a" in plan.status.message
    assert plan.actions == ()
    # c only waits for a: no cycle through it.
    assert read_cycle(kube, gr("c", after=["a"]), GreyReleaseSpec.model_validate(gr("c", after=["a"])["spec"])) == ()


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({"a": ("b",), "b": ("a",)}, ["a", "b", "a"]),
        ({"a": ("b",), "b": ("c",), "c": ("a",)}, ["a", "b", "c", "a"]),
        ({"a": ("a",)}, ["a", "a"]),
        ({"a": ("b", "c"), "b": ("d",), "c": ("a",)}, ["a", "c", "a"]),
        ({"a": ("b",), "b": ("c",), "c": ("b",)}, None),
        ({"a": ("b", "c"), "b": ("c",)}, None),
        ({"a": ()}, None),
    ],
    ids=["two", "three", "itself", "through-a-second-branch", "cycle-not-through-start", "diamond", "none"],
)
def test_find_cycle(edges: dict[str, tuple[str, ...]], cycle: list[str] | None) -> None:
    assert find_cycle("a", edges) == cycle
