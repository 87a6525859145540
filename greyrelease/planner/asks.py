"""Follow mode: the request annotations as a pass reads them, against what the status records of them.

A request annotation (``greyrelease.io/abort``, ``promote``, ``retry``) is never removed in follow mode; each
one has a record in ``status.requests``: the value last seen, the release it is for (the template under way
when the value was first seen), whether it is done and what it did. A value that differs from the record is
a new request; one equal to it is the same request, already bound to its release, and is acted on only if
it still waits. The rules that use this are in :mod:`.requests` (its docstring says why);
:mod:`.batch_states` honours an approval when its batch is live.
"""

from __future__ import annotations

from dataclasses import dataclass

from greyrelease.api.release import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    ApprovalRecord,
    RequestRecord,
)
from greyrelease.planner import follow
from greyrelease.planner.passes import Pass

#: The request annotations, in the order their records are kept.
REQUESTS = (ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION)


def word(value: str | None) -> str:
    """What a request's value asks: the part before the first ``@``, trimmed and lowercased. What follows
    ``@`` only makes a value new (``2@2026-03-01T10:00:00Z`` asks for batch 2, as ``2`` does).

    >>> word(" 2@2026-03-01T10:00:00Z"), word("TRUE")
    ('2', 'true')
    """
    return (value or "").split("@", 1)[0].strip().lower()


@dataclass(frozen=True)
class Ask:
    """A request annotation as this pass reads it: ``new`` when its value is not the one recorded (then
    ``record`` is the record it would get, bound to the release under way now)."""

    value: str
    new: bool
    record: RequestRecord

    @property
    def word(self) -> str:
        return word(self.value)


def release_of(p: Pass) -> str:
    """The release a request seen now is for: the digest of the template under way, else of the one held
    and waiting (to start, or after an abort or a failure); "" when no release is under way or waits."""
    st, target = p.status, p.world.target
    if st.restore.template:
        return st.restore.template
    if target is not None and follow.pending(target):
        return target.digest
    return st.held.digest if st.held is not None else ""


def recorded(p: Pass, annotation: str) -> RequestRecord | None:
    return next((r for r in p.status.requests if r.annotation == annotation), None)


def read(p: Pass, annotation: str) -> Ask | None:
    """The annotation as this pass reads it; None when it is not there."""
    value = p.world.annotations.get(annotation)
    if value is None:
        return None
    rec = recorded(p, annotation)
    if rec is not None and rec.value == value:
        return Ask(value, False, rec)
    return Ask(value, True, RequestRecord(annotation=annotation, value=value, template=release_of(p), seen_at=p.now))


def waiting(p: Pass, annotation: str) -> RequestRecord | None:
    """The recorded request of ``annotation`` that waits for the release under way, if there is one."""
    rec = recorded(p, annotation)
    if rec is None or rec.done_at is not None or not rec.template or rec.template != release_of(p):
        return None
    return rec if p.world.annotations.get(annotation) == rec.value else None


def note(p: Pass, rec: RequestRecord, result: str, *, done: bool = True, batch: int | None = None) -> None:
    """Record what became of a request (``done``: honoured, or found not to apply; else it waits)."""
    changes: dict[str, object] = {"result": result, "done_at": p.now if done else None}
    if batch is not None:
        changes["batch"] = batch
    new = rec.model_copy(update=changes)
    others = {r.annotation: r for r in p.status.requests if r.annotation != rec.annotation}
    others[rec.annotation] = new
    p.set(requests=[others[k] for k in REQUESTS if k in others])


def drop_waiting(p: Pass, annotation: str, why: str) -> None:
    """A request of ``annotation`` waiting for the release under way does not wait any more."""
    rec = waiting(p, annotation)
    if rec is not None:
        note(p, rec, f"dropped: {why}")


def approve(p: Pass, rec: RequestRecord, batch: int, result: str) -> None:
    """An approval honoured at ``batch``: the request done, the approval in ``status.approvals``."""
    note(p, rec, result)
    approval = ApprovalRecord(batch=batch, template=rec.template, request=rec.value, at=p.now)
    p.set(approvals=[*p.status.approvals, approval])


def tidy(p: Pass) -> None:
    """The records follow the annotations: the record of one that was removed goes (written again, its
    value is a new request), and one that waits for a release no longer under way is dropped."""
    release, annotations = release_of(p), p.world.annotations
    kept: list[RequestRecord] = []
    for rec in p.status.requests:
        if rec.annotation not in annotations:
            continue
        if rec.done_at is None and rec.template != release:
            rec = rec.model_copy(
                update={"done_at": p.now, "result": f"dropped: the release of {follow.named(p, rec.template)} is over"}
            )
        kept.append(rec)
    if kept != p.status.requests:
        p.set(requests=kept)
