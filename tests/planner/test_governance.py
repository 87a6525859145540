"""Release governance: windows and freezes (pure, with a fake ``now``), approval expiry, the concurrency
limit (the planner's side and the slots in a Lease on the in-memory API server), ordered releases, and
the bad input the models refuse."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from greyrelease.api.release import (
    ABORT_ANNOTATION,
    PAUSE_ANNOTATION,
    PROMOTE_ANNOTATION,
    BatchState,
    Freeze,
    GreyReleasePolicy,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Obj,
    Phase,
    Window,
)
from greyrelease.kube.protocol import Conflict, MemoryKube, path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import (
    DeleteCanary,
    EnsureCanary,
    FreeSlot,
    Plan,
    PrepareRouting,
    RemoveAnnotations,
    ScaleStable,
    SetStableImage,
    SetWeight,
    TakeSlot,
)
from greyrelease.planner.batches import MANUAL, Approval, expand
from greyrelease.planner.governance import (
    SPEC,
    Hold,
    Predecessor,
    Queue,
    Rules,
    Source,
    find_cycle,
    instant,
    local_text,
    next_open,
    open_at,
    queue_order,
)
from greyrelease.planner.machine import INVALID_POLL, Observed, decide, progressing
from greyrelease.reconcile.policies import (
    Governing,
    observe_governance,
    queue_of,
    read_cycle,
    read_predecessors,
    read_queue,
)
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.slots import free as free_slot
from greyrelease.reconcile.slots import holders_of, lease_path
from greyrelease.reconcile.slots import take as take_slot
from pydantic import ValidationError

from tests.support.builders import RELEASE, T0, cluster, release, roll_out, stable, status_of
from tests.support.world import World, spec

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
POLICY = "GreyReleasePolicy platform"
NS = "shop"
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


OFFICE = window(["Mon-Fri"], "09:00", "17:00", "Europe/Berlin")  # 08:00Z-16:00Z in winter
WEEKEND = window(["Sat-Mon"], "10:00", "12:00")
NIGHT = window(["Fri"], "22:00", "02:00")
DAILY_BERLIN = window(["Mon-Sun"], "09:00", "17:00", "Europe/Berlin")
OFFICE_NY = window(["Mon-Fri"], "09:00", "17:00", "America/New_York")


# --- windows (pure) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("win", "now", "opens"),
    [
        (OFFICE, "2026-12-07T08:00:00Z", "2026-12-07T08:00:00Z"),
        (OFFICE, "2026-12-07T07:59:59.999999Z", "2026-12-07T08:00:00Z"),
        (OFFICE, "2026-12-07T15:59:59Z", "2026-12-07T15:59:59Z"),
        (OFFICE, "2026-12-07T16:00:00Z", "2026-12-08T08:00:00Z"),
        (OFFICE, "2026-12-04T16:00:00Z", "2026-12-07T08:00:00Z"),
        (OFFICE, "2026-12-05T12:00:00Z", "2026-12-07T08:00:00Z"),
        (WEEKEND, "2026-12-04T11:00:00Z", "2026-12-05T10:00:00Z"),
        (WEEKEND, "2026-12-06T11:00:00Z", "2026-12-06T11:00:00Z"),
        (WEEKEND, "2026-12-07T11:59:00Z", "2026-12-07T11:59:00Z"),
        (WEEKEND, "2026-12-07T12:00:00Z", "2026-12-12T10:00:00Z"),
        (WEEKEND, "2026-12-08T11:00:00Z", "2026-12-12T10:00:00Z"),
        (NIGHT, "2026-12-04T22:00:00Z", "2026-12-04T22:00:00Z"),
        (NIGHT, "2026-12-05T01:00:00Z", "2026-12-05T01:00:00Z"),
        (NIGHT, "2026-12-04T21:59:00Z", "2026-12-04T22:00:00Z"),
        (NIGHT, "2026-12-05T02:00:00Z", "2026-12-11T22:00:00Z"),
        (NIGHT, "2026-12-05T03:00:00Z", "2026-12-11T22:00:00Z"),
    ],
    ids=[
        "mon-fri-open-exactly-at-start",
        "mon-fri-closed-just-before-start",
        "mon-fri-open-just-before-end",
        "mon-fri-closed-exactly-at-end",
        "friday-evening-waits-for-monday",
        "saturday-waits-for-monday",
        "sat-mon-friday-waits-for-saturday",
        "sat-mon-open-on-sunday",
        "sat-mon-open-on-monday-the-wrapped-day",
        "sat-mon-closed-at-monday-end",
        "sat-mon-tuesday-waits-for-saturday",
        "midnight-open-at-friday-start",
        "midnight-open-saturday-1am",
        "midnight-closed-friday-21-59",
        "midnight-closed-saturday-2am",
        "midnight-saturday-3am-waits-a-week",
    ],
)
def test_a_window_opens_at_its_start_and_closes_at_its_end(win: Window, now: str, opens: str) -> None:
    t, expected = at(now), at(opens)
    assert rules(win).next_start(t) == expected
    assert next_open([win], t) == expected
    assert open_at([win], t) == (expected == t)
    hold = rules(win).hold(t)
    assert (hold is None) == (expected == t)
    if hold is not None:
        assert hold.until == expected


def test_a_day_list_mixes_names_and_ranges() -> None:
    win = window(["Mon-Wed", "Fri"], "09:00", "10:00")
    assert win.weekdays == frozenset({0, 1, 2, 4})
    thursday = at("2026-12-10T09:30:00Z")
    assert not open_at([win], thursday)
    assert rules(win).next_start(thursday) == at("2026-12-11T09:00:00Z")


@pytest.mark.parametrize(
    ("now", "opens"),
    [
        ("2026-03-28T00:00:00Z", "2026-03-28T08:00:00Z"),  # Saturday, still CET (+01:00)
        ("2026-03-29T00:00:00Z", "2026-03-29T07:00:00Z"),  # the day clocks go forward: CEST (+02:00)
        ("2026-03-30T15:00:00Z", "2026-03-31T07:00:00Z"),  # summer: closed at 17:00 CEST, open at 09:00 CEST
        ("2026-10-24T00:00:00Z", "2026-10-24T07:00:00Z"),  # the last summer day
        ("2026-10-25T00:00:00Z", "2026-10-25T08:00:00Z"),  # the day clocks go back: CET again
    ],
    ids=["winter", "day-of-spring-change", "summer-next-day", "last-summer-day", "day-of-autumn-change"],
)
def test_a_berlin_window_keeps_its_wall_clock_hours_across_dst(now: str, opens: str) -> None:
    assert rules(DAILY_BERLIN).next_start(at(now)) == at(opens)


def test_a_berlin_window_closes_at_local_17_in_summer() -> None:
    r = rules(DAILY_BERLIN)
    assert r.hold(at("2026-03-29T14:59:59Z")) is None
    hold = r.hold(at("2026-03-29T15:00:00Z"))
    assert hold is not None and hold.until == at("2026-03-30T07:00:00Z")
    assert "opens 2026-03-30T09:00:00+02:00" in hold.message


def test_a_start_in_the_skipped_hour_opens_when_the_clock_jumps() -> None:
    # 2026-03-29 in Berlin: 02:00 CET becomes 03:00 CEST at 01:00Z; 02:30 never shows on the clock.
    assert instant(date(2026, 3, 29), time(2, 30), BERLIN) == at("2026-03-29T01:00:00Z")
    gap = window(["Sun"], "02:30", "04:00", "Europe/Berlin")
    r = rules(gap)
    hold = r.hold(at("2026-03-28T12:00:00Z"))
    assert hold is not None and hold.until == at("2026-03-29T01:00:00Z")
    assert "opens 2026-03-29T03:00:00+02:00" in hold.message
    just_before = r.hold(at("2026-03-29T00:59:59Z"))
    assert just_before is not None and just_before.until == at("2026-03-29T01:00:00Z")
    assert r.hold(at("2026-03-29T01:00:00Z")) is None
    assert r.hold(at("2026-03-29T01:59:59Z")) is None  # 03:59:59 CEST
    assert r.hold(at("2026-03-29T02:00:00Z")) is not None  # 04:00 CEST: closed


def test_an_ambiguous_start_opens_at_its_first_occurrence() -> None:
    # 2026-10-25 in Berlin: 03:00 CEST becomes 02:00 CET at 01:00Z; 02:30 shows twice (00:30Z, 01:30Z).
    assert instant(date(2026, 10, 25), time(2, 30), BERLIN) == at("2026-10-25T00:30:00Z")
    twice = window(["Sun"], "02:30", "05:00", "Europe/Berlin")
    r = rules(twice)
    hold = r.hold(at("2026-10-24T12:00:00Z"))
    assert hold is not None and hold.until == at("2026-10-25T00:30:00Z")
    assert "opens 2026-10-25T02:30:00+02:00" in hold.message
    assert r.hold(at("2026-10-25T00:29:59Z")) is not None
    assert r.hold(at("2026-10-25T00:30:00Z")) is None
    assert r.hold(at("2026-10-25T03:59:59Z")) is None  # 04:59:59 CET
    assert r.hold(at("2026-10-25T04:00:00Z")) is not None  # 05:00 CET: closed


def test_instant_of_an_ordinary_wall_time() -> None:
    assert instant(date(2026, 12, 7), time(9, 0), BERLIN) == at("2026-12-07T08:00:00Z")
    assert instant(date(2026, 7, 6), time(9, 0), BERLIN) == at("2026-07-06T07:00:00Z")


def test_a_window_in_new_york() -> None:
    r = rules(OFFICE_NY)
    hold = r.hold(at("2026-12-07T13:59:00Z"))  # 08:59 EST
    assert hold is not None and hold.until == at("2026-12-07T14:00:00Z")
    assert hold.message == "waiting for release window (opens 2026-12-07T09:00:00-05:00)"
    assert r.hold(at("2026-12-07T14:00:00Z")) is None
    # Summer (EDT, -04:00): 09:00 local is 13:00Z.
    assert r.hold(at("2026-07-06T13:00:00Z")) is None
    summer = r.hold(at("2026-07-06T12:59:00Z"))
    assert summer is not None and summer.until == at("2026-07-06T13:00:00Z")


def test_local_text_is_in_the_zone_of_the_windows() -> None:
    t = at("2026-12-07T08:00:00Z")
    assert local_text(t, BERLIN) == "2026-12-07T09:00:00+01:00"
    assert local_text(t, None) == "2026-12-07T08:00:00Z"


EVENINGS = window(["Mon-Sun"], "15:00", "20:00")  # a policy's window, in UTC


def both() -> Rules:
    """The release's window (Berlin office hours) and a policy's (evenings UTC): open 15:00Z-16:00Z."""
    return Rules((Source(SPEC, (OFFICE,)), Source(POLICY, (EVENINGS,))))


def test_every_source_with_windows_must_be_open() -> None:
    r = both()
    # Monday morning: the release's window is open, the policy's is not.
    hold = r.hold(at("2026-12-07T10:00:00Z"))
    assert hold == Hold(
        at("2026-12-07T15:00:00Z"), f"waiting for release window of {POLICY} (opens 2026-12-07T16:00:00+01:00)"
    )
    assert r.hold(at("2026-12-07T15:00:00Z")) is None
    assert r.hold(at("2026-12-07T15:59:59Z")) is None
    # 17:00 Berlin: the release's window closed, the policy's still open.
    late = r.hold(at("2026-12-07T16:00:00Z"))
    assert late == Hold(at("2026-12-08T15:00:00Z"), "waiting for release window (opens 2026-12-08T16:00:00+01:00)")
    # Saturday: the policy's is open, the release's only on Monday.
    weekend = r.hold(at("2026-12-05T16:00:00Z"))
    assert weekend is not None and weekend.until == at("2026-12-07T15:00:00Z")


def test_one_source_with_several_windows_needs_only_one_open() -> None:
    r = rules(window(["Mon"], "09:00", "10:00"), window(["Mon"], "14:00", "15:00"))
    assert r.hold(at("2026-12-07T14:30:00Z")) is None
    hold = r.hold(at("2026-12-07T11:00:00Z"))
    assert hold is not None and hold.until == at("2026-12-07T14:00:00Z")


def test_windows_that_never_meet_hold_without_an_end() -> None:
    monday, tuesday = window(["Mon"], "09:00", "10:00"), window(["Tue"], "09:00", "10:00")
    r = Rules((Source(SPEC, (monday,)), Source(POLICY, (tuesday,))))
    t = at("2026-12-07T09:30:00Z")
    assert r.next_start(t) is None
    hold = r.hold(t)
    assert hold is not None and hold.until is None
    assert hold.message.startswith(f"waiting for release window of {POLICY}")
    # The message reads as a sentence: it does not announce an opening that never comes.
    assert "(no time within a year is open in every window)" in hold.message
    assert "opens no time" not in hold.message


def test_no_rules_never_hold() -> None:
    assert not Rules()
    assert Rules().hold(T0) is None
    assert Rules().next_start(T0) == T0
    assert not rules()  # a source with neither windows nor freezes
    assert rules(OFFICE)


# --- freezes (pure) ---------------------------------------------------------------------------------

XMAS = freeze("2026-12-20T00:00:00Z", "2026-12-27T00:00:00Z", "christmas")
NEW_YEAR = freeze("2026-12-24T00:00:00Z", "2027-01-02T00:00:00Z", "new year")


def test_inside_a_freeze_holds_until_its_end() -> None:
    hold = rules(freezes=(XMAS,)).hold(at("2026-12-21T10:00:00Z"))
    assert hold == Hold(
        at("2026-12-27T00:00:00Z"), "waiting for the end of freeze 'christmas' (next start 2026-12-27T00:00:00Z)"
    )


def test_freeze_boundaries_from_inclusive_to_exclusive() -> None:
    r = rules(freezes=(XMAS,))
    assert r.hold(at("2026-12-19T23:59:59.999999Z")) is None
    start = r.hold(at("2026-12-20T00:00:00Z"))
    assert start is not None and start.until == at("2026-12-27T00:00:00Z")
    last = r.hold(at("2026-12-26T23:59:59.999999Z"))
    assert last is not None and last.until == at("2026-12-27T00:00:00Z")
    assert r.hold(at("2026-12-27T00:00:00Z")) is None


@pytest.mark.parametrize(
    ("now", "named"),
    [("2026-12-21T00:00:00Z", "christmas"), ("2026-12-25T00:00:00Z", "new year"), ("2026-12-30T00:00:00Z", "new year")],
    ids=["in-the-first-only", "in-both", "in-the-second-only"],
)
def test_overlapping_freezes_hold_until_the_later_end(now: str, named: str) -> None:
    for order in ((XMAS, NEW_YEAR), (NEW_YEAR, XMAS)):
        hold = rules(freezes=order).hold(at(now))
        assert hold is not None and hold.until == at("2027-01-02T00:00:00Z")
        assert f"freeze {named!r}" in hold.message


def test_freezes_of_different_sources_add_up() -> None:
    r = Rules((Source(SPEC, freezes=(XMAS,)), Source(POLICY, freezes=(NEW_YEAR,))))
    hold = r.hold(at("2026-12-25T00:00:00Z"))
    assert hold is not None and hold.until == at("2027-01-02T00:00:00Z")
    assert hold.message == f"waiting for the end of freeze 'new year' of {POLICY} (next start 2027-01-02T00:00:00Z)"


def test_a_freeze_ending_outside_a_window_waits_for_the_next_opening() -> None:
    incident = freeze("2026-12-03T00:00:00Z", "2026-12-04T20:00:00Z", "incident")  # ends Friday 21:00 Berlin
    r = rules(OFFICE, freezes=(incident,))
    hold = r.hold(at("2026-12-03T10:00:00Z"))
    assert hold == Hold(
        at("2026-12-07T08:00:00Z"), "waiting for the end of freeze 'incident' (next start 2026-12-07T09:00:00+01:00)"
    )
    # Just after the freeze: a closed window, named as such.
    after = r.hold(at("2026-12-04T20:00:00Z"))
    assert after == Hold(at("2026-12-07T08:00:00Z"), "waiting for release window (opens 2026-12-07T09:00:00+01:00)")


def test_a_window_opening_into_a_freeze_waits_for_the_freeze() -> None:
    monday = freeze("2026-12-07T07:00:00Z", "2026-12-07T12:00:00Z", "deploy freeze")
    hold = rules(OFFICE, freezes=(monday,)).hold(at("2026-12-05T12:00:00Z"))
    assert hold is not None and hold.until == at("2026-12-07T12:00:00Z")


def test_a_freeze_without_a_reason() -> None:
    hold = rules(freezes=(freeze("2026-12-20T00:00:00Z", "2026-12-21T00:00:00Z"),)).hold(at("2026-12-20T01:00:00Z"))
    assert hold is not None and hold.message == "waiting for the end of a freeze (next start 2026-12-21T00:00:00Z)"


def test_a_freeze_is_read_in_its_own_offset() -> None:
    berlin = freeze("2026-12-20T00:00:00+01:00", "2026-12-21T00:00:00+01:00")
    r = rules(freezes=(berlin,))
    assert r.hold(at("2026-12-19T23:00:00Z")) is not None  # midnight in Berlin
    assert r.hold(at("2026-12-19T22:59:59Z")) is None
    assert r.hold(at("2026-12-20T23:00:00Z")) is None


# --- the planner: waiting for a window or a freeze --------------------------------------------------


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


def changes(plan: Plan) -> list[object]:
    """The actions that change the canary, the stable or the traffic."""
    kinds = (EnsureCanary, ScaleStable, SetStableImage, SetWeight, DeleteCanary, PrepareRouting)
    return [a for a in plan.actions if isinstance(a, kinds)]


OFFICE_JSON = {"days": ["Mon-Fri"], "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}
SATURDAY = at("2026-12-05T10:00:00Z")
MONDAY_OPENING = at("2026-12-07T08:00:00Z")


def test_outside_its_window_a_release_waits_before_batch_1_and_writes_nothing_until_it_opens() -> None:
    w = GovWorld(spec(windows=[OFFICE_JSON]), now=SATURDAY)
    first = w.step()
    st = first.status
    assert (st.phase, st.batch_state, st.current_batch) == (Phase.WAITING, None, 0)
    assert st.message == "waiting for release window (opens 2026-12-07T09:00:00+01:00)"
    assert first.actions == ()
    assert first.requeue_after == (MONDAY_OPENING - SATURDAY).total_seconds() == 46 * 3600
    assert reasons(first) == [R.WAITING]
    assert not progressing(st) and st.restore.replicas is None
    # Looked at again before the opening (a resync, an edit elsewhere): the same status, so no write.
    for later in (at("2026-12-06T12:00:00Z"), MONDAY_OPENING - timedelta(microseconds=1)):
        w.now = later
        again = w.step()
        assert again.status == st
        assert again.actions == () and again.events == ()
        assert again.requeue_after == pytest.approx((MONDAY_OPENING - later).total_seconds())
    w.now = MONDAY_OPENING
    opened = w.step()
    assert (opened.status.phase, opened.status.current_batch) == (Phase.PROGRESSING, 1)
    assert opened.actions[0] == PrepareRouting()
    assert any(isinstance(a, EnsureCanary) and a.replicas == 2 for a in opened.actions)
    assert R.RELEASE_STARTED in reasons(opened)


def test_a_policy_freeze_holds_the_start_and_names_the_policy() -> None:
    xmas = Rules((Source(POLICY, freezes=(XMAS,)),))
    w = GovWorld(spec(), rules=xmas, now=at("2026-12-21T10:00:00Z"))
    plan = w.step()
    assert plan.status.phase == Phase.WAITING
    assert plan.status.message == (
        f"waiting for the end of freeze 'christmas' of {POLICY} (next start 2026-12-27T00:00:00Z)"
    )
    assert plan.actions == ()
    assert plan.requeue_after == (at("2026-12-27T00:00:00Z") - w.now).total_seconds()


def test_windows_that_never_meet_wait_on_a_poll() -> None:
    w = GovWorld(
        spec(windows=[{"days": ["Mon"], "start": "09:00", "end": "10:00"}]),
        rules=Rules((Source(POLICY, (window(["Tue"], "09:00", "10:00"),)),)),
        now=at("2026-12-07T09:30:00Z"),
    )
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and plan.actions == ()
    assert plan.requeue_after == INVALID_POLL


def test_abort_while_waiting_to_start_ends_it_with_nothing_changed() -> None:
    w = GovWorld(spec(windows=[OFFICE_JSON]), now=SATURDAY)
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ABORTED
    assert plan.status.message == "aborted before it started; nothing was changed"
    assert plan.actions == ()
    assert w.canary is None and w.weight == 0 and not w.prepared


FROZEN_AT = T0 + timedelta(seconds=10)
THAWED_AT = T0 + timedelta(hours=2)


def waiting_between_batches() -> tuple[GovWorld, Plan]:
    """A release whose batch 1 (30 s pause) is live when a policy's freeze begins; stepped until batch 1
    has passed and batch 2 waits for the freeze's end. The world and the plan that made it wait."""
    w = GovWorld(spec(pause="30s"))
    w.step()
    live = w.step()
    assert live.status.batch_state == BatchState.VERIFYING and live.status.canary_weight == 20
    w.rules = Rules((Source(POLICY, freezes=(freeze(FROZEN_AT, THAWED_AT, "incident"),)),))
    # The freeze has begun; the live batch still finishes its pause.
    w.now = FROZEN_AT
    pausing = w.step()
    assert (pausing.status.phase, pausing.status.batch_state) == (Phase.PROGRESSING, BatchState.VERIFYING)
    assert pausing.requeue_after == 20
    w.now = T0 + timedelta(seconds=30)
    return w, w.step()


def test_a_freeze_that_begins_mid_release_holds_the_next_batch_and_keeps_the_canary() -> None:
    w, plan = waiting_between_batches()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch, st.batch) == (Phase.WAITING, BatchState.DONE, 1, "1/5")
    assert st.message == (
        f"batch 1/5 passed; batch 2/5 is waiting for the end of freeze 'incident' of {POLICY} "
        "(next start 2026-01-01T14:00:00Z)"
    )
    assert plan.actions == ()
    assert (st.canary_weight, st.canary_replicas, st.stable_replicas) == (20, 2, 8)
    assert w.weight == 20 and w.canary is not None and w.canary.replicas == 2
    assert w.stable is not None and w.stable.replicas == 8
    assert plan.requeue_after == (THAWED_AT - w.now).total_seconds()
    assert R.WAITING in reasons(plan)
    assert st.history[0].result == "passed" and st.history[0].finished_at == w.now
    assert progressing(st)  # it holds its slot meanwhile
    # Nothing moves (and nothing is written) while it waits.
    w.now = T0 + timedelta(hours=1)
    idle = w.step()
    assert idle.status == st and idle.actions == () and idle.events == ()
    w.now = THAWED_AT
    thawed = w.step()
    assert (thawed.status.phase, thawed.status.current_batch) == (Phase.PROGRESSING, 2)
    assert EnsureCanary(replicas=4, image="app:v2", version="v2") in thawed.actions
    assert R.BATCH_PASSED in reasons(thawed)


def test_promote_full_while_waiting_between_batches_is_not_held() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PROMOTE_ANNOTATION] = "full"
    w.now += timedelta(seconds=5)  # still in the freeze
    plan = w.step()
    assert plan.status.phase == Phase.PROMOTING
    assert plan.actions[0] == RemoveAnnotations((PROMOTE_ANNOTATION,))
    assert any(isinstance(a, SetStableImage) and a.image == "app:v2" for a in plan.actions)
    assert R.PROMOTED in reasons(plan)
    w.run(until={Phase.SUCCEEDED}, tick=1.0)
    assert w.now < THAWED_AT and w.stable is not None and w.stable.image == "app:v2"


def test_promote_next_while_waiting_between_batches_respects_the_freeze() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    assert plan.actions == (RemoveAnnotations((PROMOTE_ANNOTATION,)),)
    assert (plan.status.phase, plan.status.batch_state, plan.status.current_batch) == (
        Phase.WAITING,
        BatchState.DONE,
        1,
    )
    assert any(e.type == "Warning" and "promote=full" in e.message for e in plan.events)
    assert PROMOTE_ANNOTATION not in w.annotations


def test_abort_while_waiting_between_batches_rolls_back_at_once() -> None:
    w, _ = waiting_between_batches()
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK
    assert plan.actions[0] == SetWeight(0)
    assert plan.status.end_phase == Phase.ABORTED
    w.run(until={Phase.ABORTED})
    assert w.canary is None and w.weight == 0
    assert w.stable is not None and (w.stable.replicas, w.stable.image) == (10, "app:v1")


def test_a_pause_while_waiting_between_batches_resumes_into_the_wait() -> None:
    w, _ = waiting_between_batches()
    w.annotations[PAUSE_ANNOTATION] = "true"
    paused = w.step()
    assert (paused.status.phase, paused.status.batch_state) == (Phase.PAUSED, BatchState.DONE)
    assert changes(paused) == []
    del w.annotations[PAUSE_ANNOTATION]
    w.run(until={Phase.WAITING})
    assert (w.status.batch_state, w.status.current_batch) == (BatchState.DONE, 1)
    w.now = THAWED_AT
    assert w.step().status.current_batch == 2


def test_a_closed_window_does_not_hold_the_promotion_after_the_last_batch() -> None:
    # A release of one batch with a pause, started inside the window: the window closes during the pause;
    # the last batch already runs everything, so the promotion is never held.
    s = spec(batchSize=None, canaryWeight=None, windows=[OFFICE_JSON], batches=[{"replicas": 10, "pause": "1h"}])
    w = GovWorld(s, now=at("2026-12-07T15:30:00Z"))
    w.step()
    assert w.step().status.batch_state == BatchState.VERIFYING
    w.now = at("2026-12-07T16:30:00Z")
    assert w.step().status.phase == Phase.PROMOTING


def test_an_approval_given_after_the_window_closed_waits_for_the_next_opening() -> None:
    s = spec(
        batchSize=None,
        canaryWeight=None,
        windows=[OFFICE_JSON],
        batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}],
    )
    w = GovWorld(s, now=at("2026-12-04T15:00:00Z"))  # Friday 16:00 Berlin
    w.step()
    assert w.step().status.batch_state == BatchState.WAITING_FOR_APPROVAL
    w.now = at("2026-12-04T18:00:00Z")  # approved on Friday evening
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch) == (Phase.WAITING, BatchState.DONE, 1)
    assert st.message == "batch 1/2 passed; batch 2/2 is waiting for release window (opens 2026-12-07T09:00:00+01:00)"
    assert plan.actions == (RemoveAnnotations((PROMOTE_ANNOTATION,)),)
    assert plan.requeue_after == (MONDAY_OPENING - w.now).total_seconds()
    w.now = MONDAY_OPENING
    assert w.step().status.current_batch == 2


# --- approval expiry --------------------------------------------------------------------------------


def manual(timeout: str = "4h", on_timeout: str = "abort") -> GreyReleaseSpec:
    """Batch 1 waits for an approval at most ``timeout``; batch 2 pauses 30 s."""
    first = {"replicas": 2, "pause": "manual", "approval": {"timeout": timeout, "onTimeout": on_timeout}}
    return spec(batchSize=None, canaryWeight=None, batches=[first, {"replicas": 5, "pause": "30s"}, {"replicas": 10}])


DEADLINE = T0 + timedelta(hours=4)


def live_waiting_for_approval(s: GreyReleaseSpec) -> tuple[GovWorld, Plan]:
    w = GovWorld(s)
    w.step()
    live = w.step()
    assert live.status.batch_state == BatchState.WAITING_FOR_APPROVAL
    return w, live


def test_the_steps_carry_the_approval_timeout() -> None:
    steps = expand(manual("4h", "promote"), 10)
    assert steps[0].pause == MANUAL and steps[0].approval == Approval(4 * 3600.0, "promote")
    assert steps[1].approval is None
    plain = expand(
        spec(batchSize=None, canaryWeight=None, batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}]), 10
    )
    assert plain[0].pause == MANUAL and plain[0].approval is None
    # The release's approval holds every batch waiting for one, unless the batch sets its own; a batch
    # that does not wait for an approval has none.
    every = spec(
        batchSize=None,
        canaryWeight=None,
        approval={"timeout": "1h"},
        batches=[
            {"replicas": 2, "pause": "manual"},
            {"replicas": 4, "pause": "manual", "approval": {"timeout": "30m", "onTimeout": "promote"}},
            {"replicas": 6, "pause": "30s"},
            {"replicas": 10},
        ],
    )
    assert [s.approval for s in expand(every, 10)] == [
        Approval(3600.0, "abort"),
        Approval(1800.0, "promote"),
        None,
        None,
    ]
    # The shorthand: every batch but the last waits, each at most so long.
    short = expand(spec(pause="manual", approval={"timeout": "2h", "onTimeout": "promote"}), 10)
    assert [s.approval for s in short] == [Approval(7200.0, "promote")] * 4 + [None]


def test_an_approval_deadline_is_recorded_when_the_batch_goes_live() -> None:
    _, live = live_waiting_for_approval(manual())
    st = live.status
    assert st.approval_expires_at == DEADLINE and st.batch_ready_at == T0
    assert "until 2026-01-01T16:00:00.000Z, then abort" in st.message
    assert live.requeue_after == 4 * 3600
    assert st.model_dump(mode="json", by_alias=True)["approvalExpiresAt"] == "2026-01-01T16:00:00.000Z"


def test_one_millisecond_before_the_deadline_it_still_waits() -> None:
    w, live = live_waiting_for_approval(manual())
    w.now = DEADLINE - timedelta(milliseconds=1)
    plan = w.step()
    assert plan.status == live.status
    assert plan.actions == () and plan.events == ()
    assert plan.requeue_after == pytest.approx(0.001)


def test_exactly_at_the_deadline_an_unapproved_batch_aborts() -> None:
    w, _ = live_waiting_for_approval(manual())
    w.now = DEADLINE
    plan = w.step()
    assert plan.status.phase == Phase.ROLLING_BACK and plan.status.end_phase == Phase.ABORTED
    assert plan.actions == (SetWeight(0),)
    expired = [e for e in plan.events if e.reason == R.APPROVAL_EXPIRED]
    assert len(expired) == 1 and expired[0].type == "Warning"
    assert "no approval within 14400s" in expired[0].message
    assert "(approval.timeout)" in expired[0].message  # the field that set it
    w.run(until={Phase.ABORTED})
    assert w.status.approval_expires_at is None
    assert w.canary is None and w.weight == 0
    assert w.stable is not None and (w.stable.replicas, w.stable.image) == (10, "app:v1")


def test_on_timeout_promote_goes_on_to_the_next_batch() -> None:
    w, _ = live_waiting_for_approval(manual(on_timeout="promote"))
    w.now = DEADLINE
    plan = w.step()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch) == (Phase.PROGRESSING, BatchState.UPSCALING, 2)
    assert st.approval_expires_at is None
    assert EnsureCanary(replicas=5, image="app:v2", version="v2") in plan.actions
    expired = [e for e in plan.events if e.reason == R.APPROVAL_EXPIRED]
    assert len(expired) == 1 and "onTimeout: promote" in expired[0].message
    assert st.history[0].result == "approval expired, promoted"


def test_an_approval_before_the_deadline_clears_it() -> None:
    w, _ = live_waiting_for_approval(manual())
    w.now = T0 + timedelta(hours=1)
    w.annotations[PROMOTE_ANNOTATION] = "next"
    plan = w.step()
    assert (plan.status.current_batch, plan.status.approval_expires_at) == (2, None)
    assert R.APPROVAL_EXPIRED not in reasons(plan)
    w.step()  # batch 2 live, with its timed pause
    w.now = DEADLINE
    assert w.step().status.phase != Phase.ROLLING_BACK


@pytest.mark.parametrize(
    "s",
    [
        spec(batchSize=None, canaryWeight=None, batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}]),
        spec(pause="manual"),
    ],
    ids=["batch-pause-manual", "shorthand-pause-manual"],
)
def test_a_manual_pause_without_a_timeout_never_expires(s: GreyReleaseSpec) -> None:
    w, live = live_waiting_for_approval(s)
    assert live.status.approval_expires_at is None
    assert live.requeue_after is None
    w.now = T0 + timedelta(days=400)
    plan = w.step()
    assert plan.status == live.status and plan.actions == ()


def test_the_deadline_survives_a_controller_restart() -> None:
    w, live = live_waiting_for_approval(manual())
    # A new controller knows only what the status stores.
    stored = GreyReleaseStatus.model_validate(live.status.model_dump(mode="json", by_alias=True))
    assert stored.approval_expires_at == DEADLINE
    for now, phase in ((DEADLINE - timedelta(milliseconds=1), Phase.PROGRESSING), (DEADLINE, Phase.ROLLING_BACK)):
        restarted = GovWorld(manual(), stable=w.stable, canary=w.canary, status=stored, now=now, weight=w.weight)
        plan = restarted.step()
        assert plan.status.phase == phase
    assert R.APPROVAL_EXPIRED in reasons(plan)


# --- the concurrency limit: the planner's side ------------------------------------------------------


def queue(
    *, limit: int = 2, holders: tuple[str, ...] = (), ahead: int = 0, held: bool = False, stale: tuple[str, ...] = ()
) -> Queue:
    return Queue("namespace shop", LEASE, limit, holders, ahead, held, stale)


def test_queue_order_is_creation_then_namespace_then_name() -> None:
    same = at("2026-01-01T12:00:00Z")
    keys = [
        ("z-early", queue_order(same - timedelta(seconds=1), "b", "z")),
        ("b-a", queue_order(same, "b", "a")),
        ("a-b", queue_order(same, "a", "b")),
        ("a-a", queue_order(same, "a", "a")),
        ("none", queue_order(None, "a", "a")),
        ("late", queue_order(same + timedelta(seconds=1), "a", "a")),
    ]
    assert [n for n, _ in sorted(keys, key=lambda k: k[1])] == ["z-early", "a-a", "a-b", "b-a", "late", "none"]


@pytest.mark.parametrize(
    ("q", "free", "may"),
    [
        (queue(limit=2), 2, True),
        (queue(limit=2, holders=("x",)), 1, True),
        (queue(limit=2, holders=("x",), ahead=1), 1, False),
        (queue(limit=2, ahead=1), 2, True),
        (queue(limit=2, holders=("x", "y")), 0, False),
        (queue(limit=1, holders=("x", "y")), 0, False),
        (queue(limit=2, holders=("release-uid",), held=True), 1, False),
    ],
    ids=["empty", "one-free", "one-free-one-ahead", "two-free-one-ahead", "full", "over-full", "held-already"],
)
def test_queue_may_take(q: Queue, free: int, may: bool) -> None:
    assert q.free == free
    assert q.may_take() is may


def test_under_a_full_limit_a_release_is_queued_with_its_position() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b"), ahead=2))
    plan = w.step()
    st = plan.status
    assert (st.phase, st.queue_position, st.batch) == (Phase.QUEUED, 3, "queued #3")
    assert st.message == "position 3 in the queue of namespace shop (at most 2 progressing)"
    assert plan.actions == ()
    assert reasons(plan) == [R.QUEUED]
    assert not progressing(st)
    # Nothing changes: no Event, no status change.
    w.now += timedelta(seconds=30)
    again = w.step()
    assert again.status == st and again.events == () and again.actions == ()
    # One ahead of it took a slot: a new position, announced by the status only.
    w.queue = queue(holders=("a", "b"), ahead=1)
    moved = w.step()
    assert (moved.status.queue_position, moved.status.batch) == (2, "queued #2")
    assert moved.events == ()


def test_a_free_slot_is_taken_before_anything_is_changed() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b"), ahead=0))
    assert w.step().status.phase == Phase.QUEUED
    w.queue = queue(holders=("a",), ahead=0, stale=("gone",))
    plan = w.step()
    assert plan.actions[0] == TakeSlot(LEASE, 2, "namespace shop", w.now, ("gone",))
    assert plan.actions[1] == PrepareRouting()
    st = plan.status
    assert (st.phase, st.current_batch, st.queue_position, st.batch) == (Phase.PROGRESSING, 1, None, "1/5")
    assert progressing(st)
    # Held from now on: no second TakeSlot.
    assert not any(isinstance(a, TakeSlot) for a in w.step().actions)


def test_a_slot_is_not_taken_while_the_window_is_closed() -> None:
    w = GovWorld(spec(windows=[OFFICE_JSON]), queue=queue(), now=SATURDAY)
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and plan.actions == ()


def held_run(**fields: Any) -> GovWorld:
    """A release under a limit that took its slot in its first pass."""
    w = GovWorld(spec(**fields), queue=queue(holders=("a",)))
    assert isinstance(w.step().actions[0], TakeSlot)
    assert w.queue is not None and w.queue.held
    return w


def frees(w: GovWorld) -> list[int]:
    """The passes that planned FreeSlot."""
    return [i for i, p in enumerate(w.plans) if FreeSlot(LEASE) in p.actions]


def test_a_release_that_succeeds_frees_its_slot_in_the_pass_that_ends_it() -> None:
    w = held_run()
    w.run(until={Phase.SUCCEEDED})
    assert frees(w) == [len(w.plans) - 1]
    assert w.queue is not None and not w.queue.held


def rolled_back_at_once(w: GovWorld) -> None:
    """The pass that cuts the traffic (and decides the rollback) gives the slot back, after the traffic is
    cut; the passes that restore the app after it hold no slot."""
    w.now += timedelta(seconds=1)
    cut = w.step()
    assert cut.status.phase == Phase.ROLLING_BACK
    assert cut.actions == (SetWeight(0), FreeSlot(LEASE))
    assert not progressing(cut.status)
    assert frees(w) == [len(w.plans) - 1]


def test_a_release_that_is_aborted_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    rolled_back_at_once(w)
    w.run(until={Phase.ABORTED})
    assert len(frees(w)) == 1


def test_a_release_that_fails_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.stable = None  # the target Deployment is deleted
    rolled_back_at_once(w)
    w.run(until={Phase.FAILED})
    assert w.status.message.startswith("the target Deployment 'web' is gone") and len(frees(w)) == 1


def test_a_deleted_release_frees_its_slot_at_once() -> None:
    w = held_run(pause="1h")
    w.step()
    w.deleting = True
    first = w.step()
    assert first.actions[0] == SetWeight(0) and first.actions[-1] == FreeSlot(LEASE)
    for _ in range(10):
        w.advance(10)
        plan = w.step()
        if plan.done:
            break
    assert plan.done and w.canary is None
    assert frees(w) == [w.plans.index(first)]


def test_a_queued_release_that_is_aborted_frees_nothing() -> None:
    w = GovWorld(spec(), queue=queue(holders=("a", "b")))
    w.step()
    w.annotations[ABORT_ANNOTATION] = "true"
    plan = w.step()
    assert plan.status.phase == Phase.ABORTED and plan.actions == ()


# --- the concurrency limit: slots in a Lease on the in-memory API server -----------------------------


def member(name: str, uid: str | None = None) -> Obj:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}"}}


def holders(kube: MemoryKube) -> list[str]:
    return [h.name for h in holders_of(kube.get(lease_path(LEASE)))]


def test_take_creates_the_lease_and_is_idempotent() -> None:
    kube = MemoryKube()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0)
    assert holders(kube) == ["a"]
    held = holders_of(kube.get(lease_path(LEASE)))[0]
    assert (held.uid, held.namespace, held.since) == ("uid-a", NS, "2026-01-01T12:00:00.000Z")
    kube.requests.clear()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0 + timedelta(seconds=5))
    assert kube.writes == [] and holders(kube) == ["a"]


def test_take_is_refused_when_all_slots_are_held() -> None:
    kube = MemoryKube()
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    with pytest.raises(Conflict):
        take_slot(kube, LEASE, limit=2, release=member("c"), stale=(), since=T0)
    assert kube.writes == [] and holders(kube) == ["a", "b"]


def test_stale_holders_are_dropped_in_the_same_write() -> None:
    kube = MemoryKube()
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    take_slot(kube, LEASE, limit=2, release=member("c"), stale=("uid-a",), since=T0)
    assert holders(kube) == ["b", "c"]
    assert [verb for verb, _ in kube.writes] == ["PUT"]


def race(kube: MemoryKube, first: Obj, second: Obj, *, verb: str) -> None:
    """``second`` takes a slot; between its read and its write, ``first`` takes one (another controller
    replica, say)."""
    raced = False

    def before(v: str, p: str) -> None:
        nonlocal raced
        if v == verb and not raced:
            raced = True
            take_slot(kube, LEASE, limit=2, release=first, stale=(), since=T0)

    kube.before = before
    try:
        take_slot(kube, LEASE, limit=2, release=second, stale=(), since=T0)
    finally:
        kube.before = None


def test_two_takes_racing_for_the_last_slot_one_is_refused() -> None:
    kube = MemoryKube()
    take_slot(kube, LEASE, limit=2, release=member("a"), stale=(), since=T0)
    with pytest.raises(Conflict):
        race(kube, member("b"), member("c"), verb="PUT")
    assert holders(kube) == ["a", "b"]
    # The refused pass, retried, finds the slots taken.
    with pytest.raises(Conflict, match="all 2 slots"):
        take_slot(kube, LEASE, limit=2, release=member("c"), stale=(), since=T0)
    assert holders(kube) == ["a", "b"]


def test_two_takes_racing_to_create_the_lease_both_hold_a_slot_of_two() -> None:
    kube = MemoryKube()
    race(kube, member("a"), member("b"), verb="POST")  # b's create loses (409), b reads again and takes the 2nd
    assert holders(kube) == ["a", "b"]
    posts = [p for v, p in kube.writes if v == "POST"]
    assert len(posts) == 2 and len([v for v, _ in kube.writes if v == "PUT"]) == 1, kube.writes


def test_two_takes_racing_to_create_the_lease_of_one_slot_one_is_refused() -> None:
    kube = MemoryKube()
    raced = False

    def before(v: str, p: str) -> None:
        nonlocal raced
        if v == "POST" and not raced:
            raced = True
            take_slot(kube, LEASE, limit=1, release=member("a"), stale=(), since=T0)

    kube.before = before
    try:
        with pytest.raises(Conflict, match="all 1 slots"):
            take_slot(kube, LEASE, limit=1, release=member("b"), stale=(), since=T0)
    finally:
        kube.before = None
    assert holders(kube) == ["a"]


def test_free_gives_back_only_the_slot_held() -> None:
    kube = MemoryKube()
    free_slot(kube, LEASE, uid="uid-a")  # no Lease yet
    assert kube.writes == []
    for name in ("a", "b"):
        take_slot(kube, LEASE, limit=2, release=member(name), stale=(), since=T0)
    kube.requests.clear()
    free_slot(kube, LEASE, uid="uid-z")
    assert kube.writes == [] and holders(kube) == ["a", "b"]
    free_slot(kube, LEASE, uid="uid-a")
    assert holders(kube) == ["b"] and len(kube.writes) == 1
    kube.requests.clear()
    free_slot(kube, LEASE, uid="uid-a")
    assert kube.writes == []


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


SETTINGS = Governing(max_progressing=2)


def test_releases_created_in_the_same_second_queue_by_name() -> None:
    names = ["e", "c", "a", "d", "b"]
    kube = MemoryKube(*(gr(n) for n in names))
    ref = queue_of(gr("a"), [], SETTINGS)
    assert ref is not None and ref.limit == 2
    assert all(queue_of(gr(n), [], SETTINGS) == ref for n in names)
    seen = {n: read_queue(kube, gr(n), ref, [], SETTINGS) for n in names}
    assert {n: q.ahead + 1 for n, q in seen.items()} == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}
    assert [n for n in sorted(names) if seen[n].may_take()] == ["a", "b"]
    # a and b take their slots and start; the others queue behind them, in the order of their names.
    for n in ("a", "b"):
        plan = decide(
            GreyReleaseSpec.model_validate(gr(n)["spec"]),
            GreyReleaseStatus(),
            replace(GovWorld(spec()).observed(), queue=seen[n]),
            T0,
        )
        take = plan.actions[0]
        assert isinstance(take, TakeSlot)
        take_slot(kube, take.lease, limit=take.limit, release=gr(n), stale=take.stale, since=take.since)
        kube.put(gr(n, status={"phase": "Progressing", "phaseStartedAt": "2026-01-01T12:00:00.000Z"}))
    assert [h.name for h in holders_of(kube.get(lease_path(ref.lease)))] == ["a", "b"]
    for position, n in enumerate(["c", "d", "e"], start=1):
        q = read_queue(kube, gr(n), ref, [], SETTINGS)
        assert (q.holders, q.ahead, q.may_take()) == (("uid-a", "uid-b"), position - 1, False)
        plan = GovWorld(spec(), queue=q).step()
        assert (plan.status.phase, plan.status.batch) == (Phase.QUEUED, f"queued #{position}")


def test_an_earlier_release_is_ahead_whatever_its_name() -> None:
    kube = MemoryKube(gr("a"), gr("b"), gr("z", "2026-01-01T11:59:59Z"))
    ref = queue_of(gr("a"), [], SETTINGS)
    assert ref is not None
    assert read_queue(kube, gr("z", "2026-01-01T11:59:59Z"), ref, [], SETTINGS).ahead == 0
    assert read_queue(kube, gr("a"), ref, [], SETTINGS).ahead == 1


def test_a_holder_that_ended_is_stale_and_its_slot_is_taken_over() -> None:
    done = {"phase": "Succeeded", "phaseStartedAt": "2026-01-01T13:00:00.000Z"}
    kube = MemoryKube(gr("a", status=done), gr("b", status={"phase": "Progressing"}), gr("c"))
    ref = queue_of(gr("c"), [], SETTINGS)
    assert ref is not None
    for n in ("a", "b"):
        take_slot(kube, ref.lease, limit=2, release=gr(n), stale=(), since=T0)
    q = read_queue(kube, gr("c"), ref, [], SETTINGS)
    assert (q.stale, q.holders, q.may_take()) == (("uid-a",), ("uid-b",), True)
    take_slot(kube, ref.lease, limit=2, release=gr("c"), stale=q.stale, since=T0 + timedelta(hours=2))
    assert [h.name for h in holders_of(kube.get(lease_path(ref.lease)))] == ["b", "c"]


def test_a_progressing_release_does_not_read_the_queue() -> None:
    kube = MemoryKube(gr("a", status={"phase": "Progressing"}))
    status = GreyReleaseStatus.model_validate(
        {"phase": "Progressing", "batchState": "Verifying", "restore": {"replicas": 2, "image": "app:v1"}}
    )
    kube.requests.clear()
    seen = observe_governance(kube, gr("a"), GreyReleaseSpec.model_validate(gr("a")["spec"]), status, {}, SETTINGS)
    assert seen.queue is not None and seen.queue.held
    assert not any("leases" in p for _, p in kube.requests)


# --- ordered releases -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "text"),
    [
        (Predecessor("api"), "waiting for GreyRelease 'api' to succeed (it does not exist)"),
        (Predecessor("api", found=True), "waiting for GreyRelease 'api' to succeed (now not started)"),
        (
            Predecessor("api", found=True, phase="Progressing"),
            "waiting for GreyRelease 'api' to succeed (now Progressing)",
        ),
        (
            Predecessor("api", found=True, failed=True, phase="Aborted"),
            "waiting for GreyRelease 'api', which ended Aborted: retry or fix it first",
        ),
    ],
    ids=["missing", "not-started", "pending", "aborted"],
)
def test_a_release_waits_for_its_predecessor(pred: Predecessor, text: str) -> None:
    w = GovWorld(spec(after=[{"name": "api"}]), predecessors=(pred,))
    plan = w.step()
    assert (plan.status.phase, plan.status.message) == (Phase.WAITING, text)
    assert plan.actions == ()
    assert reasons(plan) == [R.WAITING]
    assert plan.requeue_after == INVALID_POLL
    again = w.step()
    assert again.status == plan.status and again.events == ()


def test_a_release_starts_once_every_predecessor_succeeded() -> None:
    ok = Predecessor("api", found=True, succeeded=True, phase="Succeeded")
    pending = Predecessor("db", found=True, phase="Progressing")
    w = GovWorld(spec(after=[{"name": "api"}, {"name": "db"}]), predecessors=(ok, pending))
    plan = w.step()
    assert plan.status.phase == Phase.WAITING and "'db'" in plan.status.message
    w.predecessors = (ok, replace(pending, succeeded=True, phase="Succeeded"))
    started = w.step()
    assert started.status.phase == Phase.PROGRESSING and started.actions[0] == PrepareRouting()


def predecessors_from(*objects: Obj) -> tuple[Predecessor, ...]:
    kube = MemoryKube(*objects)
    return read_predecessors(kube, NS, GreyReleaseSpec.model_validate(gr("web", after=["api"])["spec"]))


def succeeded(generation: int) -> Obj:
    return {"phase": "Succeeded", "observedGeneration": generation}


@pytest.mark.parametrize(
    ("objects", "starts", "text"),
    [
        ((), False, "it does not exist"),
        ((gr("api", status={"phase": "Progressing", "observedGeneration": 1}),), False, "now Progressing"),
        ((gr("api", status={"phase": "Aborted", "observedGeneration": 1}),), False, "ended Aborted"),
        ((gr("api", status={"phase": "Failed", "observedGeneration": 1}),), False, "ended Failed"),
        ((gr("api", generation=2, status=succeeded(2)),), True, ""),
        ((gr("api", generation=2, status=succeeded(1)),), False, "'api'"),
    ],
    ids=["missing", "pending", "aborted", "failed", "succeeded-current-spec", "succeeded-older-spec"],
)
def test_predecessors_read_from_the_cluster(objects: tuple[Obj, ...], starts: bool, text: str) -> None:
    found = predecessors_from(*objects)
    assert [p.name for p in found] == ["api"]
    plan = GovWorld(spec(after=[{"name": "api"}]), predecessors=found).step()
    if starts:
        assert plan.status.phase == Phase.PROGRESSING
    else:
        assert plan.status.phase == Phase.WAITING and plan.actions == ()
        assert "GreyRelease 'api'" in plan.status.message and text in plan.status.message


def test_a_cycle_of_predecessors_is_invalid_and_named() -> None:
    a, b = gr("a", after=["b"]), gr("b", after=["a"])
    kube = MemoryKube(a, b, gr("c", after=["a"]))
    spec_a = GreyReleaseSpec.model_validate(a["spec"])
    assert read_cycle(kube, a, spec_a) == ("a", "b", "a")
    seen = observe_governance(kube, a, spec_a, GreyReleaseStatus(), {}, Governing())
    assert seen.cycle == ("a", "b", "a")
    plan = GovWorld(spec(after=[{"name": "b"}]), cycle=seen.cycle, predecessors=seen.predecessors).step()
    assert plan.status.phase == Phase.INVALID_SPEC
    assert plan.status.message.startswith("spec.after:")
    assert "a -> b -> a" in plan.status.message
    assert plan.actions == ()
    # c only waits for a: no cycle through it.
    assert read_cycle(kube, gr("c", after=["a"]), GreyReleaseSpec.model_validate(gr("c", after=["a"])["spec"])) == ()


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({"a": ("b",), "b": ("a",)}, ["a", "b", "a"]),
        ({"a": ("b",), "b": ("c",), "c": ("a",)}, ["a", "b", "c", "a"]),
        ({"a": ("a",)}, ["a", "a"]),
        ({"a": ("b", "c"), "b": ("d",), "c": ("a",)}, ["a", "c", "a"]),
        ({"a": ("b",), "b": ("c",), "c": ("b",)}, None),
        ({"a": ("b", "c"), "b": ("c",)}, None),
        ({"a": ()}, None),
    ],
    ids=["two", "three", "itself", "through-a-second-branch", "cycle-not-through-start", "diamond", "none"],
)
def test_find_cycle(edges: dict[str, tuple[str, ...]], cycle: list[str] | None) -> None:
    assert find_cycle("a", edges) == cycle


# --- bad input --------------------------------------------------------------------------------------


def refused(**fields: Any) -> list[tuple[tuple[int | str, ...], str]]:
    with pytest.raises(ValidationError) as err:
        spec(**fields)
    return [(tuple(e["loc"]), e["msg"]) for e in err.value.errors()]


MANUAL_ONLY = {"batchSize": None, "canaryWeight": None}
MANUAL_BATCH = {"replicas": 1, "pause": "manual"}


@pytest.mark.parametrize(
    ("fields", "loc", "text"),
    [
        ({"windows": [{**OFFICE_JSON, "timeZone": "Mars/Olympus"}]}, ("windows", 0, "timeZone"), "unknown time zone"),
        ({"windows": [{**OFFICE_JSON, "end": "09:00"}]}, ("windows", 0), "end must differ from start"),
        ({"windows": [{**OFFICE_JSON, "days": []}]}, ("windows", 0, "days"), "at least 1 item"),
        ({"windows": [{**OFFICE_JSON, "days": ["Monday"]}]}, ("windows", 0, "days", 0), "pattern"),
        ({"windows": [{**OFFICE_JSON, "days": ["Mon-Fre"]}]}, ("windows", 0, "days", 0), "pattern"),
        ({"windows": [{**OFFICE_JSON, "start": "24:00"}]}, ("windows", 0, "start"), "pattern"),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2026-12-19T00:00:00Z"}]},
            ("freezes", 0),
            "to must be after from",
        ),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2026-12-20T00:00:00Z"}]},
            ("freezes", 0),
            "to must be after from",
        ),
        (
            {"freezes": [{"from": "2026-12-20T00:00:00", "to": "2026-12-21T00:00:00Z"}]},
            ("freezes", 0, "from"),
            "timezone",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"timeout": "4h", "onTimeout": "skip"}}]},
            ("batches", 0, "approval", "onTimeout"),
            "'abort' or 'promote'",
        ),
        ({"approval": {"timeout": "4h", "onTimeout": "wait"}}, ("approval", "onTimeout"), "'abort' or 'promote'"),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "pause": "30s", "approval": {"timeout": "4h"}}]},
            ("batches", 0),
            "approval goes with pause: manual",
        ),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "approval": {"timeout": "4h"}}]},
            ("batches", 0),
            "approval goes with pause: manual",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"onTimeout": "abort"}}]},
            ("batches", 0, "approval", "timeout"),
            "Field required",
        ),
        (
            {**MANUAL_ONLY, "batches": [{**MANUAL_BATCH, "approval": {"timeout": "soon"}}]},
            ("batches", 0, "approval", "timeout"),
            "pattern",
        ),
        (
            {**MANUAL_ONLY, "batches": [{"replicas": 1, "pause": {"manual": True, "timeout": "4h"}}]},
            ("batches", 0, "pause"),
            "valid string",
        ),
        ({"after": [{"name": "Not A Name"}]}, ("after", 0, "name"), "pattern"),
    ],
    ids=[
        "unknown-zone",
        "start-equals-end",
        "empty-days",
        "bad-day-name",
        "bad-day-range",
        "bad-clock",
        "freeze-ends-before-it-starts",
        "freeze-of-no-time",
        "freeze-without-zone",
        "on-timeout-not-abort-or-promote",
        "release-on-timeout-not-abort-or-promote",
        "approval-with-a-timed-pause",
        "approval-without-a-pause",
        "approval-without-timeout",
        "approval-bad-timeout",
        "pause-object-refused",
        "after-bad-name",
    ],
)
def test_bad_governance_input_is_refused_naming_the_field(
    fields: dict[str, Any], loc: tuple[int | str, ...], text: str
) -> None:
    errors = refused(**fields)
    assert any(e_loc == loc and text in msg for e_loc, msg in errors), errors


def test_a_window_may_cross_midnight_and_defaults_to_utc() -> None:
    w = Window.model_validate({"days": ["Fri"], "start": "22:00", "end": "02:00"})
    assert (w.time_zone, w.weekdays) == ("UTC", frozenset({4}))
    assert spec(windows=[OFFICE_JSON]).windows == [OFFICE]


def test_the_policy_model_takes_windows_freezes_and_a_limit() -> None:
    p = GreyReleasePolicy.model_validate(
        {
            "metadata": {"name": "platform"},
            "spec": {
                "windows": [OFFICE_JSON],
                "freezes": [{"from": "2026-12-20T00:00:00Z", "to": "2027-01-02T00:00:00Z"}],
                "concurrency": {"maxProgressing": 2, "per": "Group"},
                "namespaces": [NS],
            },
        }
    )
    assert p.spec.windows == [OFFICE] and p.spec.concurrency is not None and p.spec.concurrency.per == "Group"
    assert p.spec.governs(NS, {}) and not p.spec.governs("other", {})
    with pytest.raises(ValidationError, match="maxProgressing"):
        GreyReleasePolicy.model_validate({"spec": {"concurrency": {"maxProgressing": 0}}})


# --- through the reconciler, on the in-memory API server --------------------------------------------


def test_a_release_waiting_for_its_window_writes_nothing_until_it_opens() -> None:
    kube = cluster(windows=[OFFICE_JSON])
    Reconciler(kube).reconcile(NS, "web", now=SATURDAY)
    status = status_of(kube)
    assert status["phase"] == "Waiting"
    assert status["message"] == "waiting for release window (opens 2026-12-07T09:00:00+01:00)"
    kube.requests.clear()
    for now in (at("2026-12-05T12:00:00Z"), at("2026-12-06T23:00:00Z"), MONDAY_OPENING - timedelta(seconds=1)):
        outcome = Reconciler(kube).reconcile(NS, "web", now=now)
        assert outcome is not None and outcome.plan.requeue_after == (MONDAY_OPENING - now).total_seconds()
    assert kube.writes == []
    Reconciler(kube).reconcile(NS, "web", now=MONDAY_OPENING)
    assert status_of(kube)["phase"] == "Progressing"
    assert kube.get(path("apps", "v1", "deployments", NS, "web-canary")) is not None


def second_app(kube: MemoryKube, name: str, created: str) -> None:
    """Another Deployment and its GreyRelease in the namespace."""
    app = stable()
    app["metadata"] = {**app["metadata"], "name": name, "uid": f"{name}-uid"}
    kube.put(app)
    rel = release()
    rel["metadata"] = {**rel["metadata"], "name": name, "uid": f"{name}-release-uid", "creationTimestamp": created}
    rel["spec"] = {**rel["spec"], "targetRef": {"name": name}}
    kube.put(rel)
    roll_out(kube)


def leases(kube: MemoryKube) -> list[list[str]]:
    return [[h.name for h in holders_of(o)] for o in kube.objects() if o.get("kind") == "Lease"]


def test_under_a_limit_of_one_the_second_release_queues_and_starts_when_the_first_is_aborted() -> None:
    kube = MemoryKube(stable(), release())
    web = kube.get(RELEASE)
    assert web is not None
    kube.put({**web, "metadata": {**web["metadata"], "creationTimestamp": "2026-01-01T11:00:00Z"}})
    roll_out(kube)
    second_app(kube, "api", "2026-01-01T11:00:01Z")
    reconciler = Reconciler(kube, governing=Governing(max_progressing=1))
    reconciler.reconcile(NS, "web", now=T0)
    assert status_of(kube)["phase"] == "Progressing" and leases(kube) == [["web"]]
    reconciler.reconcile(NS, "api", now=T0)
    api = dict((kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api")) or {}).get("status") or {})
    assert (api["phase"], api["queuePosition"], api["batch"]) == ("Queued", 1, "queued #1")
    assert kube.get(path("apps", "v1", "deployments", NS, "api-canary")) is None
    # The first is aborted: its slot is given back in the pass that cuts its traffic.
    kube.patch(RELEASE, {"metadata": {"annotations": {"greyrelease.io/abort": "true"}}})
    reconciler.reconcile(NS, "web", now=T0 + timedelta(seconds=10))
    assert status_of(kube)["phase"] == "RollingBack" and leases(kube) == [[]]
    reconciler.reconcile(NS, "api", now=T0 + timedelta(seconds=10))
    api = dict((kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api")) or {}).get("status") or {})
    assert api["phase"] == "Progressing" and "queuePosition" not in api
    assert leases(kube) == [["api"]]
