"""What a release waits for before a batch starts, by the governance rules (:mod:`.governance`): before
batch 1, the releases of ``spec.after`` done, a release window open (no freeze), a slot of its queue; between
batches, a release window. Waiting changes nothing on the cluster, and nothing is written while nothing
changes."""

from __future__ import annotations

from datetime import datetime

from greyrelease.api.release import BatchState, Phase
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import TakeSlot
from greyrelease.planner.governance import SPEC, Hold, Rules, Source
from greyrelease.planner.invalid import invalid
from greyrelease.planner.passes import GO_ON, INVALID_POLL, WAIT, Batch, Pass, Then


def rules(p: Pass) -> Rules:
    """The release's own windows and freezes, and those of the policies that govern it."""
    spec = p.spec
    return p.world.rules.plus(Source(SPEC, tuple(spec.windows or ()), tuple(spec.freezes or ())))


def wait_to_start(p: Pass, what: str = "") -> Then:
    """Before batch 1: the releases of ``spec.after`` done, a release window open, a slot of the queue
    taken (in this order: a slot is taken only by a release that can use it). GO_ON when all are there.
    ``what`` comes first in the messages (follow mode: the template held meanwhile)."""
    world = p.world
    if world.cycle:
        return invalid(p, "spec.after: a cycle of releases waiting for each other: " + " -> ".join(world.cycle))
    for pred in world.predecessors:
        if pred.succeeded:
            continue
        if not pred.found:
            why = f"waiting for GreyRelease {pred.name!r} to succeed (it does not exist)"
        elif pred.failed:
            why = f"waiting for GreyRelease {pred.name!r}, which ended {pred.phase}: retry or fix it first"
        else:
            why = f"waiting for GreyRelease {pred.name!r} to succeed (now {pred.phase or 'not started'})"
        return _waiting(p, what + why, None)
    hold = rules(p).hold(p.now)
    if hold is not None:
        return _waiting(p, what + hold.message, hold.until)
    queue = world.queue
    if queue is None or queue.held:
        return GO_ON
    if queue.may_take():
        p.act(TakeSlot(queue.lease, queue.limit, queue.scope, p.now, queue.stale))
        return GO_ON
    position = queue.ahead + 1
    message = f"{what}position {position} in the queue of {queue.scope} (at most {queue.limit} progressing)"
    if p.status.phase != Phase.QUEUED:
        p.event(R.QUEUED, message)
    p.set(target_version=p.version, queue_position=position, batch_state=None)
    p.phase(Phase.QUEUED, message)
    # Woken when a slot frees; the poll is only the safety net.
    p.again(INVALID_POLL)
    return WAIT


def _waiting(p: Pass, message: str, until: datetime | None) -> Then:
    """Waiting before batch 1 (or before a new version's batch 1)."""
    p.set(target_version=p.version)
    return _wait(p, message, until, state=None)


def hold_between(p: Pass, b: Batch, hold: Hold) -> Then:
    """The batch passed; the next one waits for a release window (or a freeze's end). The canary keeps
    this batch's pods and traffic meanwhile."""
    k, n = b.step.number, len(b.steps)
    p.times(next_check_at=None, approval_expires_at=None)
    return _wait(p, f"{b.label} passed; batch {k + 1}/{n} is {hold.message}", hold.until, state=BatchState.DONE)


def _wait(p: Pass, message: str, until: datetime | None, *, state: BatchState | None) -> Then:
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
