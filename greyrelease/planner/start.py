"""Starting a release: the target Deployment found, the spec checked against it, what will be restored
recorded, the routing prepared, batch 1 begun (or InvalidSpec, AlreadyAtTarget, or a wait for what
governs the start: :mod:`.waits`).

In follow mode (:func:`_start_following`) the release starts only when the Deployment holds a template that
differs from the one its pods run; until then the release is Idle (enrolled, nothing to do), and a template
waiting for a release window or a slot stays held meanwhile."""

from __future__ import annotations

from greyrelease.api.release import Phase, Restore
from greyrelease.planner import follow
from greyrelease.planner import reasons as R
from greyrelease.planner.batches import PlanError
from greyrelease.planner.images import target_image, version_of
from greyrelease.planner.invalid import invalid
from greyrelease.planner.observed import Workload
from greyrelease.planner.passes import GO_ON, WAIT, Pass, Then, images_text
from greyrelease.planner.waits import wait_to_start


def _resolve_target(p: Pass) -> Workload | str:
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
    if spec.container and not spec.follows and spec.container not in target.containers:
        return f"spec.container: Deployment {target.name!r} has no container {spec.container!r}"
    return target


def start(p: Pass) -> Then:
    """No release under way (or one that could not start): check everything, then start batch 1."""
    spec, world = p.spec, p.world
    if spec.follows:
        return _start_following(p)
    target = _resolve_target(p)
    if isinstance(target, str):
        return invalid(p, target)
    if target.enrolled and p.status.restore.replicas is None:
        return invalid(
            p,
            f"spec.targetVersion: Deployment {target.name!r} is followed (label greyrelease.io/release="
            f"{target.enrolled}), so its new templates are held: remove targetVersion to release them, or remove "
            "the label (and release its hold) to pin a version",
        )
    if world.canary is not None and world.own_canary is None:
        return invalid(
            p,
            f"Deployment {world.canary.name!r} exists and is not owned by this release; rename or delete it",
            reason=R.CANARY_CONFLICT,
        )
    if world.routing_error:
        return invalid(p, world.routing_error, reason=R.ROUTING_ERROR)
    restore = p.status.restore
    replicas = restore.replicas if restore.replicas is not None else target.replicas
    try:
        steps = p.steps(replicas)
    except PlanError as err:
        return invalid(p, str(err))
    original_image = restore.image or target.image
    image = target_image(original_image, p.version)
    if image == original_image and world.canary is None:
        p.set(
            target_version=p.version,
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
    if wait_to_start(p) is WAIT:
        return WAIT
    if not target.template_hash:
        # The Deployment controller has not labelled a ReplicaSet yet; look again shortly.
        p.set(target_version=p.version, target_name=target.name)
        p.phase(Phase.INITIALIZING, f"waiting for the ReplicaSet of {target.name}")
        p.again(1.0)
        return WAIT
    p.begin_batch(1)
    p.set(
        target_version=p.version,
        stable_version=version_of(original_image),
        target_name=target.name,
        stable_pod_template_hash=p.status.stable_pod_template_hash or target.template_hash,
        restore=Restore(replicas=replicas, image=original_image),
        total_batches=len(steps),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=target.replicas,
        metrics=[],
    )
    p.phase(Phase.PROGRESSING, f"batch 1/{len(steps)}: starting the canary")
    p.history(1, started_at=p.now)
    p.event(
        R.RELEASE_STARTED,
        f"releasing {image} to {target.name} in {len(steps)} batches (stable {version_of(original_image)})",
    )
    # The routing objects (canary Service/Ingress, stable narrowing) come before any canary pod, so the
    # stable backend never sends traffic to a canary that copied its labels.
    p.prepare_routing()
    return GO_ON


def _start_following(p: Pass) -> Then:
    """Follow mode: check everything, enrol the Deployment; then Idle while it holds nothing new, else
    (once governance lets it) batch 1 of the template it holds."""
    world = p.world
    target = _resolve_target(p)
    if isinstance(target, str):
        return invalid(p, target)
    if why := follow.foreign(p, target):
        return invalid(p, why)
    if world.canary is not None and world.own_canary is None:
        return invalid(
            p,
            f"Deployment {world.canary.name!r} exists and is not owned by this release; rename or delete it",
            reason=R.CANARY_CONFLICT,
        )
    if world.routing_error:
        return invalid(p, world.routing_error, reason=R.ROUTING_ERROR)
    follow.enrol(p, target)
    stable = target.stable
    if stable is None:
        p.set(target_name=target.name)
        p.phase(Phase.INITIALIZING, f"waiting for the ReplicaSet of {target.name}")
        p.again(1.0)
        return WAIT
    follow.record_stable(p, target)
    p.set(target_name=target.name, target_version="")
    if not follow.pending(target):
        if follow.reverted(target):
            # Held, but the template is the one that runs: nothing to release, and no pod restarts.
            follow.release_hold(p, target)
            p.event(R.HOLD_RELEASED, f"{follow.what_is_held(target)} is the one {target.name} runs: hold released")
        p.set(held=None)
        p.phase(Phase.IDLE, follow.at_rest(target))
        return WAIT
    follow.record_held(p, target)
    try:
        steps = p.steps(target.replicas)
    except PlanError as err:
        return invalid(p, str(err))
    if wait_to_start(p, f"{follow.what_is_held(target)} held; ") is WAIT:
        return WAIT
    digest = target.digest
    p.begin_batch(1)
    p.set(
        stable_pod_template_hash=stable.template_hash,
        restore=Restore(template=digest),
        total_batches=len(steps),
        canary_weight=0,
        canary_replicas=0,
        stable_replicas=target.replicas,
        end_phase=None,
        metrics=[],
    )
    p.phase(Phase.PROGRESSING, f"batch 1/{len(steps)}: starting the canary of {follow.what_is_held(target)}")
    p.history(1, started_at=p.now)
    p.event(
        R.RELEASE_STARTED,
        f"releasing {follow.what_is_held(target)} of {target.name} in {len(steps)} batches (stable ReplicaSet "
        f"{stable.name}, {images_text(stable.images)})",
    )
    p.prepare_routing()
    return GO_ON
