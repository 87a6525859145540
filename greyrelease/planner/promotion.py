"""Promotion: once every batch passed (or ``promote=full``), the stable Deployment rolls to the target
version, then the canary goes and the routing is reset."""

from __future__ import annotations

from datetime import timedelta

from greyrelease.api.release import GreyReleaseSpec, Phase, Restore
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import DeleteCanary, ResetRouting, RestoreStableSelector, SetStableImage
from greyrelease.planner.images import target_image, version_of
from greyrelease.planner.observed import Workload
from greyrelease.planner.passes import CONVERGE_POLL, GO_ON, WAIT, Pass, Then
from greyrelease.planner.rollback import deadline_passed


def _weighted(spec: GreyReleaseSpec) -> bool:
    """True when a router sets the weight explicitly (nginx, Gateway API) rather than by replicas."""
    routing = spec.traffic_routing
    return routing is not None and routing.service is None


def start_promotion(p: Pass, n: int) -> Then:
    p.end_batch()
    p.phase(Phase.PROMOTING, "rolling the stable Deployment to the target version")
    p.event(R.PROMOTING, f"all {n} batches passed; promoting the stable Deployment")
    return GO_ON


def promote(p: Pass, target: Workload) -> Then:
    """Promoting: the stable Deployment rolls to the target version, then the canary goes."""
    st, spec = p.status, p.spec
    assert st.restore.replicas is not None and st.restore.image is not None
    replicas = st.restore.replicas
    image = target_image(st.restore.image, p.version)
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
            return deadline_passed(p, f"promotion: {target.ready}/{replicas} stable pods ready on {image}")
        p.set(message=waiting)
        p.at(min(deadline, p.now + timedelta(seconds=CONVERGE_POLL)))
        return WAIT
    if p.world.canary is not None:
        # Traffic back to the (now promoted) stable, then the canary goes; the routing is reset only
        # once the canary's pods are gone. In Service mode there is no weight to move: weight 0 would
        # narrow the Service to the old stable ReplicaSet, which no longer has pods.
        if _weighted(spec):
            p.set_weight(0)
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
