"""The release state machine: a purely computational function with no side effects.

``decide(spec, status, observed, now)`` looks at what the release has recorded (``status``) and at what
the cluster looks like now (``observed``) and returns a :class:`Plan`: the actions that converge the
cluster on the current step, the new status, the events to post, and when to look again. The caller
(:mod:`greyrelease.reconciler`) applies the actions in order, then writes the status; a controller killed
between the two simply plans again from the old status, and every action is idempotent, so no batch is
skipped or repeated.

Each call advances at most one step. A transition (batch ready, next batch, promotion...) is recorded in
the returned status before anything of the next step is acted on.

How a release moves::

    Initializing -> Progressing (batch 1..N: canary up, ready, weight, pause, gate)
                 -> Promoting (stable := target, ready, weight 0, canary away) -> Succeeded
    abort / deadline / failed gate / target deleted -> RollingBack -> Aborted | Failed
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

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
from .analysis import ERROR, FAIL, Check, Verdict, fold, next_check_at
from .analysis import interval as analysis_interval
from .analysis import verdict as judge_metrics
from .api import (
    ABORT_ANNOTATION,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    TERMINAL_PHASES,
    BatchRecord,
    Condition,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Restore,
)
from .batches import MANUAL, PlanError, Step, expand
from .images import target_image, version_of

#: How long to wait for a change before looking again while something converges. Deployment watch
#: events wake the release sooner; this is only the safety net.
CONVERGE_POLL = 10.0
#: How often a release that cannot start (its Deployment is missing) looks again.
INVALID_POLL = 30.0
HISTORY_LIMIT = 20
WAITING_TEXT = "waiting for approval"
TRUTHY = {"true", "yes", "1", "y", "on"}
FALSY = {"false", "no", "0", "n", "off"}


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know of a Deployment (built from the object by the adapter)."""

    name: str
    uid: str = ""
    generation: int = 1
    observed_generation: int = 1
    replicas: int = 0  # spec.replicas
    ready: int = 0  # status.readyReplicas
    updated: int = 0  # status.updatedReplicas
    available: int = 0  # status.availableReplicas
    total: int = 0  # status.replicas: pods of every ReplicaSet, old ones included
    image: str = ""  # image of the released container
    container: str = ""
    containers: tuple[str, ...] = ()
    template_hash: str = ""  # pod-template-hash of the current ReplicaSet
    owner_uid: str = ""  # uid of the controlling owner, if any
    deleting: bool = False

    def rolled_out(self, replicas: int, image: str) -> bool:
        """All ``replicas`` pods run ``image`` and are ready, and no old pod is left."""
        return (
            self.observed_generation >= self.generation
            and self.image == image
            and self.replicas == replicas
            and self.updated >= replicas
            and self.ready >= replicas
            and self.available >= replicas
            and self.total == replicas
        )


@dataclass(frozen=True)
class Observed:
    """The world as the adapters read it for one reconcile."""

    candidates: tuple[Workload, ...] = ()  # Deployments the spec names (0, 1 or several)
    canary: Workload | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int = 1
    uid: str = ""
    deleting: bool = False
    deletion_started: datetime | None = None
    routing_error: str = ""  # the router cannot work with what it found (e.g. a Service is missing)
    checks: tuple[Check, ...] = ()  # metric samples taken in this pass (only when a check was due)


def fmt_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in TRUTHY


def aborting(annotations: Mapping[str, str], phase: str | None) -> bool:
    """Whether the next pass of a release in this phase, with these annotations, rolls it back for an
    abort (and so cuts its traffic)."""
    return phase in ("Initializing", "Progressing", "Paused", "Promoting") and _truthy(annotations.get(ABORT_ANNOTATION))


def _deadline(b: _Builder, spec: GreyReleaseSpec, since: datetime | None) -> datetime:
    """``progressDeadlineSeconds`` after ``since`` (or after now, when it is not recorded)."""
    return (since or b.now) + timedelta(seconds=spec.progress_deadline_seconds)


def _weighted(spec: GreyReleaseSpec) -> bool:
    """True when a router sets the weight explicitly (nginx, Gateway API) rather than by replicas."""
    routing = spec.traffic_routing
    return routing is not None and routing.service is None


class _Builder:
    """Collects a plan. Status changes go through ``set`` so the result is one immutable status."""

    def __init__(self, status: GreyReleaseStatus, now: datetime) -> None:
        self.status = status
        self.now = now
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.done = False
        #: A batch was finished in this pass (the pass goes on into the next step, but only once).
        self.advanced = False

    def set(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def act(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def again(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def at(self, when: datetime) -> None:
        self.again((when - self.now).total_seconds())

    def phase(self, phase: str, message: str) -> None:
        changes: dict[str, Any] = {"phase": phase, "message": message}
        if phase != self.status.phase:
            changes["phase_started_at"] = fmt_time(self.now)
        self.set(**changes)

    def history(self, batch: int, **changes: Any) -> None:
        records = list(self.status.history)
        for i, rec in enumerate(records):
            if rec.batch == batch and rec.finished_at is None:
                records[i] = rec.model_copy(update=changes)
                break
        else:
            records.append(BatchRecord(batch=batch, **changes))
        self.set(history=records[-HISTORY_LIMIT:])

    def build(self, generation: int) -> Plan:
        status = self.status.model_copy(
            update={
                "observed_generation": generation,
                "batch": f"{self.status.current_batch}/{self.status.total_batches}"
                if self.status.total_batches
                else "",
            }
        )
        status = status.model_copy(update={"conditions": _conditions(status, self.now)})
        return Plan(
            status=status,
            actions=tuple(self.actions),
            events=tuple(self.events),
            requeue_after=self.requeue,
            done=self.done,
        )


def decide(
    spec: GreyReleaseSpec, status: GreyReleaseStatus, observed: Observed, now: datetime
) -> Plan:
    """Plan the next step of a release. Pure: same inputs, same plan."""
    b = _Builder(status, now)
    if observed.deleting:
        _cleanup(b, spec, observed)
        return b.build(observed.generation)

    ann = observed.annotations
    phase = status.phase
    restarting = phase is not None and status.target_version not in ("", spec.target_version)

    if phase in TERMINAL_PHASES - {"InvalidSpec"} and (
        restarting or (phase in ("Aborted", "Failed") and RETRY_ANNOTATION in ann)
    ):
        # A new version, or a retry, starts a fresh release; the sticky abort is consumed with it.
        b.act(RemoveAnnotations((ABORT_ANNOTATION, RETRY_ANNOTATION)))
        if not restarting:
            b.event(R.RETRIED, f"retrying the release of {spec.target_version}")
        _reset(b)
        _initialize(b, spec, observed)
    elif restarting and phase in ("Progressing", "Paused", "Promoting", "Initializing"):
        _restart(b, spec, observed)
    elif phase in (None, "InvalidSpec"):
        if _truthy(ann.get(ABORT_ANNOTATION)) and phase is None:
            b.set(target_version=spec.target_version)
            b.phase("Aborted", "aborted before it started; nothing was changed")
            b.event(R.ABORTED, "aborted before the release started", warning=True)
        else:
            _initialize(b, spec, observed)
    elif aborting(ann, phase):
        _roll_back(b, spec, observed, end="Aborted", reason=R.ABORTED, message="aborted by annotation")
    elif phase == "Initializing":
        _initialize(b, spec, observed)
    elif phase in ("Progressing", "Paused"):
        _progress(b, spec, observed)
    elif phase == "Promoting":
        _promote(b, spec, observed)
    elif phase == "RollingBack":
        _rolling_back(b, spec, observed)
    # Succeeded, Aborted, Failed: nothing to do until the spec or an annotation changes.
    return b.build(observed.generation)


# --- starting -------------------------------------------------------------------------------------


def _invalid(b: _Builder, spec: GreyReleaseSpec, message: str, *, reason: str = R.INVALID_SPEC) -> None:
    if b.status.phase != "InvalidSpec" or b.status.message != message:
        b.event(reason, message, warning=True)
    b.set(target_version=spec.target_version)
    b.phase("InvalidSpec", message)
    b.again(INVALID_POLL)


def _resolve_target(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> Workload | None:
    """The one Deployment the spec names, or None after marking the release InvalidSpec."""
    found = observed.candidates
    if not found:
        if spec.target_ref:
            _invalid(b, spec, f"spec.targetRef.name: Deployment {spec.target_ref.name!r} not found")
        else:
            _invalid(b, spec, f"spec.appName: no Deployment is labelled app={spec.app_name}")
        return None
    if len(found) > 1:
        names = ", ".join(sorted(w.name for w in found))
        _invalid(
            b, spec, f"spec.appName: {len(found)} Deployments are labelled app={spec.app_name} ({names}); "
            "use targetRef to pick one"
        )
        return None
    target = found[0]
    if spec.container and spec.container not in target.containers:
        _invalid(
            b, spec, f"spec.container: Deployment {target.name!r} has no container {spec.container!r}"
        )
        return None
    return target


def _steps(b: _Builder, spec: GreyReleaseSpec, replicas: int) -> list[Step] | None:
    try:
        return expand(spec, replicas)
    except PlanError as err:
        _invalid(b, spec, str(err))
        return None


def _initialize(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    target = _resolve_target(b, spec, observed)
    if target is None:
        return
    if observed.canary is not None and observed.canary.owner_uid != observed.uid:
        _invalid(
            b,
            spec,
            f"Deployment {observed.canary.name!r} exists and is not owned by this release; "
            "rename or delete it",
            reason=R.CANARY_CONFLICT,
        )
        return
    if observed.routing_error:
        _invalid(b, spec, observed.routing_error, reason=R.ROUTING_ERROR)
        return
    restore = b.status.restore
    replicas = restore.replicas if restore.replicas is not None else target.replicas
    steps = _steps(b, spec, replicas)
    if steps is None:
        return
    original_image = restore.image or target.image
    image = target_image(original_image, spec.target_version)
    if image == original_image and observed.canary is None:
        b.set(
            target_version=spec.target_version,
            stable_version=version_of(original_image),
            target_name=target.name,
            current_batch=0,
            total_batches=0,
            canary_weight=0,
            canary_replicas=0,
            stable_replicas=target.replicas,
        )
        b.phase("Succeeded", f"{target.name} already runs {image}")
        b.event(R.ALREADY_AT_TARGET, f"{target.name} already runs {image}; nothing to release")
        return
    if not target.template_hash:
        # The Deployment controller has not labelled a ReplicaSet yet; look again shortly.
        b.set(target_version=spec.target_version, target_name=target.name)
        b.phase("Initializing", f"waiting for the ReplicaSet of {target.name}")
        b.again(1.0)
        return
    now = fmt_time(b.now)
    b.set(
        target_version=spec.target_version,
        stable_version=version_of(original_image),
        target_name=target.name,
        stable_pod_template_hash=b.status.stable_pod_template_hash or target.template_hash,
        restore=Restore(replicas=replicas, image=original_image),
        current_batch=1,
        total_batches=len(steps),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=target.replicas,
        batch_started_at=now,
        batch_ready_at=None,
        next_check_at=None,
        metrics=[],
    )
    b.phase("Progressing", f"batch 1/{len(steps)}: starting the canary")
    b.history(1, started_at=now)
    b.event(
        R.RELEASE_STARTED,
        f"releasing {image} to {target.name} in {len(steps)} batches (stable {version_of(original_image)})",
    )
    # The routing objects (canary Service/Ingress, stable narrowing) come before any canary pod, so the
    # stable backend never sends traffic to a canary that copied its labels. The same pass goes on to
    # grow the first batch (its actions come after these).
    b.act(PrepareRouting())
    _progress(b, spec, observed)


def _reset(b: _Builder) -> None:
    """Forget the last release before a new one starts."""
    b.set(
        restore=Restore(),
        stable_pod_template_hash="",
        current_batch=0,
        total_batches=0,
        history=[],
        metrics=[],
        batch_started_at=None,
        batch_ready_at=None,
        next_check_at=None,
        last_promotion="",
        end_phase="",
    )


def _restart(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    """A new targetVersion mid-release: traffic back to stable, then batch 1 of the new version."""
    old = b.status.target_version
    target = observed.candidates[0] if len(observed.candidates) == 1 else None
    b.act(SetWeight(0))
    restore = b.status.restore
    if target is not None and restore.image and restore.replicas is not None:
        if target.image != restore.image:
            b.act(RestoreStableSelector(), SetStableImage(restore.image, restore.replicas))
    b.event(R.RESTARTED, f"targetVersion changed from {old} to {spec.target_version}: restarting at batch 1")
    b.set(history=[], metrics=[])
    b.phase("Initializing", f"restarting for {spec.target_version}")
    b.set(target_version=spec.target_version)
    b.again(0)


# --- batches --------------------------------------------------------------------------------------


def _paused(spec: GreyReleaseSpec, observed: Observed) -> bool:
    """``spec.paused``, or a ``greyrelease.io/pause`` annotation whose value is not false."""
    value = observed.annotations.get(PAUSE_ANNOTATION)
    return spec.paused or (value is not None and value.strip().lower() not in FALSY)


def _progress(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    st = b.status
    if len(observed.candidates) != 1:
        _roll_back(
            b, spec, observed, end="Failed", reason=R.TARGET_DELETED,
            message=f"the target Deployment {st.target_name!r} is gone",
        )
        return
    target = observed.candidates[0]
    if observed.canary is not None and observed.canary.owner_uid != observed.uid:
        _roll_back(
            b, spec, observed, end="Failed", reason=R.CANARY_CONFLICT,
            message=f"Deployment {observed.canary.name!r} is not owned by this release",
        )
        return
    assert st.restore.replicas is not None and st.restore.image is not None
    steps = _steps(b, spec, st.restore.replicas)
    if steps is None:
        return
    k = min(max(st.current_batch, 1), len(steps))
    step = steps[k - 1]
    image = target_image(st.restore.image, spec.target_version)

    paused = _paused(spec, observed)
    if paused and st.phase != "Paused":
        b.phase("Paused", f"batch {k}/{len(steps)}: paused")
        b.event(R.PAUSED, f"paused at batch {k}/{len(steps)}")
        return
    if not paused and st.phase == "Paused":
        b.phase("Progressing", f"batch {k}/{len(steps)}: resumed")
        b.event(R.RESUMED, f"resumed at batch {k}/{len(steps)}")
        if st.batch_ready_at is None:
            # The deadline measures progress, and nothing was asked to progress while paused.
            b.set(batch_started_at=fmt_time(b.now))
        b.again(0)
        return
    if paused:
        return

    b.set(total_batches=len(steps), current_batch=k)
    if st.batch_ready_at is not None and (observed.canary is None or observed.canary.deleting):
        _canary_lost(b, steps, step)
    if b.status.batch_ready_at is None:
        at_once = _moves_on_at_once(spec, step)
        _scale_batch(b, spec, observed, target, steps, step, image, chain=at_once)
        if b.status.batch_ready_at is None or not at_once:
            return
    _hold_batch(b, spec, observed, steps, step)
    # A finished batch is followed, in the same pass, by the next step: the next batch's canary grows, or
    # the promotion starts. That saves a pass and a status write per transition; the actions stay in
    # order and are idempotent, so a controller killed in between plans the same steps again.
    if not b.advanced:
        return
    if b.status.phase == "Promoting":
        _promote(b, spec, observed)
    elif b.status.phase == "Progressing" and b.status.current_batch == k + 1:
        _scale_batch(b, spec, observed, target, steps, steps[k], image, chain=False)


def _moves_on_at_once(spec: GreyReleaseSpec, step: Step) -> bool:
    """A batch without a pause and without analysis is done the moment it is ready."""
    return not step.pause and spec.analysis is None


def _canary_lost(b: _Builder, steps: list[Step], step: Step) -> None:
    """The canary of a live batch was deleted (by someone else): the batch is not ready any more.

    Traffic goes back to what it was before this batch, and the batch is grown again at once (the stable
    keeps the previous batch's size meanwhile, see :func:`_scale_batch`) rather than at the next batch, so
    the app never runs short of pods while a pause runs. Once the new canary is ready the batch goes live
    again with a full pause and a fresh gate; its history record is the same one.
    """
    k, n = step.number, len(steps)
    before = steps[k - 2] if k > 1 else None
    b.act(SetWeight(before.weight if before else 0, before.header_match if before else None))
    b.set(
        batch_started_at=fmt_time(b.now),
        batch_ready_at=None,
        next_check_at=None,
        canary_weight=before.weight if before else 0,
        metrics=[m.model_copy(update={"successes": 0, "failures": 0, "consecutive_errors": 0}) for m in b.status.metrics],
    )
    b.event(R.CANARY_LOST, f"batch {k}/{n}: the canary Deployment was deleted; recreating it", warning=True)


def _scale_batch(
    b: _Builder,
    spec: GreyReleaseSpec,
    observed: Observed,
    target: Workload,
    steps: list[Step],
    step: Step,
    image: str,
    *,
    chain: bool,
) -> None:
    """Grow the canary to the batch's size; once it is ready, move the traffic. With ``chain`` the caller
    goes on at once with a ready batch that has no pause, so no timer is set for it here."""
    st = b.status
    k, n = step.number, len(steps)
    # Until the new canary pods are ready the stable keeps the size of the batch before, so ready pods
    # never fall below what the user asked for.
    stable_before = steps[k - 2].stable_replicas if k > 1 else st.restore.replicas or step.stable_replicas
    canary = observed.canary
    ready = (
        canary is not None
        and not canary.deleting
        and canary.rolled_out(step.canary_replicas, image)
    )
    if not ready:
        have = 0 if canary is None or canary.image != image else min(canary.ready, canary.updated)
        deadline = _deadline(b, spec, parse_time(st.batch_started_at))
        if b.now >= deadline:
            _roll_back(
                b, spec, observed, end="Failed", reason=R.PROGRESS_DEADLINE,
                message=f"batch {k}/{n}: {have}/{step.canary_replicas} canary pods ready after "
                f"{spec.progress_deadline_seconds}s (progressDeadlineSeconds)",
            )
            return
        b.act(EnsureCanary(replicas=step.canary_replicas, image=image, version=spec.target_version))
        if _stable_size(b, target) != stable_before:
            b.act(ScaleStable(stable_before))
        # The message does not count ready pods: it would cost a status write per pod.
        b.set(message=f"batch {k}/{n}: waiting for {step.canary_replicas} canary pods to be ready")
        b.at(min(deadline, b.now + timedelta(seconds=CONVERGE_POLL)))
        return

    now = fmt_time(b.now)
    if _stable_size(b, target) != step.stable_replicas:
        b.act(ScaleStable(step.stable_replicas))
    b.act(SetWeight(step.weight, step.header_match))
    next_check = None
    if isinstance(step.pause, (int, float)):
        next_check = fmt_time(b.now + timedelta(seconds=step.pause))
    b.set(
        batch_ready_at=now,
        next_check_at=next_check,
        canary_weight=step.weight,
        canary_replicas=step.canary_replicas,
        stable_replicas=step.stable_replicas,
    )
    b.history(k, canary_replicas=step.canary_replicas, weight=step.weight, ready_at=now)
    b.event(
        R.BATCH_READY,
        f"batch {k}/{n}: {step.canary_replicas} canary pods ready, weight {step.weight}%",
    )
    b.set(message=_hold_message(k, n, step, next_check))
    if step.pause == MANUAL:
        b.event(R.WAITING_FOR_APPROVAL, f"batch {k}/{n} waits for greyrelease.io/promote=next")
    elif isinstance(step.pause, (int, float)) and step.pause > 0:
        b.again(step.pause)
    elif not chain:
        b.again(0)
    if spec.analysis is not None:
        # The first check is due one interval after the batch went live, also within a long or manual pause:
        # waking only at the pause's end would let a bad canary serve, unjudged, for the whole pause.
        b.again(analysis_interval(spec.analysis))


def _stable_size(b: _Builder, target: Workload) -> int:
    """The stable's replicas once this pass's actions so far are applied (a chained step plans on from
    the earlier step's actions, not from the Deployment as it was read)."""
    for action in reversed(b.actions):
        if isinstance(action, (ScaleStable, SetStableImage)):
            return action.replicas
    return target.replicas


def _stable_shrinking(b: _Builder, target: Workload) -> bool:
    """This pass scales the stable, or its last scaling down has not landed yet (old pods left)."""
    return (
        any(isinstance(a, ScaleStable) for a in b.actions)
        or target.observed_generation < target.generation
        or target.total > target.replicas
    )


def _hold_message(k: int, n: int, step: Step, next_check: str | None) -> str:
    if step.pause == MANUAL:
        return (
            f"batch {k}/{n}: weight {step.weight}%, {WAITING_TEXT} "
            "(annotate greyrelease.io/promote=next)"
        )
    if next_check:
        return f"batch {k}/{n}: weight {step.weight}%, pausing until {next_check}"
    return f"batch {k}/{n}: weight {step.weight}%"


def _hold_batch(
    b: _Builder, spec: GreyReleaseSpec, observed: Observed, steps: list[Step], step: Step
) -> None:
    """The batch is live: wait for its pause and its gate, then move on."""
    st = b.status
    k, n = step.number, len(steps)
    gate = _gate(b, spec, observed, k, n)
    if gate is not None and gate.failed:
        _roll_back(b, spec, observed, end="Failed", reason=R.ANALYSIS_FAILED, message=f"batch {k}/{n}: {gate.message}")
        return

    promote = observed.annotations.get(PROMOTE_ANNOTATION, "").strip().lower()
    if promote in ("next", "full"):
        # Consumed once: the annotation is removed before the step it approved is recorded, so a
        # controller that dies in between drops the approval rather than applying it twice.
        b.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        b.set(last_promotion=f"{promote} at batch {k}/{n} {fmt_time(b.now)}")
        b.event(R.PROMOTED, f"promote={promote} at batch {k}/{n}")
        if promote == "full":
            _finish_batch(b, k, "promoted (full)")
            _start_promotion(b, n)
            return
        _advance(b, spec, steps, step, result="promoted")
        return
    elif PROMOTE_ANNOTATION in observed.annotations:
        b.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        b.event(R.INVALID_SPEC, f"ignored greyrelease.io/promote={promote!r}: use next or full", warning=True)

    if step.pause == MANUAL:
        b.set(message=_hold_message(k, n, step, None))
        return
    next_check = parse_time(st.next_check_at)
    if next_check is not None and b.now < next_check:
        b.at(next_check)
        return
    if gate is not None and not gate.passed:
        # No verdict yet (no data, or too few passing checks): wait, but not past the progress deadline.
        deadline = _deadline(b, spec, next_check or parse_time(st.batch_ready_at))
        if b.now >= deadline:
            _roll_back(
                b, spec, observed, end="Failed", reason=R.ANALYSIS_FAILED,
                message=f"batch {k}/{n}: no passing analysis within {spec.progress_deadline_seconds}s "
                f"(progressDeadlineSeconds): {gate.message}",
            )
            return
        b.set(message=f"batch {k}/{n}: weight {step.weight}%, waiting for the analysis: {gate.message}")
        b.at(deadline)
        return
    _advance(b, spec, steps, step, result="passed")


def _gate(b: _Builder, spec: GreyReleaseSpec, observed: Observed, k: int, n: int) -> Verdict | None:
    """Fold this pass's metric checks into the status and judge the batch; None without analysis."""
    analysis = spec.analysis
    if analysis is None:
        return None
    metrics = {m.name: m for m in b.status.metrics}
    by_name = {m.name: m for m in analysis.metrics}
    now = fmt_time(b.now)
    for check in observed.checks:
        metric = by_name.get(check.metric)
        if metric is None:
            continue
        folded = fold(metric, metrics.get(metric.name), check, now)
        metrics[metric.name] = folded
        if folded.verdict in (FAIL, ERROR):
            b.event(R.METRIC_CHECK_FAILED, f"batch {k}/{n}: metric {metric.name}: {folded.message}", warning=True)
    ordered = [metrics[m.name] for m in analysis.metrics if m.name in metrics]
    b.set(metrics=ordered)
    live_since = parse_time(b.status.batch_ready_at) or b.now
    b.at(next_check_at(analysis, ordered, live_since))
    return judge_metrics(analysis, ordered)


def _finish_batch(b: _Builder, k: int, result: str) -> None:
    b.history(k, finished_at=fmt_time(b.now), result=result)
    b.advanced = True


def _advance(b: _Builder, spec: GreyReleaseSpec, steps: list[Step], step: Step, *, result: str) -> None:
    k, n = step.number, len(steps)
    _finish_batch(b, k, result)
    if k >= n:
        _start_promotion(b, n)
        return
    now = fmt_time(b.now)
    b.set(
        current_batch=k + 1,
        batch_started_at=now,
        batch_ready_at=None,
        next_check_at=None,
        # The last values stay visible; the counts start again, since only checks of the new batch count.
        metrics=[m.model_copy(update={"successes": 0, "failures": 0, "consecutive_errors": 0}) for m in b.status.metrics],
    )
    b.history(k + 1, started_at=now)
    b.phase("Progressing", f"batch {k + 1}/{n}: growing the canary")
    b.event(R.BATCH_PASSED, f"batch {k}/{n} {result}; starting batch {k + 1}/{n}")


# --- promotion ------------------------------------------------------------------------------------


def _start_promotion(b: _Builder, n: int) -> None:
    b.set(batch_ready_at=None, next_check_at=None)
    b.phase("Promoting", "rolling the stable Deployment to the target version")
    b.event(R.PROMOTING, f"all {n} batches passed; promoting the stable Deployment")


def _promote(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    st = b.status
    assert st.restore.replicas is not None and st.restore.image is not None
    if len(observed.candidates) != 1:
        _roll_back(
            b, spec, observed, end="Failed", reason=R.TARGET_DELETED,
            message=f"the target Deployment {st.target_name!r} is gone",
        )
        return
    target = observed.candidates[0]
    replicas = st.restore.replicas
    image = target_image(st.restore.image, spec.target_version)
    if not target.rolled_out(replicas, image):
        if target.image != image and _stable_shrinking(b, target):
            # The last batch scaled the stable down (Service mode: to nothing, all traffic on the
            # canary). Its old pods go before the new image comes: given both at once, the Deployment
            # would keep old pods serving while it rolls.
            # (The message is the one the next step shows too: no status write just for this wait.)
            b.set(message=f"promoting: waiting for {replicas} stable pods ready on {version_of(image)}")
            b.at(b.now + timedelta(seconds=CONVERGE_POLL))
            return
        if target.image != image or target.replicas != replicas:
            # The narrowing of the stable Service goes first: the stable's new pods must get traffic.
            b.act(RestoreStableSelector(), SetStableImage(image, replicas))
        deadline = _deadline(b, spec, parse_time(st.phase_started_at))
        if b.now >= deadline:
            _roll_back(
                b, spec, observed, end="Failed", reason=R.PROGRESS_DEADLINE,
                message=f"promotion: {target.ready}/{replicas} stable pods ready on {image} after "
                f"{spec.progress_deadline_seconds}s (progressDeadlineSeconds)",
            )
            return
        b.set(message=f"promoting: waiting for {replicas} stable pods ready on {version_of(image)}")
        b.at(min(deadline, b.now + timedelta(seconds=CONVERGE_POLL)))
        return
    if observed.canary is not None:
        # Traffic back to the (now promoted) stable, then the canary goes; the routing is reset only
        # once the canary's pods are gone. In Service mode there is no weight to move: weight 0 would
        # narrow the Service to the old stable ReplicaSet, which no longer has pods.
        if _weighted(spec):
            b.act(SetWeight(0))
        b.act(DeleteCanary())
        b.set(message="promoted: removing the canary", canary_weight=0)
        b.again(CONVERGE_POLL)
        return
    b.act(ResetRouting())
    b.set(
        stable_version=version_of(image),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=replicas,
        restore=Restore(),
    )
    b.phase("Succeeded", f"{st.target_name} runs {image} on {replicas} replicas")
    b.event(R.SUCCEEDED, f"released {image} to {st.target_name}")


# --- rollback -------------------------------------------------------------------------------------


def _roll_back(
    b: _Builder, spec: GreyReleaseSpec, observed: Observed, *, end: str, reason: str, message: str
) -> None:
    """Traffic to stable at once: the pass that decides it writes the weight, its Event and the status,
    nothing else. Putting the stable back and removing the canary follow in the next pass, which is not
    urgent: when many releases roll back at once (a burst of aborts), every one of them has its traffic
    cut before the API server is kept busy restoring capacity."""
    b.act(SetWeight(0))
    b.set(canary_weight=0, end_phase=end)
    b.phase("RollingBack", message)
    b.event(reason, message, warning=True)
    b.again(0)


def _rolling_back(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    st = b.status
    end = st.end_phase or "Failed"
    reason_text = st.message
    if not any(isinstance(a, SetWeight) for a in b.actions):
        b.act(SetWeight(0))
    target = observed.candidates[0] if len(observed.candidates) == 1 else None
    restore = st.restore
    stable_ready = True
    if target is not None and restore.image and restore.replicas is not None:
        if target.image != restore.image or target.replicas != restore.replicas:
            b.act(SetStableImage(restore.image, restore.replicas))
        stable_ready = target.rolled_out(restore.replicas, restore.image)
    deadline = _deadline(b, spec, parse_time(st.phase_started_at))
    if not stable_ready and b.now < deadline:
        # Keep the canary's pods until the stable can carry the load again; they get no traffic.
        b.at(min(deadline, b.now + timedelta(seconds=CONVERGE_POLL)))
        return
    if observed.canary is not None and observed.canary.owner_uid == observed.uid:
        b.act(DeleteCanary())
        b.again(CONVERGE_POLL)
        return
    b.act(ResetRouting())
    b.set(
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=restore.replicas or (target.replicas if target else 0),
        restore=Restore(),
        batch_ready_at=None,
        next_check_at=None,
        end_phase="",
    )
    b.phase(end, f"{reason_text}; stable {st.stable_version} serves all traffic")
    b.event(R.ROLLED_BACK, f"rolled back: all traffic on the stable version {st.stable_version}")


# --- deletion -------------------------------------------------------------------------------------


def _cleanup(b: _Builder, spec: GreyReleaseSpec, observed: Observed) -> None:
    """The GreyRelease is being deleted: leave the app as it was before the release began."""
    st = b.status
    restore = st.restore
    target = observed.candidates[0] if len(observed.candidates) == 1 else None
    touched = restore.replicas is not None or observed.canary is not None
    if not touched:
        b.done = True
        return
    b.act(SetWeight(0))
    stable_ready = True
    if target is not None and restore.image and restore.replicas is not None:
        if target.image != restore.image or target.replicas != restore.replicas:
            b.act(SetStableImage(restore.image, restore.replicas))
        stable_ready = target.rolled_out(restore.replicas, restore.image)
    started = observed.deletion_started or b.now
    if not stable_ready and b.now < started + timedelta(seconds=spec.progress_deadline_seconds):
        b.again(CONVERGE_POLL)
        return
    if observed.canary is not None and observed.canary.owner_uid == observed.uid:
        b.act(DeleteCanary())
        b.again(CONVERGE_POLL)
        return
    b.act(ResetRouting())
    b.event(R.CLEANED_UP, "release deleted: stable restored, canary removed")
    b.set(restore=Restore())
    b.done = True


# --- conditions -----------------------------------------------------------------------------------


def _conditions(status: GreyReleaseStatus, now: datetime) -> list[Condition]:
    phase = status.phase
    wanted: list[tuple[str, bool, str]] = [
        (R.COND_PROGRESSING, phase in ("Initializing", "Progressing", "Promoting", "RollingBack"), phase or ""),
        (R.COND_PAUSED, phase == "Paused" or WAITING_TEXT in status.message, phase or ""),
        (R.COND_COMPLETED, phase in TERMINAL_PHASES, phase or ""),
        (R.COND_HEALTHY, phase not in ("RollingBack", "Aborted", "Failed", "InvalidSpec"), phase or ""),
        (R.COND_INVALID_SPEC, phase == "InvalidSpec", phase or ""),
    ]
    old = {c.type: c for c in status.conditions}
    out: list[Condition] = []
    for ctype, true, reason in wanted:
        value = "True" if true else "False"
        prev = old.get(ctype)
        message = status.message if true else ""
        if prev is not None and prev.status == value:
            out.append(prev.model_copy(update={"reason": reason, "message": message}))
        else:
            out.append(
                Condition(type=ctype, status=value, reason=reason, message=message, last_transition_time=fmt_time(now))
            )
    return out
