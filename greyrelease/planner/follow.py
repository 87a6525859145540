"""Follow mode, what its handlers share: a GreyRelease without ``targetVersion`` releases every new pod
template of its Deployment, which the admission webhook holds (``spec.paused``, ``greyrelease.io/held``)
while the stable keeps running its ReplicaSet.

Here: enrolment (the label that makes the webhook hold), what the status records of the held template and
of the stable ReplicaSet, whether a template waits to be released, and the words a user reads about them.
The handlers are where the states are (:mod:`.start`, :mod:`.rest`, :mod:`.requests`, :mod:`.promotion`,
:mod:`.rollback`). Nothing here writes the Deployment's replicas or template: in follow mode the only field
of it a release writes is ``spec.paused`` (:class:`~greyrelease.planner.actions.ReleaseHold`).
"""

from __future__ import annotations

from greyrelease.api.release import HeldTemplate, StableReplicaSet
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Enrol, ReleaseHold
from greyrelease.planner.observed import Workload
from greyrelease.planner.passes import Pass, container_images, images_text


def foreign(p: Pass, target: Workload) -> str:
    """Why the target cannot be followed by this release ("" when it can): another release follows it."""
    if target.enrolled and target.enrolled != p.label:
        return (
            f"spec.targetRef: Deployment {target.name!r} is followed by GreyRelease {target.enrolled!r} "
            f"(label greyrelease.io/release={target.enrolled}); one release follows a Deployment"
        )
    return ""


def enrol(p: Pass, target: Workload) -> None:
    """The target carries the enrolment label (put back when someone removed it)."""
    if not target.enrolled:
        p.act(Enrol(p.label))
        p.event(
            R.ENROLLED,
            f"following Deployment {target.name}: its new pod templates are held for release "
            f"(label greyrelease.io/release={p.label})",
        )


def pending(target: Workload) -> bool:
    """A template is held that differs from what the stable runs: a release of it is due."""
    return target.is_held and target.stable is not None and target.digest != target.stable.digest


def reverted(target: Workload) -> bool:
    """The template held is the one the stable runs (a revert): releasing the hold restarts no pod."""
    return target.is_held and target.stable is not None and target.digest == target.stable.digest


def record_stable(p: Pass, target: Workload) -> None:
    """``status.stable`` is the ReplicaSet the target's pods run (and the stable version its digest, the
    stable pod-template-hash its hash: what a pass reads again without listing ReplicaSets while the
    Deployment's revision stays the same)."""
    rs = target.stable
    if rs is None:
        return
    stable = StableReplicaSet(name=rs.name, revision=rs.revision, digest=rs.digest, images=container_images(rs.images))
    st = p.status
    if (st.stable, st.stable_version, st.stable_pod_template_hash) != (stable, rs.digest, rs.template_hash):
        p.set(stable=stable, stable_version=rs.digest, stable_pod_template_hash=rs.template_hash)


def record_held(p: Pass, target: Workload) -> None:
    """``status.held`` is the template the target holds, since when this release first saw it."""
    held = p.status.held
    same = held is not None and held.digest == target.digest
    since = (held.held_since if held is not None and same else None) or p.now
    new = HeldTemplate(digest=target.digest, images=container_images(target.images), held_since=since)
    if held != new:
        if held is None or held.digest != target.digest:
            p.event(R.HELD, f"Deployment {target.name} holds template {target.digest} ({images_text(target.images)})")
        p.set(held=new)


def release_hold(p: Pass, target: Workload) -> None:
    """Plan the hold's release, when the target holds a template."""
    if target.is_held:
        p.act(ReleaseHold(target.held))


def what_runs(target: Workload | None) -> str:
    """``ReplicaSet web-5d8f6c (app:v1)``."""
    rs = target.stable if target is not None else None
    if rs is None:
        return "its current ReplicaSet"
    return f"ReplicaSet {rs.name} ({images_text(rs.images)})"


def what_is_held(target: Workload) -> str:
    """``template 7c9f5d... (app:v2)``."""
    return f"template {target.digest} ({images_text(target.images)})"


def stuck(p: Pass, target: Workload | None, why: str) -> str:
    """The message of a release stopped while its template stays held: what is held, what runs, the ways
    out."""
    if target is None or not target.is_held:
        return why
    return (
        f"{why}. Deployment {target.name} holds {what_is_held(target)} but runs {what_runs(target)}. Ways out: a "
        "new template (a new commit), a revert to the template it runs, greyrelease.io/retry to release it "
        "again, or greyrelease.io/promote=full to accept it without a canary"
    )


def at_rest(target: Workload) -> str:
    return f"following Deployment {target.name}: it runs {what_runs(target)}; nothing held"
