"""The release state machine: a purely computational function with no side effects.

``decide(spec, status, observed, now)`` looks at what the release has recorded (``status``) and at what
the cluster looks like now (``observed``) and returns a :class:`Plan`: the actions that converge the
cluster, the new status, the events to post, and when to look again. The caller applies the actions in
order, then writes the status; a controller killed between the two plans again from the old status, and
every action is idempotent, so no batch is skipped or repeated.

The state is the phase and, while a batch is under way (Progressing, Paused; Waiting between batches), its
``batchState``::

    (start) ──> Progressing: batch 1..N ─────────────────────────────────────────> Promoting ──> Succeeded
                     Upscaling ──> Verifying ─────────────(pause over, gate passed)─┐
                         ▲    └──> WaitingForApproval ───(batch k approved)─────────┤
                         │                                       (no window open: Waiting, Done)
                         └──────────────── batch k+1 <──────────────────────────────┘ (after batch N: Promoting)
    Progressing <──(pause / resume)──> Paused          promote=full: Promoting at once
    Initializing, Progressing, Paused, Promoting ──(abort, failed gate, deadline, target gone)──> RollingBack
    RollingBack ──> Aborted | Failed ──(retry, or a new targetVersion)──> start again
    a new targetVersion mid-release: traffic back to the stable ──> Initializing ──> batch 1 of the new version

An approval of batch k (``greyrelease.io/promote``) ends its pause, manual or the rest of a timed one; a
failed gate still rolls back first. Pinned mode: ``promote=next`` (or ``promote=k``) approves the batch
live now and is consumed (removed before what it did is recorded). Follow mode: ``promote: "k"`` approves
batch k and no other, waiting for it when written ahead; ``next`` is the batch current when first seen; the
annotation is never removed, each value honoured once and recorded in ``status.requests`` and
``status.approvals`` (:mod:`.requests`).

Follow mode (no targetVersion: every new pod template of the Deployment, held at admission, is released)::

    (start: enrol) ──> Idle ──(a held template that differs from the stable's)──> Waiting | Queued | batch 1
    batch 1..N (a canary from the held template, sized from the stable's replicas now) ──> Promoting (the
        hold released; the Deployment controller rolls; the canary keeps its traffic) ──> Succeeded
    batch k waits for its approval, promote: "k" (written ahead, it waits for batch k; Git may keep it)
    abort, failed gate, deadline ──> RollingBack ──> Aborted | Failed, the template still held (Stalled)
        ──(retry: batch 1 again; promote=full: Promoting without a canary; a new template: a new release)
    a new template mid-release: Superseded ──> Initializing ──> batch 1 of it
    a revert (the template held is the stable's): RollingBack (when started) ──> Idle, the hold released

Each (phase, batchState) has one handler in :data:`HANDLERS` (a unit test checks this table against it)::

    phase          batchState           handler       what it waits for, and where it goes then
    (none)         -                    start         the Deployment and a valid spec -> Progressing, Upscaling
    InvalidSpec    -                    start         (the same: the spec or the cluster fixed)
    Initializing   -                    start         a ReplicaSet to name the stable by
    Waiting        -                    start         spec.after done, a release window open -> Queued or batch 1
    Queued         -                    start         a slot of the queue -> batch 1
    Progressing    Upscaling            upscale       canary pods ready (and endpoints of the canary Service, when
                                                      the mode has one) -> traffic moved -> Verifying or
                                                      WaitingForApproval (pause: manual)
    Progressing    Verifying            verify        the pause and the gate, or an approval of the batch ->
                                                      next batch (Upscaling), Waiting (Done) or Promoting
    Progressing    WaitingForApproval   verify        an approval of the batch (pinned: promote=next or its
                                                      number; follow: promote: "N" for this batch) -> next
                                                      batch; promote=full -> Promoting; the approval's timeout
                                                      -> RollingBack or next batch
    Progressing    Done                 between       (resumed while Done) a release window -> next batch
    Waiting        Done                 between       a release window open -> next batch; promote=full ->
                                                      Promoting
    Paused         Upscaling            on_pause      the pause lifted -> Progressing, the batch as it was
    Paused         Verifying            on_pause      (the same; one waiting for approval is Verifying while paused)
    Paused         WaitingForApproval   on_pause      (the same; not recorded, see Verifying)
    Paused         Done                 on_pause      (the same)
    Promoting      -                    promote       the stable on the target, then the canary gone -> Succeeded
    RollingBack    -                    rolling_back  the stable restored, then the canary gone -> Aborted/Failed
    Succeeded      -                    finished      nothing (a retry or a new version is a request, below);
                                                      follow mode: a new template held -> start
    Aborted        -                    finished      (the same; follow mode: the template stays held until a
                                                      new one, a revert, a retry or promote=full)
    Failed         -                    finished      (the same)
    Idle           -                    finished      (follow mode) a held template that differs from the
                                                      stable's -> start

A handler plans what its state needs and either waits (for pods, a timer, an annotation: the pass ends)
or moves to another state and lets that state's handler go on in the same pass, against the world as the
actions planned so far leave it (:func:`~greyrelease.planner.observed.project`), never against the actions
themselves. A pass verifies at most one batch: once a finished batch's successor is live, the pass ends and
the next one looks again at once. Requests that cut across the states (a new targetVersion, a retry, an
abort; in follow mode a new template or a revert) are looked at first (:mod:`.requests`); a deletion
restores the app through the same path as a rollback (:mod:`.rollback`). In follow mode the same states and
handlers run, with what differs in the handlers: the canary built from the held template and sized from the
stable's replicas every pass, the stable never scaled nor rolled by the release (:mod:`.follow`).

What a handler needs before it can run, it declares in :data:`HANDLERS` (:class:`Plain`, :class:`NeedsTarget`,
:class:`NeedsBatch`), and the dispatcher checks it first, in one place for every state: the target gone is a
rollback, a canary that is not ours a rollback, batches that no longer fit the spec InvalidSpec, a pause asked
for pauses the batch, a live batch's canary deleted grows the batch again. The handler gets what it asked for
(the target, the current batch) as an argument.

The handlers, by concern: :mod:`.start` (starting), :mod:`.waits` (what governance makes a release wait for),
:mod:`.batch_states` (a batch under way), :mod:`.hooks` (its webhook checks), :mod:`.promotion`,
:mod:`.rollback` (and deletion), :mod:`.requests`, :mod:`.rest` (the phases a release rests in); what they
share is :mod:`.passes` (one pass: the status being built, the world projected forward, the actions
planned), :mod:`.observed` (what the cluster looks like) and :mod:`.follow` (a followed Deployment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from greyrelease.api.release import (
    BATCH_PHASES,
    TERMINAL_PHASES,
    BatchState,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Phase,
)
from greyrelease.planner import follow, hooks
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import FreeSlot, Plan
from greyrelease.planner.batch_states import between, canary_lost, follow_size, on_pause, pause, upscale, verify
from greyrelease.planner.batches import PlanError
from greyrelease.planner.images import target_image
from greyrelease.planner.invalid import invalid
from greyrelease.planner.observed import Observed, Workload, project
from greyrelease.planner.passes import (
    CONVERGE_POLL,
    ENDPOINTS_POLL,
    GO_ON,
    INVALID_POLL,
    WAIT,
    Batch,
    Pass,
    Then,
    paused,
    started,
)
from greyrelease.planner.promotion import promote
from greyrelease.planner.requests import aborting, request
from greyrelease.planner.rest import finished
from greyrelease.planner.rollback import delete, roll_back, rolling_back
from greyrelease.planner.start import start

__all__ = [
    "CONVERGE_POLL",
    "ENDPOINTS_POLL",
    "HANDLERS",
    "INVALID_POLL",
    "NeedsBatch",
    "NeedsTarget",
    "Observed",
    "Plain",
    "State",
    "Workload",
    "aborting",
    "decide",
    "progressing",
    "project",
    "started",
]

#: More state changes in one pass than any path through the machine takes: a loop is a bug.
MAX_TRANSITIONS = 16


def decide(spec: GreyReleaseSpec, status: GreyReleaseStatus, observed: Observed, now: datetime) -> Plan:
    """Plan the next step of a release. Pure: same inputs, same plan."""
    p = Pass(spec, status, observed, now)
    if observed.deleting:
        delete(p)
    else:
        hooks.fold_answers(p)
        first = request(p)
        if first is None or first(p) is GO_ON:
            _run(p)
        if p.follow:
            follow.tell_target(p)  # a release that ended leaving its Deployment held or half-rolled says so there
    queue = observed.queue
    if queue is not None and queue.held and (observed.deleting or not progressing(p.status)):
        # A release that ends, rolls back, is deleted or goes back to waiting gives its slot back at once
        # (after the actions that cut its traffic).
        p.act(FreeSlot(queue.lease))
    return p.build(observed.generation)


def progressing(status: GreyReleaseStatus) -> bool:
    """Whether the release counts against a concurrency limit: from the pass that takes its slot until it
    ends or starts rolling back. A release waiting to start (for a window, a predecessor or a slot) does
    not count; one paused, waiting for an approval or for the window of its next batch does (it holds its
    slot)."""
    phase = status.phase
    if phase is None or phase in TERMINAL_PHASES or phase in (Phase.QUEUED, Phase.ROLLING_BACK):
        return False
    return not (phase == Phase.WAITING and status.batch_state is None and not started(status))


def _run(p: Pass) -> None:
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


# --- what a handler needs, checked before it runs ---------------------------------------------------


@dataclass(frozen=True)
class Plain:
    """A state whose handler needs nothing resolved first (it checks what it needs itself: starting is
    checking everything)."""

    run: Callable[[Pass], Then]

    def __call__(self, p: Pass) -> Then:
        return self.run(p)


@dataclass(frozen=True)
class NeedsTarget:
    """A state whose handler needs the target Deployment: when it is gone, the release rolls back instead
    (TargetDeleted)."""

    run: Callable[[Pass, Workload], Then]

    def __call__(self, p: Pass) -> Then:
        target = _target(p)
        return target if isinstance(target, Then) else self.run(p, target)


@dataclass(frozen=True)
class NeedsBatch:
    """A state whose handler needs the current batch (:class:`~greyrelease.planner.passes.Batch`): the
    target there (else, as for :class:`NeedsTarget`, a rollback), the canary Deployment ours if there is one
    (else a rollback: CanaryConflict), and batches that fit the spec as it is now (else InvalidSpec).

    ``moves``: the handler may move the batch on, so a pause asked for pauses the release instead, and the
    batch numbers in the status follow the plan first (the spec may have been edited). ``live``: the
    batch has its traffic, so it needs its canary too; when the canary was deleted, the batch is grown
    again instead (CanaryLost)."""

    run: Callable[[Pass, Batch], Then]
    moves: bool = True
    live: bool = False

    def __call__(self, p: Pass) -> Then:
        b = _batch(p)
        if isinstance(b, Then):
            return b
        if p.follow and not (p.status.phase == Phase.PROGRESSING and p.status.batch_state == BatchState.UPSCALING):
            follow_size(p, b)
        if self.moves:
            if paused(p.spec, p.world):
                return pause(p, b)
            _count(p, b)
        if self.live:
            canary = p.world.canary
            if canary is None or canary.deleting:
                return canary_lost(p, b)
        return self.run(p, b)


State = Plain | NeedsTarget | NeedsBatch


def _target(p: Pass) -> Workload | Then:
    """The target Deployment; when it is gone, the rollback planned instead."""
    target = p.world.target
    if target is not None:
        return target
    return roll_back(p, Phase.FAILED, R.TARGET_DELETED, f"the target Deployment {p.status.target_name!r} is gone")


def _batch(p: Pass) -> Batch | Then:
    """The current batch; or, when it cannot go on (the target gone, the canary not ours, a spec that
    does not fit), the rollback or InvalidSpec planned instead."""
    st = p.status
    target = _target(p)
    if isinstance(target, Then):
        return target
    canary = p.world.canary
    if canary is not None and p.world.own_canary is None:
        return roll_back(p, Phase.FAILED, R.CANARY_CONFLICT, f"Deployment {canary.name!r} is not owned by this release")
    if p.follow:
        # The batches are of the stable's size now (an HPA's or Git's): computed again every pass.
        try:
            steps = p.steps(target.replicas)
        except PlanError as err:
            return invalid(p, str(err))
        k = min(max(st.current_batch, 1), len(steps))
        return Batch(target, steps, steps[k - 1], "", template=st.restore.template or target.digest)
    assert st.restore.replicas is not None and st.restore.image is not None
    try:
        steps = p.steps(st.restore.replicas)
    except PlanError as err:
        return invalid(p, str(err))
    k = min(max(st.current_batch, 1), len(steps))
    return Batch(target, steps, steps[k - 1], target_image(st.restore.image, p.version))


def _count(p: Pass, b: Batch) -> None:
    """The batch numbers in the status follow the plan (the spec may have been edited)."""
    if (p.status.total_batches, p.status.current_batch) != (len(b.steps), b.step.number):
        p.set(total_batches=len(b.steps), current_batch=b.step.number)


#: The handler of each (phase, batchState), and what it needs. A state missing here is a bug (KeyError).
HANDLERS: dict[tuple[Phase | None, BatchState | None], State] = {
    (None, None): Plain(start),
    (Phase.INVALID_SPEC, None): Plain(start),
    (Phase.INITIALIZING, None): Plain(start),
    (Phase.WAITING, None): Plain(start),
    (Phase.QUEUED, None): Plain(start),
    (Phase.PROGRESSING, BatchState.UPSCALING): NeedsBatch(upscale),
    (Phase.PROGRESSING, BatchState.VERIFYING): NeedsBatch(verify, live=True),
    (Phase.PROGRESSING, BatchState.WAITING_FOR_APPROVAL): NeedsBatch(verify, live=True),
    (Phase.PROGRESSING, BatchState.DONE): NeedsBatch(between, live=True),
    (Phase.WAITING, BatchState.DONE): NeedsBatch(between, live=True),
    **{(Phase.PAUSED, state): NeedsBatch(on_pause, moves=False) for state in BatchState},
    (Phase.PROMOTING, None): NeedsTarget(promote),
    (Phase.ROLLING_BACK, None): Plain(rolling_back),
    (Phase.SUCCEEDED, None): Plain(finished),
    (Phase.ABORTED, None): Plain(finished),
    (Phase.FAILED, None): Plain(finished),
    (Phase.IDLE, None): Plain(finished),
}
