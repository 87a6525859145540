"""One pass of :func:`~greyrelease.planner.machine.decide`: the status being built, the world projected
forward, what is planned (:class:`Pass`); what a handler does after its state (:class:`Then`); the current
batch as the handlers get it (:class:`Batch`); and the conditions the status ends with."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from greyrelease.api.release import (
    BATCH_PHASES,
    PAUSE_ANNOTATION,
    TERMINAL_PHASES,
    BatchRecord,
    BatchState,
    BatchTimes,
    Condition,
    ContainerImage,
    GreyReleaseSpec,
    GreyReleaseStatus,
    LastRelease,
    MetricStatus,
    Outcome,
    Phase,
    WebhookStatus,
)
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Action, EnsureCanary, Event, Plan, PrepareRouting, Regarding, SetWeight
from greyrelease.planner.batches import Step, expand
from greyrelease.planner.images import label_value, target_image
from greyrelease.planner.observed import HeldCheck, Images, Observed, Workload, project

#: How long to wait for a change before looking again while something converges: only the net under a
#: lost wake-up. Each change of a Deployment the release waits on wakes it, and so does a relist of the
#: Deployments (after a watch too old to resume, when changes came with no event). 30 s, not 10: every
#: release waiting on pods looked again this often, a pass each for nothing, and on a slow cluster those
#: passes were a share of the controller's CPU that grew with the time pods took (bench/README.md,
#: "The net under lost wake-ups").
CONVERGE_POLL = 30.0
#: How often a batch whose canary pods are ready looks again for them among the canary Service's
#: endpoints. Nothing watches EndpointSlices (a cache of every slice in the cluster, for a wait of a
#: fraction of a second once per batch): the release polls, one LIST of the Service's slices a time.
ENDPOINTS_POLL = 0.5
#: How often a release that cannot start (its Deployment is missing) looks again.
INVALID_POLL = 30.0
HISTORY_LIMIT = 20
FALSY = {"false", "no", "0", "n", "off"}


class Then(Enum):
    """What a handler's state does after it: waits (the pass ends) or lets the next state go on."""

    WAIT = "wait"
    GO_ON = "go on"


WAIT, GO_ON = Then.WAIT, Then.GO_ON


@dataclass(frozen=True)
class Batch:
    """The current batch, resolved against the target."""

    target: Workload
    steps: list[Step]
    step: Step
    image: str  # pinned mode: the target version's image
    template: str = ""  # follow mode: the digest of the held template being released

    @property
    def label(self) -> str:
        return f"batch {self.step.number}/{len(self.steps)}"

    def built(self, canary: Workload) -> bool:
        """Whether ``canary`` is built from what this release releases (the image, or the held template)."""
        return canary.source == self.template if self.template else canary.image == self.image

    def ensure_canary(self, replicas: int, version: str) -> EnsureCanary:
        """The action that makes the canary this release's, at ``replicas``."""
        if self.template:
            return EnsureCanary(replicas=replicas, template=self.template)
        return EnsureCanary(replicas=replicas, image=self.image, version=version)


class Pass:
    """One call of :func:`~greyrelease.planner.machine.decide`: the status being built, the world
    projected forward, what is planned."""

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
        self.polling: float | None = None
        self.done = False
        self._steps: tuple[int, list[Step]] | None = None

    @property
    def version(self) -> str:
        """Pinned mode: ``spec.targetVersion``; "" in follow mode, which releases templates, not versions."""
        return self.spec.target_version or ""

    @property
    def follow(self) -> bool:
        """Follow mode: the release of every new template of the Deployment (no targetVersion)."""
        return self.spec.follows

    @property
    def label(self) -> str:
        """Follow mode: the value of the enrolment label ``greyrelease.io/release`` (the release's name)."""
        return label_value(self._world.name) or "release"

    def ended(self, outcome: Outcome, message: str) -> None:
        """The release under way ends so (``status.lastRelease``): what it released, how, why."""
        st = self.status
        if self.follow:
            digest = st.restore.template or (st.held.digest if st.held else "")
            images = list(st.held.images) if st.held and st.held.digest == digest else []
            record = LastRelease(
                outcome=outcome, digest=digest or None, images=images, ended_at=self.now, message=message
            )
        else:
            target = self.world.target
            restored, version = st.restore.image, st.target_version
            image = target_image(restored, version) if restored and version else ""
            container = target.container if target is not None else ""
            images = [ContainerImage(name=container, image=image)] if image and container else []
            record = LastRelease(
                outcome=outcome, version=st.target_version or None, images=images, ended_at=self.now, message=message
            )
        self.set(last_release=record)

    def set(self, **changes: Any) -> None:
        """The status with ``changes``; the same object when it has them already (a pass that changes
        nothing leaves the status it read, which needs no comparison to tell: see ``Reconciler._record``)."""
        status = self.status
        if any(getattr(status, k) != v for k, v in changes.items()):
            self.status = status.model_copy(update=changes)

    def steps(self, replicas: int) -> list[Step]:
        """The batches for a stable of ``replicas`` (computed once a pass: states that follow each other
        in one pass need them again). Raises :class:`~greyrelease.planner.batches.PlanError`."""
        if self._steps is None or self._steps[0] != replicas:
            self._steps = (replicas, expand(self.spec, replicas))
        return self._steps[1]

    def act(self, *actions: Action) -> None:
        self.actions.extend(actions)
        self._unseen.extend(actions)

    def prepare_routing(self) -> None:
        """Plan the routing objects, the stable Service narrowed to the stable ReplicaSet recorded."""
        self.act(PrepareRouting(stable_hash=self.status.stable_pod_template_hash))

    def set_weight(self, weight: int, header_match: dict[str, str] | None = None) -> None:
        """Plan the canary's share of the traffic (weight 0 narrows a Service to the stable ReplicaSet
        recorded)."""
        self.act(SetWeight(weight, header_match, stable_hash=self.status.stable_pod_template_hash))

    @property
    def world(self) -> Observed:
        """What was observed, as the actions planned so far leave it. (Projected when read: most passes
        end with their actions, and nothing reads the world after them.)"""
        if self._unseen:
            for action in self._unseen:
                self._world = project(self._world, action)
            self._unseen.clear()
        return self._world

    def event(self, reason: str, message: str, *, warning: bool = False, about: Workload | None = None) -> None:
        """An Event of this transition, on the release, or ``about`` another object (the target Deployment)."""
        regarding = Regarding(about.name, about.uid) if about is not None else None
        self.events.append(Event("Warning" if warning else "Normal", reason, message, regarding))

    def again(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def at(self, when: datetime) -> None:
        self.again((when - self.now).total_seconds())

    def poll(self, seconds: float) -> None:
        """Look again within ``seconds`` while the release waits on its Deployments, which wake it as they
        change: a net under a lost wake-up, not a time the plan depends on (that is :meth:`at`)."""
        self.polling = seconds if self.polling is None else min(self.polling, seconds)

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

    # The current batch's timers are begun and ended here, and nowhere else.

    def begin_batch(self, number: int) -> None:
        """Batch ``number`` begins (or begins again, its canary lost): Upscaling, its timers counting from
        now, the metrics' counts from zero (their last values stay visible: only checks of this batch
        count for it)."""
        self.set(
            batch_state=BatchState.UPSCALING,
            current_batch=number,
            batch_times=BatchTimes(started_at=self.now),
            metrics=[_fresh(m) for m in self.status.metrics],
            webhooks=[_fresh_webhook(w) for w in self.status.webhooks],
        )

    def end_batch(self) -> None:
        """The last batch is over (the promotion starts, a rollback is done): nothing is timed any more.
        When it began stays, as its number does."""
        self.set(batch_times=BatchTimes(started_at=self.status.batch_times.started_at))

    def times(self, **changes: datetime | None) -> None:
        """The current batch's timers as it goes on (live, its pause set, its approval's deadline)."""
        self.set(batch_times=self.status.batch_times.model_copy(update=changes))

    def build(self, generation: int) -> Plan:
        st = self.status
        if st.phase == Phase.QUEUED:
            batch = f"queued #{st.queue_position}"
        else:
            batch = f"{st.current_batch}/{st.total_batches}" if st.total_batches else ""
        # An idle pass changes none of these: the status is copied only for what changed (bench/README.md,
        # "What an idle pass repeats").
        if st.observed_generation != generation or st.batch != batch:
            st = st.model_copy(update={"observed_generation": generation, "batch": batch})
        conditions = _conditions(st, self.now, self._world.held_check if self.follow else None)
        if len(conditions) != len(st.conditions) or any(
            a is not b for a, b in zip(conditions, st.conditions, strict=True)
        ):
            st = st.model_copy(update={"conditions": conditions})
        return Plan(
            status=st,
            actions=tuple(self.actions),
            events=tuple(self.events),
            requeue_after=_earliest(self.requeue, self.polling),
            polled=self.polling is not None,
            timer_after=self.requeue if self.polling is not None else None,
            done=self.done,
        )


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def paused(spec: GreyReleaseSpec, world: Observed) -> bool:
    """``spec.paused``, or a ``greyrelease.io/pause`` annotation whose value is not false."""
    value = world.annotations.get(PAUSE_ANNOTATION)
    return spec.paused or (value is not None and value.strip().lower() not in FALSY)


def _fresh(m: MetricStatus) -> MetricStatus:
    """A metric's status for a new batch: the last values stay visible, the counts start again."""
    return m.model_copy(update={"successes": 0, "failures": 0, "consecutive_errors": 0})


def _fresh_webhook(w: WebhookStatus) -> WebhookStatus:
    """A webhook's status for a new batch: its last answer stays visible; it counts as not called yet at
    any point of the new batch (even one that begins at the same instant as its last call)."""
    if w.checked_at is None and not (w.successes or w.failures or w.consecutive_errors):
        return w
    return w.model_copy(update={"checked_at": None, "successes": 0, "failures": 0, "consecutive_errors": 0})


def started(status: GreyReleaseStatus) -> bool:
    """Whether the release has changed anything on the cluster (its undo record is kept from then on): a
    pinned release its stable's size, a follow-mode one its routing and canary."""
    return status.restore.replicas is not None or status.restore.template is not None


def container_images(images: Images) -> list[ContainerImage]:
    return [ContainerImage(name=name, image=image) for name, image in images]


def images_text(images: Images | list[ContainerImage]) -> str:
    """``app=app:v2, sidecar=proxy:1`` (the image alone for a single container)."""
    pairs = [(i.name, i.image) if isinstance(i, ContainerImage) else i for i in images]
    if len(pairs) == 1:
        return pairs[0][1]
    return ", ".join(f"{name}={image}" for name, image in pairs)


# --- conditions -------------------------------------------------------------------------------------


def _waiting_for_approval(status: GreyReleaseStatus) -> bool:
    """Waiting for ``greyrelease.io/promote``, or for a confirm webhook's yes."""
    if status.phase != Phase.PROGRESSING:
        return False
    return status.batch_state == BatchState.WAITING_FOR_APPROVAL or bool(status.awaiting_confirmation)


#: kstatus (Flux's health checks, ``kubectl wait``): Reconciling True is InProgress, Stalled True is Failed,
#: neither (with observedGeneration current) is Current. Ready is what people and Argo CD read.
READY_PHASES = frozenset({Phase.SUCCEEDED, Phase.IDLE})
RECONCILING_PHASES = frozenset(
    {
        Phase.INITIALIZING,
        Phase.WAITING,
        Phase.QUEUED,
        Phase.PROGRESSING,
        Phase.PAUSED,
        Phase.PROMOTING,
        Phase.ROLLING_BACK,
    }
)
STALLED_PHASES = frozenset({Phase.ABORTED, Phase.FAILED, Phase.INVALID_SPEC})


def _conditions(status: GreyReleaseStatus, now: datetime, held: HeldCheck | None = None) -> list[Condition]:
    """The conditions of the phase, and in follow mode ``Held`` (the hold's self-test, ``held``): each
    copied only when it changes, its lastTransitionTime only when its status does."""
    phase = status.phase
    reason = phase.value if phase else ""
    wanted: list[tuple[str, bool]] = [
        (R.COND_PROGRESSING, phase in (Phase.INITIALIZING, Phase.PROGRESSING, Phase.PROMOTING, Phase.ROLLING_BACK)),
        (R.COND_PAUSED, phase == Phase.PAUSED or _waiting_for_approval(status)),
        (R.COND_COMPLETED, phase in TERMINAL_PHASES),
        (R.COND_HEALTHY, phase not in (Phase.ROLLING_BACK, Phase.ABORTED, Phase.FAILED, Phase.INVALID_SPEC)),
        (R.COND_INVALID_SPEC, phase == Phase.INVALID_SPEC),
        (R.COND_READY, phase in READY_PHASES),
        (R.COND_RECONCILING, phase in RECONCILING_PHASES),
        (R.COND_STALLED, phase in STALLED_PHASES),
    ]
    old = {c.type: c for c in status.conditions}
    out: list[Condition] = []
    for ctype, true in wanted:
        value = "True" if true else "False"
        prev = old.get(ctype)
        message = status.message if true else ""
        if prev is not None and prev.status == value:
            # Most passes change nothing here: copied only when changed (bench/README.md, "Conditions copied
            # only when they change").
            same = prev.reason == reason and prev.message == message
            out.append(prev if same else prev.model_copy(update={"reason": reason, "message": message}))
        else:
            out.append(Condition(type=ctype, status=value, reason=reason, message=message, last_transition_time=now))
    if held is not None:
        prev = old.get(R.COND_HELD)
        if held.status is None:  # not tested yet by this process: what the status says stays
            if prev is not None:
                out.append(prev)
        elif prev is not None and prev.status == held.status:
            same = prev.reason == held.reason and prev.message == held.message
            out.append(prev if same else prev.model_copy(update={"reason": held.reason, "message": held.message}))
        else:
            out.append(
                Condition(
                    type=R.COND_HELD,
                    status=held.status,
                    reason=held.reason,
                    message=held.message,
                    last_transition_time=now,
                )
            )
    return out
