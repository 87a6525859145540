"""A small in-memory world for driving the pure planner through whole releases in tests.

It applies the planner's actions the way the adapters would (idempotently) and lets a test decide
whether pods become ready. It stands in for no Kubernetes API: only the planner's own inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus
from greyrelease.planner.actions import (
    DeleteCanary,
    EnsureCanary,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ResetRouting,
    RestoreStableSelector,
    ScaleStable,
    SetStableImage,
    SetWeight,
)
from greyrelease.planner.machine import Observed, Workload, decide

from tests.support.builders import T0, UID


def spec(**fields: Any) -> GreyReleaseSpec:
    base: dict[str, Any] = {"targetRef": {"name": "web"}, "targetVersion": "v2", "batchSize": 2, "canaryWeight": 20}
    base.update(fields)
    return GreyReleaseSpec.model_validate({k: v for k, v in base.items() if v is not None})


def workload(name: str = "web", replicas: int = 10, image: str = "app:v1", **kw: Any) -> Workload:
    ready = kw.pop("ready", replicas)
    return Workload(
        name=name,
        uid=f"{name}-uid",
        replicas=replicas,
        ready=ready,
        updated=ready,
        available=ready,
        total=replicas,
        image=image,
        container="app",
        containers=("app",),
        template_hash=kw.pop("template_hash", "stablehash"),
        **kw,
    )


class Stepping:
    """What both in-memory worlds share: the canary and routing actions, the user's annotations consumed,
    and stepping the planner until a phase. A world holds ``canary``, ``prepared``, ``weight``,
    ``narrowed``, ``annotations``, ``status`` and ``now``, and plans with :meth:`step`."""

    canary: Workload | None
    prepared: bool
    weight: int
    narrowed: bool
    annotations: dict[str, str]
    status: GreyReleaseStatus
    now: datetime

    def step(self) -> Plan:
        raise NotImplementedError

    def apply_common(self, action: object) -> bool:
        """Apply ``action`` if it is one both worlds carry out alike; False when it is not."""
        match action:
            case DeleteCanary():
                if self.canary is not None and self.canary.owner_uid == UID:
                    self.canary = None
            case PrepareRouting():
                self.prepared = True
            case SetWeight(weight=w):
                self.weight = w
                self.narrowed = w == 0
            case RestoreStableSelector():
                self.narrowed = False
            case ResetRouting():
                self.narrowed = False
                self.prepared = False
                self.weight = 0
            case RemoveAnnotations(keys=keys):
                for k in keys:
                    self.annotations.pop(k, None)
            case _:
                return False
        return True

    def run(self, *, until: set[str], max_steps: int = 200, tick: float = 1.0) -> list[str]:
        """Step (advancing time by ``tick`` when the plan waits) until the phase is in ``until``."""
        phases = []
        for _ in range(max_steps):
            plan = self.step()
            phases.append(plan.status.phase or "")
            if plan.status.phase in until:
                return phases
            if plan.requeue_after is None or plan.requeue_after > 0:
                self.now += timedelta(seconds=tick if plan.requeue_after is None else min(plan.requeue_after, 3600))
        raise AssertionError(f"never reached {until}; phases: {phases[-10:]}, status: {self.status}")


@dataclass
class World(Stepping):
    spec: GreyReleaseSpec
    stable: Workload | None = field(default_factory=workload)
    canary: Workload | None = None
    status: GreyReleaseStatus = field(default_factory=GreyReleaseStatus)
    annotations: dict[str, str] = field(default_factory=dict)
    now: datetime = T0
    pods_get_ready: bool = True
    weight: int = 0  # what the router last set
    narrowed: bool = False
    prepared: bool = False
    deleting: bool = False
    extra_candidates: tuple[Workload, ...] = ()
    canary_endpoints: int | None = None  # what the router reads of the canary Service (None: not read)
    plans: list[Plan] = field(default_factory=list)
    #: The status of the plan being applied (adapters act on what the plan records).
    acting: GreyReleaseStatus | None = None

    def observed(self) -> Observed:
        candidates = ((self.stable,) if self.stable else ()) + self.extra_candidates
        return Observed(
            candidates=candidates,
            canary=self.canary,
            annotations=dict(self.annotations),
            generation=1,
            uid=UID,
            deleting=self.deleting,
            deletion_started=T0 if self.deleting else None,
            canary_endpoints=self.canary_endpoints,
        )

    def step(self) -> Plan:
        plan = decide(self.spec, self.status, self.observed(), self.now)
        self.acting = plan.status
        for action in plan.actions:
            self.apply(action)
        self.status = plan.status
        self.plans.append(plan)
        return plan

    def _ready(self, w: Workload) -> Workload:
        n = w.replicas if self.pods_get_ready else 0
        return replace(w, ready=n, updated=n, available=n, total=w.replicas, observed_generation=w.generation)

    def apply(self, action: object) -> None:
        match action:
            case EnsureCanary(replicas=r, image=image):
                if self.canary is None:
                    self.canary = Workload(name="web-canary", owner_uid=UID, container="app", containers=("app",))
                self.canary = self._ready(replace(self.canary, replicas=r, image=image))
            case ScaleStable(replicas=r):
                assert self.stable is not None
                self.stable = self._ready(replace(self.stable, replicas=r))
            case SetStableImage(image=image, replicas=r):
                assert self.stable is not None
                changed = image != self.stable.image
                self.stable = self._ready(
                    replace(
                        self.stable,
                        image=image,
                        replicas=r,
                        template_hash="newhash" if changed else self.stable.template_hash,
                    )
                )
            case _ if self.apply_common(action):
                pass
            case _:
                raise AssertionError(f"unexpected action {action}")

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
