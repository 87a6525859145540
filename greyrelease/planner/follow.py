"""Follow mode, what its handlers share: a GreyRelease without ``targetVersion`` releases every new pod
template of its Deployment, which the admission webhook holds (``spec.paused``, ``greyrelease.io/held``)
while the stable keeps running its ReplicaSet.

Here: enrolment (the label that makes the webhook hold), what the status records of the held template and
of the stable ReplicaSet, whether a template waits to be released, the words a user reads about them, and
the Events posted on the Deployment itself (:func:`tell_target`), so that ``kubectl describe deployment``
says why it is paused.
The handlers are where the states are (:mod:`.start`, :mod:`.rest`, :mod:`.requests`, :mod:`.promotion`,
:mod:`.rollback`). Nothing here writes the Deployment's replicas or template: in follow mode the only field
of it a release writes is ``spec.paused`` (:class:`~greyrelease.planner.actions.ReleaseHold`).
"""

from __future__ import annotations

from greyrelease.api.release import ContainerImage, HeldTemplate, Phase, StableReplicaSet
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Enrol, ReleaseHold
from greyrelease.planner.observed import Images, Workload
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
            p.event(R.HELD, f"Deployment {target.name} holds {what_is_held(target)}")
        p.set(held=new)


def release_hold(p: Pass, target: Workload) -> None:
    """Plan the hold's release, when the target holds a template."""
    if target.is_held:
        p.act(ReleaseHold(target.held))


#: How many hex digits of a template's digest a message shows (``greyrelease.io/held`` and the status keep
#: all 16): enough to tell templates apart at a glance and to find the annotation's value.
SHORT = 8


def short(digest: str) -> str:
    return digest[:SHORT]


def _pairs(images: Images | list[ContainerImage]) -> Images:
    return tuple((i.name, i.image) if isinstance(i, ContainerImage) else i for i in images)


def template_text(digest: str, images: Images | list[ContainerImage], stable: Images | list[ContainerImage]) -> str:
    """A template as people read it: ``app:v2 (template 7c9f5d0a)`` when its images differ from the stable's
    (``stable``; () when unknown), ``template 7c9f5d0a (app:v1, images unchanged)`` when only something
    else differs (an env var, a restart), ``template 7c9f5d0a`` when its images are not known."""
    mine = _pairs(images)
    if not mine:
        return f"template {short(digest)}"
    if mine == _pairs(stable):
        return f"template {short(digest)} ({images_text(mine)}, images unchanged)"
    return f"{images_text(mine)} (template {short(digest)})"


def named(p: Pass, digest: str) -> str:
    """The template of ``digest`` as :func:`template_text` words it, with the images the status (the template
    held) or the Deployment (its template now) knows it by."""
    held, target, stable = p.status.held, p.world.target, p.status.stable
    images: Images | list[ContainerImage] = ()
    if held is not None and held.digest == digest:
        images = held.images
    elif target is not None and target.digest == digest:
        images = target.images
    return template_text(digest, images, stable.images if stable is not None and stable.digest != digest else ())


def what_runs(target: Workload | None) -> str:
    """``ReplicaSet web-5d8f6c (app:v1)``."""
    rs = target.stable if target is not None else None
    if rs is None:
        return "its current ReplicaSet"
    return f"ReplicaSet {rs.name} ({images_text(rs.images)})"


def what_is_held(target: Workload) -> str:
    """``app:v2 (template 7c9f5d0a)``."""
    return template_text(target.digest, target.images, target.stable.images if target.stable is not None else ())


def stuck(p: Pass, target: Workload | None, why: str) -> str:
    """The message of a release stopped while its template stays held (what is held, what runs, the ways
    out), or while the Deployment is half-rolled (a promotion whose rollout stalled)."""
    if target is not None and rolling(target):
        return (
            f"{why}. The canary is removed and the traffic is on Deployment {target.name}'s own pods (those of "
            f"both templates that are ready); the Deployment controller goes on rolling {named(p, target.digest)}. "
            "Ways out: what stops the rollout fixed (the Deployment's conditions and Events say what), a new "
            "template (a new commit) or a revert"
        )
    if target is None or not target.is_held:
        return why
    return (
        f"{why}. Deployment {target.name} holds {what_is_held(target)} but runs {what_runs(target)}. Ways out: a "
        "new template (a new commit), a revert to the template it runs, greyrelease.io/retry to release it "
        "again, or greyrelease.io/promote=full to accept it without a canary"
    )


#: The ways out of a template left held, as the Deployment's Event words them.
WAYS_OUT = (
    "a new commit of the template (a new release), a revert to the template the pods run (the hold released, no "
    "pod restarted), greyrelease.io/retry on the GreyRelease (released again with a canary) or "
    "greyrelease.io/promote=full (taken without one)"
)


def tell_target(p: Pass) -> None:
    """The Deployment's own Warning, posted by the pass that ends a release Aborted or Failed (whichever
    path got there) and leaves it held (paused: its spec says the new template, its pods run the old one)
    or half-rolled (the hold released, the rollout not complete): ``kubectl describe deployment`` then says
    why it is as it is and what gets it going. Nothing when the release ends with the Deployment as it
    should be, or gone."""
    st, target = p.status, p.world.target
    end = st.phase
    if end not in (Phase.ABORTED, Phase.FAILED) or p.recorded.phase == end or target is None:
        return
    why = st.last_release.message if st.last_release is not None else st.message
    reason = R.RELEASE_ABORTED if end == Phase.ABORTED else R.RELEASE_FAILED
    release = f"GreyRelease {p.world.name}"
    if target.is_held:
        p.event(
            reason,
            f"paused by {release}, whose release of {what_is_held(target)} ended {end.value}: {why}. The spec "
            f"holds that template; the pods run {what_runs(target)}. It stays paused until {WAYS_OUT}",
            warning=True,
            about=target,
        )
    elif rolling(target):
        p.event(
            reason,
            f"{release}'s release of {named(p, target.digest)} ended {end.value}: {why}. "
            "Its canary is removed and the traffic is on this Deployment's own pods; the Deployment controller goes "
            "on rolling the template. A new commit or a revert starts a new release",
            warning=True,
            about=target,
        )


def rolling(target: Workload) -> bool:
    """Not held, and the Deployment controller has not rolled its template to every pod yet."""
    return not target.is_held and not target.rolled_out_template(target.digest)


def at_rest(target: Workload) -> str:
    return f"following Deployment {target.name}: it runs {what_runs(target)}; nothing held"
