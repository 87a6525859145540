"""What the governance tests share: instants, windows and freezes written as in a spec, the rules of a
release and its policies, GreyRelease objects with a creation time, and :class:`GovWorld`, the planner's
world under governance."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from greyrelease.api.release import Freeze, Obj, Window
from greyrelease.planner.actions import FreeSlot, Plan, TakeSlot
from greyrelease.planner.governance import SPEC, Predecessor, Queue, Rules, Source
from greyrelease.planner.machine import Observed

from tests.support.builders import NS
from tests.support.world import World

POLICY = "GreyReleasePolicy platform"
LEASE = "greyrelease-system/greyrelease-slots-test"


def at(text: str) -> datetime:
    """An instant written in RFC 3339."""
    return datetime.fromisoformat(text)


def window(days: list[str], start: str, end: str, zone: str = "UTC") -> Window:
    return Window.model_validate({"days": days, "start": start, "end": end, "timeZone": zone})


def freeze(start: datetime | str, end: datetime | str, reason: str = "") -> Freeze:
    return Freeze.model_validate({"from": start, "to": end, "reason": reason})


def rules(*windows: Window, freezes: tuple[Freeze, ...] = (), name: str = SPEC) -> Rules:
    return Rules((Source(name, tuple(windows), freezes),))


#: Office hours in Berlin, as the model reads them and as a spec writes them.
OFFICE = window(["Mon-Fri"], "09:00", "17:00", "Europe/Berlin")  # 08:00Z-16:00Z in winter
OFFICE_JSON = {"days": ["Mon-Fri"], "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}
#: A Saturday, and the Monday opening of ``OFFICE`` after it.
SATURDAY = at("2026-12-05T10:00:00Z")
MONDAY_OPENING = at("2026-12-07T08:00:00Z")


@dataclass
class GovWorld(World):
    """A :class:`World` under governance: the rules of its policies, a queue and predecessors as the
    adapters would observe them. A slot taken or freed shows in the queue the next pass sees."""

    rules: Rules = field(default_factory=Rules)
    queue: Queue | None = None
    predecessors: tuple[Predecessor, ...] = ()
    cycle: tuple[str, ...] = ()
    slot_actions: list[TakeSlot | FreeSlot] = field(default_factory=list)

    def observed(self) -> Observed:
        return replace(
            super().observed(), rules=self.rules, queue=self.queue, predecessors=self.predecessors, cycle=self.cycle
        )

    def apply(self, action: object) -> None:
        match action:
            case TakeSlot():
                self.slot_actions.append(action)
                assert self.queue is not None
                self.queue = replace(self.queue, held=True, holders=(*self.queue.holders, "release-uid"))
            case FreeSlot():
                self.slot_actions.append(action)
                if self.queue is not None:
                    holders = tuple(h for h in self.queue.holders if h != "release-uid")
                    self.queue = replace(self.queue, held=False, holders=holders)
            case _:
                super().apply(action)


def reasons(plan: Plan) -> list[str]:
    return [e.reason for e in plan.events]


def gr(
    name: str,
    created: str = "2026-01-01T12:00:00Z",
    *,
    status: Obj | None = None,
    generation: int = 1,
    after: list[str] | None = None,
) -> Obj:
    obj: Obj = {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyRelease",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "generation": generation,
        },
        "spec": {"targetRef": {"name": name}, "targetVersion": "v2", "batchSize": 1, "canaryWeight": 50},
    }
    if after:
        obj["spec"]["after"] = [{"name": a} for a in after]
    if status is not None:
        obj["status"] = status
    return obj
