"""End-to-end: a follow-mode release of a Deployment that a real HorizontalPodAutoscaler scales.

The HPA is kube-controller-manager's HPA controller (syncing every 5 s on the local cluster), reading pod CPU
from metrics-server (e2e/harness/metrics_server.py) through the API server's aggregation layer, which scrapes
KWOK's simulated kubelets; the pods' CPU is what KWOK computes (e2e/kwok/metrics.yaml), set per namespace by
the test. Git (the GitOps emulator, server-side as Flux, every two seconds) holds the Deployment without
``replicas``, its HorizontalPodAutoscaler and the GreyRelease. A commit of v2 is held and released; at batch 1
the CPU is raised, the HPA scales the Deployment up, then lowered, and it scales it down; the canary follows
each time; then the release is approved and promoted at the HPA's size. The audit log shows who wrote the
Deployment's replicas: the HPA controller, through ``/scale``, under its own account; the controller wrote
its label and the hold's release, nothing else.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from greyrelease.admission import HELD_ANNOTATION

from e2e.harness.controlplane import HPA_CONTROLLER_USER, LocalCluster
from e2e.harness.follow import Follower, check_deployment_writes, follow_release, git_deployment, image, wait_held
from e2e.harness.follow import set_up as follow_set_up
from e2e.harness.gitops import FLUX, GitOps, audited_requests
from e2e.harness.metrics_server import MetricsServer, millicores, pod_metrics, set_cpu
from e2e.harness.observe import Reads

pytestmark = pytest.mark.e2e

REQUEST = "100m"  # the container's CPU request: the HPA's utilization is usage over it
TARGET = 50  # averageUtilization, %
LOW, HIGH = "10m", "200m"  # per container: 10 % and 200 % of the request
MIN, MAX = 2, 4
SHARE = 0.5  # batch 1


def git_hpa() -> dict[str, Any]:
    """The HorizontalPodAutoscaler of Deployment web, as a team commits it: CPU at 50 % of the request, 2 to 4
    replicas, scaling down without the default 5-minute stabilization (so that a test sees it)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": MIN,
            "maxReplicas": MAX,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": TARGET}},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        },
    }


def deployment(tag: str) -> dict[str, Any]:
    """Deployment web without replicas (the HPA's), its container asking for 100m of CPU."""
    d = git_deployment(tag, replicas=1)
    del d["spec"]["replicas"]
    d["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": REQUEST}}
    return d


def test_a_real_hpa_scales_the_deployment_mid_release_and_the_canary_follows(
    local_cluster: LocalCluster, metrics_server: MetricsServer, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    cluster = local_cluster
    gitops = GitOps(cluster, namespace, tmp_path / "repo", FLUX)
    gitops.commit(deployment("v1"))
    gitops.commit(git_hpa())
    gitops.commit(follow_release([{"replicas": f"{SHARE:.0%}", "pause": "manual"}, {"replicas": "100%"}]))
    reads = Reads(cluster, namespace, agent="e2e-follow-hpa")
    since = datetime.now(UTC)
    moves: list[str] = []

    def hpa_status() -> dict[str, Any]:
        found = reads.client.get(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/web")
        return dict((found or {}).get("status") or {})

    def utilization() -> int | None:
        for m in hpa_status().get("currentMetrics") or []:
            found = ((m.get("resource") or {}).get("current") or {}).get("averageUtilization")
            if found is not None:
                return int(found)
        return None

    def replicas() -> int:
        d = reads.deployment()
        assert d is not None
        return int(d["spec"].get("replicas") or 0)

    def canary_follows(stable: int, since_write: float) -> tuple[float, float]:
        """Once the Deployment has ``stable`` replicas: waits for the canary at its share of them; returns when
        the HPA's write of that count came (its last write since ``since_write``) and how long the canary
        took after it."""
        want = math.ceil(SHARE * stable)
        scaled = reads.wait(lambda: _last_scale_write(cluster, namespace, since_write), 10, "the HPA's write")
        reads.wait(
            lambda: (c := reads.deployment("web-canary")) is not None and c["spec"]["replicas"] == want,
            30,
            f"the canary at {want} for the stable's {stable}",
            interval=0.05,
        )
        return scaled, time.time() - scaled

    set_cpu(cluster, namespace, LOW)
    try:
        follow_set_up(cluster, namespace, gitops, reads)
        with gitops.self_heal():
            # The HPA at its minimum, with metrics of every pod.
            reads.wait(lambda: replicas() == MIN and utilization() is not None, 90, "the HPA at 2 with metrics")
            print(f"\nHPA at rest: {replicas()} replicas at {utilization()}% of {REQUEST} ({LOW} a pod)")
            gitops.commit(deployment("v2"))
            digest = str(wait_held(reads, "v2")["metadata"]["annotations"][HELD_ANNOTATION])
            reads.wait_status(lambda s: s.get("batchState") == "WaitingForApproval", 90, "batch 1 live")
            reads.wait(
                lambda: (c := reads.deployment("web-canary")) is not None and c["spec"]["replicas"] == 1, 30, "canary 1"
            )

            # Load up: every pod at 200 % of its request. The HPA scales to its maximum.
            raised = time.time()
            set_cpu(cluster, namespace, HIGH)
            reads.wait(lambda: replicas() == MAX, 120, f"the HPA scaling up to {MAX}")
            scaled, took = canary_follows(MAX, raised)
            st = reads.status()
            moves.append(
                f"CPU {LOW} -> {HIGH} a pod: the HPA wrote {MAX} replicas {scaled - raised:.1f}s later (at "
                f"{utilization()}%), the canary at {math.ceil(SHARE * MAX)} {took:.2f}s after that (status "
                f"{st.get('stableReplicas')} + {st.get('canaryReplicas')})"
            )
            assert st.get("phase") == "Progressing" and st.get("currentBatch") == 1, st

            # Load down: 10 %. The HPA scales down to its minimum.
            lowered = time.time()
            set_cpu(cluster, namespace, LOW)
            reads.wait(lambda: replicas() == MIN, 120, f"the HPA scaling down to {MIN}")
            scaled, took = canary_follows(MIN, lowered)
            st = reads.status()
            moves.append(
                f"CPU {HIGH} -> {LOW}: the HPA wrote {MIN} replicas {scaled - lowered:.1f}s later, the canary at "
                f"{math.ceil(SHARE * MIN)} {took:.2f}s after that (status {st.get('stableReplicas')} + "
                f"{st.get('canaryReplicas')})"
            )
            d = reads.deployment()
            assert d is not None and d["spec"].get("paused") is True, "the template is no longer held"
            metrics = pod_metrics(cluster, namespace)
            drift = gitops.drift()

            cluster.kubectl("annotate", "gr", "web", "-n", namespace, "--overwrite", "greyrelease.io/promote=1")
            done = reads.wait_phase({"Succeeded"}, 120)
            final_drift = gitops.drift()
        refused = gitops.refused()
    finally:
        set_cpu(cluster, namespace, None)

    for line in moves:
        print(f"  {line}")
    usage = {name[-5:]: round(millicores(p["containers"][0]["usage"]["cpu"])) for name, p in metrics.items()}
    print(f"  metrics.k8s.io at the end of batch 1 (millicores by pod): {usage}")
    assert done["lastRelease"]["digest"] == digest
    assert drift.in_sync and final_drift.in_sync, drift.diff + final_drift.diff
    assert not refused, [str(a) for a in refused]
    d = reads.deployment()
    assert d is not None and "paused" not in d["spec"] and d["spec"]["replicas"] == MIN
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == image("v2")

    # Who wrote the replicas: the HPA controller, through /scale, under its own account; nobody else.
    scale_writes = [
        r
        for r in audited_requests(cluster, namespace, since=since)
        if r.resource == "deployments" and r.name == "web" and r.subresource == "scale" and not r.dry_run
    ]
    writers = {(r.user, r.impersonated, r.agent.split("/")[0], r.verb) for r in scale_writes}
    print(
        f"  writes of deployments/web/scale: {len(scale_writes)}, by {sorted(writers)}; "
        f"{check_deployment_writes(cluster, namespace, since, {digest})}"
    )
    assert writers == {(HPA_CONTROLLER_USER, "", "kube-controller-manager", "update")}, writers
    assert len(scale_writes) >= 3, [str(r) for r in scale_writes]  # 1 -> 2, 2 -> 4, 4 -> 2
    replicas_in_body = [
        str(r)
        for r in audited_requests(cluster, namespace, since=since)
        if r.resource == "deployments" and r.name == "web" and not r.subresource and r.user == HPA_CONTROLLER_USER
    ]
    assert not replicas_in_body, replicas_in_body  # the HPA writes the scale, never the Deployment itself


def _last_scale_write(cluster: LocalCluster, namespace: str, since: float) -> float | None:
    """When (time.time()) the API server received the HPA controller's last write of deployments/web/scale
    since ``since`` (None without one)."""
    found = [
        r.at.timestamp()
        for r in audited_requests(cluster, namespace, since=datetime.fromtimestamp(since, UTC))
        if r.resource == "deployments" and r.subresource == "scale" and r.user == HPA_CONTROLLER_USER and r.code < 300
    ]
    return max(found, default=None)
