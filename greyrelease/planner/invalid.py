"""InvalidSpec, both ways a spec is refused: one the API server let through but the models refuse (e.g.
under an older CRD: :func:`invalid_spec`, planned by the reconciler instead of a call of
:func:`~greyrelease.planner.machine.decide`), and one that does not fit the cluster as it is (no such
Deployment, batches that shrink: :func:`invalid`, planned by a handler). Either way the release is marked
InvalidSpec with a message naming the field, and nothing else is done."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from greyrelease.api.release import GreyReleaseStatus, Phase, field_path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Event, Plan
from greyrelease.planner.passes import INVALID_POLL, WAIT, Pass, Then


def invalid_spec(status: GreyReleaseStatus, err: ValidationError, now: datetime) -> Plan:
    """The plan that records the error (an Event only when the message is new). Pure."""
    first = err.errors()[0]
    field = field_path(tuple(first["loc"]))
    message = f"{field}: {first['msg']}"
    changes: dict[str, object] = {"phase": Phase.INVALID_SPEC, "message": message}
    if status.phase != Phase.INVALID_SPEC:
        changes["phase_started_at"] = now
    new = status.model_copy(update=changes)
    events = (Event("Warning", R.INVALID_SPEC, message),) if status.message != message else ()
    return Plan(status=new, events=events)


def invalid(p: Pass, message: str, *, reason: str = R.INVALID_SPEC) -> Then:
    """The spec cannot be honoured against the cluster: InvalidSpec (an Event only when the message is
    new), looked at again in a while."""
    if p.status.phase != Phase.INVALID_SPEC or p.status.message != message:
        p.event(reason, message, warning=True)
    p.set(target_version=p.version)
    p.phase(Phase.INVALID_SPEC, message)
    p.again(INVALID_POLL)
    return WAIT
