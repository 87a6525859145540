"""`make demo`: a full release on the local cluster with `kubectl get gr -w` on screen, then a bad release
aborted with `kubectl annotate`. Uses the cluster KUBECONFIG points at when it is reachable."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e2e.cluster import Cluster, LocalCluster, external_cluster
from e2e.controller import CRD, Controller, app_manifest, gr


def say(text: str) -> None:
    print(f"\n\033[1m$ {text}\033[0m", flush=True)


def watch_until(cluster: Cluster, ns: str, phases: set[str], timeout: float = 180) -> None:
    say(f"kubectl get gr -n {ns} -w")
    proc = subprocess.Popen([cluster.kubectl_path, "get", "gr", "-n", ns, "-w"], env=cluster.env)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            out = cluster.kubectl("get", "gr", "web", "-n", ns, "-o", "jsonpath={.status.phase}", check=False).stdout
            if out in phases:
                time.sleep(1)
                return
            time.sleep(0.5)
        raise SystemExit(f"demo: the release did not reach {phases} in {timeout}s")
    finally:
        proc.terminate()
        proc.wait()


def run(cluster: Cluster) -> None:
    ns = "greyrelease-demo"
    work = Path(tempfile.mkdtemp(prefix="greyrelease-demo-"))
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/greyreleases.greyrelease.io", "--timeout=30s")
    cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("create", "namespace", ns)
    cluster.wait_for_namespace_ready(ns)
    say("kubectl apply -f app.yaml   # Deployment web (10 replicas of app:v1) and its Service")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=app_manifest("web", 10))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", ns, "--timeout=60s")
    controller = Controller(cluster, ns, work / "controller.log")
    say(f"greyrelease run --namespace {ns} &")
    controller.start()
    try:
        release = gr(
            "web", targetRef={"name": "web"}, targetVersion="v2", trafficRouting={"service": {"name": "web"}},
            batches=[{"replicas": 2, "pause": "3s"}, {"replicas": 5, "pause": "3s"}, {"replicas": 8, "pause": "3s"}, {"replicas": 10}],
        )  # fmt: skip
        say("kubectl apply -f release.yaml   # targetVersion: v2, 4 batches")
        print(json.dumps(release["spec"], indent=1))
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(release))
        watch_until(cluster, ns, {"Succeeded", "Failed"})
        say("kubectl get deployment web -o wide")
        print(cluster.kubectl("get", "deployment", "-n", ns, "-o", "wide").stdout)

        say("kubectl patch gr web --type merge -p '{\"spec\":{\"targetVersion\":\"v3\"}}'   # a bad release...")
        cluster.kubectl("patch", "gr", "web", "-n", ns, "--type", "merge", "-p",
                        json.dumps({"spec": {"targetVersion": "v3", "batches": [{"replicas": 3, "pause": "manual"}, {"replicas": 10}]}}))
        for _ in range(120):
            if cluster.kubectl("get", "gr", "web", "-n", ns, "-o", "jsonpath={.status.batchReadyAt}").stdout:
                break
            time.sleep(0.5)
        print(cluster.kubectl("get", "gr", "-n", ns).stdout)
        say("kubectl annotate gr web greyrelease.io/abort=true")
        cluster.kubectl("annotate", "gr", "web", "-n", ns, "greyrelease.io/abort=true")
        watch_until(cluster, ns, {"Aborted"})
        say("kubectl describe gr web   # the story, in Events")
        described = cluster.kubectl("describe", "gr", "web", "-n", ns).stdout
        print(described[described.find("Events:"):])
        say("kubectl get deployment web -o wide   # still v2, all 10 replicas; no canary")
        print(cluster.kubectl("get", "deployment", "-n", ns, "-o", "wide").stdout)
    finally:
        controller.stop()
        cluster.kubectl("delete", "gr", "--all", "-n", ns, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    existing = external_cluster()
    if existing is not None:
        run(existing)
        return 0
    print("starting the local cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)...", flush=True)
    local = LocalCluster(Path(tempfile.mkdtemp(prefix="greyrelease-cluster-")))
    local.start()
    try:
        run(local)
    finally:
        local.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
