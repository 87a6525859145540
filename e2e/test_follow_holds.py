"""End-to-end: what holds a follow-mode release back, and what stops one, on the local cluster with the
controller and its admission webhook run from a terminal, the app applied from "Git" by the GitOps emulator
every two seconds (server-side, as Argo CD; e2e/harness/gitops.py).

- a freeze of a GreyReleasePolicy holds a commit: the Deployment stays held (paused, the pods on the old
  ReplicaSet, no ReplicaSet of the new template, no canary) for as long as the freeze lasts, with Git in sync;
  the freeze lifted, the template is released;
- a rollout the Deployment controller gives up on: once the canary carries all the traffic, the hold's release
  rolls the template, whose new pods never become Ready (no node takes them: the nodes are cordoned after the
  canary started, as when a cluster has no room for the rollout's surge); the Deployment's own
  ``progressDeadlineSeconds`` passes (``ProgressDeadlineExceeded``) and the release ends ``Failed`` with a
  message saying so and what to do, the canary removed and the traffic back on the Deployment's pods under
  load, no request failed; with room again, the rollout completes and the release is ``Idle``.

The figures are printed (``-s``); the bounds are generous.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from greyrelease.admission import HELD_ANNOTATION

from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.dataplane import DataPlane
from e2e.harness.follow import (
    Follower,
    check_deployment_writes,
    follow_release,
    git_deployment,
    git_route,
    git_service,
    ignore_rules,
    image,
    set_up,
    wait_held,
)
from e2e.harness.gitops import ARGOCD, GitOps
from e2e.harness.load import Load, summarise
from e2e.harness.observe import Reads, condition, event_line, events_of, first_image

pytestmark = pytest.mark.e2e


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def old_replicasets_only(reads: Reads, tag: str) -> bool:
    """No ReplicaSet of ``tag``'s template, and no canary."""
    return all(first_image(r["spec"]["template"]) != image(tag) for r in reads.replicasets()) and (
        reads.deployment("web-canary") is None
    )


# --- a freeze holds a commit --------------------------------------------------------------------------------


def test_a_freeze_keeps_a_commit_held_until_it_is_lifted_then_releases_it(
    local_cluster: LocalCluster, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    cluster, replicas = local_cluster, 2
    gitops = GitOps(cluster, namespace, tmp_path / "repo", ARGOCD)
    gitops.commit(git_deployment("v1", replicas=replicas))
    gitops.commit(follow_release([{"replicas": "50%", "pause": "1s"}, {"replicas": "100%"}]))
    reads = Reads(cluster, namespace, agent="e2e-follow-holds")
    name = f"freeze-{namespace}"
    now = datetime.now(UTC)
    policy = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyReleasePolicy",
        "metadata": {"name": name},
        "spec": {
            "namespaces": [namespace],
            "freezes": [
                {
                    "from": rfc3339(now - timedelta(hours=1)),
                    "to": rfc3339(now + timedelta(hours=1)),
                    "reason": "e2e freeze",
                }
            ],
        },
    }
    since = now
    try:
        set_up(cluster, namespace, gitops, reads)
        uids = {p["metadata"]["uid"] for p in reads.pods(canary=False)}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(policy))
        with gitops.self_heal():
            committed = time.monotonic()
            gitops.commit(git_deployment("v2", replicas=replicas))
            digest = str(wait_held(reads, "v2")["metadata"]["annotations"][HELD_ANNOTATION])
            held_after = time.monotonic() - committed
            waiting = reads.wait_phase({"Waiting"}, 30)
            # Three applies of Git later: still held, nothing of v2 runs, Git in sync.
            for _ in range(3):
                gitops.next_apply(after=time.monotonic())
            d = reads.deployment()
            assert d is not None and d["spec"].get("paused") is True, d and d["spec"]
            assert d["metadata"]["annotations"][HELD_ANNOTATION] == digest
            assert old_replicasets_only(reads, "v2"), [r["metadata"]["name"] for r in reads.replicasets()]
            assert {p["metadata"]["uid"] for p in reads.pods(canary=False)} == uids
            st = reads.status()
            assert st.get("phase") == "Waiting" and (st.get("currentBatch") or 0) == 0, st
            drift = gitops.drift()
            assert drift.in_sync, drift.diff
            frozen_for = time.monotonic() - committed

            # The freeze lifted: the release starts, and ends as any other.
            cluster.kubectl("delete", "greyreleasepolicy", name)
            lifted = time.monotonic()
            applies = len([a for a in gitops.applies if committed <= a.started < lifted])
            started = reads.wait_status(lambda s: (s.get("currentBatch") or 0) >= 1, 60, "batch 1 started")
            start_after = time.monotonic() - lifted
            done = reads.wait_phase({"Succeeded"}, 120)
            done_after = time.monotonic() - lifted
            end_drift = gitops.drift()
        refused = gitops.refused()
    finally:
        cluster.kubectl("delete", "greyreleasepolicy", name, "--ignore-not-found", check=False)

    print(
        f"\nfreeze: template {digest} (v2) held {held_after:.2f}s after the commit; Waiting: {waiting.get('message')}"
    )
    print(
        f"  held for {frozen_for:.1f}s (through {applies} applies of Git, in sync), no ReplicaSet of v2, no "
        f"canary, the pods unchanged; the freeze lifted: batch 1 "
        f"{start_after:.2f}s later, Succeeded {done_after:.1f}s later"
    )
    assert "freeze 'e2e freeze' of GreyReleasePolicy" in str(waiting.get("message")), waiting.get("message")
    assert started.get("phase") in ("Progressing", "Promoting", "Succeeded"), started
    assert done["lastRelease"]["outcome"] == "Succeeded" and done["lastRelease"]["digest"] == digest
    assert end_drift.in_sync, end_drift.diff
    assert not refused, [str(a) for a in refused]
    d = reads.deployment()
    assert d is not None and first_image(d) == image("v2") and "paused" not in d["spec"]
    print(f"  {check_deployment_writes(cluster, namespace, since, {digest})}")
    assert start_after < 15, f"the release started {start_after:.1f}s after the freeze was lifted"


# --- a rollout the Deployment controller gives up on ------------------------------------------------------------

RATE = 50.0  # requests/s through Traefik
DEADLINE = 8  # the Deployment's progressDeadlineSeconds, in Git


def cordon(cluster: Cluster, on: bool) -> list[str]:
    nodes = [n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes")["items"]]
    cluster.kubectl("cordon" if on else "uncordon", *nodes)
    return nodes


def test_a_rollout_that_stalls_fails_the_release_and_puts_the_traffic_back_on_the_deployments_pods(
    local_cluster: LocalCluster, dataplane: DataPlane, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    cluster, replicas = local_cluster, 2
    host = f"web.{namespace}.example"
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
    gitops = GitOps(cluster, namespace, tmp_path / "repo", ARGOCD, ignore=ignore_rules("web"))

    def deployment(tag: str) -> dict[str, Any]:
        d = git_deployment(tag, replicas=replicas, serving=True)
        d["spec"]["progressDeadlineSeconds"] = DEADLINE
        return d

    gitops.commit(deployment("v1"))
    gitops.commit(git_service("web"))
    gitops.commit(git_route(host, "web", dataplane.parent_ref))
    gitops.commit(follow_release([{"replicas": "100%", "weight": 100, "pause": "manual"}], trafficRouting=routing))
    reads = Reads(cluster, namespace, agent="e2e-follow-holds")
    since = datetime.now(UTC)
    cordoned = False
    try:
        set_up(cluster, namespace, gitops, reads)

        def all_answer() -> bool:
            with Load(dataplane.gateway_url, 50, host=host, timeout=2) as probe:
                time.sleep(0.5)
            s = probe.summary()
            return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == replicas

        reads.wait(all_answer, 60, f"Traefik answering for {host} from {replicas} pods", interval=0.2)
        with gitops.self_heal(), Load(dataplane.gateway_url, RATE, host=host) as load:
            gitops.commit(deployment("v2"))
            digest = str(wait_held(reads, "v2")["metadata"]["annotations"][HELD_ANNOTATION])
            reads.wait_status(lambda s: s.get("batchState") == "WaitingForApproval", 90, "the batch live")
            reads.wait(
                lambda: any(r.image == image("v2") for r in load.records[-20:]),
                30,
                "the canary answering",
                interval=0.2,
            )
            cordon(cluster, True)
            cordoned = True
            approved = time.time()
            cluster.kubectl("annotate", "gr", "web", "-n", namespace, "--overwrite", "greyrelease.io/promote=1")
            reads.wait_phase({"Promoting"}, 30)
            failed = reads.wait_phase({"Failed"}, DEADLINE + 60)
            failed_at = time.time()
            reads.wait(
                lambda: reads.deployment("web-canary") is None and not reads.pods(canary=True), 60, "the canary gone"
            )
            route = cluster.kubectl_json("get", "httproute", "web", "-n", namespace)
            service = cluster.kubectl_json("get", "service", "web", "-n", namespace)
            d = reads.deployment()
            assert d is not None
            progressing = next(c for c in d["status"]["conditions"] if c["type"] == "Progressing")
            time.sleep(5)  # the Deployment's pods alone serve, with the rollout stuck
            stuck_until = time.time()
            failed_drift = gitops.drift()

            # Room again: the rollout completes, and the release rests.
            cordon(cluster, False)
            cordoned = False
            idle = reads.wait_phase({"Idle"}, 90)
            idle_after = time.time() - stuck_until
            end_drift = gitops.drift()
        records = load.records
        refused = gitops.refused()
    finally:
        if cordoned:
            cordon(cluster, False)

    message = str(failed.get("message"))
    print(f"\nstalled rollout: Failed {failed_at - approved:.1f}s after the approval: {message}")
    print(f"  the Deployment's Progressing condition: {progressing.get('reason')}: {progressing.get('message')}")
    assert (condition(failed, "Stalled"), condition(failed, "Ready")) == ("True", "False")
    assert progressing.get("reason") == "ProgressDeadlineExceeded", progressing
    assert "ProgressDeadlineExceeded" in message and f"did not roll {image('v2')} (template {digest[:8]})" in message
    assert "The canary is removed and the traffic is on Deployment web's own pods" in message, message
    assert failed["lastRelease"]["outcome"] == "Failed" and failed["lastRelease"]["digest"] == digest
    # The route and the Service as Git has them (what the release changed is undone), Git in sync.
    assert [[b["name"] for b in r["backendRefs"]] for r in route["spec"]["rules"]] == [["web"]], route["spec"]
    assert "pod-template-hash" not in service["spec"]["selector"], service["spec"]["selector"]
    assert failed_drift.in_sync and end_drift.in_sync, failed_drift.diff + end_drift.diff
    warned = events_of(cluster, namespace, "Deployment", "web", reason="ReleaseFailed")
    assert len(warned) == 1 and warned[0]["type"] == "Warning", [event_line(e) for e in warned]
    print(f"  on the Deployment: {event_line(warned[0])}")

    after_failed = [r for r in records if failed_at + 1 <= r.sent < stuck_until]
    s = summarise(records, records[0].sent, records[-1].sent, asked_rate=RATE)
    served = {r.image for r in after_failed if r.image}
    print(
        f"  load: {s.sent} requests at {s.rate:.1f}/s, {len(s.failed)} failed; from 1s after Failed until room "
        f"came back: {len(after_failed)} requests answered by {sorted(served)}; then Idle {idle_after:.1f}s after "
        f"the nodes took pods again ({idle.get('message')})"
    )
    assert s.failed == [], [(r.sent - approved, r.status, r.error) for r in s.failed[:10]]
    assert served == {image("v1")}, served  # the Deployment's own pods: the old ReplicaSet's, all ready
    assert idle["lastRelease"]["outcome"] == "Failed", idle["lastRelease"]
    d = reads.deployment()
    assert d is not None and first_image(d) == image("v2") and "paused" not in d["spec"]
    assert not refused, [str(a) for a in refused]
    print(f"  {check_deployment_writes(cluster, namespace, since, {digest})}")
