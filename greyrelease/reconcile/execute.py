"""Execution: each action of a plan handed to the adapter that carries it out, in order."""

from __future__ import annotations

from greyrelease.kube.protocol import Kube
from greyrelease.planner.actions import (
    Action,
    DeleteCanary,
    Enrol,
    EnsureCanary,
    FreeSlot,
    PrepareRouting,
    ReleaseHold,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    ScaleStable,
    SetStableImage,
    SetWeight,
    TakeSlot,
    Unenrol,
)
from greyrelease.reconcile.observe import Scene
from greyrelease.reconcile.record import remove_annotations
from greyrelease.reconcile.slots import free, take


def execute(kube: Kube, actions: tuple[Action, ...], scene: Scene) -> None:
    for action in actions:
        apply(kube, action, scene)


def apply(kube: Kube, action: Action, scene: Scene) -> None:
    workload, router = scene.deployments, scene.router
    match action:
        case EnsureCanary(replicas=replicas, image=image, version=version, template=template):
            workload.ensure_canary(replicas=replicas, image=image, version=version, template=template)
        case ScaleStable(replicas=replicas):
            workload.scale_stable(replicas)
        case SetStableImage(image=image, replicas=replicas):
            workload.set_stable_image(image=image, replicas=replicas)
        case DeleteCanary():
            workload.delete_canary()
        case PrepareRouting(stable_hash=stable_hash):
            router.prepare(stable_hash)
        case SetWeight(weight=weight, header_match=headers, stable_hash=stable_hash):
            router.set_weight(weight, headers, stable_hash=stable_hash)
        case RestoreStableSelector():
            router.restore_stable_selector()
        case ResetRouting():
            router.reset()
        case Enrol(release=release):
            workload.enrol(release)
        case Unenrol(release=release):
            workload.unenrol(release)
        case ReleaseHold(digest=digest):
            workload.release_hold(digest)
        case RemoveAnnotations(keys=keys):
            remove_annotations(kube, scene.release, keys)
        case TakeSlot(lease=lease, limit=limit, since=since, stale=stale):
            take(kube, lease, limit=limit, release=scene.release, stale=stale, since=since)
        case FreeSlot(lease=lease):
            free(kube, lease, uid=scene.release["metadata"]["uid"])
        case _:
            raise TypeError(f"unknown action {action!r}")
