"""Follow mode through the reconciler, on the in-memory API server with the hold webhook in front of the
Deployments and a Deployment controller that honours ``spec.paused``: a whole release of a template a GitOps
sync applied, an HPA resizing the stable mid-batch, an abort, a revert, a deletion, and a controller killed
before each of its writes. Throughout, the only writes to the Deployment are its enrolment label and the
hold's release, under the field manager ``greyrelease``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.admission.hold import FIELD_MANAGER, HELD_ANNOTATION, RELEASE, template_digest
from greyrelease.api.release import RELEASE_LABEL, TRACK_LABEL, VERSION_LABEL, Obj
from greyrelease.kube.protocol import JSON_PATCH, MERGE, Conflict
from greyrelease.kube.workload import SOURCE_ANNOTATION
from greyrelease.reconcile.reconciler import Outcome, Reconciler

from tests.support.builders import EVENTS, NS, SERVICE, T0, status_of
from tests.support.faults import Crash, crash_before_write
from tests.support.follow_cluster import (
    CANARY,
    WEB,
    HeldKube,
    cluster,
    commit,
    release,
    replicasets,
    roll_out,
    scale,
)
from tests.support.follow_cluster import (
    RELEASE as RELEASE_PATH,
)

SERVICE_MODE: dict[str, Any] = {"trafficRouting": {"service": {"name": "web"}}}


def timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if not k.endswith(("At", "Time", "Since"))}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def reasons(kube: HeldKube) -> list[str]:
    return [e["reason"] for e in sorted(kube.objects(EVENTS), key=lambda e: int(e["metadata"]["resourceVersion"]))]


def web(kube: HeldKube) -> Obj:
    return kube.get(WEB) or {}


def run(
    kube: HeldKube,
    *,
    until: set[str],
    max_passes: int = 80,
    on_pass: Callable[[int], None] | None = None,
    hold_rollouts: bool = False,
) -> list[Outcome]:
    """Passes, the Deployment controller converging between them, until the phase is in ``until``; a pass
    that fails (a crash, a 409) is run again at the same time by a new controller."""
    reconciler, now, outcomes = Reconciler(kube), T0, []
    for n in range(max_passes):
        if on_pass is not None:
            on_pass(n)
        try:
            outcome = reconciler.reconcile(NS, "web", now=now)
        except (Crash, Conflict):
            reconciler = Reconciler(kube)
            continue
        assert outcome is not None
        outcomes.append(outcome)
        if status_of(kube).get("phase") in until:
            return outcomes
        roll_out(kube, hold_rollouts=hold_rollouts)
        wait = outcome.plan.requeue_after
        now += timedelta(seconds=1.0 if wait is None else min(wait, 3600.0))
    raise AssertionError(f"never reached {until}: {status_of(kube)}")


PatchSummary = tuple[str, ...]


def summary(body: Any) -> PatchSummary:
    """The paths a patch writes: ``/spec/paused``, ``/metadata/labels/...``."""
    if isinstance(body, list):
        return tuple(sorted(str(op["path"]) for op in body if op["op"] != "test"))
    out: list[str] = []

    def walk(node: Any, at: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{at}/{k}")
        else:
            out.append(at)

    walk(body, "")
    return tuple(sorted(out))


def only_label_and_hold_written(kube: HeldKube) -> None:
    """Every write of the controller to the Deployment: the label, the hold's release; nothing else, and
    each under the field manager greyrelease (the webhook let the release through)."""
    mine = [(name, t, body, m) for name, t, body, m in kube.writes_to if name == "web"]
    for _, patch_type, body, manager in mine:
        if manager != FIELD_MANAGER:
            continue  # another client's (none here: the tests' own writes do not go through patch)
        paths = summary(body)
        assert all(
            p == f"/metadata/labels/{RELEASE_LABEL}"
            or p in ("/spec/paused", "/metadata/annotations/greyrelease.io~1held")
            for p in paths
        ), paths
        assert patch_type in (MERGE, JSON_PATCH)
    assert [m for *_, m in mine] == [FIELD_MANAGER] * len(mine)


def test_a_whole_follow_mode_release_of_a_template_gitops_applied() -> None:
    kube = cluster(**SERVICE_MODE)
    run(kube, until={"Idle"})
    before = web(kube)
    stable_rs = [rs["metadata"]["name"] for rs in replicasets(kube)]
    digest = commit(kube, "app:v2", flag="off")
    held = web(kube)
    assert held["spec"]["paused"] is True and held["metadata"]["annotations"][HELD_ANNOTATION] == digest
    seen: list[Obj] = []

    def canary_built(_: int) -> None:
        canary = kube.get(CANARY)
        if canary is not None and not canary["metadata"].get("deletionTimestamp"):
            seen.append(canary)

    run(kube, until={"Succeeded"}, on_pass=canary_built)
    after = web(kube)
    # The Deployment is what Git applied: its template (every container, env, config reference) and size,
    # unpaused, the webhook's annotation gone; it runs a new ReplicaSet of that template.
    assert after["spec"]["template"] == held["spec"]["template"] and after["spec"]["replicas"] == 4
    assert "paused" not in after["spec"] and HELD_ANNOTATION not in after["metadata"].get("annotations", {})
    assert after["metadata"]["labels"][RELEASE_LABEL] == "web"
    assert len(replicasets(kube)) == len(stable_rs) + 1
    assert kube.get(CANARY) is None and (kube.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}
    only_label_and_hold_written(kube)
    # One write to the Deployment: the hold's release, which the webhook let through as the controller's.
    assert [(t, summary(b)) for name, t, b, _ in kube.writes_to if name == "web"] == [
        (JSON_PATCH, ("/metadata/annotations/greyrelease.io~1held", "/spec/paused"))
    ]
    assert RELEASE in kube.decisions
    # The canary: the held template as written, with its track and version labels; no GitOps tracking.
    canary = seen[0]
    template = canary["spec"]["template"]
    assert template["spec"] == held["spec"]["template"]["spec"]
    assert template["metadata"]["labels"] == {"app": "web", TRACK_LABEL: "canary", VERSION_LABEL: digest}
    assert canary["metadata"]["annotations"][SOURCE_ANNOTATION] == digest
    assert "app.kubernetes.io/instance" not in canary["metadata"]["labels"]
    assert not any(k.startswith("argocd.argoproj.io/") for k in canary["metadata"]["annotations"])
    assert sorted({c["spec"]["replicas"] for c in seen}) == [1, 2, 4]
    status = status_of(kube)
    assert status["lastRelease"]["outcome"] == "Succeeded" and status["lastRelease"]["digest"] == digest
    assert status["stable"]["digest"] == digest and "held" not in status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert before["spec"]["replicas"] == after["spec"]["replicas"]
    # At rest: a pass reads and writes nothing.
    kube.requests.clear()
    Reconciler(kube).reconcile(NS, "web", now=T0 + timedelta(hours=1))
    assert kube.writes == []


def test_an_unenrolled_deployment_is_enrolled_by_the_first_pass_and_its_next_template_held() -> None:
    kube = cluster(enrolled=False)
    run(kube, until={"Idle"})
    assert web(kube)["metadata"]["labels"][RELEASE_LABEL] == "web"
    assert reasons(kube) == ["Enrolled"]
    assert [(t, summary(b), m) for _, t, b, m in kube.writes_to] == [
        (MERGE, (f"/metadata/labels/{RELEASE_LABEL}",), FIELD_MANAGER)
    ]
    commit(kube, "app:v2")
    assert web(kube)["spec"]["paused"] is True


def test_the_canary_follows_an_hpa_that_resizes_the_stable_mid_batch() -> None:
    kube = cluster(batches=[{"replicas": "50%", "pause": "1h"}, {"replicas": "100%"}], **SERVICE_MODE)
    commit(kube, "app:v2")
    reconciler, now = Reconciler(kube), T0
    for _ in range(5):
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    assert status_of(kube)["batchState"] == "Verifying"
    assert (kube.get(CANARY) or {})["spec"]["replicas"] == 2
    for replicas, canary in ((10, 5), (3, 2)):
        scale(kube, replicas)
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        assert (kube.get(CANARY) or {})["spec"]["replicas"] == canary
        assert web(kube)["spec"]["replicas"] == replicas  # the HPA's, never written by the release
        st = status_of(kube)
        assert (st["canaryReplicas"], st["stableReplicas"], st["batchState"]) == (canary, replicas, "Verifying")
    only_label_and_hold_written(kube)


def aborted(**spec: Any) -> tuple[HeldKube, str, list[str]]:
    kube = cluster(**{**SERVICE_MODE, **spec})
    stable_rs = sorted(rs["metadata"]["name"] for rs in replicasets(kube))
    digest = commit(kube, "app:v2")
    run(kube, until={"Progressing"})
    run(kube, until={"Progressing"}, max_passes=3)
    kube.patch(RELEASE_PATH, {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})
    run(kube, until={"Aborted"})
    return kube, digest, stable_rs


def test_an_abort_removes_the_canary_and_leaves_the_template_held() -> None:
    kube, digest, stable_rs = aborted()
    d = web(kube)
    assert d["spec"]["paused"] is True and d["metadata"]["annotations"][HELD_ANNOTATION] == digest
    assert template_digest(d["spec"]["template"]) == digest  # the spec says the new template ...
    assert sorted(rs["metadata"]["name"] for rs in replicasets(kube)) == stable_rs  # ... the pods run the old
    assert kube.get(CANARY) is None and (kube.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}
    status = status_of(kube)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Stalled"]["status"] == "True" and conditions["Ready"]["status"] == "False"
    assert f"holds app:v2 (template {digest[:8]}) but runs ReplicaSet {stable_rs[0]} (app:v1)" in status["message"]
    assert status["held"]["digest"] == digest and status["lastRelease"]["outcome"] == "Aborted"
    (told,) = about_web(kube)
    assert (told["type"], told["reason"]) == ("Warning", "ReleaseAborted")
    assert told["involvedObject"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "web",
        "namespace": NS,
        "uid": d["metadata"]["uid"],
    }
    assert told["message"].startswith(
        f"paused by GreyRelease web, whose release of app:v2 (template {digest[:8]}) ended Aborted: aborted by "
        f"annotation. The spec holds that template; the pods run ReplicaSet {stable_rs[0]} (app:v1)."
    )
    only_label_and_hold_written(kube)


def about_web(kube: HeldKube) -> list[Obj]:
    """The Events whose involvedObject is the Deployment web."""
    return [e for e in kube.objects(EVENTS) if e["involvedObject"]["kind"] == "Deployment"]


def test_an_abort_by_a_controller_killed_before_any_of_its_writes_tells_the_deployment_once() -> None:
    def abort_under_way() -> HeldKube:
        kube = cluster(**SERVICE_MODE)
        commit(kube, "app:v2")
        run(kube, until={"Progressing"})
        run(kube, until={"Progressing"}, max_passes=3)
        kube.patch(RELEASE_PATH, {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})
        kube.requests.clear()
        return kube

    clean = abort_under_way()
    run(clean, until={"Aborted"})
    writes = len(clean.writes)
    expected = reasons(clean)
    assert writes >= 4 and expected.count("ReleaseAborted") == 1
    for at in range(writes):
        kube = abort_under_way()
        crash_before_write(kube, at)
        run(kube, until={"Aborted"})
        assert reasons(kube) == expected, f"killed before write {at}"
        assert [e["reason"] for e in about_web(kube)] == ["ReleaseAborted"], f"killed before write {at}"


def test_a_revert_in_git_after_an_abort_releases_the_hold_and_restarts_no_pod() -> None:
    kube, _, stable_rs = aborted()
    commit(kube, "app:v1")
    run(kube, until={"Idle"})
    d = web(kube)
    assert "paused" not in d["spec"] and HELD_ANNOTATION not in d["metadata"].get("annotations", {})
    roll_out(kube)
    assert sorted(rs["metadata"]["name"] for rs in replicasets(kube)) == stable_rs  # no new ReplicaSet
    status = status_of(kube)
    assert status["lastRelease"]["outcome"] == "Reverted" and "held" not in status
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    only_label_and_hold_written(kube)


def test_a_revert_mid_release_ends_it_reverted() -> None:
    kube = cluster(**SERVICE_MODE)
    stable_rs = sorted(rs["metadata"]["name"] for rs in replicasets(kube))
    commit(kube, "app:v2")
    run(kube, until={"Progressing"})
    run(kube, until={"Progressing"}, max_passes=3)
    assert kube.get(CANARY) is not None
    commit(kube, "app:v1")
    run(kube, until={"Idle"})
    assert kube.get(CANARY) is None and "paused" not in web(kube)["spec"]
    roll_out(kube)
    assert sorted(rs["metadata"]["name"] for rs in replicasets(kube)) == stable_rs
    assert status_of(kube)["lastRelease"]["outcome"] == "Reverted"
    assert "Reverted" in reasons(kube)


def test_deleting_the_release_mid_release_hands_the_deployment_back() -> None:
    kube = cluster(**SERVICE_MODE)
    commit(kube, "app:v2")
    run(kube, until={"Progressing"})
    run(kube, until={"Progressing"}, max_passes=3)
    gr = kube.get(RELEASE_PATH) or {}
    gr["metadata"].update(finalizers=["greyrelease.io/finalizer"], deletionTimestamp="2026-01-01T12:05:00Z")
    kube.put(gr)
    reconciler, now = Reconciler(kube), T0 + timedelta(minutes=5)
    for _ in range(10):
        outcome = reconciler.reconcile(NS, "web", now=now)
        assert outcome is not None
        if outcome.plan.done:
            break
        roll_out(kube)
        now += timedelta(seconds=10)
    else:
        raise AssertionError("the deletion never finished")
    d = web(kube)
    assert RELEASE_LABEL not in d["metadata"]["labels"] and "paused" not in d["spec"]
    assert (
        kube.get(CANARY) is None
        or kube.get(
            CANARY,
        )
        is None
    )
    assert (kube.get(SERVICE) or {})["spec"]["selector"] == {"app": "web"}
    handed = {e["involvedObject"]["kind"]: e for e in kube.objects(EVENTS) if e["reason"] == "HandedBack"}
    assert sorted(handed) == ["Deployment", "GreyRelease"]  # one on each
    assert {e["type"] for e in handed.values()} == {"Warning"}
    assert handed["Deployment"]["involvedObject"]["uid"] == d["metadata"]["uid"]
    assert handed["Deployment"]["message"].startswith("GreyRelease web was deleted: this Deployment is no longer")
    assert "rolls now, without a canary" in handed["Deployment"]["message"]
    only_label_and_hold_written(kube)


def clean_run(**spec: Any) -> tuple[Obj, list[str], int, Obj]:
    kube = cluster(**spec)
    commit(kube, "app:v2")
    kube.requests.clear()
    run(kube, until={"Succeeded"})
    return timeless(status_of(kube)), reasons(kube), len(kube.writes), web(kube)


@pytest.mark.parametrize("routing", [None, {"service": {"name": "web"}}], ids=["replicas", "service"])
def test_a_controller_killed_before_any_write_of_a_follow_mode_release_resumes_exactly(routing: Obj | None) -> None:
    spec: dict[str, Any] = {"trafficRouting": routing} if routing else {}
    expected_status, expected_reasons, write_count, expected_web = clean_run(**spec)
    assert write_count >= 10 and [h["batch"] for h in expected_status["history"]] == [1, 2, 3]
    for at in range(write_count):
        kube = cluster(**spec)
        commit(kube, "app:v2")
        kube.requests.clear()
        crash_before_write(kube, at)
        run(kube, until={"Succeeded"})
        assert timeless(status_of(kube)) == expected_status, f"killed before write {at}"
        assert reasons(kube) == expected_reasons, f"killed before write {at}"
        assert web(kube)["spec"] == expected_web["spec"], f"killed before write {at}"
        assert kube.get(CANARY) is None, f"killed before write {at}"
        only_label_and_hold_written(kube)


# --- governance reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "pending", "annotations", "starts"),
    [
        ("Idle", True, {}, True),
        ("Idle", False, {}, False),
        ("Succeeded", True, {}, True),
        ("Aborted", False, {"greyrelease.io/retry": "1"}, True),
        ("Aborted", False, {}, False),
        ("Waiting", False, {}, True),
    ],
)
def test_a_release_at_rest_reads_what_governs_its_start_only_when_a_template_waits(
    phase: str, pending: bool, annotations: dict[str, str], starts: bool
) -> None:
    from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus
    from greyrelease.reconcile.policies import may_start

    spec = GreyReleaseSpec.model_validate(release()["spec"])
    assert may_start(GreyReleaseStatus(phase=phase), spec, annotations, pending=pending) is starts


def test_a_followed_deployment_at_rest_holds_no_release_that_comes_after_it() -> None:
    from greyrelease.api.release import GreyReleaseSpec
    from greyrelease.reconcile.policies import read_predecessors

    kube = cluster()
    run(kube, until={"Idle"})
    gr = kube.get(RELEASE_PATH) or {}
    gr["status"]["observedGeneration"] = gr["metadata"]["generation"]
    kube.put(gr)
    spec = GreyReleaseSpec.model_validate({**release()["spec"], "after": [{"name": "web"}]})
    (pred,) = read_predecessors(kube, NS, spec)
    assert pred.succeeded and pred.phase == "Idle"
