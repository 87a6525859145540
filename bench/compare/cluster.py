"""The cluster and the apps on it: the CRDs, the namespaces, each app's objects (the same for both
controllers: a Service, a pod template, an Ingress), and when the pods have settled."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e2e.harness.controller import CRD, POLICY_CRD
from e2e.harness.controlplane import LocalCluster
from e2e.harness.dataplane import INGRESS_CLASS, serving_gate
from greyrelease.kube.client import ApiError, KubeClient, path

from bench.run import wait

if TYPE_CHECKING:
    from bench.compare.contender import Contender

ROOT = Path(__file__).resolve().parents[2]  # the repository
K8S_VERSION = os.environ.get("K8S_VERSION", "1.37.2")
IMAGE = "registry.example/app:"
NGINX = "nginx.ingress.kubernetes.io"
GRACE_SECONDS = 5  # an answering pod's termination grace: how long a deleted one keeps answering


def cache_dir() -> Path:
    """Where e2e/build/build.sh puts what it builds for this Kubernetes version."""
    base = Path(os.environ.get("GREYRELEASE_CACHE", Path.home() / ".cache" / "greyrelease"))
    return base / f"k8s-v{K8S_VERSION}"


# --- the CRDs and the namespaces -------------------------------------------------------------------------


def install_crds(cluster: LocalCluster, kube: KubeClient, argo_crds: Path | None) -> None:
    """GreyRelease's CRDs, and Argo Rollouts' (a kustomization) unless ``argo_crds`` is None; returns once
    the API server serves them."""
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
    if argo_crds is not None:
        cluster.kubectl("apply", "--server-side", "-k", str(argo_crds), timeout=120)

    def established(crd: str) -> bool:
        got = kube.get(path("apiextensions.k8s.io", "v1", "customresourcedefinitions", name=crd)) or {}
        conditions = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    for crd in ("greyreleases.greyrelease.io", "rollouts.argoproj.io")[: 1 if argo_crds is None else 2]:
        wait(lambda: established(crd), 60, f"CRD {crd} established", 0.5)  # noqa: B023 - called at once


def new_namespace(cluster: LocalCluster, kube: KubeClient, ns: str) -> None:
    kube.create(path("", "v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.wait_for_namespace_ready(ns, timeout=60)


def drop_namespace(c: Contender, kube: KubeClient, ns: str) -> None:
    """Deletes the namespace (after whatever would hold it up once the controller is gone); does not wait."""
    try:
        c.cleanup(kube, ns)
        kube.delete(path("", "v1", "namespaces", name=ns))
    except ApiError as exc:
        print(f"cleaning {ns}: {exc}", file=sys.stderr)


# --- an app's objects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """An app: its replicas, and whether its pods answer HTTP (the cut-off on real requests)."""

    replicas: int = 2
    answering: bool = False


APP = Shape()


def service(name: str, selector: dict[str, str], answering: bool = False) -> dict[str, Any]:
    port: dict[str, Any] = {"port": 80, "targetPort": "http", "name": "http"} if answering else {"port": 80}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [port]},
    }


def ingress(name: str) -> dict[str, Any]:
    backend = {"service": {"name": name, "port": {"number": 80}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name},
        "spec": {
            "ingressClassName": "nginx",
            "rules": [
                {
                    "host": f"{name}.example",
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
                }
            ],
        },
    }


def traefik_ingress(name: str, host: str) -> dict[str, Any]:
    """The Ingress of class traefik that sends ``host``'s requests to the app's Service (the data plane)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": name},
        "spec": {
            "ingressClassName": INGRESS_CLASS,
            "rules": [
                {
                    "host": host,
                    "http": {
                        "paths": [
                            {
                                "path": "/",
                                "pathType": "Prefix",
                                "backend": {"service": {"name": name, "port": {"number": 80}}},
                            }
                        ]
                    },
                }
            ],
        },
    }


def template(name: str, version: str, answering: bool = False) -> dict[str, Any]:
    """The app's pod template; an answering app's pods answer HTTP on port 8080 through the data plane
    (Ready only once they do, and answering for 5 s after their deletion), as e2e/harness/dataplane.py's."""
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": IMAGE + version}]}
    if answering:
        spec["containers"][0]["ports"] = [{"containerPort": 8080, "name": "http"}]
        spec |= {"readinessGates": [serving_gate()], "terminationGracePeriodSeconds": GRACE_SECONDS}
    return {"metadata": {"labels": {"app": name}}, "spec": spec}


# --- the pods ----------------------------------------------------------------------------------------------


def pods_settled(kube: KubeClient, ns: str, expected: int | None = None) -> bool:
    """Every pod of the namespace Ready, none on its way out (and ``expected`` of them, when given)."""
    pods = kube.list(path("", "v1", "pods", ns))

    def ready(p: dict[str, Any]) -> bool:
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or []
        )

    return (
        (expected is None or len(pods) == expected)
        and all(ready(p) for p in pods)
        and not any(p["metadata"].get("deletionTimestamp") for p in pods)
    )


def canary_pods(kube: KubeClient, ns: str, version: str) -> dict[str, set[str]]:
    """The pods running ``version``, by app."""
    out: dict[str, set[str]] = {}
    for p in kube.list(path("", "v1", "pods", ns)):
        if p["spec"]["containers"][0]["image"] == IMAGE + version and not p["metadata"].get("deletionTimestamp"):
            out.setdefault(p["metadata"]["labels"]["app"], set()).add(p["metadata"]["name"])
    return out
