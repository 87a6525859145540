"""Observation: the world one pass plans from, read through a :class:`~greyrelease.kube.protocol.Kube`, and the
adapters that pass acts through (built once, from what was read; what they act on beyond that comes with
each action).

In follow mode the target is read for more (its hold, its template's digest and images, its enrolment,
its rollout: :func:`~greyrelease.kube.workload.workload_of`), and with it the ReplicaSet its pods run. That
ReplicaSet is listed only when the Deployment's revision differs from the one the status recorded it for
(a paused Deployment makes no new ReplicaSet, so a release under way lists it once); otherwise it is what
the status says."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from greyrelease.api.release import (
    ANNOTATION_PREFIX,
    TRACK_LABEL,
    BatchState,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Obj,
    Phase,
)
from greyrelease.kube.protocol import Kube, path
from greyrelease.kube.workload import (
    canary_name,
    current_replicaset,
    current_template_hash,
    replicaset_of,
    revision_of,
    workload_of,
)
from greyrelease.planner.follow import pending
from greyrelease.planner.machine import Observed, Workload
from greyrelease.planner.observed import ReplicaSet
from greyrelease.reconcile.deployments import Deployments, deployments_path
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.policies import Governing, observe_governance
from greyrelease.routers import Router, router_for


@dataclass
class Scene:
    """One pass's reading of the world, and the adapters built on it."""

    release: Obj
    spec: GreyReleaseSpec
    observed: Observed
    deployments: Deployments
    router: Router

    @property
    def target_name(self) -> str:
        target = self.deployments.target
        return str(target["metadata"]["name"]) if target is not None else ""


def _targets(kube: Kube, namespace: str, spec: GreyReleaseSpec) -> list[Obj]:
    if spec.target_ref is not None:
        found = kube.get(deployments_path(namespace, spec.target_ref.name))
        return [found] if found is not None else []
    # The canary copies the stable's labels, so it is left out by its track label.
    return kube.list(deployments_path(namespace), label_selector=f"app={spec.app_name},!{TRACK_LABEL}")


def _replicasets(kube: Kube, namespace: str, deployment: Obj) -> list[Obj]:
    labels = deployment.get("spec", {}).get("selector", {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return kube.list(path("apps", "v1", "replicasets", namespace), label_selector=selector or None)


def _template_hash(kube: Kube, namespace: str, deployment: Obj) -> str:
    return current_template_hash(deployment, _replicasets(kube, namespace, deployment))


def _stable(kube: Kube, namespace: str, deployment: Obj, status: GreyReleaseStatus) -> ReplicaSet | None:
    """Follow mode: the ReplicaSet of the Deployment's current revision; from the status when it recorded
    that revision's, else listed."""
    revision, recorded = revision_of(deployment), status.stable
    if revision and recorded is not None and recorded.revision == revision and status.stable_pod_template_hash:
        images = tuple((i.name, i.image) for i in recorded.images)
        return ReplicaSet(recorded.name, status.stable_pod_template_hash, recorded.digest, images, recorded.revision)
    rs = current_replicaset(deployment, _replicasets(kube, namespace, deployment))
    return replicaset_of(rs) if rs is not None else None


def _target_of(
    kube: Kube, namespace: str, d: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus, template_hash: str
) -> Workload:
    if spec.follows:
        return workload_of(d, None, follow=True, stable=_stable(kube, namespace, d, status))
    return workload_of(d, spec.container, template_hash)


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _going_live(status: GreyReleaseStatus, canary: Obj | None) -> bool:
    """The batch waits for its canary pods, some of which are ready: the pass may give them traffic,
    so it needs to know how many the proxy can reach (one read, in this state only)."""
    return (
        status.phase in (Phase.PROGRESSING, Phase.PAUSED)  # a pass that resumes may go live at once
        and status.batch_state == BatchState.UPSCALING
        and canary is not None
        and int((canary.get("status") or {}).get("readyReplicas") or 0) > 0
    )


def _starting(status: GreyReleaseStatus, target: Workload) -> bool:
    """Follow mode, a template held that differs from what runs: this release is about to start its
    release (it sees the template for the first time, or waits to start it)."""
    return status.held is None or status.held.digest != target.digest or status.phase in (Phase.WAITING, Phase.QUEUED)


def observe(
    kube: Kube,
    release: Obj,
    spec: GreyReleaseSpec,
    status: GreyReleaseStatus,
    governing: Governing | None = None,
    selftest: HeldSelfTest | None = None,
) -> Scene:
    """Read the release's Deployments (and, once, the stable ReplicaSet's hash) and ask the router
    whether it can work with what it finds, before the release has started only. In follow mode, the
    result of the process's ``selftest`` of the hold (tested first when this release is about to start
    the release of a held template: :meth:`~greyrelease.reconcile.held.HeldSelfTest.check`)."""
    meta = release["metadata"]
    namespace = meta["namespace"]
    targets = _targets(kube, namespace, spec)
    target = targets[0] if len(targets) == 1 else None
    template_hash = ""
    if target is not None and not status.stable_pod_template_hash and not spec.follows:
        template_hash = _template_hash(kube, namespace, target)
    target_name = target["metadata"]["name"] if target is not None else status.target_name
    canary_deployment = canary_name(target_name) if target_name else ""
    canary = kube.get(deployments_path(namespace, canary_deployment)) if canary_deployment else None
    router = router_for(kube, namespace=namespace, release=release, spec=spec, canary=canary_deployment)
    routing_error = router.problem() if status.phase in (None, Phase.INITIALIZING, Phase.INVALID_SPEC) else ""
    canary_endpoints = router.canary_endpoints() if _going_live(status, canary) else None
    deletion = _time(meta.get("deletionTimestamp"))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    candidates = tuple(
        _target_of(kube, namespace, d, spec, status, template_hash) if d is target else workload_of(d, spec.container)
        for d in targets
    )
    held = spec.follows and len(candidates) == 1 and pending(candidates[0])
    governance = observe_governance(kube, release, spec, status, annotations, governing or Governing(), pending=held)
    held_check = None
    if selftest is not None and spec.follows:
        one = candidates[0] if len(candidates) == 1 else None
        held_check = selftest.check(
            starting=held and one is not None and _starting(status, one),
            enrolled=one is not None and bool(one.enrolled),
        )
    observed = Observed(
        candidates=candidates,
        canary=workload_of(canary, spec.container) if canary is not None else None,
        annotations=annotations,
        generation=int(meta.get("generation", 1)),
        uid=meta.get("uid", ""),
        name=meta.get("name", ""),
        deleting=deletion is not None,
        deletion_started=deletion,
        routing_error=routing_error,
        canary_endpoints=canary_endpoints,
        rules=governance.rules,
        queue=governance.queue,
        predecessors=governance.predecessors,
        cycle=governance.cycle,
        held_check=held_check,
    )
    container = None if spec.follows else spec.container
    deployments = Deployments(kube, release=release, container=container, target=target, canary=canary)
    return Scene(release, spec, observed, deployments, router)
