"""End-to-end: the controller as its own process, driven with the real kubectl, on a real control plane."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    deployment,
    endpoint_pods,
    events,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster

pytestmark = pytest.mark.e2e
SERVICE = {"service": {"name": "web"}}


def watch_rows(cluster: Cluster, namespace: str, stop: threading.Event, rows: list[str]) -> threading.Thread:
    """`kubectl get gr -w`, as a user would watch it, collecting the rows it prints."""

    def run() -> None:
        proc = subprocess.Popen(
            [cluster.kubectl_path, "get", "gr", "-n", namespace, "-w", "--no-headers"],
            stdout=subprocess.PIPE,
            text=True,
            env=cluster.env,
        )
        assert proc.stdout is not None

        def end_when_stopped() -> None:
            stop.wait()
            proc.terminate()

        threading.Thread(target=end_when_stopped, daemon=True).start()
        for line in proc.stdout:
            rows.append(" ".join(line.split()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_full_release_in_four_batches(cluster: Cluster, namespace: str, controller: Controller) -> None:
    deploy_app(cluster, namespace, replicas=10)
    rows: list[str] = []
    stop = threading.Event()
    watcher = watch_rows(cluster, namespace, stop, rows)
    # The app keeps serving: the Service never has fewer ready pods than the 10 the user asked for.
    serving: list[int] = []

    def sample() -> None:
        while not stop.is_set():
            serving.append(len(endpoint_pods(cluster, namespace, "web")))
            time.sleep(0.2)

    wait_for(lambda: len(endpoint_pods(cluster, namespace, "web")) == 10, 30, "10 pods behind the Service")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    batches = [
        {"replicas": 2, "pause": "2s"},
        {"replicas": 5, "pause": "2s"},
        {"replicas": 8, "pause": "2s"},
        {"replicas": 10},
    ]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    st = wait_phase(cluster, namespace, "web", {"Succeeded", "Failed", "Aborted", "InvalidSpec"}, timeout=90)
    time.sleep(0.5)
    stop.set()
    watcher.join(5)
    sampler.join(5)
    assert st["phase"] == "Succeeded", (st, controller.logs())
    assert len(serving) > 10 and min(serving) >= 10, serving
    # PHASE / BATCH / WEIGHT advanced through every batch, as `kubectl get gr -w` showed them.
    seen = {tuple(r.split()[1:4]) for r in rows if len(r.split()) >= 5}
    for batch, weight in (("1/4", "20"), ("2/4", "50"), ("3/4", "80")):
        assert ("Progressing", batch, weight) in seen, rows
    # The last batch has no pause: the pass that finds it ready moves all traffic and starts promoting.
    assert ("Promoting", "4/4", "100") in seen or ("Progressing", "4/4", "100") in seen, rows
    assert any(r.split()[1] == "Promoting" for r in rows), rows
    assert rows[-1].split()[1:6] == ["Succeeded", "4/4", "0", "v2", "v2"], rows
    # The app runs the new version on all 10 replicas; nothing of the canary remains.
    dep = deployment(cluster, namespace, "web")
    assert dep is not None
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v2"
    assert dep["spec"]["replicas"] == 10 and dep["status"].get("readyReplicas") == 10
    assert deployment(cluster, namespace, "web-canary") is None
    wait_for(lambda: not [p for p in endpoint_pods(cluster, namespace, "web") if "canary" in p], 20, "canary pods gone")
    assert [h["batch"] for h in st["history"]] == [1, 2, 3, 4]
    reasons = [e["reason"] for e in events(cluster, namespace, "web")]
    assert reasons.count("BatchReady") == 4 and "Succeeded" in reasons


def test_abort_mid_batch_cuts_canary_off_at_once(cluster: Cluster, namespace: str, controller: Controller) -> None:
    deploy_app(cluster, namespace, replicas=6)
    batches = [{"replicas": 2, "pause": "manual"}, {"replicas": 6}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    wait_for(
        lambda: len([p for p in endpoint_pods(cluster, namespace, "web") if "canary" in p]) == 2,
        20,
        "canary in endpoints",
    )

    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/abort=true")
    t0 = time.monotonic()
    wait_for(
        lambda: not [p for p in endpoint_pods(cluster, namespace, "web") if "canary" in p],
        10,
        "canary out of endpoints",
        0.05,
    )
    cut = time.monotonic() - t0
    assert cut <= 1.0, f"canary still served {cut:.2f}s after the abort annotation"

    st = wait_phase(cluster, namespace, "web", {"Aborted"}, timeout=60)
    assert st["canaryWeight"] == 0
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["replicas"] == 6
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v1"
    wait_for(
        lambda: (
            dep is not None
            and (deployment(cluster, namespace, "web") or {}).get("status", {}).get("readyReplicas") == 6
        ),
        30,
        "stable at full size",
    )
    assert deployment(cluster, namespace, "web-canary") is None
    pods = endpoint_pods(cluster, namespace, "web")
    assert len(pods) == 6 and not [p for p in pods if "canary" in p]
    svc = cluster.kubectl_json("get", "service", "web", "-n", namespace)
    assert svc["spec"]["selector"] == {"app": "web"}
    assert "Aborted" in [e["reason"] for e in events(cluster, namespace, "web")]


def test_manual_pause_waits_for_promote_and_pause_holds(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    batches = [{"replicas": 1, "pause": "manual"}, {"replicas": 2, "pause": "1s"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: "waiting for approval" in status(cluster, namespace, "web").get("message", ""), 60, "manual pause")
    time.sleep(3)
    st = status(cluster, namespace, "web")
    assert st["currentBatch"] == 1 and st["phase"] == "Progressing"

    # pause holds the release at batch 2 even after its 1 s pause, until the annotation goes.
    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/pause=true")
    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/promote=next")
    wait_phase(cluster, namespace, "web", {"Paused"}, timeout=10)
    time.sleep(3)
    st = status(cluster, namespace, "web")
    assert st["phase"] == "Paused" and st["currentBatch"] == 1
    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/pause-")
    wait_for(lambda: status(cluster, namespace, "web").get("currentBatch") == 2, 10, "promoted to batch 2")
    # The one-shot promote annotation was consumed.
    annotations = cluster.kubectl_json("get", "gr", "web", "-n", namespace)["metadata"].get("annotations") or {}
    assert "greyrelease.io/promote" not in annotations
    st = wait_phase(cluster, namespace, "web", {"Succeeded"}, timeout=60)
    assert [h["batch"] for h in st["history"]] == [1, 2, 3]
    assert "promoted" in st["history"][0]["result"]


def test_canary_never_ready_fails_at_the_deadline_and_rolls_back(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    apply_release(
        cluster,
        namespace,
        gr(
            "web",
            targetRef={"name": "web"},
            targetVersion="never-ready",
            batchSize=2,
            canaryWeight=50,
            progressDeadlineSeconds=6,
            trafficRouting=SERVICE,
        ),
    )
    wait_for(lambda: deployment(cluster, namespace, "web-canary"), 30, "canary created")
    st = wait_phase(cluster, namespace, "web", {"Failed"}, timeout=60)
    assert "progressDeadlineSeconds" in st["message"] and "0/2 canary pods ready" in st["message"]
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v1"
    assert deployment(cluster, namespace, "web-canary") is None
    reasons = [e["reason"] for e in events(cluster, namespace, "web")]
    assert "ProgressDeadlineExceeded" in reasons and "RolledBack" in reasons
    described = cluster.kubectl("describe", "gr", "web", "-n", namespace).stdout
    assert "ProgressDeadlineExceeded" in described


def test_controller_killed_mid_batch_resumes_without_skipping_or_repeating(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=8)
    batches = [
        {"replicas": 2, "pause": "3s"},
        {"replicas": 4, "pause": "3s"},
        {"replicas": 6, "pause": "3s"},
        {"replicas": 8},
    ]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: status(cluster, namespace, "web").get("currentBatch") == 2, 60, "batch 2")
    controller.kill()
    before = status(cluster, namespace, "web")
    time.sleep(4)  # batch 2's pause runs out while nobody watches
    assert status(cluster, namespace, "web")["currentBatch"] == before["currentBatch"]
    controller.start()
    st = wait_phase(cluster, namespace, "web", {"Succeeded", "Failed", "Aborted"}, timeout=90)
    assert st["phase"] == "Succeeded", controller.logs()
    assert [h["batch"] for h in st["history"]] == [1, 2, 3, 4]
    ready = [e for e in events(cluster, namespace, "web") if e["reason"] == "BatchReady"]
    assert sorted(e["message"].split(":")[0] for e in ready) == ["batch 1/4", "batch 2/4", "batch 3/4", "batch 4/4"]
    assert deployment(cluster, namespace, "web-canary") is None


def test_app_name_matching_two_deployments_is_marked_and_nothing_touched(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, name="web", replicas=2)
    second = cluster.kubectl("get", "deployment", "web", "-n", namespace, "-o", "json").stdout
    second = second.replace('"name": "web"', '"name": "web-2"', 1)
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=second)
    apply_release(cluster, namespace, gr("web", appName="web", targetVersion="v2", batchSize=1, canaryWeight=50))
    st = wait_phase(cluster, namespace, "web", {"InvalidSpec"}, timeout=30)
    assert st["message"].startswith("spec.appName: 2 Deployments are labelled app=web")
    assert deployment(cluster, namespace, "web-canary") is None
    for name in ("web", "web-2"):
        dep = deployment(cluster, namespace, name)
        assert dep is not None
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v1"


def test_deleting_a_release_mid_batch_restores_the_app(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    batches = [{"replicas": 2, "pause": "manual"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    assert (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 2
    cluster.kubectl("delete", "gr", "web", "-n", namespace, "--timeout=60s")
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["replicas"] == 4
    assert deployment(cluster, namespace, "web-canary") is None
    svc = cluster.kubectl_json("get", "service", "web", "-n", namespace)
    assert svc["spec"]["selector"] == {"app": "web"}
    assert "greyrelease.io/original-selector" not in (svc["metadata"].get("annotations") or {})
