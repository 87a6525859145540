"""One reconcile of one GreyRelease: observe, decide (pure), act, record.

The order is what makes a crash harmless: the actions of a plan are applied first, in order, and the
status is written last. A controller killed in between plans again from the old status; since every
action is idempotent, re-applying it is a no-op, and the transition is recorded on the next pass.
The status is written only when it differs, so an idle release costs reads, never writes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from . import reasons as R
from .actions import (
    Action,
    DeleteCanary,
    EnsureCanary,
    Event,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    ScaleStable,
    SetStableImage,
    SetWeight,
)
from .analysis import Check, Sample, due, render_query
from .api import (
    ABORT_ANNOTATION,
    ANNOTATION_PREFIX,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    GROUP,
    KIND,
    PLURAL,
    TRACK_LABEL,
    VERSION,
    Analysis,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Phase,
    parse_duration,
    parse_time,
)
from .kubeclient import MERGE, STRATEGIC, ApiError, Conflict, KubeClient, path
from .planner import Observed, decide
from .prometheus import Prometheus
from .routers import Router, router_for
from .workload import (
    build_canary,
    canary_name,
    canary_patch,
    controller_uid,
    current_template_hash,
    stable_image_patch,
    workload_of,
)

Obj = dict[str, Any]
log = logging.getLogger("greyrelease")


USER_ANNOTATIONS = (ABORT_ANNOTATION, PAUSE_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION)


def _stored(value: Any) -> Any:
    """``value`` without its null fields, at any depth (how the API server stores a status)."""
    if isinstance(value, dict):
        return {k: _stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_stored(v) for v in value]
    return value


def release_path(namespace: str, name: str, sub: str | None = None) -> str:
    return path(GROUP, VERSION, PLURAL, namespace, name, sub)


def deployments_path(namespace: str, name: str | None = None) -> str:
    return path("apps", "v1", "deployments", namespace, name)


@dataclass
class Outcome:
    """What a reconcile did: the plan, the names of the Deployments it watched, and when (on the
    monotonic clock) the plan's ``now`` was taken: its ``requeue_after`` counts from there, not from the
    end of the pass."""

    plan: Plan
    watched: tuple[str, ...] = ()
    waiting: bool = False
    decided_at: float = field(default_factory=time.monotonic)


@dataclass
class _World:
    """The objects read for this reconcile, kept for the actions that need their full bodies."""

    release: Obj
    spec: GreyReleaseSpec
    status: GreyReleaseStatus
    target: Obj | None
    canary: Obj | None
    router: Router


class Reconciler:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._prometheus: dict[tuple[str, str | None, str, bool], Prometheus] = {}

    # --- metrics ----------------------------------------------------------------------------------

    def _prometheus_for(self, namespace: str, analysis: Analysis) -> Prometheus:
        prom = analysis.prometheus
        token = None
        if prom.bearer_token_secret is not None:
            ref = prom.bearer_token_secret
            secret = self.kube.get(path("", "v1", "secrets", namespace, ref.name)) or {}
            raw = (secret.get("data") or {}).get(ref.key)
            if raw is None:
                raise ValueError(f"spec.analysis.prometheus.bearerTokenSecret: no key {ref.key!r} in Secret {ref.name!r}")
            token = base64.b64decode(raw).decode().strip()
        key = (prom.address, token, prom.timeout, prom.insecure_skip_verify)
        if key not in self._prometheus:
            self._prometheus[key] = Prometheus(
                prom.address, token=token, timeout=parse_duration(prom.timeout), verify=not prom.insecure_skip_verify
            )
        return self._prometheus[key]

    def _checks(self, release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus) -> tuple[Check, ...]:
        """Query every metric for the canary (and the stable track where compared). Errors are samples."""
        assert spec.analysis is not None
        meta = release["metadata"]
        try:
            prom = self._prometheus_for(meta["namespace"], spec.analysis)
        except ValueError as err:
            return tuple(Check(m.name, Sample(error=str(err))) for m in spec.analysis.metrics)
        values = {
            "namespace": meta["namespace"],
            "name": meta["name"],
            "app": spec.app_name or status.target_name,
            "batch": status.current_batch,
        }
        checks = []
        for metric in spec.analysis.metrics:
            canary = prom.sample(render_query(metric.query, track="canary", version=spec.target_version, **values))
            stable = None
            if metric.compare is not None:
                stable = prom.sample(render_query(metric.query, track="stable", version=status.stable_version, **values))
            checks.append(Check(metric.name, canary, stable))
        return tuple(checks)

    # --- observe ----------------------------------------------------------------------------------

    def _targets(self, namespace: str, spec: GreyReleaseSpec) -> list[Obj]:
        if spec.target_ref is not None:
            found = self.kube.get(deployments_path(namespace, spec.target_ref.name))
            return [found] if found is not None else []
        # The canary copies the stable's labels, so it is left out by its track label.
        return self.kube.list(deployments_path(namespace), label_selector=f"app={spec.app_name},!{TRACK_LABEL}")

    def _template_hash(self, namespace: str, deployment: Obj) -> str:
        labels = deployment.get("spec", {}).get("selector", {}).get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        replicasets = self.kube.list(path("apps", "v1", "replicasets", namespace), label_selector=selector or None)
        return current_template_hash(deployment, replicasets)

    def observe(self, release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus) -> tuple[Observed, _World]:
        meta = release["metadata"]
        namespace = meta["namespace"]
        targets = self._targets(namespace, spec)
        target = targets[0] if len(targets) == 1 else None
        template_hash = ""
        if target is not None and not status.stable_pod_template_hash:
            template_hash = self._template_hash(namespace, target)
        target_name = target["metadata"]["name"] if target is not None else status.target_name
        canary = self.kube.get(deployments_path(namespace, canary_name(target_name))) if target_name else None
        router = router_for(self.kube, namespace=namespace, release=release, spec=spec, status=status)
        routing_error = router.problem() if status.phase in (None, "Initializing", "InvalidSpec") else ""
        candidates = tuple(
            workload_of(d, spec.container, template_hash if d is target else "") for d in targets
        )
        deletion = parse_time(meta.get("deletionTimestamp"))
        observed = Observed(
            candidates=candidates,
            canary=workload_of(canary, spec.container) if canary is not None else None,
            annotations={k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)},
            generation=int(meta.get("generation", 1)),
            uid=meta.get("uid", ""),
            deleting=deletion is not None,
            deletion_started=deletion,
            routing_error=routing_error,
        )
        return observed, _World(release, spec, status, target, canary, router)

    # --- act --------------------------------------------------------------------------------------

    def _apply(self, action: Action, w: _World) -> None:
        meta = w.release["metadata"]
        namespace = meta["namespace"]
        container = w.spec.container
        match action:
            case EnsureCanary(replicas=replicas, image=image, version=version):
                assert w.target is not None
                desired = build_canary(
                    w.target, w.release, image=image, version=version, replicas=replicas, container=container
                )
                if w.canary is None:
                    w.canary = self.kube.create(deployments_path(namespace), desired)
                elif controller_uid(w.canary) != meta["uid"]:
                    raise RuntimeError(f"refusing to change Deployment {w.canary['metadata']['name']}: not ours")
                elif (patch := canary_patch(w.canary, desired)) is not None:
                    w.canary = self.kube.patch(deployments_path(namespace, desired["metadata"]["name"]), patch)
            case ScaleStable(replicas=replicas):
                if w.target is not None and w.target["spec"].get("replicas") != replicas:
                    w.target = self.kube.patch(
                        deployments_path(namespace, w.target["metadata"]["name"]), {"spec": {"replicas": replicas}}
                    )
            case SetStableImage(image=image, replicas=replicas):
                if w.target is not None:
                    patch = stable_image_patch(w.target, image=image, replicas=replicas, container=container)
                    if patch is not None:
                        w.target = self.kube.patch(
                            deployments_path(namespace, w.target["metadata"]["name"]), patch, patch_type=STRATEGIC
                        )
            case DeleteCanary():
                canary = w.canary
                if canary is not None and controller_uid(canary) == meta["uid"] and not canary["metadata"].get("deletionTimestamp"):
                    # Foreground: the Deployment goes only after its pods, so "canary gone" means gone.
                    self.kube.delete(deployments_path(namespace, canary["metadata"]["name"]), propagation="Foreground")
            case PrepareRouting():
                w.router.prepare()
            case SetWeight(weight=weight, header_match=headers):
                w.router.set_weight(weight, headers)
            case RestoreStableSelector():
                w.router.restore_stable_selector()
            case ResetRouting():
                w.router.reset()
            case RemoveAnnotations(keys=keys):
                present = [k for k in keys if k in (meta.get("annotations") or {})]
                if present:
                    self.kube.patch(
                        release_path(namespace, meta["name"]),
                        {"metadata": {"annotations": {k: None for k in present}}},
                    )
            case _:
                raise TypeError(f"unknown action {action!r}")

    def post_events(self, release: Obj, events: tuple[Event, ...], now: datetime) -> None:
        """Post a plan's Events after its actions and before its status: exactly once per transition.

        Each Event is named after the state it was planned from (the release's uid, generation, our
        annotations and status as read) and its place in the plan. A controller killed before the status
        write plans the same transition from the same state again and posts the same names, which the API
        server refuses (409): nothing is lost (as with Events posted after the status write) and nothing
        is posted twice. An Event the API server refuses for another reason is logged and skipped.
        """
        if not events:
            return
        meta = release["metadata"]
        # The user's annotations only: kopf's own (its finalizer bookkeeping, last-handled-configuration)
        # may be written between a pass and its repetition and must not make the names differ.
        ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k in USER_ANNOTATIONS}
        state = json.dumps([meta.get("uid"), meta.get("generation"), ours, release.get("status") or {}], sort_keys=True)
        stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for i, ev in enumerate(events):
            digest = hashlib.sha256(f"{state}|{i}|{ev.reason}|{ev.message}".encode()).hexdigest()[:16]
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{meta['name'][:200]}.{digest}", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta.get("uid", "")},  # fmt: skip
                "type": ev.type,
                "reason": ev.reason,
                "message": ev.message[:1024],
                "source": {"component": "greyrelease"},
                "reportingComponent": "greyrelease",
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                self.kube.create(path("", "v1", "events", meta["namespace"]), body)
            except Conflict:
                pass  # posted by the pass that planned the same transition and died before its status write
            except ApiError as err:
                log.warning(f"event {ev.reason} not posted: {err}")

    def write_status(self, release: Obj, status: GreyReleaseStatus) -> bool:
        """Write ``status`` when it differs from what the object has; True when written."""
        new = status.model_dump(by_alias=True, mode="json")
        old = release.get("status") or {}
        # Compared as stored: the API server keeps no null field (a merge patch's null removes the key,
        # and the CRD's schema drops a null in a list item), so a null in the model is a missing key.
        if all(_stored(old.get(k)) == _stored(v) for k, v in new.items()):
            return False
        meta = release["metadata"]
        self.kube.patch(release_path(meta["namespace"], meta["name"], "status"), {"status": new}, patch_type=MERGE)
        return True

    # --- the whole pass ---------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, *, now: datetime | None = None) -> Outcome | None:
        """Observe, plan, act, record. None when the GreyRelease is gone.

        Passes over one release never overlap: a pass already running (say, in a daemon that kopf is
        stopping because the object is being deleted) finishes before the next one starts, so two
        passes never race on the same objects.
        """
        with self._lock_for((namespace, name)):
            return self._reconcile(namespace, name, now=now)

    def _lock_for(self, key: tuple[str, str]) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        with self._locks_guard:
            self._locks.pop((namespace, name), None)

    def _reconcile(self, namespace: str, name: str, *, now: datetime | None = None) -> Outcome | None:
        release = self.kube.get(release_path(namespace, name))
        if release is None:
            return None
        decided_at = time.monotonic()
        now = now or datetime.now(timezone.utc)
        status = GreyReleaseStatus.model_validate(release.get("status") or {})
        try:
            spec = GreyReleaseSpec.model_validate(release.get("spec") or {})
        except ValidationError as err:
            return replace(self._invalid_spec(release, status, err, now), decided_at=decided_at)
        observed, world = self.observe(release, spec, status)
        if due(spec.analysis, phase=status.phase, batch_ready_at=status.batch_ready_at, statuses=list(status.metrics), now=now):
            observed = replace(observed, checks=self._checks(release, spec, status))
        plan = decide(spec, status, observed, now)
        if plan.actions:
            # The router acts on what the plan records (e.g. the stable ReplicaSet's hash, recorded in the
            # very pass that prepares the routing), not on the status read before it.
            world.router = router_for(self.kube, namespace=release["metadata"]["namespace"], release=release, spec=spec, status=plan.status)
        for action in plan.actions:
            self._apply(action, world)
        self.post_events(release, plan.events, now)
        if not observed.deleting:
            self.write_status(release, plan.status)
        return Outcome(plan=plan, watched=self._watched(plan, world), waiting=self._waiting(plan), decided_at=decided_at)

    @staticmethod
    def _watched(plan: Plan, world: _World) -> tuple[str, ...]:
        """The Deployments this release is about (the target and its canary)."""
        names = {n for n in (world.target and world.target["metadata"]["name"], plan.status.target_name) if n}
        return tuple(sorted(names | {canary_name(n) for n in names}))

    @staticmethod
    def _waiting(plan: Plan) -> bool:
        """Whether the release waits for its Deployments to converge. Only then does every change of
        theirs wake it: a batch on hold waits for a timer or an annotation, and a finished release for a
        new spec; waking those on every pod becoming ready would cost a pass each for nothing. (A
        Deployment deleted wakes the release in any case.)"""
        st = plan.status
        return plan.done or st.phase in ("Initializing", "Promoting", "RollingBack") or (
            st.phase == "Progressing" and st.batch_ready_at is None
        )

    def _invalid_spec(self, release: Obj, status: GreyReleaseStatus, err: ValidationError, now: datetime) -> Outcome:
        """A spec the API server let through but the models refuse (e.g. an older CRD): mark it."""
        first = err.errors()[0]
        field = "spec." + ".".join(str(p) for p in first["loc"]) if first["loc"] else "spec"
        message = f"{field}: {first['msg']}"
        new = status.model_copy(update={"phase": Phase.INVALID_SPEC, "message": message})
        if status.phase != Phase.INVALID_SPEC:
            new = new.model_copy(update={"phase_started_at": now})
        plan = Plan(status=new, events=(Event("Warning", R.INVALID_SPEC, message),) if status.message != message else ())
        self.post_events(release, plan.events, now)
        self.write_status(release, new)
        return Outcome(plan=plan)
