"""End-to-end: two controllers, one Lease; the controller's own metrics in Prometheus."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    drop_releases,
    events,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster
from e2e.harness.process import free_port
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e


def test_killing_the_leader_hands_over_and_the_release_completes_once(
    cluster: Cluster, crd: Path, namespace: str, tmp_path: Path
) -> None:
    a = Controller(cluster, namespace, tmp_path / "a.log")
    b_health = free_port()
    b = Controller(cluster, namespace, tmp_path / "b.log", extra_args=["--health-port", str(b_health)])
    a.start()
    try:
        wait_for(lambda: "leading as" in a.logs(), 30, "controller a leading")
        b.start()
        wait_for(lambda: "waiting for the lease" in b.logs(), 30, "controller b waiting")
        # A standby is healthy: the kubelet must not restart it for waiting.
        with urllib.request.urlopen(f"http://127.0.0.1:{b_health}/healthz", timeout=5) as resp:
            assert resp.status == 200 and b"standby" in resp.read()
        deploy_app(cluster, namespace, replicas=6)
        batches = [
            {"replicas": 2, "pause": "3s"},
            {"replicas": 4, "pause": "3s"},
            {"replicas": 6, "pause": "3s"},
            {"replicas": 6},
        ]
        apply_release(
            cluster,
            namespace,
            gr(
                "web",
                targetRef={"name": "web"},
                targetVersion="v2",
                batches=batches,
                trafficRouting={"service": {"name": "web"}},
            ),
        )
        wait_for(lambda: status(cluster, namespace, "web").get("currentBatch") == 2, 60, "batch 2")
        assert "leading as" not in b.logs()  # exactly one acts at a time
        a.kill()
        t0 = time.monotonic()
        wait_for(lambda: "leading as" in b.logs(), 30, "controller b leading", 0.1)
        failover = time.monotonic() - t0
        print(f"failover: {failover:.1f}s from SIGKILL of the leader to the standby leading")
        assert failover <= 20  # the Lease (15 s) runs out, and the standby's next try (every 2 s) takes it
        st = wait_phase(cluster, namespace, "web", {"Succeeded", "Failed", "Aborted"}, timeout=90)
        assert st["phase"] == "Succeeded", b.logs()
        assert [h["batch"] for h in st["history"]] == [1, 2, 3, 4]
        ready = [e["message"].split(":")[0] for e in events(cluster, namespace, "web") if e["reason"] == "BatchReady"]
        assert sorted(ready) == ["batch 1/4", "batch 2/4", "batch 3/4", "batch 4/4"]
        lease = cluster.kubectl_json("get", "lease", "greyrelease-controller", "-n", namespace)
        leading = re.search(r"leading as (\S+)", b.logs())
        assert leading is not None, b.logs()
        assert leading.group(1) == lease["spec"]["holderIdentity"]
    finally:
        a.stop()
        b.stop()
        drop_releases(cluster, namespace)


def test_controller_metrics_are_scraped_by_prometheus(
    cluster: Cluster, crd: Path, namespace: str, tmp_path: Path, prometheus: PrometheusStack
) -> None:
    port = free_port()
    ctl = Controller(cluster, namespace, tmp_path / "ctl.log", extra_args=["--metrics-port", str(port)])
    ctl.start()
    target = f"127.0.0.1:{port}"
    try:
        prometheus.add_scrape_target(target, "greyrelease-controller", {"release_ns": namespace})
        deploy_app(cluster, namespace, replicas=2)
        apply_release(
            cluster,
            namespace,
            gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=[{"replicas": 1}, {"replicas": 2}]),
        )
        wait_phase(cluster, namespace, "web", {"Succeeded"}, timeout=60)
        sel = f'job="greyrelease-controller",release_ns="{namespace}"'
        prometheus.wait_for_query(f'greyrelease_releases{{{sel},phase="Succeeded"}}', 1, timeout=30)
        prometheus.wait_for_query(
            f"greyrelease_batch_transitions_total{{{sel}}}", lambda v: v is not None and v >= 2, timeout=30
        )
        count = prometheus.query(f"greyrelease_reconcile_duration_seconds_count{{{sel}}}")
        assert count is not None and count >= 4
    finally:
        prometheus.remove_scrape_target(target)
        ctl.stop()
        drop_releases(cluster, namespace)
