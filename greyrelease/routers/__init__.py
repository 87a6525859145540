"""Traffic routers: one small interface, one module per way of splitting traffic.

A router is built for one reconcile of one release and answers five calls:

- ``problem()``: why it cannot work with the cluster as it is ("" when it can); read-only.
- ``prepare()``: routing objects exist with the canary at weight 0, before any canary pod does.
- ``set_weight(w, header_match)``: the canary gets ``w`` percent; 0 is the abort, and it comes first.
- ``restore_stable_selector()``: the stable Service selects as the user wrote it (before the stable rolls).
- ``reset()``: everything the router added is gone and the user's objects are as they were.

Modules: ``replicas`` (no routing), ``service`` (one Service, weight = replica share), ``nginx`` (a canary
Ingress for ingress-nginx), ``gateway`` (weights on a Gateway API HTTPRoute); ``selector`` and
``canary_service`` hold what the last two share.

Every call is idempotent: it builds the desired state, compares, and writes only what differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..api import TRACK_LABEL, GreyReleaseSpec, GreyReleaseStatus
from ..kubeclient import KubeClient, path


class Router(Protocol):
    def problem(self) -> str: ...

    def prepare(self) -> None: ...

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None: ...

    def restore_stable_selector(self) -> None: ...

    def reset(self) -> None: ...


def router_for(
    kube: KubeClient,
    *,
    namespace: str,
    release: dict,
    spec: GreyReleaseSpec,
    status: GreyReleaseStatus,
) -> Router:
    from ..workload import owner_reference
    from .gateway import GatewayRouter
    from .nginx import NginxRouter
    from .replicas import ReplicaRouter
    from .service import ServiceRouter

    routing = spec.traffic_routing
    if routing is None:
        return ReplicaRouter(kube, namespace=namespace, release_uid=release["metadata"]["uid"], status=status)
    if routing.service is not None:
        return ServiceRouter(kube, namespace=namespace, service=routing.service.name, status=status)
    owner = owner_reference(release)
    stable_hash = stable_hash_of(kube, namespace=namespace, spec=spec, status=status)
    if routing.nginx is not None:
        return NginxRouter(
            kube,
            namespace=namespace,
            routing=routing.nginx,
            spec=spec,
            owner=owner,
            stable_hash=stable_hash,
        )
    assert routing.gateway_api is not None  # the models allow exactly one mode
    return GatewayRouter(
        kube, namespace=namespace, routing=routing.gateway_api, owner=owner, stable_hash=stable_hash
    )


def stable_hash_of(
    kube: KubeClient, *, namespace: str, spec: GreyReleaseSpec, status: GreyReleaseStatus
) -> Callable[[], str]:
    """The stable ReplicaSet's ``pod-template-hash``, looked up only when asked and not yet recorded.

    The first pass of a release records the hash in the same plan that prepares the routing, and the
    router of that pass was built from the status read before it; so ``prepare()`` finds the hash the
    way the reconciler's observation did (the target Deployment's current ReplicaSet).
    """
    from ..workload import current_template_hash

    def resolve() -> str:
        if status.stable_pod_template_hash:
            return status.stable_pod_template_hash
        deployments = path("apps", "v1", "deployments", namespace)
        if spec.target_ref is not None:
            found = kube.get(f"{deployments}/{spec.target_ref.name}")
            targets = [found] if found is not None else []
        else:
            targets = kube.list(deployments, label_selector=f"app={spec.app_name},!{TRACK_LABEL}")
        if len(targets) != 1:
            return ""
        labels = targets[0].get("spec", {}).get("selector", {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None
        replicasets = kube.list(path("apps", "v1", "replicasets", namespace), label_selector=selector)
        return current_template_hash(targets[0], replicasets)

    return resolve
