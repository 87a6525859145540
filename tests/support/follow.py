"""A small world for driving the pure planner through follow-mode releases: one Deployment that an admission
webhook holds (``commit``), an HPA that scales it (``scale``), and a Deployment controller that rolls its
template once the hold is released. It applies the planner's actions as the adapters would (idempotently),
and refuses any that writes the Deployment's replicas or template: in follow mode a release never does.
It stands in for no Kubernetes API: only the planner's own inputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus
from greyrelease.planner.actions import (
    Action,
    Enrol,
    EnsureCanary,
    Plan,
    ReleaseHold,
    Unenrol,
)
from greyrelease.planner.machine import Observed, Workload, decide
from greyrelease.planner.observed import Images, ReplicaSet

from tests.support.builders import T0, UID
from tests.support.world import Stepping

NAME = "web"


def follow_spec(**fields: Any) -> GreyReleaseSpec:
    """A follow-mode release of ``web`` (no targetVersion): batches of 25 and 50 % paused a minute each, then
    100 %, unless said."""
    base: dict[str, Any] = {
        "targetRef": {"name": NAME},
        "batches": [{"replicas": "25%", "pause": "1m"}, {"replicas": "50%", "pause": "1m"}, {"replicas": "100%"}],
    }
    base.update(fields)
    return GreyReleaseSpec.model_validate({k: v for k, v in base.items() if v is not None})


def digest_of(images: Images) -> str:
    return hashlib.sha256(repr(images).encode()).hexdigest()[:16]


@dataclass
class Deployment:
    """The target as the cluster has it: its template, its hold, and the ReplicaSets it has made."""

    replicas: int = 4
    images: Images = (("app", "app:v1"),)
    paused: bool = False
    held: str = ""
    enrolled: str = ""
    generation: int = 1
    observed_generation: int = 1
    revision: int = 1
    #: digest -> (ReplicaSet, revision); the current one is the stable.
    replicasets: dict[str, ReplicaSet] = field(default_factory=dict)
    current: str = ""
    rolling: bool = False  # the hold released, the rollout not done yet
    progress_deadline: int = 0  # spec.progressDeadlineSeconds (0: not set)
    timed_out: str = ""  # the Progressing condition's message once the controller reports ProgressDeadlineExceeded

    @property
    def digest(self) -> str:
        return digest_of(self.images)

    def rs(self, digest: str, images: Images) -> ReplicaSet:
        found = self.replicasets.get(digest)
        if found is None:
            found = ReplicaSet(f"web-{digest[:6]}", template_hash=digest[:10], digest=digest, images=images)
            self.replicasets[digest] = found
        return found


@dataclass
class FollowWorld(Stepping):
    spec: GreyReleaseSpec = field(default_factory=follow_spec)
    deployment: Deployment = field(default_factory=Deployment)
    canary: Workload | None = None
    status: GreyReleaseStatus = field(default_factory=GreyReleaseStatus)
    annotations: dict[str, str] = field(default_factory=dict)
    now: datetime = T0
    pods_get_ready: bool = True
    #: Whether the Deployment controller rolls a released template at once (else: ``finish_rollout``).
    rolls_at_once: bool = True
    weight: int = 0
    narrowed: bool = False
    prepared: bool = False
    deleting: bool = False
    target_gone: bool = False
    enrolled_elsewhere: str = ""
    plans: list[Plan] = field(default_factory=list)
    #: Every action applied, in order.
    applied: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        d = self.deployment
        d.current = d.digest
        rs = d.rs(d.digest, d.images)
        d.replicasets[d.digest] = replace(rs, revision=str(d.revision))

    # --- what people, GitOps and the HPA do ---------------------------------------------------------------

    def commit(self, image: str) -> str:
        """A new template applied (a GitOps sync): held by the webhook when enrolled. Its digest."""
        d = self.deployment
        d.images = (("app", image),)
        d.generation += 1
        d.observed_generation = d.generation
        if d.enrolled or self.enrolled_elsewhere:
            d.paused, d.held = True, d.digest
        else:
            self._roll()
        return d.digest

    def scale(self, replicas: int) -> None:
        """The HPA: the Deployment's replicas (the stable's pods follow at once)."""
        self.deployment.replicas = replicas

    def stall(self, message: str) -> None:
        """The Deployment controller gives up on the rollout under way: its Progressing condition False,
        reason ProgressDeadlineExceeded, with ``message`` (the pods stay as they are)."""
        d = self.deployment
        assert d.rolling, "no rollout under way"
        d.timed_out, d.observed_generation = message, d.generation

    def finish_rollout(self) -> None:
        if self.deployment.rolling:
            self._roll()

    # --- what the planner sees ----------------------------------------------------------------------------

    def target(self) -> Workload:
        d = self.deployment
        stable = d.replicasets[d.current]
        on_template = d.digest == d.current
        updated = d.replicas if on_template else 0
        return Workload(
            name=NAME,
            uid="web-uid",
            generation=d.generation,
            observed_generation=d.observed_generation,
            replicas=d.replicas,
            ready=d.replicas,
            updated=updated,
            available=d.replicas,
            total=d.replicas,
            image=d.images[0][1],
            container="app",
            containers=("app",),
            paused=d.paused,
            held=d.held,
            digest=d.digest,
            images=d.images,
            enrolled=self.enrolled_elsewhere or d.enrolled,
            stable=stable,
            progress_deadline=d.progress_deadline,
            timed_out=d.timed_out if d.rolling else "",
        )

    def observed(self) -> Observed:
        return Observed(
            candidates=() if self.target_gone else (self.target(),),
            canary=self.canary,
            annotations=dict(self.annotations),
            generation=1,
            uid=UID,
            name=NAME,
            deleting=self.deleting,
            deletion_started=T0 if self.deleting else None,
        )

    # --- the pass, and the adapters -----------------------------------------------------------------------

    def step(self) -> Plan:
        plan = decide(self.spec, self.status, self.observed(), self.now)
        for action in plan.actions:
            self.apply(action)
        self.status = plan.status
        self.plans.append(plan)
        return plan

    def _ready(self, w: Workload) -> Workload:
        n = w.replicas if self.pods_get_ready else 0
        return replace(w, ready=n, updated=n, available=n, total=w.replicas, observed_generation=w.generation)

    def _roll(self) -> None:
        """The Deployment controller: the template's ReplicaSet (an existing one for a template it had)
        becomes current and gets every pod."""
        d = self.deployment
        if d.digest != d.current:
            d.revision += 1
            rs = d.rs(d.digest, d.images)
            d.replicasets[d.digest] = replace(rs, revision=str(d.revision))
            d.current = d.digest
        d.rolling = False
        d.timed_out = ""
        d.observed_generation = d.generation

    def apply(self, action: Action) -> None:
        self.applied.append(action)
        d = self.deployment
        match action:
            case EnsureCanary(replicas=r, template=template) if template:
                # The adapter builds only from the template the Deployment holds as planned.
                if template != d.digest:
                    return
                if self.canary is None:
                    self.canary = Workload(name="web-canary", owner_uid=UID, container="app", containers=("app",))
                self.canary = self._ready(replace(self.canary, replicas=r, source=template, image=d.images[0][1]))
            case ReleaseHold(digest=digest):
                if d.paused and d.held == digest:
                    d.paused, d.held = False, ""
                    d.generation += 1
                    d.rolling = True
                    if self.rolls_at_once:
                        self._roll()
                    elif d.digest == d.current:
                        self._roll()  # the template it runs: nothing to roll
            case Enrol(release=release):
                d.enrolled = release
            case Unenrol(release=release):
                if d.enrolled == release:
                    d.enrolled = ""
            case _ if self.apply_common(action):
                pass
            case _:
                raise AssertionError(f"not an action of follow mode: {action}")

    def live(self, batch: int) -> None:
        """Step until batch ``batch`` has its traffic."""
        for _ in range(50):
            plan = self.step()
            st = self.status
            if st.current_batch == batch and st.batch_times.ready_at is not None and st.phase == "Progressing":
                return
            if plan.requeue_after is None or plan.requeue_after > 0:
                self.now += timedelta(seconds=1 if plan.requeue_after is None else min(plan.requeue_after, 3600))
        raise AssertionError(f"batch {batch} never went live: {self.status.phase} {self.status.message}")

    def reasons(self) -> list[str]:
        return [e.reason for p in self.plans for e in p.events]
