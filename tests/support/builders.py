"""The objects the tests build: a release of ``web`` on its Deployment and Service in namespace ``shop``, on
the in-memory API server, and what the control plane does between two passes (:func:`roll_out`)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path

NS = "shop"
#: The time the tests' releases start at.
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
#: The uid of the release (its canary's owner).
UID = "release-uid"
RELEASE = path("greyrelease.io", "v1", "greyreleases", NS, "web")
DEPLOYMENTS = path("apps", "v1", "deployments", NS)
EVENTS = path("", "v1", "events", NS)
SERVICE = path("", "v1", "services", NS, "web")


def stable(replicas: int = 4, image: str = "app:v1") -> Obj:
    """The Deployment ``web`` the release rolls."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "uid": "web-uid", "labels": {"app": "web"}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": image}]},
            },
        },
    }


def service() -> Obj:
    """The Service ``web`` in front of the stable's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }


def ingress() -> Obj:
    """The Ingress ``web`` of class nginx, all paths to the Service ``web``."""
    path_ = {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"ingressClassName": "nginx", "rules": [{"http": {"paths": [path_]}}]},
    }


def http_route() -> Obj:
    """The HTTPRoute ``web``, all requests to the Service ``web``."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": NS, "resourceVersion": "1"},
        "spec": {"parentRefs": [{"name": "gw"}], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]},
    }


def release(**spec: Any) -> Obj:
    """The GreyRelease ``web``: three batches to ``v2`` unless ``spec`` says otherwise."""
    return {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {"name": "web", "namespace": NS, "uid": UID},
        "spec": {
            "targetRef": {"name": "web"},
            "targetVersion": "v2",
            "batches": [{"replicas": 1}, {"replicas": 2}, {"replicas": 4}],
            **spec,
        },
    }


def cluster(**spec: Any) -> MemoryKube:
    """The stable, its Service and the release (with ``spec``) on the in-memory API server, rolled out."""
    kube = MemoryKube(stable(), service(), release(**spec))
    roll_out(kube)
    return kube


def _hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def roll_out(kube: MemoryKube) -> None:
    """What the control plane does between two passes, all at once: foreground deletions finish, and
    every Deployment has its current ReplicaSet and all its pods ready."""
    kube.collect()
    for d in kube.objects(DEPLOYMENTS):
        meta, replicas = d["metadata"], d["spec"].get("replicas", 1)
        status = {
            "observedGeneration": meta["generation"],
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
            "availableReplicas": replicas,
        }
        if d.get("status") != status:
            kube.put({**d, "status": status})
        template_hash = _hash(d["spec"]["template"])
        labels = {**d["spec"]["template"]["metadata"]["labels"], "pod-template-hash": template_hash}
        rs: Obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{meta['name']}-{template_hash}",
                "namespace": NS,
                "labels": labels,
                "ownerReferences": [{"uid": meta["uid"], "controller": True}],
            },
        }
        if kube.get(path("apps", "v1", "replicasets", NS, rs["metadata"]["name"])) is None:
            kube.put(rs)


def status_of(kube: MemoryKube) -> Obj:
    """The release's status as stored (empty before the first write)."""
    return dict((kube.get(RELEASE) or {}).get("status") or {})
