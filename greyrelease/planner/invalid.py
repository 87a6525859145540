"""A spec the API server let through but the models refuse (e.g. under an older CRD): the release is
marked InvalidSpec, with the first error naming its field, and nothing else is done."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from greyrelease.api.release import GreyReleaseStatus, Phase, field_path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Event, Plan


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
