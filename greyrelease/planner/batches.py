"""Batch arithmetic: a spec and the stable replica count in, the table of batches out. Pure.

Worked example (shorthand ``batchSize: 3, canaryWeight: 25`` over 10 replicas)::

    batch  canary  weight
    1      3       25
    2      6       50
    3      9       75
    4      10      100      <- the last batch is always all replicas and all traffic

In Service mode (and with no traffic routing) traffic follows the replica ratio, so the stable Deployment
shrinks as the canary grows (stable = replicas - canary) and the weight is the canary's share of the pods.
With an nginx Ingress or a Gateway API route the weight is set explicitly and the stable Deployment keeps
all its replicas, so an abort can send everything back to it at once.

In follow mode (no ``targetVersion``) the stable is never scaled: it keeps all its replicas in every mode,
``total`` is its size now (the HPA's or Git's, read every pass), and where traffic follows the replica
ratio the canary's share is canary / (stable + canary): a batch of 100% of the replicas gets 50%. The
promotion (the Deployment rolling the held template itself) does the rest. That share is also the weight
of a batch that sets none in the nginx and Gateway API modes (a canary pod then carries a stable pod's
load); their last batch has all the traffic, as in pinned mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from greyrelease.api.release import Approval as ApprovalSpec
from greyrelease.api.release import GreyReleaseSpec, parse_duration

MANUAL = "manual"


@dataclass(frozen=True)
class Approval:
    """How long a manual pause waits for its approval, and what happens then."""

    timeout: float  # seconds from when the batch went live
    on_timeout: Literal["abort", "promote"]


@dataclass(frozen=True)
class Step:
    """One batch, resolved against the stable replica count."""

    number: int  # 1-based
    canary_replicas: int
    stable_replicas: int
    weight: int
    pause: float | str | None  # seconds, MANUAL, or None (no pause)
    header_match: dict[str, str] | None = None
    approval: Approval | None = None  # with MANUAL: its timeout

    @property
    def pause_label(self) -> str:
        if self.pause is None:
            return "-"
        if self.pause == MANUAL:
            if self.approval is not None:
                return f"{MANUAL} ({self.approval.timeout:g}s, then {self.approval.on_timeout})"
            return MANUAL
        return f"{self.pause:g}s"


class PlanError(ValueError):
    """The spec cannot be honoured against the cluster as it is (e.g. replicas decrease)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _pause(value: str | None) -> float | str | None:
    if value is None:
        return None
    if value == MANUAL:
        return MANUAL
    seconds = parse_duration(value)
    return seconds or None


def _approval(pause: str | None, approval: ApprovalSpec | None) -> Approval | None:
    if pause != MANUAL or approval is None:
        return None
    return Approval(parse_duration(approval.timeout), approval.on_timeout)


def _resolve_replicas(value: int | str, total: int) -> int:
    """``2`` -> 2; ``"20%"`` of 10 -> 2 (rounded up, at least 1); never more than ``total``."""
    if isinstance(value, str):
        count = math.ceil(total * int(value.rstrip("%")) / 100)
        return min(max(count, 1), total)
    return min(value, total)


def share(canary: int, total: int) -> int:
    """The canary's share of ``total`` pods in percent (2 of 10 -> 20)."""
    return 0 if total <= 0 else round(100 * canary / total)


def expand(spec: GreyReleaseSpec, total: int) -> list[Step]:
    """The batches of ``spec`` for a stable Deployment of ``total`` replicas.

    Raises :class:`PlanError` naming the field when the plan cannot be honoured.
    """
    if total < 1:
        raise PlanError("spec.targetRef", "the Deployment has 0 replicas; scale it up to release it")
    weighted = spec.traffic_routing is not None and spec.traffic_routing.service is None
    follows = spec.follows
    Row = tuple[int, int | None, str | None, dict[str, str] | None, ApprovalSpec | None]
    rows: list[Row] = []
    if spec.batches is not None:
        for b in spec.batches:
            rows.append(
                (_resolve_replicas(b.replicas, total), b.weight, b.pause, b.header_match, b.approval or spec.approval)
            )
    else:
        assert spec.batch_size is not None and spec.canary_weight is not None
        count = math.ceil(total / spec.batch_size)
        if weighted and spec.canary_weight > 0:
            count = max(count, math.ceil(100 / spec.canary_weight))
        for k in range(1, count + 1):
            rows.append(
                (min(k * spec.batch_size, total), min(k * spec.canary_weight, 100), spec.pause, None, spec.approval)
            )
        # The shorthand's pause holds every batch but the last: after the last comes promotion.
        last = rows[-1]
        rows[-1] = (last[0], last[1], None, None, None)

    steps: list[Step] = []
    for i, (canary, weight, pause, headers, approval) in enumerate(rows, start=1):
        if i == len(rows):
            canary, weight = total, 100
        if steps and canary < steps[-1].canary_replicas:
            raise PlanError(
                f"spec.batches[{i - 1}].replicas",
                f"{canary} canary replicas is fewer than the {steps[-1].canary_replicas} of the batch before",
            )
        if not weighted or weight is None:
            weight = share(canary, total + canary if follows else total)
        if steps and weight < steps[-1].weight:
            raise PlanError(f"spec.batches[{i - 1}].weight", "weights must never decrease")
        stable = total if weighted or follows else total - canary
        steps.append(Step(i, canary, stable, weight, _pause(pause), headers, _approval(pause, approval)))
    return steps


def earliest_finish(steps: list[Step]) -> float | None:
    """Seconds of pauses the release waits at least, or None when a batch waits for approval."""
    if any(s.pause == MANUAL for s in steps):
        return None
    return sum(float(s.pause) for s in steps if isinstance(s.pause, (int, float)))
