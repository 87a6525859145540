"""What the planner reads of the cluster (:class:`Observed`, with a :class:`Workload` for each Deployment),
and the world as a later state of the same pass sees it once the actions planned so far are applied
(:func:`project`). Built by the adapters; plain data here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

from greyrelease.analysis.verdicts import Check
from greyrelease.analysis.webhooks import Answer
from greyrelease.planner.actions import (
    Action,
    DeleteCanary,
    Enrol,
    EnsureCanary,
    ReleaseHold,
    RemoveAnnotations,
    ScaleStable,
    SetStableImage,
    Unenrol,
)
from greyrelease.planner.governance import Predecessor, Queue, Rules

_T = TypeVar("_T")

#: A Deployment's spec.progressDeadlineSeconds at this value (the largest int32): the Deployment controller
#: reports no timeout.
NO_PROGRESS_DEADLINE = 2**31 - 1

#: The images of a pod template: (container, image) for each container, in order.
Images = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ReplicaSet:
    """Follow mode: the ReplicaSet of the Deployment's current revision, whose pods are the stable while a
    new template is held (a paused Deployment makes no new ReplicaSet, so it stays the same one)."""

    name: str
    template_hash: str = ""  # its pod-template-hash label
    digest: str = ""  # the digest of its pod template, as greyrelease.io/held counts it
    images: Images = ()
    revision: str = ""  # deployment.kubernetes.io/revision


@dataclass(frozen=True)
class Workload:
    """What the planner needs to know of a Deployment (built from the object by the adapter).

    Follow mode reads more of the target: whether it is paused and holds a template (``held``, the value of
    ``greyrelease.io/held``), the digest and images of its ``spec.template`` as it is now, the enrolment
    label, and the ReplicaSet its pods run (``stable``); of the canary, which template it was built from
    (``source``). Rollout progress is in the counts (``total`` counts the pods of every ReplicaSet, so
    ``total > updated`` means old pods remain), and whether the Deployment controller gave up waiting for
    it (``timed_out``: its own ``progressDeadlineSeconds`` passed without progress)."""

    name: str
    uid: str = ""
    generation: int = 1
    observed_generation: int = 1
    replicas: int = 0  # spec.replicas
    ready: int = 0  # status.readyReplicas
    updated: int = 0  # status.updatedReplicas
    available: int = 0  # status.availableReplicas
    total: int = 0  # status.replicas: pods of every ReplicaSet, old ones included
    image: str = ""  # image of the released container
    container: str = ""
    containers: tuple[str, ...] = ()
    template_hash: str = ""  # pod-template-hash of the current ReplicaSet
    owner_uid: str = ""  # uid of the controlling owner, if any
    deleting: bool = False
    paused: bool = False  # spec.paused
    held: str = ""  # the annotation greyrelease.io/held: the digest of the template held
    digest: str = ""  # the digest of spec.template as it is now
    images: Images = ()  # the images of spec.template as it is now
    enrolled: str = ""  # the label greyrelease.io/release: the release that follows it
    source: str = ""  # a canary: the digest of the template it was built from (follow mode)
    stable: ReplicaSet | None = None  # follow mode: the ReplicaSet its pods run
    progress_deadline: int = 0  # follow mode: spec.progressDeadlineSeconds (0 when not set)
    #: Follow mode: the message of its Progressing condition when the Deployment controller reports the
    #: rollout timed out (reason ProgressDeadlineExceeded); "" otherwise.
    timed_out: str = ""

    @property
    def is_held(self) -> bool:
        """Paused with a template held by the admission webhook (``greyrelease.io/held``)."""
        return self.paused and bool(self.held)

    def converged(self, replicas: int) -> bool:
        """All ``replicas`` pods of the current template are ready, and no old pod is left."""
        return (
            self.observed_generation >= self.generation
            and self.replicas == replicas
            and self.updated >= replicas
            and self.ready >= replicas
            and self.available >= replicas
            and self.total == replicas
        )

    def rolled_out(self, replicas: int, image: str) -> bool:
        """All ``replicas`` pods run ``image`` and are ready, and no old pod is left."""
        return self.image == image and self.converged(replicas)

    def rolled_out_template(self, digest: str) -> bool:
        """Follow mode: not paused, its template is ``digest``, and the Deployment controller has rolled it
        to every replica it has now (whatever an HPA made of them): all updated and available, no pod of an
        older ReplicaSet left."""
        return (
            not self.paused
            and self.digest == digest
            and self.observed_generation >= self.generation
            and self.updated >= self.replicas
            and self.ready >= self.replicas
            and self.available >= self.replicas
            and self.total <= self.updated
        )

    def rollout_timed_out(self, digest: str) -> str:
        """Follow mode: why the Deployment controller gave up on the rollout of template ``digest`` (the
        message of its Progressing condition, reason ProgressDeadlineExceeded), once it has seen the spec
        that rolls it (not paused, its generation observed); "" otherwise."""
        if self.paused or self.digest != digest or self.observed_generation < self.generation:
            return ""
        return self.timed_out

    def reports_timeouts(self) -> bool:
        """Follow mode: the Deployment has a progressDeadlineSeconds the Deployment controller reports."""
        return 0 < self.progress_deadline < NO_PROGRESS_DEADLINE

    def settling(self) -> bool:
        """A change of its spec has not landed yet: not observed, or old pods still there."""
        return self.observed_generation < self.generation or self.total > self.replicas

    def respec(self, **changes: Any) -> Workload:
        """This Deployment once its spec is changed so: a new generation, not yet observed; the pods
        are the ones there were."""
        mine = self.__dict__
        for k, v in changes.items():
            if mine[k] != v:
                return _evolve(self, generation=self.generation + 1, **changes)
        return self


@dataclass(frozen=True)
class HeldCheck:
    """Follow mode: the last result of the hold's self-test (a dry-run template change of an enrolled
    Deployment, see :mod:`greyrelease.admission.probe`), shared by every release the process drives and
    shown as their ``Held`` condition. ``status`` is ``True``, ``False`` or ``Unknown``, or None while the
    process has not tested yet (the condition recorded stays as it is)."""

    status: Literal["True", "False", "Unknown"] | None
    reason: str = ""
    message: str = ""


#: The process has not tested the hold yet.
UNTESTED = HeldCheck(None)


@dataclass(frozen=True)
class Observed:
    """The world as the adapters read it for one reconcile."""

    candidates: tuple[Workload, ...] = ()  # Deployments the spec names (0, 1 or several)
    canary: Workload | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int = 1
    uid: str = ""
    deleting: bool = False
    deletion_started: datetime | None = None
    name: str = ""  # the release's name (follow mode enrols its Deployment with it)
    routing_error: str = ""  # the router cannot work with what it found (e.g. a Service is missing)
    #: The canary pods the proxy can send to (ready endpoints of the canary Service): read only while
    #: a batch's canary grows, and only in the modes that route through a canary Service; else None.
    canary_endpoints: int | None = None
    checks: tuple[Check, ...] = ()  # metric samples taken in this pass (only when a check was due)
    answers: tuple[Answer, ...] = ()  # webhook answers got in this pass (only from webhooks that were due)
    rules: Rules = field(default_factory=Rules)  # the windows and freezes of the policies that govern the release
    queue: Queue | None = None  # the concurrency limit it is under, if any
    predecessors: tuple[Predecessor, ...] = ()  # the releases of spec.after, as found
    cycle: tuple[str, ...] = ()  # a cycle of spec.after through this release (a, b, a), if any
    #: Follow mode: the hold's self-test, when the process runs it (None: no Held condition).
    held_check: HeldCheck | None = None

    @property
    def target(self) -> Workload | None:
        """The one Deployment the spec names, if exactly one."""
        return self.candidates[0] if len(self.candidates) == 1 else None

    @property
    def own_canary(self) -> Workload | None:
        """The canary Deployment, if this release owns it."""
        return self.canary if self.canary is not None and self.canary.owner_uid == self.uid else None


def _evolve(obj: _T, **changes: Any) -> _T:
    """``dataclasses.replace`` for the frozen dataclasses here, without running ``__init__`` (they
    validate nothing): the projection copies a Workload and the Observed for most actions of every pass,
    and ``replace`` costs about 4 us on a 15-field frozen dataclass, a sixth of a whole ``decide``."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def project(world: Observed, action: Action) -> Observed:
    """The world as a later state of the same pass sees it once ``action`` is applied: Deployment specs
    and annotations change at once, pods do not (they are the ones observed)."""
    match action:
        case EnsureCanary(replicas=r, template=template) if template:
            canary = world.canary or Workload(name="", owner_uid=world.uid, observed_generation=0)
            return _evolve(world, canary=canary.respec(replicas=r, source=template))
        case EnsureCanary(replicas=r, image=image):
            canary = world.canary or Workload(name="", owner_uid=world.uid, observed_generation=0)
            return _evolve(world, canary=canary.respec(replicas=r, image=image))
        case ScaleStable(replicas=r) if world.target is not None:
            return _evolve(world, candidates=(world.target.respec(replicas=r),))
        case SetStableImage(image=image, replicas=r) if world.target is not None:
            return _evolve(world, candidates=(world.target.respec(image=image, replicas=r),))
        case DeleteCanary() if world.canary is not None:
            # Deleted in the foreground: the object stays, marked, until its pods are gone.
            return _evolve(world, canary=_evolve(world.canary, deleting=True))
        case ReleaseHold(digest=digest) if world.target is not None and world.target.held == digest:
            return _evolve(world, candidates=(world.target.respec(paused=False, held=""),))
        case Enrol(release=release) if world.target is not None:
            return _evolve(world, candidates=(_evolve(world.target, enrolled=release),))
        case Unenrol(release=release) if world.target is not None and world.target.enrolled == release:
            return _evolve(world, candidates=(_evolve(world.target, enrolled=""),))
        case RemoveAnnotations(keys=keys):
            return _evolve(world, annotations={k: v for k, v in world.annotations.items() if k not in keys})
    # Routing actions change nothing the planner observes.
    return world
