"""The release state machine: a purely computational function with no side effects.

``decide(spec, status, observed, now)`` looks at what the release has recorded (``status``) and at what
the cluster looks like now (``observed``) and returns a :class:`Plan`: the actions that converge the
cluster, the new status, the events to post, and when to look again. The caller applies the actions in
order, then writes the status; a controller killed between the two plans again from the old status, and
every action is idempotent, so no batch is skipped or repeated.

The state is the phase and, while a batch is under way (Progressing, Paused), its ``batchState``::

    (start) ──> Progressing: batch 1..N ─────────────────────────────────────────> Promoting ──> Succeeded
                     Upscaling ──> Verifying ─────────────(pause over, gate passed)─┐
                         ▲    └──> WaitingForApproval ───(promote=next)─────────────┤
                         └──────────────── batch k+1 <──────────────────────────────┘ (after batch N: Promoting)
    Progressing <──(pause / resume)──> Paused          promote=full: Promoting at once
    Initializing, Progressing, Paused, Promoting ──(abort, failed gate, deadline, target gone)──> RollingBack
    RollingBack ──> Aborted | Failed ──(retry, or a new targetVersion)──> start again
    a new targetVersion mid-release: traffic back to the stable ──> Initializing ──> batch 1 of the new version

    phase            batchState            handler         what it waits for, and where it goes then
    (none)           -                     _start          the Deployment and a valid spec -> Progressing, Upscaling
    InvalidSpec      -                     _start          (the same: the spec or the cluster fixed)
    Initializing     -                     _start          a ReplicaSet to name the stable by
    Progressing      Upscaling             _upscale        canary pods ready (and endpoints of the canary Service,
                                                           when the mode has one) -> traffic moved -> Verifying
                                                           or WaitingForApproval (pause: manual)
    Progressing      Verifying             _verify         the pause and the gate -> next batch (Upscaling) or Promoting
    Progressing      WaitingForApproval    _verify         promote=next -> next batch; promote=full -> Promoting
    Paused           Upscaling, Verifying  _on_pause       the pause lifted -> Progressing, the batch as it was
                                                           (one waiting for approval is Verifying while paused)
    Promoting        -                     _promote        the stable on the target, then the canary gone -> Succeeded
    RollingBack      -                     _rolling_back   the stable restored, then the canary gone -> Aborted/Failed
    Succeeded, Aborted, Failed             _finished       nothing (a retry or a new version is a request, below)

A handler plans what its state needs and either waits (for pods, a timer, an annotation: the pass ends)
or moves to another state and lets that state's handler go on in the same pass, against the world as the
actions planned so far leave it (:func:`project`), never against the actions themselves. A pass verifies
at most one batch: once a finished batch's successor is live, the pass ends and the next one looks again
at once. Requests that cut across the states (a new targetVersion, a retry, an abort) are looked at
first (:func:`_request`); a deletion restores the app through the same path as a rollback (:func:`_restore`).

What a handler needs before it can run, it declares in :data:`HANDLERS` (:class:`Plain`, :class:`NeedsTarget`,
:class:`NeedsBatch`), and the dispatcher checks it first, in one place for every state: the target gone is a
rollback, a canary that is not ours a rollback, batches that no longer fit the spec InvalidSpec, a pause asked
for pauses the batch, a live batch's canary deleted grows the batch again. The handler gets what it asked for
(the target, the current batch) as an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from greyrelease.analysis.verdicts import Check, Verdict, fold, next_check_at
from greyrelease.analysis.verdicts import interval as analysis_interval
from greyrelease.analysis.verdicts import verdict as judge_metrics
from greyrelease.api.release import (
    ABORT_ANNOTATION,
    BATCH_PHASES,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    TERMINAL_PHASES,
    WAITING_TEXT,
    BatchRecord,
    BatchState,
    CheckVerdict,
    Condition,
    GreyReleaseSpec,
    GreyReleaseStatus,
    MetricStatus,
    Phase,
    Restore,
    fmt_time,
)
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    Action,
    DeleteCanary,
    EnsureCanary,
    Event,
    FreeSlot,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    ScaleStable,
    SetStableImage,
    SetWeight,
    TakeSlot,
)
from greyrelease.planner.batches import MANUAL, Approval, PlanError, Step, expand
from greyrelease.planner.governance import SPEC, Hold, Predecessor, Queue, Rules, Source
from greyrelease.planner.images import target_image, version_of

#: How long to wait for a change before looking again while something converges. Deployment watch
#: events wake the release sooner; this is only the safety net.
CONVERGE_POLL = 10.0
#: How often a batch whose canary pods are ready looks again for them among the canary Service's
#: endpoints. Nothing watches EndpointSlices (a cache of every slice in the cluster, for a wait of a
#: fraction of a second once per batch): the release polls, one LIST of the Service's slices a time.
ENDPOINTS_POLL = 0.5
#: How often a release that cannot start (its Deployment is missing) looks again.
INVALID_POLL = 30.0
HISTORY_LIMIT = 20
TRUTHY = {"true", "yes", "1", "y", "on"}
FALSY = {"false", "no", "0", "n", "off"}
_T = TypeVar("_T")
#: More state changes in one pass than any path through the machine takes: a loop is a bug.
MAX_TRANSITIONS = 16


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

    def settling(self) -> bool:
        """A change of its spec has not landed yet: not observed, or old pods still there."""
        return self.observed_generation < self.generation or self.total > self.replicas

    def respec(self, **changes: Any) -> Workload:
        """This Deployment once its spec is changed so: a new generation, not yet observed; the pods
        are the ones there were."""
        mine = self.__dict__
        for k, v in changes.items():
            if mine[k] != v:
                return _evolve(self, generation=self.generation + 1, **changes)
        return self


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
    #: The canary pods the proxy can send to (ready endpoints of the canary Service): read only while
    #: a batch's canary grows, and only in the modes that route through a canary Service; else None.
    canary_endpoints: int | None = None
    checks: tuple[Check, ...] = ()  # metric samples taken in this pass (only when a check was due)
    rules: Rules = field(default_factory=Rules)  # the windows and freezes of the policies that govern the release
    queue: Queue | None = None  # the concurrency limit it is under, if any
    predecessors: tuple[Predecessor, ...] = ()  # the releases of spec.after, as found
    cycle: tuple[str, ...] = ()  # a cycle of spec.after through this release (a, b, a), if any

    @property
    def target(self) -> Workload | None:
        """The one Deployment the spec names, if exactly one."""
        return self.candidates[0] if len(self.candidates) == 1 else None

    @property
    def own_canary(self) -> Workload | None:
        """The canary Deployment, if this release owns it."""
        return self.canary if self.canary is not None and self.canary.owner_uid == self.uid else None


def _evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the frozen dataclasses here, without running ``__init__`` (they
    validate nothing): the projection copies a Workload and the Observed for most actions of every pass,
    and ``replace`` costs about 4 us on a 15-field frozen dataclass, a sixth of a whole ``decide``."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def project(world: Observed, action: Action) -> Observed:
    """The world as a later state of the same pass sees it once ``action`` is applied: Deployment specs
    and annotations change at once, pods do not (they are the ones observed)."""
    match action:
        case EnsureCanary(replicas=r, image=image):
            canary = world.canary or Workload(name="", owner_uid=world.uid, observed_generation=0)
            return _evolve(world, canary=canary.respec(replicas=r, image=image))
        case ScaleStable(replicas=r) if world.target is not None:
            return _evolve(world, candidates=(world.target.respec(replicas=r),))
        case SetStableImage(image=image, replicas=r) if world.target is not None:
            return _evolve(world, candidates=(world.target.respec(image=image, replicas=r),))
        case DeleteCanary() if world.canary is not None:
            # Deleted in the foreground: the object stays, marked, until its pods are gone.
            return _evolve(world, canary=_evolve(world.canary, deleting=True))
        case RemoveAnnotations(keys=keys):
            return _evolve(world, annotations={k: v for k, v in world.annotations.items() if k not in keys})
    # Routing actions change nothing the planner observes.
    return world


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in TRUTHY


def aborting(annotations: Mapping[str, str], phase: str | None) -> bool:
    """Whether the next pass of a release in this phase, with these annotations, rolls it back for an
    abort (and so cuts its traffic)."""
    return phase in _ABORTABLE and _truthy(annotations.get(ABORT_ANNOTATION))


_ABORTABLE = frozenset(
    {Phase.INITIALIZING, Phase.WAITING, Phase.QUEUED, Phase.PROGRESSING, Phase.PAUSED, Phase.PROMOTING}
)


def _weighted(spec: GreyReleaseSpec) -> bool:
    """True when a router sets the weight explicitly (nginx, Gateway API) rather than by replicas."""
    routing = spec.traffic_routing
    return routing is not None and routing.service is None


def _paused(spec: GreyReleaseSpec, world: Observed) -> bool:
    """``spec.paused``, or a ``greyrelease.io/pause`` annotation whose value is not false."""
    value = world.annotations.get(PAUSE_ANNOTATION)
    return spec.paused or (value is not None and value.strip().lower() not in FALSY)


class Then(Enum):
    """What a handler's state does after it: waits (the pass ends) or lets the next state go on."""

    WAIT = "wait"
    GO_ON = "go on"


WAIT, GO_ON = Then.WAIT, Then.GO_ON


class _Pass:
    """One call of :func:`decide`: the status being built, the world projected forward, what is planned."""

    def __init__(self, spec: GreyReleaseSpec, status: GreyReleaseStatus, world: Observed, now: datetime) -> None:
        self.spec = spec
        self.status = status
        self.recorded = status  # the status as this pass found it recorded
        self._world = world
        self._unseen: list[Action] = []  # planned, not yet projected onto _world
        self.now = now
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.done = False
        self._steps: tuple[int, list[Step]] | None = None

    def set(self, **changes: Any) -> None:
        self.status = self.status.model_copy(update=changes)

    def steps(self, replicas: int) -> list[Step]:
        """The batches for a stable of ``replicas`` (computed once a pass: states that follow each other
        in one pass need them again). Raises :class:`PlanError`."""
        if self._steps is None or self._steps[0] != replicas:
            self._steps = (replicas, expand(self.spec, replicas))
        return self._steps[1]

    def act(self, *actions: Action) -> None:
        self.actions.extend(actions)
        self._unseen.extend(actions)

    @property
    def world(self) -> Observed:
        """What was observed, as the actions planned so far leave it. (Projected when read: most passes
        end with their actions, and nothing reads the world after them.)"""
        if self._unseen:
            for action in self._unseen:
                self._world = project(self._world, action)
            self._unseen.clear()
        return self._world

    def event(self, reason: str, message: str, *, warning: bool = False) -> None:
        self.events.append(Event("Warning" if warning else "Normal", reason, message))

    def again(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def at(self, when: datetime) -> None:
        self.again((when - self.now).total_seconds())

    def phase(self, phase: Phase, message: str) -> None:
        changes: dict[str, Any] = {"phase": phase, "message": message}
        if phase != self.status.phase:
            changes["phase_started_at"] = self.now
        if phase not in BATCH_PHASES:
            changes["batch_state"] = None
        if phase != Phase.QUEUED:
            changes["queue_position"] = None
        self.set(**changes)

    def deadline(self, since: datetime | None) -> datetime:
        """``progressDeadlineSeconds`` after ``since`` (or after now, when it is not recorded)."""
        return (since or self.now) + timedelta(seconds=self.spec.progress_deadline_seconds)

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
        st = self.status
        if st.phase == Phase.QUEUED:
            batch = f"queued #{st.queue_position}"
        else:
            batch = f"{st.current_batch}/{st.total_batches}" if st.total_batches else ""
        status = st.model_copy(update={"observed_generation": generation, "batch": batch})
        status = status.model_copy(update={"conditions": _conditions(status, self.now)})
        return Plan(
            status=status,
            actions=tuple(self.actions),
            events=tuple(self.events),
            requeue_after=self.requeue,
            done=self.done,
        )


Handler = Callable[[_Pass], Then]


def decide(spec: GreyReleaseSpec, status: GreyReleaseStatus, observed: Observed, now: datetime) -> Plan:
    """Plan the next step of a release. Pure: same inputs, same plan."""
    p = _Pass(spec, status, observed, now)
    if observed.deleting:
        _delete(p)
    else:
        first = _request(p)
        if first is None or first(p) is GO_ON:
            _run(p)
    queue = observed.queue
    if queue is not None and queue.held and (observed.deleting or not progressing(p.status)):
        # A release that ends, rolls back, is deleted or goes back to waiting gives its slot back at once
        # (after the actions that cut its traffic).
        p.act(FreeSlot(queue.lease))
    return p.build(observed.generation)


def started(status: GreyReleaseStatus) -> bool:
    """Whether the release has changed anything on the cluster (its undo record is kept from then on)."""
    return status.restore.replicas is not None


def progressing(status: GreyReleaseStatus) -> bool:
    """Whether the release counts against a concurrency limit: from the pass that takes its slot until it
    ends or starts rolling back. A release waiting to start (for a window, a predecessor or a slot) does
    not count; one paused, waiting for an approval or for the window of its next batch does (it holds its
    slot)."""
    phase = status.phase
    if phase is None or phase in TERMINAL_PHASES or phase in (Phase.QUEUED, Phase.ROLLING_BACK):
        return False
    return not (phase == Phase.WAITING and status.batch_state is None and not started(status))


def _run(p: _Pass) -> None:
    """The handlers of the states the release passes through, until one waits."""
    verified = False
    for _ in range(MAX_TRANSITIONS):
        st = p.status
        state = st.batch_state if st.phase in BATCH_PHASES else None
        if st.phase == Phase.PROGRESSING and state != BatchState.UPSCALING:
            if verified:
                # A batch finished in this pass and the next one is live already: the next pass goes on.
                p.again(0)
                return
            verified = True
        if HANDLERS[st.phase, state](p) is WAIT:
            return
    raise AssertionError(f"no state waits: {p.status.phase} {p.status.batch_state}")


def _request(p: _Pass) -> Handler | None:
    """What a request that cuts across the states (a new version, a retry, an abort) does first; None
    when there is none and the state's own handler runs."""
    st, ann = p.status, p.world.annotations
    phase = st.phase
    new_version = phase is not None and st.target_version not in ("", p.spec.target_version)
    if phase in (Phase.SUCCEEDED, Phase.ABORTED, Phase.FAILED) and (
        new_version or (phase != Phase.SUCCEEDED and RETRY_ANNOTATION in ann)
    ):
        return _start_over
    if phase in (None, Phase.WAITING, Phase.QUEUED) and not started(st) and p.world.canary is None:
        # Nothing changed yet: an abort ends it as it is; a new version is just what it will start with.
        return _abort_before_start if _truthy(ann.get(ABORT_ANNOTATION)) else None
    if new_version and phase in _ABORTABLE:
        return _restart
    if aborting(ann, phase):
        return _abort
    return None


# --- requests ---------------------------------------------------------------------------------------


def _start_over(p: _Pass) -> Then:
    """A new version, or a retry, starts a fresh release; the sticky abort is consumed with it."""
    retry = p.status.target_version in ("", p.spec.target_version)
    p.act(RemoveAnnotations((ABORT_ANNOTATION, RETRY_ANNOTATION)))
    if retry:
        p.event(R.RETRIED, f"retrying the release of {p.spec.target_version}")
    p.set(
        restore=Restore(),
        stable_pod_template_hash="",
        current_batch=0,
        total_batches=0,
        history=[],
        metrics=[],
        batch_started_at=None,
        batch_ready_at=None,
        next_check_at=None,
        approval_expires_at=None,
        last_promotion="",
        end_phase=None,
    )
    return _start(p)


def _restart(p: _Pass) -> Then:
    """A new targetVersion mid-release: traffic back to stable, then batch 1 of the new version."""
    old = p.status.target_version
    target, restore = p.world.target, p.status.restore
    p.act(SetWeight(0))
    if target is not None and restore.image and restore.replicas is not None and target.image != restore.image:
        p.act(RestoreStableSelector(), SetStableImage(restore.image, restore.replicas))
    p.event(R.RESTARTED, f"targetVersion changed from {old} to {p.spec.target_version}: restarting at batch 1")
    p.set(history=[], metrics=[])
    p.phase(Phase.INITIALIZING, f"restarting for {p.spec.target_version}")
    p.set(target_version=p.spec.target_version)
    p.again(0)
    return WAIT


def _abort_before_start(p: _Pass) -> Then:
    p.set(target_version=p.spec.target_version)
    p.phase(Phase.ABORTED, "aborted before it started; nothing was changed")
    p.event(R.ABORTED, "aborted before the release started", warning=True)
    return WAIT


def _abort(p: _Pass) -> Then:
    return _roll_back(p, Phase.ABORTED, R.ABORTED, "aborted by annotation")


# --- starting ---------------------------------------------------------------------------------------


def _invalid(p: _Pass, message: str, *, reason: str = R.INVALID_SPEC) -> Then:
    if p.status.phase != Phase.INVALID_SPEC or p.status.message != message:
        p.event(reason, message, warning=True)
    p.set(target_version=p.spec.target_version)
    p.phase(Phase.INVALID_SPEC, message)
    p.again(INVALID_POLL)
    return WAIT


def _resolve_target(p: _Pass) -> Workload | str:
    """The one Deployment the spec names, or why there is none (naming the field)."""
    spec, found = p.spec, p.world.candidates
    if not found:
        if spec.target_ref:
            return f"spec.targetRef.name: Deployment {spec.target_ref.name!r} not found"
        return f"spec.appName: no Deployment is labelled app={spec.app_name}"
    if len(found) > 1:
        names = ", ".join(sorted(w.name for w in found))
        return (
            f"spec.appName: {len(found)} Deployments are labelled app={spec.app_name} ({names}); "
            "use targetRef to pick one"
        )
    target = found[0]
    if spec.container and spec.container not in target.containers:
        return f"spec.container: Deployment {target.name!r} has no container {spec.container!r}"
    return target


def _start(p: _Pass) -> Then:
    """No release under way (or one that could not start): check everything, then start batch 1."""
    spec, world = p.spec, p.world
    target = _resolve_target(p)
    if isinstance(target, str):
        return _invalid(p, target)
    if world.canary is not None and world.own_canary is None:
        return _invalid(
            p,
            f"Deployment {world.canary.name!r} exists and is not owned by this release; rename or delete it",
            reason=R.CANARY_CONFLICT,
        )
    if world.routing_error:
        return _invalid(p, world.routing_error, reason=R.ROUTING_ERROR)
    restore = p.status.restore
    replicas = restore.replicas if restore.replicas is not None else target.replicas
    try:
        steps = p.steps(replicas)
    except PlanError as err:
        return _invalid(p, str(err))
    original_image = restore.image or target.image
    image = target_image(original_image, spec.target_version)
    if image == original_image and world.canary is None:
        p.set(
            target_version=spec.target_version,
            stable_version=version_of(original_image),
            target_name=target.name,
            current_batch=0,
            total_batches=0,
            canary_weight=0,
            canary_replicas=0,
            stable_replicas=target.replicas,
        )
        p.phase(Phase.SUCCEEDED, f"{target.name} already runs {image}")
        p.event(R.ALREADY_AT_TARGET, f"{target.name} already runs {image}; nothing to release")
        return WAIT
    if _wait_to_start(p) is WAIT:
        return WAIT
    if not target.template_hash:
        # The Deployment controller has not labelled a ReplicaSet yet; look again shortly.
        p.set(target_version=spec.target_version, target_name=target.name)
        p.phase(Phase.INITIALIZING, f"waiting for the ReplicaSet of {target.name}")
        p.again(1.0)
        return WAIT
    p.set(
        target_version=spec.target_version,
        stable_version=version_of(original_image),
        target_name=target.name,
        stable_pod_template_hash=p.status.stable_pod_template_hash or target.template_hash,
        restore=Restore(replicas=replicas, image=original_image),
        current_batch=1,
        total_batches=len(steps),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=target.replicas,
        batch_started_at=p.now,
        batch_ready_at=None,
        next_check_at=None,
        approval_expires_at=None,
        metrics=[],
        batch_state=BatchState.UPSCALING,
    )
    p.phase(Phase.PROGRESSING, f"batch 1/{len(steps)}: starting the canary")
    p.history(1, started_at=p.now)
    p.event(
        R.RELEASE_STARTED,
        f"releasing {image} to {target.name} in {len(steps)} batches (stable {version_of(original_image)})",
    )
    # The routing objects (canary Service/Ingress, stable narrowing) come before any canary pod, so the
    # stable backend never sends traffic to a canary that copied its labels.
    p.act(PrepareRouting())
    return GO_ON


# --- governance: what a release waits for before a batch starts ------------------------------------


def _rules(p: _Pass) -> Rules:
    """The release's own windows and freezes, and those of the policies that govern it."""
    spec = p.spec
    return p.world.rules.plus(Source(SPEC, tuple(spec.windows or ()), tuple(spec.freezes or ())))


def _wait_to_start(p: _Pass) -> Then:
    """Before batch 1: the releases of ``spec.after`` done, a release window open, a slot of the queue
    taken (in this order: a slot is taken only by a release that can use it). GO_ON when all are there."""
    world = p.world
    if world.cycle:
        return _invalid(p, "spec.after: a cycle of releases waiting for each other: " + " -> ".join(world.cycle))
    for pred in world.predecessors:
        if pred.succeeded:
            continue
        if not pred.found:
            why = f"waiting for GreyRelease {pred.name!r} to succeed (it does not exist)"
        elif pred.failed:
            why = f"waiting for GreyRelease {pred.name!r}, which ended {pred.phase}: retry or fix it first"
        else:
            why = f"waiting for GreyRelease {pred.name!r} to succeed (now {pred.phase or 'not started'})"
        return _waiting(p, why, None)
    hold = _rules(p).hold(p.now)
    if hold is not None:
        return _waiting(p, hold.message, hold.until)
    queue = world.queue
    if queue is None or queue.held:
        return GO_ON
    if queue.may_take():
        p.act(TakeSlot(queue.lease, queue.limit, queue.scope, p.now, queue.stale))
        return GO_ON
    position = queue.ahead + 1
    message = f"position {position} in the queue of {queue.scope} (at most {queue.limit} progressing)"
    if p.status.phase != Phase.QUEUED:
        p.event(R.QUEUED, message)
    p.set(target_version=p.spec.target_version, queue_position=position, batch_state=None)
    p.phase(Phase.QUEUED, message)
    # Woken when a slot frees; the poll is only the safety net.
    p.again(INVALID_POLL)
    return WAIT


def _waiting(p: _Pass, message: str, until: datetime | None) -> Then:
    """Waiting before batch 1 (or before a new version's batch 1)."""
    p.set(target_version=p.spec.target_version)
    return _wait(p, message, until, state=None)


def _hold_between(p: _Pass, b: _Batch, hold: Hold) -> Then:
    """The batch passed; the next one waits for a release window (or a freeze's end). The canary keeps
    this batch's pods and traffic meanwhile."""
    k, n = b.step.number, len(b.steps)
    p.set(next_check_at=None, approval_expires_at=None)
    return _wait(p, f"{b.label} passed; batch {k + 1}/{n} is {hold.message}", hold.until, state=BatchState.DONE)


def _wait(p: _Pass, message: str, until: datetime | None, *, state: BatchState | None) -> Then:
    """Waiting, until ``until`` (a window's opening, a freeze's end) or until woken (a predecessor's
    change; without ``until``, a poll as the safety net). Nothing is written while nothing changes."""
    if p.status.phase != Phase.WAITING or p.status.message != message:
        p.event(R.WAITING, message)
    p.set(batch_state=state)
    p.phase(Phase.WAITING, message)
    if until is not None:
        p.at(until)
    else:
        p.again(INVALID_POLL)
    return WAIT


def _between(p: _Pass, b: _Batch) -> Then:
    """Done (Waiting, or Progressing after a pause): the batch passed; start the next one once a window
    is open. ``promote=full`` is never held; ``promote=next`` is the approval the batch already had."""
    promote = p.world.annotations.get(PROMOTE_ANNOTATION, "").strip().lower()
    if PROMOTE_ANNOTATION in p.world.annotations:
        p.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        if promote == "full":
            p.set(last_promotion=f"full at {b.label} {fmt_time(p.now)}")
            p.event(R.PROMOTED, f"promote=full at {b.label}")
            return _start_promotion(p, len(b.steps))
        p.event(
            R.WAITING,
            f"ignored greyrelease.io/promote={promote!r}: {b.label} passed already; the next "
            "batch waits for its release window (promote=full goes on at once)",
            warning=True,
        )
    hold = _rules(p).hold(p.now)
    if hold is not None:
        return _hold_between(p, b, hold)
    return _advance(p, b)


# --- a batch ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    """The current batch, resolved against the target."""

    target: Workload
    steps: list[Step]
    step: Step
    image: str  # the target version's image

    @property
    def label(self) -> str:
        return f"batch {self.step.number}/{len(self.steps)}"


def _pause(p: _Pass, b: _Batch) -> Then:
    if p.status.batch_state == BatchState.WAITING_FOR_APPROVAL:
        # Paused, it waits for the resume first; the wait for approval is announced again after it.
        p.set(batch_state=BatchState.VERIFYING)
    p.phase(Phase.PAUSED, f"{b.label}: paused")
    p.event(R.PAUSED, f"paused at {b.label}")
    return WAIT


def _on_pause(p: _Pass, b: _Batch) -> Then:
    """Paused: nothing moves until the pause is lifted; then the batch goes on from where it was."""
    if _paused(p.spec, p.world):
        return WAIT
    p.phase(Phase.PROGRESSING, f"{b.label}: resumed")
    p.event(R.RESUMED, f"resumed at {b.label}")
    if p.status.batch_state == BatchState.UPSCALING:
        # The deadline measures progress, and nothing was asked to progress while paused.
        p.set(batch_started_at=p.now)
    p.again(0)
    return WAIT


def _upscale(p: _Pass, b: _Batch) -> Then:
    """Upscaling: grow the canary to the batch's size; once it is ready, move the traffic (live)."""
    st, step, target = p.status, b.step, b.target
    k = step.number
    canary = p.world.canary
    if canary is None or canary.deleting or not canary.rolled_out(step.canary_replicas, b.image):
        have = 0 if canary is None or canary.image != b.image else min(canary.ready, canary.updated)
        deadline = p.deadline(st.batch_started_at)
        if p.now >= deadline:
            return _deadline_passed(p, f"{b.label}: {have}/{step.canary_replicas} canary pods ready")
        # Until the new canary pods are ready the stable keeps the size of the batch before, so ready
        # pods never fall below what the user asked for.
        stable_before = b.steps[k - 2].stable_replicas if k > 1 else st.restore.replicas or step.stable_replicas
        p.act(EnsureCanary(replicas=step.canary_replicas, image=b.image, version=p.spec.target_version))
        if target.replicas != stable_before:
            p.act(ScaleStable(stable_before))
        # The message does not count ready pods: it would cost a status write per pod.
        p.set(message=f"{b.label}: waiting for {step.canary_replicas} canary pods to be ready")
        p.at(min(deadline, p.now + timedelta(seconds=CONVERGE_POLL)))
        return WAIT
    serving = p.world.canary_endpoints
    if serving is not None and serving < step.canary_replicas and (step.weight or step.header_match):
        # Ready pods are not yet endpoints: the EndpointSlice controller lists them a moment later, and
        # a proxy answers 503 for the share it sends to a Service with none.
        deadline = p.deadline(st.batch_started_at)
        if p.now >= deadline:
            return _deadline_passed(p, f"{b.label}: the canary Service lists {serving}/{step.canary_replicas} pods")
        p.set(message=f"{b.label}: waiting for the canary Service to list {step.canary_replicas} ready pods")
        p.at(min(deadline, p.now + timedelta(seconds=ENDPOINTS_POLL)))
        return WAIT
    return _go_live(p, b)


def _go_live(p: _Pass, b: _Batch) -> Then:
    """The canary is ready: the stable takes the batch's size and the canary the batch's traffic."""
    step, target = b.step, b.target
    if target.replicas > step.stable_replicas and p.recorded.restore.replicas is None:
        # The stable's size before the release is known only from the status once that is written. A
        # controller killed after shrinking the stable but before the write would, on resuming, take the
        # shrunk size for the original and promote to it: the first shrink waits for the next pass.
        p.again(0)
        return WAIT
    if target.replicas != step.stable_replicas:
        p.act(ScaleStable(step.stable_replicas))
    p.act(SetWeight(step.weight, step.header_match))
    pause = float(step.pause) if isinstance(step.pause, (int, float)) else None
    next_check = p.now + timedelta(seconds=pause) if pause is not None else None
    manual = step.pause == MANUAL
    expires = p.now + timedelta(seconds=step.approval.timeout) if manual and step.approval else None
    p.set(
        batch_state=BatchState.WAITING_FOR_APPROVAL if manual else BatchState.VERIFYING,
        batch_ready_at=p.now,
        next_check_at=next_check,
        approval_expires_at=expires,
        canary_weight=step.weight,
        canary_replicas=step.canary_replicas,
        stable_replicas=step.stable_replicas,
    )
    p.history(step.number, canary_replicas=step.canary_replicas, weight=step.weight, ready_at=p.now)
    p.event(R.BATCH_READY, f"{b.label}: {step.canary_replicas} canary pods ready, weight {step.weight}%")
    p.set(message=_hold_message(b, next_check, expires))
    if expires is not None:
        p.at(expires)
    if p.spec.analysis is not None:
        # The first check is due one interval after the batch went live, also within a long or manual pause:
        # waking only at the pause's end would let a bad canary serve, unjudged, for the whole pause.
        p.again(analysis_interval(p.spec.analysis))
    if manual:
        p.event(R.WAITING_FOR_APPROVAL, f"{b.label} waits for greyrelease.io/promote=next")
        return WAIT
    if pause is not None:
        p.again(pause)
        return WAIT
    if p.spec.analysis is None:
        return GO_ON  # neither pause nor analysis: the batch is done the moment it is live
    p.again(0)
    return WAIT


def _hold_message(b: _Batch, next_check: datetime | None, expires: datetime | None = None) -> str:
    step = b.step
    if step.pause == MANUAL:
        until = ""
        if expires is not None and step.approval is not None:
            until = f" until {fmt_time(expires)}, then {step.approval.on_timeout}"
        return f"{b.label}: weight {step.weight}%, {WAITING_TEXT}{until} (annotate greyrelease.io/promote=next)"
    if next_check:
        return f"{b.label}: weight {step.weight}%, pausing until {fmt_time(next_check)}"
    return f"{b.label}: weight {step.weight}%"


def _verify(p: _Pass, b: _Batch) -> Then:
    """Verifying (or WaitingForApproval): the batch is live; wait for its pause, its gate or an
    approval, then move on."""
    st, step = p.status, b.step
    k, n = step.number, len(b.steps)
    gate = _gate(p, b)
    if gate is not None and gate.failed:
        return _roll_back(p, Phase.FAILED, R.ANALYSIS_FAILED, f"{b.label}: {gate.message}")

    promote = p.world.annotations.get(PROMOTE_ANNOTATION, "").strip().lower()
    if promote in ("next", "full"):
        # Consumed once: the annotation is removed before the step it approved is recorded, so a
        # controller that dies in between drops the approval rather than applying it twice.
        p.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        p.set(last_promotion=f"{promote} at {b.label} {fmt_time(p.now)}")
        p.event(R.PROMOTED, f"promote={promote} at {b.label}")
        if promote == "full":
            p.history(k, finished_at=p.now, result="promoted (full)")
            return _start_promotion(p, n)
        return _next_batch(p, b, result="promoted")
    if PROMOTE_ANNOTATION in p.world.annotations:
        p.act(RemoveAnnotations((PROMOTE_ANNOTATION,)))
        p.event(R.INVALID_SPEC, f"ignored greyrelease.io/promote={promote!r}: use next or full", warning=True)

    if step.pause == MANUAL:
        expires = None
        if step.approval is not None:
            # Recorded when the batch went live; a timeout added to the spec meanwhile counts from then too.
            expires = st.approval_expires_at or (st.batch_ready_at or p.now) + timedelta(seconds=step.approval.timeout)
            if p.now >= expires:
                return _approval_expired(p, b, step.approval)
            p.at(expires)
        p.set(
            batch_state=BatchState.WAITING_FOR_APPROVAL,
            approval_expires_at=expires,
            message=_hold_message(b, None, expires),
        )
        return WAIT
    if st.next_check_at is not None and p.now < st.next_check_at:
        p.at(st.next_check_at)
        return WAIT
    if gate is not None and not gate.passed:
        # No verdict yet (no data, or too few passing checks): wait, but not past the progress deadline.
        deadline = p.deadline(st.next_check_at or st.batch_ready_at)
        if p.now >= deadline:
            return _roll_back(
                p,
                Phase.FAILED,
                R.ANALYSIS_FAILED,
                f"{b.label}: no passing analysis within {p.spec.progress_deadline_seconds}s "
                f"(progressDeadlineSeconds): {gate.message}",
            )
        p.set(message=f"{b.label}: weight {step.weight}%, waiting for the analysis: {gate.message}")
        p.at(deadline)
        return WAIT
    return _next_batch(p, b, result="passed")


def _approval_expired(p: _Pass, b: _Batch, approval: Approval) -> Then:
    """Nobody approved the batch within ``approval.timeout``: abort, or go on as if approved."""
    waited = f"{b.label}: no approval within {approval.timeout:g}s (approval.timeout)"
    if approval.on_timeout == "abort":
        return _roll_back(p, Phase.ABORTED, R.APPROVAL_EXPIRED, f"{waited}: aborted")
    p.event(R.APPROVAL_EXPIRED, f"{waited}: going on (onTimeout: promote)")
    return _next_batch(p, b, result="approval expired, promoted")


def _canary_lost(p: _Pass, b: _Batch) -> Then:
    """The canary of a live batch was deleted (by someone else): the batch is not live any more.

    Traffic goes back to what it was before this batch, and the batch is grown again at once (the stable
    keeps the previous batch's size meanwhile, see :func:`_upscale`) rather than at the next batch, so
    the app never runs short of pods while a pause runs. Once the new canary is ready the batch goes live
    again with a full pause and a fresh gate; its history record is the same one.
    """
    k = b.step.number
    before = b.steps[k - 2] if k > 1 else None
    p.act(SetWeight(before.weight if before else 0, before.header_match if before else None))
    p.set(
        batch_state=BatchState.UPSCALING,
        batch_started_at=p.now,
        batch_ready_at=None,
        next_check_at=None,
        approval_expires_at=None,
        canary_weight=before.weight if before else 0,
        metrics=[_fresh(m) for m in p.status.metrics],
    )
    p.event(R.CANARY_LOST, f"{b.label}: the canary Deployment was deleted; recreating it", warning=True)
    return GO_ON


def _fresh(m: MetricStatus) -> MetricStatus:
    """A metric's status for a new batch: the last values stay visible, the counts start again."""
    return m.model_copy(update={"successes": 0, "failures": 0, "consecutive_errors": 0})


def _gate(p: _Pass, b: _Batch) -> Verdict | None:
    """Fold this pass's metric checks into the status and judge the batch; None without analysis."""
    analysis = p.spec.analysis
    if analysis is None:
        return None
    metrics = {m.name: m for m in p.status.metrics}
    by_name = {m.name: m for m in analysis.metrics}
    for check in p.world.checks:
        metric = by_name.get(check.metric)
        if metric is None:
            continue
        folded = fold(metric, metrics.get(metric.name), check, p.now)
        metrics[metric.name] = folded
        if folded.verdict in (CheckVerdict.FAIL, CheckVerdict.ERROR):
            p.event(R.METRIC_CHECK_FAILED, f"{b.label}: metric {metric.name}: {folded.message}", warning=True)
    ordered = [metrics[m.name] for m in analysis.metrics if m.name in metrics]
    p.set(metrics=ordered)
    p.at(next_check_at(analysis, ordered, p.status.batch_ready_at or p.now))
    return judge_metrics(analysis, ordered)


def _next_batch(p: _Pass, b: _Batch, *, result: str) -> Then:
    """The batch is done: on to the next one (Upscaling) once a release window lets it start, or to the
    promotion after the last (never held: the last batch already runs every replica on all the traffic)."""
    k, n = b.step.number, len(b.steps)
    p.history(k, finished_at=p.now, result=result)
    if k >= n:
        return _start_promotion(p, n)
    hold = _rules(p).hold(p.now)
    if hold is not None:
        return _hold_between(p, b, hold)
    return _advance(p, b)


def _advance(p: _Pass, b: _Batch) -> Then:
    """Batch k+1 starts: the canary grows to its size (Upscaling)."""
    k, n = b.step.number, len(b.steps)
    result = next((r.result for r in reversed(p.status.history) if r.batch == k), "passed") or "passed"
    p.set(
        batch_state=BatchState.UPSCALING,
        current_batch=k + 1,
        batch_started_at=p.now,
        batch_ready_at=None,
        next_check_at=None,
        approval_expires_at=None,
        # The last values stay visible; the counts start again, since only checks of the new batch count.
        metrics=[_fresh(m) for m in p.status.metrics],
    )
    p.history(k + 1, started_at=p.now)
    p.phase(Phase.PROGRESSING, f"batch {k + 1}/{n}: growing the canary")
    p.event(R.BATCH_PASSED, f"batch {k}/{n} {result}; starting batch {k + 1}/{n}")
    return GO_ON


# --- promotion --------------------------------------------------------------------------------------


def _start_promotion(p: _Pass, n: int) -> Then:
    p.set(batch_ready_at=None, next_check_at=None, approval_expires_at=None)
    p.phase(Phase.PROMOTING, "rolling the stable Deployment to the target version")
    p.event(R.PROMOTING, f"all {n} batches passed; promoting the stable Deployment")
    return GO_ON


def _promote(p: _Pass, target: Workload) -> Then:
    """Promoting: the stable Deployment rolls to the target version, then the canary goes."""
    st, spec = p.status, p.spec
    assert st.restore.replicas is not None and st.restore.image is not None
    replicas = st.restore.replicas
    image = target_image(st.restore.image, spec.target_version)
    waiting = f"promoting: waiting for {replicas} stable pods ready on {version_of(image)}"
    if not target.rolled_out(replicas, image):
        if target.image != image and target.settling():
            # The last batch scaled the stable down (Service mode: to nothing, all traffic on the
            # canary). Its old pods go before the new image comes: given both at once, the Deployment
            # would keep old pods serving while it rolls.
            # (The message is the one the next step shows too: no status write just for this wait.)
            p.set(message=waiting)
            p.at(p.now + timedelta(seconds=CONVERGE_POLL))
            return WAIT
        if target.image != image or target.replicas != replicas:
            # The narrowing of the stable Service goes first: the stable's new pods must get traffic.
            p.act(RestoreStableSelector(), SetStableImage(image, replicas))
        deadline = p.deadline(st.phase_started_at)
        if p.now >= deadline:
            return _deadline_passed(p, f"promotion: {target.ready}/{replicas} stable pods ready on {image}")
        p.set(message=waiting)
        p.at(min(deadline, p.now + timedelta(seconds=CONVERGE_POLL)))
        return WAIT
    if p.world.canary is not None:
        # Traffic back to the (now promoted) stable, then the canary goes; the routing is reset only
        # once the canary's pods are gone. In Service mode there is no weight to move: weight 0 would
        # narrow the Service to the old stable ReplicaSet, which no longer has pods.
        if _weighted(spec):
            p.act(SetWeight(0))
        p.act(DeleteCanary())
        p.set(message="promoted: removing the canary", canary_weight=0)
        p.again(CONVERGE_POLL)
        return WAIT
    p.act(ResetRouting())
    p.set(
        stable_version=version_of(image),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=replicas,
        restore=Restore(),
    )
    p.phase(Phase.SUCCEEDED, f"{st.target_name} runs {image} on {replicas} replicas")
    p.event(R.SUCCEEDED, f"released {image} to {st.target_name}")
    return WAIT


# --- rollback and deletion --------------------------------------------------------------------------


def _deadline_passed(p: _Pass, what: str) -> Then:
    """``progressDeadlineSeconds`` passed before ``what`` got better: the release fails."""
    seconds = p.spec.progress_deadline_seconds
    return _roll_back(p, Phase.FAILED, R.PROGRESS_DEADLINE, f"{what} after {seconds}s (progressDeadlineSeconds)")


def _roll_back(p: _Pass, end: Phase, reason: str, message: str) -> Then:
    """Traffic to stable at once: the pass that decides it writes the weight, its Event and the status,
    nothing else. Putting the stable back and removing the canary follow in the next pass, which is not
    urgent: when many releases roll back at once (a burst of aborts), every one of them has its traffic
    cut before the API server is kept busy restoring capacity."""
    p.act(SetWeight(0))
    p.set(canary_weight=0, end_phase=end)
    p.phase(Phase.ROLLING_BACK, message)
    p.event(reason, message, warning=True)
    p.again(0)
    return WAIT


def _restore(p: _Pass, since: datetime) -> bool:
    """Put the app back as it was before the release: no traffic to the canary, the stable's image and
    size, then (once the stable is ready, or ``progressDeadlineSeconds`` after ``since``) the canary
    removed, then the routing reset. True once all is back."""
    st, world = p.status, p.world
    p.act(SetWeight(0))
    target, restore = world.target, st.restore
    stable_ready = True
    if target is not None and restore.image and restore.replicas is not None:
        if target.image != restore.image or target.replicas != restore.replicas:
            p.act(SetStableImage(restore.image, restore.replicas))
        stable_ready = target.rolled_out(restore.replicas, restore.image)
    deadline = p.deadline(since)
    if not stable_ready and p.now < deadline:
        # Keep the canary's pods until the stable can carry the load again; they get no traffic.
        p.at(min(deadline, p.now + timedelta(seconds=CONVERGE_POLL)))
        return False
    if world.own_canary is not None:
        p.act(DeleteCanary())
        p.again(CONVERGE_POLL)
        return False
    p.act(ResetRouting())
    return True


def _rolling_back(p: _Pass) -> Then:
    """RollingBack: the app restored, then the phase the rollback was for (Aborted or Failed)."""
    st = p.status
    target = p.world.target
    if not _restore(p, st.phase_started_at or p.now):
        return WAIT
    p.set(
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=st.restore.replicas or (target.replicas if target else 0),
        restore=Restore(),
        batch_ready_at=None,
        next_check_at=None,
        approval_expires_at=None,
        end_phase=None,
    )
    p.phase(st.end_phase or Phase.FAILED, f"{st.message}; stable {st.stable_version} serves all traffic")
    p.event(R.ROLLED_BACK, f"rolled back: all traffic on the stable version {st.stable_version}")
    return WAIT


def _delete(p: _Pass) -> None:
    """The GreyRelease is being deleted: leave the app as it was before the release began."""
    if p.status.restore.replicas is None and p.world.canary is None:
        p.done = True  # nothing was changed
        return
    if _restore(p, p.world.deletion_started or p.now):
        p.event(R.CLEANED_UP, "release deleted: stable restored, canary removed")
        p.set(restore=Restore())
        p.done = True


def _finished(p: _Pass) -> Then:
    """Succeeded, Aborted, Failed: nothing to do until the spec or an annotation changes."""
    return WAIT


# --- what a handler needs, checked before it runs ---------------------------------------------------


@dataclass(frozen=True)
class Plain:
    """A state whose handler needs nothing resolved first (it checks what it needs itself: starting is
    checking everything)."""

    run: Callable[[_Pass], Then]

    def __call__(self, p: _Pass) -> Then:
        return self.run(p)


@dataclass(frozen=True)
class NeedsTarget:
    """A state whose handler needs the target Deployment: when it is gone, the release rolls back instead
    (TargetDeleted)."""

    run: Callable[[_Pass, Workload], Then]

    def __call__(self, p: _Pass) -> Then:
        target = _target(p)
        return target if isinstance(target, Then) else self.run(p, target)


@dataclass(frozen=True)
class NeedsBatch:
    """A state whose handler needs the current batch (:class:`_Batch`): the target there (else, as for
    :class:`NeedsTarget`, a rollback), the canary Deployment ours if there is one (else a rollback:
    CanaryConflict), and batches that fit the spec as it is now (else InvalidSpec).

    ``moves``: the handler may move the batch on, so a pause asked for pauses the release instead, and the
    batch numbers in the status follow the plan first (the spec may have been edited). ``live``: the
    batch has its traffic, so it needs its canary too; when the canary was deleted, the batch is grown
    again instead (CanaryLost)."""

    run: Callable[[_Pass, _Batch], Then]
    moves: bool = True
    live: bool = False

    def __call__(self, p: _Pass) -> Then:
        b = _batch(p)
        if isinstance(b, Then):
            return b
        if self.moves:
            if _paused(p.spec, p.world):
                return _pause(p, b)
            _count(p, b)
        if self.live:
            canary = p.world.canary
            if canary is None or canary.deleting:
                return _canary_lost(p, b)
        return self.run(p, b)


State = Plain | NeedsTarget | NeedsBatch


def _target(p: _Pass) -> Workload | Then:
    """The target Deployment; when it is gone, the rollback planned instead."""
    target = p.world.target
    if target is not None:
        return target
    return _roll_back(p, Phase.FAILED, R.TARGET_DELETED, f"the target Deployment {p.status.target_name!r} is gone")


def _batch(p: _Pass) -> _Batch | Then:
    """The current batch; or, when it cannot go on (the target gone, the canary not ours, a spec that
    does not fit), the rollback or InvalidSpec planned instead."""
    st = p.status
    target = _target(p)
    if isinstance(target, Then):
        return target
    canary = p.world.canary
    if canary is not None and p.world.own_canary is None:
        return _roll_back(
            p, Phase.FAILED, R.CANARY_CONFLICT, f"Deployment {canary.name!r} is not owned by this release"
        )
    assert st.restore.replicas is not None and st.restore.image is not None
    try:
        steps = p.steps(st.restore.replicas)
    except PlanError as err:
        return _invalid(p, str(err))
    k = min(max(st.current_batch, 1), len(steps))
    return _Batch(target, steps, steps[k - 1], target_image(st.restore.image, p.spec.target_version))


def _count(p: _Pass, b: _Batch) -> None:
    """The batch numbers in the status follow the plan (the spec may have been edited)."""
    if (p.status.total_batches, p.status.current_batch) != (len(b.steps), b.step.number):
        p.set(total_batches=len(b.steps), current_batch=b.step.number)


#: The handler of each (phase, batchState), and what it needs. A state missing here is a bug (KeyError).
HANDLERS: dict[tuple[Phase | None, BatchState | None], State] = {
    (None, None): Plain(_start),
    (Phase.INVALID_SPEC, None): Plain(_start),
    (Phase.INITIALIZING, None): Plain(_start),
    (Phase.PROGRESSING, BatchState.UPSCALING): NeedsBatch(_upscale),
    (Phase.PROGRESSING, BatchState.VERIFYING): NeedsBatch(_verify, live=True),
    (Phase.PROGRESSING, BatchState.WAITING_FOR_APPROVAL): NeedsBatch(_verify, live=True),
    (Phase.PROGRESSING, BatchState.DONE): NeedsBatch(_between, live=True),
    **{(Phase.PAUSED, state): NeedsBatch(_on_pause, moves=False) for state in BatchState},
    (Phase.WAITING, None): Plain(_start),
    (Phase.WAITING, BatchState.DONE): NeedsBatch(_between, live=True),
    (Phase.QUEUED, None): Plain(_start),
    (Phase.PROMOTING, None): NeedsTarget(_promote),
    (Phase.ROLLING_BACK, None): Plain(_rolling_back),
    (Phase.SUCCEEDED, None): Plain(_finished),
    (Phase.ABORTED, None): Plain(_finished),
    (Phase.FAILED, None): Plain(_finished),
}


# --- conditions -------------------------------------------------------------------------------------


def _waiting_for_approval(status: GreyReleaseStatus) -> bool:
    return status.phase == Phase.PROGRESSING and status.batch_state == BatchState.WAITING_FOR_APPROVAL


def _conditions(status: GreyReleaseStatus, now: datetime) -> list[Condition]:
    phase = status.phase
    reason = phase.value if phase else ""
    wanted: list[tuple[str, bool]] = [
        (R.COND_PROGRESSING, phase in (Phase.INITIALIZING, Phase.PROGRESSING, Phase.PROMOTING, Phase.ROLLING_BACK)),
        (R.COND_PAUSED, phase == Phase.PAUSED or _waiting_for_approval(status)),
        (R.COND_COMPLETED, phase in TERMINAL_PHASES),
        (R.COND_HEALTHY, phase not in (Phase.ROLLING_BACK, Phase.ABORTED, Phase.FAILED, Phase.INVALID_SPEC)),
        (R.COND_INVALID_SPEC, phase == Phase.INVALID_SPEC),
    ]
    old = {c.type: c for c in status.conditions}
    out: list[Condition] = []
    for ctype, true in wanted:
        value = "True" if true else "False"
        prev = old.get(ctype)
        message = status.message if true else ""
        if prev is not None and prev.status == value:
            # Most passes change nothing here; a copy of each condition was 4 % of the CPU at N = 500.
            same = prev.reason == reason and prev.message == message
            out.append(prev if same else prev.model_copy(update={"reason": reason, "message": message}))
        else:
            out.append(Condition(type=ctype, status=value, reason=reason, message=message, last_transition_time=now))
    return out
