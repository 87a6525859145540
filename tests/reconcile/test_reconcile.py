"""The reconciler on the in-memory API server: whole releases pass by pass, a controller killed before any
of its writes (between the actions, the Events and the status), and a status write refused with 409."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import Conflict, path
from greyrelease.reconcile.reconciler import Outcome, Reconciler

from tests.support.builders import (
    DEPLOYMENTS,
    EVENTS,
    NS,
    RELEASE,
    SERVICE,
    T0,
    cluster,
    release,
    roll_out,
    stable,
    status_of,
)
from tests.support.faults import Crash, crash_before_write, refuse


def timeless(value: Any) -> Any:
    """``value`` without its times: a pass repeated after a crash may find the world a step further on
    (its first try's writes landed) and record the same transitions a poll later."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not k.endswith(("At", "Time"))}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def apps(kube: MemoryKube) -> list[Obj]:
    """The Deployments as the user sees them (name, replicas, template)."""
    return [
        {"name": d["metadata"]["name"], **{k: d["spec"][k] for k in ("replicas", "template")}}
        for d in kube.objects(DEPLOYMENTS)
    ]


def reasons(kube: MemoryKube) -> list[str]:
    """The Events' reasons, in the order they were posted."""
    return [e["reason"] for e in sorted(kube.objects(EVENTS), key=lambda e: int(e["metadata"]["resourceVersion"]))]


def run(
    kube: MemoryKube, *, until: set[str], max_passes: int = 60, on_pass: Callable[[int], None] | None = None
) -> list[Outcome]:
    """Passes, the control plane converging between them, until the phase is in ``until``. A pass that
    fails (a crash, a 409) is run again at the same time, as the retry after it would."""
    reconciler, now, outcomes = Reconciler(kube), T0, []
    for n in range(max_passes):
        if on_pass is not None:
            on_pass(n)
        try:
            outcome = reconciler.reconcile(NS, "web", now=now)
        except (Crash, Conflict):
            reconciler = Reconciler(kube)  # a new controller, with nothing in memory
            continue
        assert outcome is not None
        outcomes.append(outcome)
        if status_of(kube).get("phase") in until:
            return outcomes
        roll_out(kube)
        wait = outcome.plan.requeue_after
        now += timedelta(seconds=1.0 if wait is None else min(wait, 3600.0))
    raise AssertionError(f"never reached {until}: {status_of(kube)}")


def test_a_whole_release_pass_by_pass(kube: MemoryKube) -> None:
    first = Reconciler(kube).reconcile(NS, "web", now=T0)
    assert first is not None and first.watched == ("web", "web-canary")
    assert status_of(kube)["phase"] in ("Initializing", "Progressing")
    run(kube, until={"Succeeded"})
    status = status_of(kube)
    assert [h["batch"] for h in status["history"]] == [1, 2, 3]
    assert reasons(kube).count("BatchReady") == 3
    web = kube.get(path("apps", "v1", "deployments", NS, "web")) or {}
    assert web["spec"]["replicas"] == 4
    assert web["spec"]["template"]["spec"]["containers"][0]["image"] == "app:v2"
    assert kube.get(path("apps", "v1", "deployments", NS, "web-canary")) is None
    # Finished and idle: a pass reads, and writes nothing.
    kube.requests.clear()
    Reconciler(kube).reconcile(NS, "web", now=T0 + timedelta(hours=1))
    assert kube.writes == []


def test_the_canary_is_built_and_owned_and_the_stable_shrinks_as_it_grows(kube: MemoryKube) -> None:
    seen: list[tuple[int, int]] = []

    def sizes(_: int) -> None:
        canary = kube.get(path("apps", "v1", "deployments", NS, "web-canary"))
        web = kube.get(path("apps", "v1", "deployments", NS, "web")) or {}
        if canary is not None:
            assert canary["metadata"]["ownerReferences"][0]["uid"] == "release-uid"
            assert canary["spec"]["template"]["spec"]["containers"][0]["image"] == "app:v2"
            seen.append((canary["spec"]["replicas"], web["spec"]["replicas"]))

    run(kube, until={"Succeeded"}, on_pass=sizes)
    canary_sizes = [c for c, _ in seen]
    assert canary_sizes == sorted(canary_sizes) and {1, 2} <= set(canary_sizes)
    assert all(c + s >= 4 for c, s in seen)  # capacity never drops below the stable's size


def test_a_spec_the_models_refuse_is_marked_invalid_with_its_field() -> None:
    kube = MemoryKube(stable(), release(batches=[{"replicas": 0}]))
    Reconciler(kube).reconcile(NS, "web", now=T0)
    status = status_of(kube)
    assert status["phase"] == "InvalidSpec" and status["message"].startswith("spec.batches[0].replicas")
    kube.requests.clear()
    Reconciler(kube).reconcile(NS, "web", now=T0 + timedelta(seconds=5))
    assert kube.writes == []  # recorded once; the same error again writes nothing
    assert reasons(kube) == ["InvalidSpec"]


def clean_run(**spec: Any) -> tuple[Obj, list[str], int, list[Obj]]:
    kube = cluster(**spec)
    kube.requests.clear()
    run(kube, until={"Succeeded"})
    return timeless(status_of(kube)), reasons(kube), len(kube.writes), apps(kube)


@pytest.mark.parametrize("routing", [None, {"service": {"name": "web"}}], ids=["replicas", "service"])
def test_a_controller_killed_before_any_write_resumes_with_no_batch_skipped_or_repeated(routing: Obj | None) -> None:
    spec = {"trafficRouting": routing} if routing else {}
    expected_status, expected_reasons, write_count, expected_apps = clean_run(**spec)
    assert write_count >= 15 and [h["batch"] for h in expected_status["history"]] == [1, 2, 3]
    for at in range(write_count):
        kube = cluster(**spec)
        kube.requests.clear()
        crash_before_write(kube, at)
        run(kube, until={"Succeeded"})
        assert timeless(status_of(kube)) == expected_status, f"killed before write {at}"  # same batches, once each
        assert reasons(kube) == expected_reasons, f"killed before write {at}"  # each Event exactly once
        assert apps(kube) == expected_apps, f"killed before write {at}"
        assert (kube.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}, f"killed before write {at}"


def test_a_status_write_refused_with_409_fails_the_pass_and_the_next_one_records_it(kube: MemoryKube) -> None:
    expected_status, expected_reasons, _, expected_apps = clean_run()
    # The second status write is refused with 409.
    refused = refuse(
        kube,
        lambda: Conflict(409, "Conflict", "the object has been modified"),
        verb="PATCH",
        path=RELEASE.sub("status"),
        skip=1,
        times=1,
    )
    before = copy.deepcopy(status_of(kube))
    run(kube, until={"Succeeded"})
    assert len(refused) > 2 and before == {}
    assert timeless(status_of(kube)) == expected_status
    assert reasons(kube) == expected_reasons
    assert apps(kube) == expected_apps


ABORT = {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}}
HELD = [{"replicas": 1}, {"replicas": 2, "pause": "1h"}, {"replicas": 4}]


def held_at_batch_2(**spec: Any) -> MemoryKube:
    """A release whose batch 2 is live and paused for an hour, then aborted."""
    kube = cluster(batches=HELD, **spec)
    reconciler, now = Reconciler(kube), T0
    for _ in range(20):
        reconciler.reconcile(NS, "web", now=now)
        status = status_of(kube)
        if status.get("currentBatch") == 2 and (status.get("batchTimes") or {}).get("readyAt"):
            break
        roll_out(kube)
        now += timedelta(seconds=10)
    else:
        raise AssertionError(f"batch 2 never went live: {status_of(kube)}")
    kube.patch(RELEASE, ABORT)
    return kube


def test_a_controller_killed_before_any_write_of_an_abort_puts_everything_back() -> None:
    routing = {"trafficRouting": {"service": {"name": "web"}}}
    clean = held_at_batch_2(**routing)
    clean.requests.clear()
    run(clean, until={"Aborted"})
    expected_status, expected_reasons, expected_apps = timeless(status_of(clean)), reasons(clean), apps(clean)
    assert expected_apps == [{"name": "web", **{k: stable()["spec"][k] for k in ("replicas", "template")}}]
    assert (clean.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}
    for at in range(len(clean.writes)):
        kube = held_at_batch_2(**routing)
        kube.requests.clear()
        crash_before_write(kube, at)
        run(kube, until={"Aborted"})
        assert timeless(status_of(kube)) == expected_status, f"killed before write {at}"
        assert reasons(kube) == expected_reasons, f"killed before write {at}"
        assert apps(kube) == expected_apps, f"killed before write {at}"
        assert (kube.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}, f"killed before write {at}"
