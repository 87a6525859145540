"""Follow mode's requests through the reconciler, on the in-memory API server, with a GitOps sync that puts
the annotations Git declares back on the GreyRelease before every pass (selfHeal): the controller never
writes the GreyRelease's metadata (no annotation removed), each approval is honoured once, and a controller
killed before any of its writes ends the release exactly as one that was never killed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from greyrelease.api.release import ABORT_ANNOTATION, PROMOTE_ANNOTATION, Obj
from greyrelease.kube.protocol import Conflict
from greyrelease.reconcile.reconciler import Reconciler

from tests.support.builders import EVENTS, NS, T0, status_of
from tests.support.faults import Crash, crash_before_write
from tests.support.follow_cluster import RELEASE, HeldKube, cluster, commit, roll_out

MANUAL = [{"replicas": "25%", "pause": "manual"}, {"replicas": "50%", "pause": "manual"}, {"replicas": "100%"}]
SPEC: dict[str, Any] = {"batches": MANUAL, "trafficRouting": {"service": {"name": "web"}}}

#: What Git declares on the GreyRelease, given its status: an approval of batch 1 from the start (it waits
#: for batch 1 to be live), changed to batch 2 once batch 2 waits; an abort of an earlier release left there.
Git = Callable[[Obj], dict[str, str]]


def approvals_in_git(status: Obj) -> dict[str, str]:
    waiting_two = status.get("currentBatch") == 2 and status.get("batchState") == "WaitingForApproval"
    return {PROMOTE_ANNOTATION: "2" if waiting_two or status.get("phase") == "Promoting" else "1"}


def sync(kube: HeldKube, git: Git) -> None:
    """The GitOps sync with selfHeal: the annotations Git declares put back as Git has them."""
    gr = kube.get(RELEASE) or {}
    wanted = git(gr.get("status") or {})
    annotations = gr["metadata"].setdefault("annotations", {})
    if any(annotations.get(k) != v for k, v in wanted.items()):
        annotations.update(wanted)
        kube.put(gr)


def run(kube: HeldKube, git: Git, *, until: Callable[[Obj], bool], max_passes: int = 120) -> int:
    """Passes (the sync before each, the Deployment controller after), until ``until(status)``; a pass that
    fails is run again at the same time by a new controller. How many passes it took."""
    reconciler, now = Reconciler(kube), T0
    for n in range(max_passes):
        sync(kube, git)
        try:
            outcome = reconciler.reconcile(NS, "web", now=now)
        except (Crash, Conflict):
            reconciler = Reconciler(kube)
            continue
        assert outcome is not None
        if until(status_of(kube)):
            return n
        roll_out(kube)
        wait = outcome.plan.requeue_after
        now += timedelta(seconds=1.0 if wait is None else min(wait, 5.0))
    raise AssertionError(f"never got there: {status_of(kube)}")


def metadata_writes(kube: HeldKube) -> list[tuple[str, Any]]:
    """The controller's writes to the GreyRelease itself (its metadata: annotations), not to its status."""
    return [(verb, ref) for verb, ref in kube.writes if ref == RELEASE]


def timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k != "at" and not k.endswith(("At", "Time", "Since"))}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def reasons(kube: HeldKube) -> list[str]:
    return [e["reason"] for e in sorted(kube.objects(EVENTS), key=lambda e: int(e["metadata"]["resourceVersion"]))]


def succeeded(status: Obj) -> bool:
    return status.get("phase") == "Succeeded"


def test_approvals_git_keeps_applying_are_each_honoured_once_and_no_annotation_is_removed() -> None:
    kube = cluster(**SPEC)
    digest = commit(kube, "app:v2")
    kube.requests.clear()
    run(kube, approvals_in_git, until=succeeded)
    status = status_of(kube)
    assert [(a["batch"], a["template"], a["request"]) for a in status["approvals"]] == [
        (1, digest, "1"),
        (2, digest, "2"),
    ]
    assert reasons(kube).count("Promoted") == 2
    assert metadata_writes(kube) == []
    assert (kube.get(RELEASE) or {})["metadata"]["annotations"][PROMOTE_ANNOTATION] == "2"


def test_an_abort_git_left_on_the_object_does_not_abort_the_next_release() -> None:
    kube = cluster(**SPEC)
    commit(kube, "app:v2")

    def git(status: Obj) -> dict[str, str]:
        return {ABORT_ANNOTATION: "true"}

    run(kube, git, until=lambda st: st.get("phase") == "Aborted")
    v3 = commit(kube, "app:v3")
    run(kube, git, until=lambda st: st.get("batchState") == "WaitingForApproval" and st.get("currentBatch") == 1)
    for _ in range(10):
        sync(kube, git)
        Reconciler(kube).reconcile(NS, "web", now=T0 + timedelta(minutes=10))
    status = status_of(kube)
    assert status["phase"] == "Progressing" and status["restore"]["template"] == v3
    assert reasons(kube).count("Aborted") == 1
    assert metadata_writes(kube) == []


def clean_run() -> tuple[Obj, list[str], int]:
    kube = cluster(**SPEC)
    commit(kube, "app:v2")
    kube.requests.clear()
    run(kube, approvals_in_git, until=succeeded)
    return timeless(status_of(kube)), reasons(kube), len(kube.writes)


def test_a_controller_killed_before_any_write_approves_each_batch_once() -> None:
    expected_status, expected_reasons, writes = clean_run()
    assert writes >= 10 and expected_reasons.count("Promoted") == 2
    assert [a["batch"] for a in expected_status["approvals"]] == [1, 2]
    for at in range(writes):
        kube = cluster(**SPEC)
        commit(kube, "app:v2")
        kube.requests.clear()
        crash_before_write(kube, at)
        run(kube, approvals_in_git, until=succeeded)
        assert timeless(status_of(kube)) == expected_status, f"killed before write {at}"
        assert reasons(kube) == expected_reasons, f"killed before write {at}"
        assert metadata_writes(kube) == [], f"killed before write {at}"
