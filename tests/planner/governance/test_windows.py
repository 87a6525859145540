"""Release windows: when a window opens and closes (pure, with a fake ``now``: day lists, midnight, time
zones, DST), the windows of several sources, and a release waiting for one (the planner, the reconciler)."""

from __future__ import annotations

from datetime import date, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from greyrelease.api.release import ABORT_ANNOTATION, PROMOTE_ANNOTATION, BatchState, Phase, Window
from greyrelease.kube.protocol import path
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import EnsureCanary, PrepareRouting, RemoveAnnotations
from greyrelease.planner.governance import SPEC, Hold, Rules, Source, instant, local_text, next_open, open_at
from greyrelease.planner.machine import INVALID_POLL, progressing
from greyrelease.reconcile.reconciler import Reconciler

from tests.support.builders import NS, T0, cluster, status_of
from tests.support.governance import (
    MONDAY_OPENING,
    OFFICE,
    OFFICE_JSON,
    POLICY,
    SATURDAY,
    GovWorld,
    at,
    reasons,
    rules,
    window,
)
from tests.support.world import spec

BERLIN = ZoneInfo("Europe/Berlin")

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


# --- the planner: waiting for a window --------------------------------------------------------------


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


def test_a_canary_deleted_while_the_next_batch_waits_for_its_window_is_grown_again() -> None:
    # Batch 1 passed on Friday evening and batch 2 waits for Monday's window; someone deletes the canary.
    # The batch is not live any more: it is grown again (Progressing, Upscaling), then waits again.
    s = spec(
        batchSize=None,
        canaryWeight=None,
        windows=[OFFICE_JSON],
        batches=[{"replicas": 2, "pause": "manual"}, {"replicas": 10}],
    )
    w = GovWorld(s, now=at("2026-12-04T15:00:00Z"))  # Friday 16:00 Berlin
    w.step()
    assert w.step().status.batch_state == BatchState.WAITING_FOR_APPROVAL
    w.now = at("2026-12-04T18:00:00Z")
    w.annotations[PROMOTE_ANNOTATION] = "next"
    assert w.step().status.batch_state == BatchState.DONE
    w.canary = None
    plan = w.step()
    st = plan.status
    assert (st.phase, st.batch_state, st.current_batch) == (Phase.PROGRESSING, BatchState.UPSCALING, 1)
    assert "CanaryLost" in reasons(plan)
    for _ in range(5):
        st = w.step().status
    assert (st.phase, st.current_batch) in {(Phase.WAITING, 1), (Phase.PROGRESSING, 1)}
    assert st.batch_state in {BatchState.DONE, BatchState.WAITING_FOR_APPROVAL, BatchState.VERIFYING}
