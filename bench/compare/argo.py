"""Argo Rollouts' side: its controller (rollouts-controller, built by `e2e/build/build.sh argo`) and its
CRDs, a Rollout per app carrying the same pod template, and a Rollout's status read as the same milestones."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import LocalCluster
from e2e.harness.process import free_port
from greyrelease.kube.client import KubeClient, Ref, path

from bench.compare.cluster import APP, ROOT, Shape, cache_dir, ingress, service, template
from bench.compare.contender import DEADLINE, PAUSE, Contender
from bench.compare.probes import Progress, Tracker

ARGO_VERSION = os.environ.get("ARGO_VERSION", "1.10.2")


def argo_binary() -> Path:
    return Path(os.environ.get("GREYRELEASE_BIN_DIR", cache_dir() / "bin")) / "rollouts-controller"


def argo_crds() -> Path:
    return cache_dir() / "crd" / f"argo-rollouts-v{ARGO_VERSION}"


def argo_steps(hold: bool, replicas: int = 2) -> list[dict[str, Any]]:
    """1 pod of ``replicas`` (without a traffic router Argo splits by replicas), the pause, then all."""
    pause = {} if hold else {"duration": f"{PAUSE:g}s"}
    return [{"setWeight": round(100 / replicas)}, {"pause": pause}, {"setWeight": 100}]


class ArgoContender(Contender):
    def __init__(self, binary: Path) -> None:
        super().__init__(
            "argo", f"Argo Rollouts v{ARGO_VERSION}", ("rollouts-controller", "argo-rollouts"), "argo-rollouts"
        )
        self.binary = binary
        #: (namespace, name) -> the version last seen promoted and its pod-template hash.
        self._promoted: dict[tuple[str, str], tuple[str, str]] = {}

    def start(self, cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
        # Its defaults (every namespace, leader election in argo-rollouts, QPS 40 / burst 80, 10 rollout
        # workers), with its metrics endpoint on; the two ports are chosen free on this shared machine.
        self.command = [
            str(self.binary),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--metricsPort",
            str(free_port()),
            "--healthzPort",
            str(free_port()),
        ]
        return subprocess.Popen(
            self.command, cwd=ROOT, env=cluster.env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )

    def create_app(self, kube: KubeClient, ns: str, name: str, nginx: bool, shape: Shape = APP) -> None:
        canary: dict[str, Any] = {"steps": argo_steps(False, shape.replicas)}
        if nginx:
            canary.update(
                canaryService=f"{name}-canary", stableService=name, trafficRouting={"nginx": {"stableIngress": name}}
            )
        ro = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": name},
            "spec": {
                "replicas": shape.replicas,
                "selector": {"matchLabels": {"app": name}},
                "progressDeadlineSeconds": DEADLINE,
                "template": template(name, "v1", shape.answering),
                "strategy": {"canary": canary},
            },
        }
        kube.create(path("", "v1", "services", ns), service(name, {"app": name}, shape.answering))
        if nginx:
            kube.create(path("", "v1", "services", ns), service(f"{name}-canary", {"app": name}))
            kube.create(path("networking.k8s.io", "v1", "ingresses", ns), ingress(name))
        kube.create(self.collection(ns), ro)

    def release(
        self, kube: KubeClient, ns: str, name: str, version: str, hold: bool, nginx: bool, shape: Shape = APP
    ) -> None:
        patch = {
            "spec": {
                "template": template(name, version, shape.answering),
                "strategy": {"canary": {"steps": argo_steps(hold, shape.replicas)}},
            }
        }
        kube.patch(f"{self.collection(ns)}/{name}", patch)

    def abort(self, kube: KubeClient, ns: str, name: str) -> None:
        kube.patch(f"{self.collection(ns)}/{name}/status", {"status": {"abort": True}})

    def cutting_write(self, resource: str, name: str, canary_sets: dict[str, str]) -> str | None:
        return canary_sets.get(name) if resource == "replicasets" else None  # the canary scaled to 0

    def collection(self, ns: str) -> Ref:
        return path("argoproj.io", "v1alpha1", "rollouts", ns)

    def progress(self, obj: dict[str, Any]) -> Progress | None:
        st, spec, meta = obj.get("status") or {}, obj["spec"], obj["metadata"]
        if str(st.get("observedGeneration")) != str(meta.get("generation")):
            return None  # the status is not about this spec yet
        version = spec["template"]["spec"]["containers"][0]["image"].rsplit(":", 1)[1]
        key, pod_hash = (meta.get("namespace", ""), meta["name"]), st.get("currentPodHash", "")
        before = self._promoted.get(key)
        if not pod_hash or (before is not None and before[0] != version and before[1] == pod_hash):
            return None  # still the previous template's status
        steps = len(spec["strategy"]["canary"].get("steps") or [])
        index = st.get("currentStepIndex", 0)
        paused = index == 1 and any(c.get("reason") == "CanaryPauseStep" for c in st.get("pauseConditions") or [])
        done = st.get("stableRS") == pod_hash and st.get("phase") == "Healthy" and index == steps
        if done and (before is None or before[0] != version):
            self._promoted[key] = (version, pod_hash)
        return Progress(version=version, paused=paused, advanced=index >= 2, done=done)

    def initial_done(self, tracker: Tracker, names: list[str]) -> bool:
        return tracker.count(names, "v1", "done") == len(names)

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout.strip().splitlines() or ["?"])[0]
