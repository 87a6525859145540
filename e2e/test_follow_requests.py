"""End-to-end: follow mode's requests and endings on the local cluster, with Git re-applied every two seconds.

One app for the module: Deployment web (2 pods, Ready at once, no data plane) and GreyRelease web without
``targetVersion``, both in a "Git" directory applied by the GitOps emulator (e2e/harness/gitops.py) as Argo
CD applies (server-side, field manager ``argocd-controller``) in a self-heal loop for the whole module; the
controller run from a terminal with its admission webhook. Each test commits a new template and takes its
release to an end before the next test begins (the tests run in the file's order; each first brings a
release that a failed test before it left under way to rest, by a revert in Git).

- an approval committed in Git (``greyrelease.io/promote: "1"`` in the GreyRelease's manifest) approves
  batch 1 and nothing more: re-applied by the sync and read by later passes, it leaves batch 2 waiting at
  its manual pause; the controller never removes it (the object, and the audit log: no write of the
  controller's touches a request annotation); ``status.approvals`` lists batch 1;
- an abort leaves the template held and a ``ReleaseAborted`` Warning on the Deployment; ``kubectl gr
  retry`` releases the held template again from batch 1; after a second abort, ``kubectl gr promote
  --full`` releases the hold without a canary (the Deployment rolls, the release ends, no canary made);
- a new template committed mid-release supersedes it: ``Superseded`` (lastRelease and an Event), batch 1
  of the new template; then a revert in Git ends it ``Reverted`` with the same pods;
- deleting the GreyRelease (pruned from Git) hands the Deployment back: hold released, canary gone, label
  removed, a ``HandedBack`` Warning on the Deployment, and the next commit rolls without being held.

The figures (how long each step took) are printed; ``-s`` shows them.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from greyrelease.admission import HELD_ANNOTATION
from greyrelease.api.release import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RELEASE_LABEL, RETRY_ANNOTATION

from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.follow import (
    Follower,
    follow_release,
    git_deployment,
    image,
    kubectl_gr,
    running_tag,
    set_up,
    wait_held,
)
from e2e.harness.gitops import ARGOCD, GitOps, file_name
from e2e.harness.observe import (
    Reads,
    condition,
    event_line,
    events_of,
    first_image,
    request_annotation_writes,
)
from e2e.harness.reliability import CONTROLLER_AGENTS, audited_writes

pytestmark = pytest.mark.e2e

REPLICAS = 2
# Two batches, each held at a manual pause: only an approval moves a release on.
BATCHES = [{"replicas": "50%", "pause": "manual"}, {"replicas": "100%", "pause": "manual"}]


@dataclass
class Env:
    cluster: LocalCluster
    namespace: str
    gitops: GitOps
    reads: Reads

    def annotate(self, key: str, value: str) -> None:
        """``kubectl annotate --overwrite``: a person's request, a new value each time."""
        self.cluster.kubectl("annotate", "gr", "web", "-n", self.namespace, "--overwrite", f"{key}={value}")

    def events(self, kind: str, reason: str) -> list[dict[str, Any]]:
        """The Events about ``kind`` web of ``reason``, oldest first."""
        return events_of(self.cluster, self.namespace, kind, "web", reason=reason)


@pytest.fixture(scope="module")
def env(cluster: Cluster, crd: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("reads the local API server's audit log")
    namespace = f"e2e-follow-requests-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_namespace_ready(namespace)
    work = tmp_path_factory.mktemp("follow-requests")
    follower = Follower(cluster, namespace, work / "controller.log")
    gitops = GitOps(cluster, namespace, work / "repo", ARGOCD)
    gitops.commit(git_deployment("v1", replicas=REPLICAS))
    gitops.commit(follow_release(BATCHES))
    reads = Reads(cluster, namespace, agent="e2e-follow-requests")
    try:
        took = follower.start()
        set_up(cluster, namespace, gitops, reads)
        print(f"\ncontroller and webhook ready in {took:.1f}s; app v1 synced, release Idle")
        with gitops.self_heal():
            yield Env(cluster, namespace, gitops, reads)
        refused = gitops.refused()
        print(f"GitOps: {len(gitops.applies)} applies, {len(refused)} refused")
        assert not refused, [str(a) for a in refused]
    finally:
        follower.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


# --- steps ------------------------------------------------------------------------------------------------


def settle(env: Env) -> None:
    """A release left under way (a test before failed) reverted in Git to what runs; the GreyRelease as Git
    has it at the module's start (no annotation)."""
    env.gitops.commit(follow_release(BATCHES))
    if env.reads.status().get("phase") in ("Idle", "Succeeded", None):
        return
    env.gitops.commit(git_deployment(running_tag(env.reads), replicas=REPLICAS))
    env.reads.wait_phase({"Idle"}, 90)


def commit_template(env: Env, tag: str) -> str:
    """Commits Deployment web with ``tag``; its digest once the webhook holds it."""
    env.gitops.commit(git_deployment(tag, replicas=REPLICAS))
    return str(wait_held(env.reads, tag)["metadata"]["annotations"][HELD_ANNOTATION])


def waiting(env: Env, batch: int, digest: str, timeout: float = 90) -> dict[str, Any]:
    """The status once batch ``batch`` of the release of template ``digest`` is live and waits at its manual
    pause."""

    def at_pause(st: dict[str, Any]) -> bool:
        return (
            st.get("phase") == "Progressing"
            and st.get("currentBatch") == batch
            and st.get("batchState") == "WaitingForApproval"
            and (st.get("held") or {}).get("digest") == digest
        )

    return env.reads.wait_status(at_pause, timeout, f"batch {batch} of template {digest[:8]} waiting for approval")


def canary_of(env: Env, tag: str) -> dict[str, Any]:
    """The canary Deployment once it runs ``tag`` with every pod ready."""

    def ready() -> dict[str, Any] | None:
        c = env.reads.deployment("web-canary")
        if c is None or first_image(c) != image(tag):
            return None
        st = c.get("status") or {}
        return c if st.get("readyReplicas") == c["spec"]["replicas"] == st.get("replicas") else None

    return env.reads.wait(ready, 60, f"the canary of {tag} ready")


def canary_gone(env: Env) -> None:
    env.reads.wait(
        lambda: env.reads.deployment("web-canary") is None and not env.reads.pods(canary=True),
        60,
        "the canary and its pods removed",
    )


def rolled_out(env: Env, tag: str) -> dict[str, Any]:
    """Deployment web once its controller has rolled ``tag`` to every pod, with no hold."""

    def done() -> dict[str, Any] | None:
        d = env.reads.deployment()
        if d is None or d["spec"].get("paused") or first_image(d) != image(tag):
            return None
        st = d.get("status") or {}
        complete = (
            st.get("observedGeneration") == d["metadata"]["generation"]
            and st.get("updatedReplicas") == st.get("replicas") == st.get("availableReplicas") == REPLICAS
        )
        return d if complete else None

    return env.reads.wait(done, 90, f"deployment/web rolled to {tag}")


def stable_pod_uids(env: Env) -> set[str]:
    return {p["metadata"]["uid"] for p in env.reads.pods(canary=False)}


def request_record(st: dict[str, Any], annotation: str) -> dict[str, Any]:
    found = [r for r in st.get("requests") or [] if r.get("annotation") == annotation]
    assert len(found) == 1, st.get("requests")
    return dict(found[0])


def passes_seen(env: Env, deadline: int) -> dict[str, Any]:
    """Commits the GreyRelease with its approval and progressDeadlineSeconds ``deadline`` (a spec change that
    moves no batch); returns the status once a pass has observed that generation."""
    env.gitops.commit(follow_release(BATCHES, annotations={PROMOTE_ANNOTATION: "1"}, deadline=deadline))

    def observed() -> dict[str, Any] | None:
        rel = env.reads.release() or {}
        spec, st = rel.get("spec") or {}, rel.get("status") or {}
        seen = spec.get("progressDeadlineSeconds") == deadline and st.get("observedGeneration") == (
            rel.get("metadata") or {}
        ).get("generation")
        return st if seen else None

    return env.reads.wait(observed, 30, f"a pass over the GreyRelease with progressDeadlineSeconds {deadline}")


# --- 1: an approval in Git ---------------------------------------------------------------------------------


def test_an_approval_committed_in_git_approves_its_batch_and_nothing_more(env: Env) -> None:
    settle(env)
    since = datetime.now(UTC)
    digest = commit_template(env, "v2")
    waiting(env, 1, digest)
    committed = time.monotonic()
    env.gitops.commit(follow_release(BATCHES, annotations={PROMOTE_ANNOTATION: "1"}))
    waiting(env, 2, digest, timeout=60)
    approved_after = time.monotonic() - committed
    canary_of(env, "v2")
    # With batch 2 live, the sync goes on applying the approval, and two passes read it (each made by a spec
    # change Git commits, which the pass records as observed).
    held_from = time.monotonic()
    for deadline in (181, 182):
        st = passes_seen(env, deadline)
        assert (st.get("currentBatch"), st.get("batchState")) == (2, "WaitingForApproval"), st
    env.gitops.next_apply(after=time.monotonic())
    applies = [a for a in env.gitops.applies if a.started >= committed]
    rel = env.reads.release()
    assert rel is not None
    st = rel["status"]
    waited = time.monotonic() - held_from

    assert (st.get("currentBatch"), st.get("batchState")) == (2, "WaitingForApproval"), st
    assert st.get("phase") not in ("Promoting", "Succeeded"), st.get("phase")
    assert rel["metadata"]["annotations"].get(PROMOTE_ANNOTATION) == "1", rel["metadata"]["annotations"]
    approvals = [(a.get("batch"), a.get("template"), a.get("request")) for a in st.get("approvals") or []]
    assert approvals == [(1, digest, "1")], st.get("approvals")
    record = request_record(st, PROMOTE_ANNOTATION)
    assert (record.get("value"), record.get("template")) == ("1", digest) and record.get("doneAt"), record
    removals = request_annotation_writes(env.cluster, env.namespace, since)
    assert removals == [], "the controller wrote a request annotation:\n" + "\n".join(removals)
    drift = env.gitops.drift()
    assert drift.in_sync, f"drift with batch 2 waiting:\n{drift.diff}"

    # Batch 2 approved in Git too: the promotion, the template rolled, the approval still on the object.
    env.gitops.commit(follow_release(BATCHES, annotations={PROMOTE_ANNOTATION: "2"}))
    end = env.reads.wait_phase({"Succeeded"}, 90)
    rolled_out(env, "v2")
    canary_gone(env)
    rel = env.reads.release()
    assert rel is not None and rel["metadata"]["annotations"].get(PROMOTE_ANNOTATION) == "2"
    assert end["lastRelease"]["outcome"] == "Succeeded" and end["lastRelease"]["digest"] == digest, end["lastRelease"]
    removals = request_annotation_writes(env.cluster, env.namespace, since)
    assert removals == [], "the controller wrote a request annotation:\n" + "\n".join(removals)
    print(
        f'\napproval in Git: batch 2 live {approved_after:.1f}s after promote: "1" was committed; it stayed at '
        f"batch 2 for {waited:.1f}s over {len(applies)} applies of Git and two passes that read the approval; "
        f'approvals {approvals}; no controller write touched a request annotation; promote: "2" in Git -> '
        f"Succeeded"
    )


# --- 2: an abort, retry, promote=full ------------------------------------------------------------------------


def test_an_abort_leaves_the_deployment_a_warning_and_retry_or_promote_full_release_the_template(env: Env) -> None:
    settle(env)
    since = datetime.now(UTC)
    runs = running_tag(env.reads)
    digest = commit_template(env, "v3")
    waiting(env, 1, digest)
    canary_of(env, "v3")
    uids = stable_pod_uids(env)

    # An abort: the template stays held, the Deployment says why it is paused.
    env.annotate(ABORT_ANNOTATION, "true@first")
    st = env.reads.wait_phase({"Aborted"}, 60)
    canary_gone(env)
    assert condition(st, "Stalled") == "True", st.get("conditions")
    assert f"holds {image('v3')} (template {digest[:8]})" in st["message"], st["message"]
    d = env.reads.deployment()
    assert d is not None and d["spec"].get("paused") is True
    assert d["metadata"]["annotations"][HELD_ANNOTATION] == digest
    assert {first_image(p) for p in env.reads.pods(canary=False)} == {image(runs)}
    warned = env.reads.wait(
        lambda: env.events("Deployment", "ReleaseAborted"), 30, "ReleaseAborted on deployment/web", interval=1.0
    )
    assert len(warned) == 1, [event_line(e) for e in warned]
    first = warned[0]
    assert first["type"] == "Warning" and first["source"]["component"] == "greyrelease", event_line(first)
    for words in ("paused by GreyRelease web", f"{image('v3')} (template {digest[:8]})", "ended Aborted"):
        assert words in first["message"], (words, first["message"])
    assert "greyrelease.io/retry" in first["message"] and "greyrelease.io/promote=full" in first["message"]

    # kubectl gr retry: the same template again from batch 1, the old abort left on the object doing nothing.
    retried = time.monotonic()
    kubectl_gr(env.cluster, "retry", "web", "-n", env.namespace)
    st = waiting(env, 1, digest)
    retry_took = time.monotonic() - retried
    canary_of(env, "v3")
    assert st.get("phase") != "Aborted" and condition(st, "Stalled") != "True", st
    assert env.events("GreyRelease", "Retried"), "no Retried Event"
    record = request_record(st, RETRY_ANNOTATION)
    assert record.get("doneAt") and "retried" in str(record.get("result")), record
    d = env.reads.deployment()
    assert d is not None and d["spec"].get("paused") is True, "the hold was released by the retry"

    # Aborted again; then kubectl gr promote --full: the hold released with no canary.
    env.annotate(ABORT_ANNOTATION, "true@second")
    env.reads.wait_phase({"Aborted"}, 60)
    canary_gone(env)
    warned = env.reads.wait(
        lambda: (lambda found: found if len(found) >= 2 else None)(env.events("Deployment", "ReleaseAborted")),
        30,
        "a second ReleaseAborted on deployment/web",
        interval=1.0,
    )
    assert len({e["metadata"]["name"] for e in warned}) == len(warned) == 2, [event_line(e) for e in warned]
    full_at = datetime.now(UTC)
    accepted = time.monotonic()
    kubectl_gr(env.cluster, "promote", "web", "--full", "-n", env.namespace)
    d = rolled_out(env, "v3")
    rolled_after = time.monotonic() - accepted
    end = env.reads.wait_status(
        lambda st: st.get("phase") in ("Succeeded", "Idle") and (st.get("lastRelease") or {}).get("digest") == digest,
        60,
        "the release ended after promote=full",
    )
    assert HELD_ANNOTATION not in (d["metadata"].get("annotations") or {})
    assert {first_image(p) for p in env.reads.pods(canary=False)} == {image("v3")}
    assert not stable_pod_uids(env) & uids, "pods of v2 left"
    assert env.reads.deployment("web-canary") is None and not env.reads.pods(canary=True)
    created = [
        str(w)
        for w in audited_writes(env.cluster, namespace=env.namespace, agents=CONTROLLER_AGENTS, since=full_at)
        if w.resource == "deployments" and w.verb == "create"
    ]
    assert created == [], f"a canary was made after promote=full: {created}"
    assert (condition(end, "Ready"), condition(end, "Stalled")) == ("True", "False"), end.get("conditions")
    if end["phase"] == "Succeeded":
        assert end["lastRelease"]["outcome"] == "Succeeded", end["lastRelease"]
    removals = request_annotation_writes(env.cluster, env.namespace, since)
    assert removals == [], "the controller wrote a request annotation:\n" + "\n".join(removals)
    drift = env.gitops.drift()
    assert drift.in_sync, drift.diff
    print(
        f"\nabort -> Aborted, held, {len(warned)} ReleaseAborted Warnings on deployment/web "
        f"({first['message'][:120]}...); "
        f"kubectl gr retry -> batch 1 of the same template live {retry_took:.1f}s later; aborted again; "
        f"kubectl gr promote --full -> rolled to v3 without a canary {rolled_after:.1f}s later, release "
        f"{end.get('phase')} ({end['lastRelease']['outcome']})"
    )


# --- 3: a new template mid-release -----------------------------------------------------------------------------


def test_a_new_template_committed_mid_release_supersedes_it(env: Env) -> None:
    settle(env)
    runs = running_tag(env.reads)
    first = commit_template(env, "v4")
    waiting(env, 1, first)
    canary_of(env, "v4")
    committed = time.monotonic()
    second = commit_template(env, "v5")
    st = waiting(env, 1, second)
    canary_of(env, "v5")
    restarted_after = time.monotonic() - committed
    last = st.get("lastRelease") or {}
    assert (last.get("outcome"), last.get("digest")) == ("Superseded", first), last
    superseded = env.events("GreyRelease", "Superseded")
    # Each template named by its images and the first digits of its digest, as every message names them.
    named = f"{image('v5')} (template {second[:8]}) superseded {image('v4')} (template {first[:8]})"
    assert len(superseded) == 1 and named in superseded[0]["message"], [event_line(e) for e in superseded]
    assert not st.get("approvals"), st.get("approvals")
    d = env.reads.deployment()
    assert d is not None and d["spec"].get("paused") is True and d["metadata"]["annotations"][HELD_ANNOTATION] == second

    # A revert in Git ends the release of v5: Reverted, the hold released, no pod restarted.
    uids = stable_pod_uids(env)
    env.gitops.commit(git_deployment(runs, replicas=REPLICAS))
    end = env.reads.wait_status(
        lambda st: st.get("phase") == "Idle" and (st.get("lastRelease") or {}).get("outcome") == "Reverted",
        60,
        "Idle after the revert",
    )
    rolled_out(env, runs)
    canary_gone(env)
    assert stable_pod_uids(env) == uids, "a pod was restarted by the revert"
    print(
        f"\nsuperseded: batch 1 of v5 live {restarted_after:.1f}s after its commit (lastRelease Superseded, "
        f"{superseded[0]['message'][:140]}); reverted to {runs}: {end['phase']}, same pods"
    )


# --- 4: the GreyRelease deleted --------------------------------------------------------------------------------


def test_deleting_the_greyrelease_hands_the_deployment_back(env: Env) -> None:
    settle(env)
    digest = commit_template(env, "v6")
    waiting(env, 1, digest)
    canary_of(env, "v6")
    # Removed from Git and pruned, as Argo CD does it: the file goes, then the object.
    env.gitops.stop()
    (env.gitops.repo / file_name(follow_release(BATCHES))).unlink()
    env.gitops.start()
    deleting = time.monotonic()
    env.cluster.kubectl("delete", "gr", "web", "-n", env.namespace, "--timeout=90s")
    deleted_after = time.monotonic() - deleting
    assert env.reads.release() is None
    d = env.reads.deployment()
    assert d is not None
    assert not d["spec"].get("paused"), d["spec"]
    assert HELD_ANNOTATION not in (d["metadata"].get("annotations") or {}), d["metadata"].get("annotations")
    assert RELEASE_LABEL not in (d["metadata"].get("labels") or {}), d["metadata"].get("labels")
    canary_gone(env)
    rolled_out(env, "v6")
    handed = env.events("Deployment", "HandedBack")
    assert len(handed) == 1, [event_line(e) for e in handed]
    assert handed[0]["type"] == "Warning", event_line(handed[0])
    assert "GreyRelease web was deleted" in handed[0]["message"] and image("v6") in handed[0]["message"], handed[0]

    # Handed back: the next commit rolls at once, held by nobody.
    env.gitops.commit(git_deployment("v7", replicas=REPLICAS))
    d = rolled_out(env, "v7")
    assert HELD_ANNOTATION not in (d["metadata"].get("annotations") or {})
    drift = env.gitops.drift()
    assert drift.in_sync, drift.diff
    print(
        f"\ndeleted mid-release in {deleted_after:.1f}s (finalizer done): hold of v6 released, canary removed, "
        f"label removed, rolled to v6; HandedBack on deployment/web: {handed[0]['message'][:160]}; "
        f"v7 then rolled unheld"
    )
