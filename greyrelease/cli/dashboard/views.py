"""What ``kubectl gr dashboard`` shows, as pure functions of the objects it watches and the time.

- :func:`summary`: one row of the list of releases (name, namespace, phase, batch x/y, weight, mode).
- :class:`History`: what the page charts and the status keeps only as its latest value: the canary's traffic
  weight at each change, and each metric gate's checks (its value, the stable's, and the bounds it was held
  to). Kept in memory while the dashboard runs, from the first time it sees a release; a release seen in the
  middle starts from the batches its status recorded (``status.history``).
- :func:`detail`: the page of one release: its batches, the traffic and gate series, the webhooks' last
  answers, the Events, the governance state (window, queue place, what it waits for) and which buttons
  apply in its phase.

Times go to the page as seconds since the epoch (the charts' scale) or as the RFC 3339 text the API
server wrote; the page works out ages itself, so a snapshot changes only when the objects do.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from greyrelease.analysis.verdicts import compare_limit
from greyrelease.api.release import (
    PAUSE_ANNOTATION,
    TERMINAL_PHASES,
    GreyReleaseSpec,
    Metric,
    Obj,
    Phase,
    parse_time,
)
from greyrelease.cli.plugin import REQUESTS, event_time, last_events
from greyrelease.planner.batches import PlanError, Step, expand
from greyrelease.planner.governance import SPEC, Rules, Source

#: Points kept per series of one release (a metric checked every second fills it in about 33 minutes).
MAX_POINTS = 2000
#: Events shown for one release, the newest first.
EVENTS_SHOWN = 30
#: The phases in which a batch is under way (and so can be promoted).
UNDER_WAY = frozenset({Phase.PROGRESSING, Phase.PAUSED, Phase.WAITING})

Key = tuple[str, str]  # namespace, name


def _key(release: Obj) -> Key:
    meta = release.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _epoch(text: str | None) -> float | None:
    t = parse_time(text)
    return t.timestamp() if t is not None else None


def routing_of(spec: Obj) -> str:
    """How traffic reaches the canary: ``service``, ``nginx``, ``gatewayAPI``, or ``replicas`` (no routing:
    the Deployments' pods alone)."""
    routing = spec.get("trafficRouting") or {}
    return next((k for k in ("service", "nginx", "gatewayAPI") if routing.get(k)), "replicas")


def phase_of(release: Obj) -> str:
    return str((release.get("status") or {}).get("phase") or "Pending")


def summary(release: Obj) -> dict[str, Any]:
    """One row of the list: name, namespace, phase, batch x/y, weight, mode, and what else fits a line."""
    namespace, name = _key(release)
    meta = release.get("metadata") or {}
    spec = release.get("spec") or {}
    st = release.get("status") or {}
    held = st.get("held") or {}
    return {
        "namespace": namespace,
        "name": name,
        "phase": phase_of(release),
        "batchState": st.get("batchState") or "",
        "batch": int(st.get("currentBatch") or 0),
        "batches": int(st.get("totalBatches") or 0),
        "weight": int(st.get("canaryWeight") or 0),
        "mode": "pinned" if spec.get("targetVersion") else "follow",
        "routing": routing_of(spec),
        "target": st.get("targetVersion") or spec.get("targetVersion") or held.get("digest") or "",
        "stable": st.get("stableVersion") or (st.get("stable") or {}).get("name") or "",
        "message": st.get("message") or "",
        "queuePosition": st.get("queuePosition"),
        "created": meta.get("creationTimestamp") or "",
        "phaseStartedAt": st.get("phaseStartedAt") or "",
        "paused": PAUSE_ANNOTATION in (meta.get("annotations") or {}) or bool(spec.get("paused")),
        "seen": int(st.get("observedGeneration") or 0) >= int(meta.get("generation") or 1),
    }


def summaries(releases: Sequence[Obj]) -> list[dict[str, Any]]:
    """The list's rows, by namespace and name."""
    return sorted((summary(r) for r in releases), key=lambda s: (s["namespace"], s["name"]))


# --- history -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One check of a metric gate, as the status recorded it, with the bounds it was held to."""

    at: float
    value: float | None
    stable: float | None
    lower: float | None
    upper: float | None
    verdict: str
    batch: int


def bounds(metric: Metric | None, stable: float | None) -> tuple[float | None, float | None]:
    """The lowest and highest passing canary value of a check: ``thresholdRange``'s, and under ``compare``
    the stable's value (or the floor) times ``1 + maxIncrease``, the tighter of the two where both apply."""
    if metric is None:
        return None, None
    lower = upper = None
    if metric.threshold_range is not None:
        lower, upper = metric.threshold_range.min, metric.threshold_range.max
    if metric.compare is not None:
        limit = compare_limit(metric.compare, stable)
        upper = limit if upper is None else min(upper, limit)
    return lower, upper


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _metrics_of(spec: Obj) -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for raw in (spec.get("analysis") or {}).get("metrics") or []:
        try:
            metric = Metric.model_validate(raw)
        except ValidationError:
            continue  # the API server's schema refuses what this would; a gate shown without bounds
        out[metric.name] = metric
    return out


@dataclass
class _Kept:
    uid: str
    traffic: deque[tuple[float, int, int]]  # when, weight, batch
    checks: dict[str, deque[Check]] = field(default_factory=dict)
    seen_checks: dict[str, str] = field(default_factory=dict)  # metric name -> its last checkedAt


class History:
    """What the dashboard keeps of each release while it runs (thread-safe): the canary's traffic weight
    each time it changes, and each metric gate's checks (a new ``checkedAt`` in the status is a new point).
    At most ``max_points`` per series; a release deleted, or created again under its name (a new uid),
    starts afresh."""

    def __init__(self, max_points: int = MAX_POINTS) -> None:
        self._max = max_points
        self._lock = threading.Lock()
        self._kept: dict[Key, _Kept] = {}

    def observe(self, release: Obj, now: datetime) -> None:
        """Fold one body of ``release`` (a list's item or a watch event's) in, seen at ``now``."""
        key = _key(release)
        uid = str((release.get("metadata") or {}).get("uid") or "")
        spec = release.get("spec") or {}
        st = release.get("status") or {}
        weight, batch = int(st.get("canaryWeight") or 0), int(st.get("currentBatch") or 0)
        at = now.timestamp()
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.uid != uid:
                kept = _Kept(uid, deque(self._recorded(st, at), maxlen=self._max))
                self._kept[key] = kept
            last = kept.traffic[-1] if kept.traffic else None
            if last is None or (last[1], last[2]) != (weight, batch):
                kept.traffic.append((max(at, last[0]) if last else at, weight, batch))
            metrics = _metrics_of(spec)
            for m in st.get("metrics") or []:
                name, checked = str(m.get("name") or ""), m.get("checkedAt")
                when = _epoch(checked)
                if not name or when is None or kept.seen_checks.get(name) == checked:
                    continue
                kept.seen_checks[name] = str(checked)
                stable = _number(m.get("stableValue"))
                lower, upper = bounds(metrics.get(name), stable)
                series = kept.checks.setdefault(name, deque(maxlen=self._max))
                series.append(
                    Check(when, _number(m.get("value")), stable, lower, upper, str(m.get("verdict") or ""), batch)
                )

    @staticmethod
    def _recorded(st: Obj, now: float) -> list[tuple[float, int, int]]:
        """The weights the status recorded before the dashboard saw the release: each batch in
        ``status.history`` from when it went live."""
        points = []
        for record in st.get("history") or []:
            ready = _epoch(record.get("readyAt"))
            if ready is not None and ready < now:
                points.append((ready, int(record.get("weight") or 0), int(record.get("batch") or 0)))
        return sorted(points)

    def forget(self, release: Obj) -> None:
        with self._lock:
            self._kept.pop(_key(release), None)

    def traffic(self, key: Key) -> list[tuple[float, int, int]]:
        with self._lock:
            kept = self._kept.get(key)
            return list(kept.traffic) if kept else []

    def checks(self, key: Key) -> dict[str, list[Check]]:
        with self._lock:
            kept = self._kept.get(key)
            return {name: list(series) for name, series in kept.checks.items()} if kept else {}


# --- one release -------------------------------------------------------------------------------------


def _total(spec: Obj, st: Obj) -> int:
    """The stable Deployment's replicas the batches are resolved against, as far as the status tells: what
    the release recorded to put back, else, when the stable shrinks as the canary grows (pinned, Service
    mode or no routing), stable + canary of the live batch, else the stable's own."""
    restore = (st.get("restore") or {}).get("replicas")
    if isinstance(restore, int) and restore > 0:
        return restore
    stable, canary = int(st.get("stableReplicas") or 0), int(st.get("canaryReplicas") or 0)
    shrinks = spec.get("targetVersion") and routing_of(spec) in ("service", "replicas")
    return stable + canary if shrinks else stable


def _plan(spec: Obj, st: Obj) -> list[Step]:
    total = _total(spec, st)
    if total < 1:
        return []
    try:
        return expand(GreyReleaseSpec.model_validate(spec), total)
    except (ValidationError, PlanError):
        return []


def batches(release: Obj) -> list[dict[str, Any]]:
    """Each batch: what the plan gives it (canary pods, weight, pause), what the status recorded of it (when
    it started, went live, ended, and how) and where it stands: ``done``, ``live``, ``next``, ``pending`` or,
    for the batch a rollback ended, ``rolled back``."""
    spec = release.get("spec") or {}
    st = release.get("status") or {}
    phase = phase_of(release)
    current = int(st.get("currentBatch") or 0)
    records = {int(r.get("batch") or 0): r for r in st.get("history") or []}
    plan = {s.number: s for s in _plan(spec, st)}
    count = max([int(st.get("totalBatches") or 0), *plan, *records, 0])
    rows = []
    for k in range(1, count + 1):
        step, record = plan.get(k), records.get(k) or {}
        if k < current or (k == current and phase in (Phase.PROMOTING, Phase.SUCCEEDED)):
            state = "done"
        elif k == current and phase in UNDER_WAY:
            state = "live" if st.get("batchState") != "Done" else "done"
        elif k == current and phase in (Phase.ROLLING_BACK, Phase.ABORTED, Phase.FAILED):
            state = "rolled back"
        elif k == current + 1 and phase in UNDER_WAY | {Phase.INITIALIZING, Phase.QUEUED}:
            state = "next"
        else:
            state = "pending"
        rows.append(
            {
                "batch": k,
                "canary": record.get("canaryReplicas", step.canary_replicas if step else None),
                "weight": record.get("weight", step.weight if step else None),
                "pause": step.pause_label if step else "",
                "state": state,
                "startedAt": record.get("startedAt") or "",
                "readyAt": record.get("readyAt") or "",
                "finishedAt": record.get("finishedAt") or "",
                "result": record.get("result") or "",
            }
        )
    return rows


def _series(points: Sequence[tuple[float, int, int]]) -> dict[str, list[Any]]:
    return {"t": [p[0] for p in points], "weight": [p[1] for p in points], "batch": [p[2] for p in points]}


def gates(release: Obj, checks: dict[str, list[Check]]) -> list[dict[str, Any]]:
    """Each metric gate: its bounds in words, its last verdict and message, and its checks as series (the
    canary's value, the stable's where it is compared, the lowest and highest passing values)."""
    spec = release.get("spec") or {}
    st = release.get("status") or {}
    latest = {str(m.get("name")): m for m in st.get("metrics") or []}
    out = []
    for name, metric in _metrics_of(spec).items():
        series = checks.get(name, [])
        last = latest.get(name) or {}
        words = []
        if metric.threshold_range is not None:
            if metric.threshold_range.min is not None:
                words.append(f"at least {metric.threshold_range.min:g}")
            if metric.threshold_range.max is not None:
                words.append(f"at most {metric.threshold_range.max:g}")
        if metric.compare is not None:
            words.append(f"at most the stable's x {1 + metric.compare.max_increase:g}")
        out.append(
            {
                "name": name,
                "threshold": ", ".join(words) or "no bounds",
                "verdict": last.get("verdict") or "Pending",
                "message": last.get("message") or "",
                "value": _number(last.get("value")),
                "checkedAt": last.get("checkedAt") or "",
                "compared": metric.compare is not None,
                "t": [c.at for c in series],
                "values": [c.value for c in series],
                "stable": [c.stable for c in series],
                "lower": [c.lower for c in series],
                "upper": [c.upper for c in series],
                "verdicts": [c.verdict for c in series],
            }
        )
    return out


def webhooks(release: Obj) -> list[dict[str, Any]]:
    """Each webhook's last answer, as the status keeps it."""
    keep = ("name", "at", "kind", "verdict", "code", "value", "message", "checkedAt")
    return [{k: w.get(k) for k in keep} for w in (release.get("status") or {}).get("webhooks") or []]


def events(release: Obj, found: Sequence[Obj]) -> list[dict[str, Any]]:
    """The release's Events (those of an earlier object of the same name left out), the newest first."""
    meta = release.get("metadata") or {}
    mine = [
        e
        for e in found
        if (e.get("involvedObject") or {}).get("name") == meta.get("name")
        and (e.get("involvedObject") or {}).get("uid") in (None, meta.get("uid"))
    ]
    return [
        {
            "time": event_time(e),
            "type": e.get("type") or "",
            "reason": e.get("reason") or "",
            "message": e.get("message") or "",
            "count": int(e.get("count") or 1),
        }
        for e in reversed(last_events(mine, EVENTS_SHOWN))
    ]


def rules_for(release: Obj, policies: Rules) -> Rules:
    """The release's own windows and freezes with those of the policies that govern it."""
    spec = release.get("spec") or {}
    try:
        parsed = GreyReleaseSpec.model_validate(spec)
    except ValidationError:
        return policies
    return policies.plus(Source(SPEC, tuple(parsed.windows or ()), tuple(parsed.freezes or ())))


def governance(release: Obj, rules: Rules, now: datetime, *, policies_note: str = "") -> dict[str, Any]:
    """Whether a batch may start now (the release windows and freezes of the spec and the policies), the
    place in the queue, what the release waits for (the controller's words), the approval's deadline, the
    confirm webhook it waits on, the releases it comes after, and the requests written and not yet taken."""
    meta = release.get("metadata") or {}
    spec = release.get("spec") or {}
    st = release.get("status") or {}
    phase = phase_of(release)
    hold = rules.hold(now) if rules else None
    if not rules:
        window = {"state": "none", "text": "no release windows or freezes", "until": ""}
    elif hold is None:
        window = {"state": "open", "text": "open: a batch may start now", "until": ""}
    else:
        until = hold.until.isoformat().replace("+00:00", "Z") if hold.until else ""
        window = {"state": "closed", "text": hold.message, "until": until}
    waiting = ""
    if phase in (Phase.WAITING, Phase.QUEUED, Phase.PAUSED) or st.get("batchState") == "WaitingForApproval":
        waiting = st.get("message") or phase
    elif st.get("awaitingConfirmation"):
        waiting = f"a yes from webhook {st['awaitingConfirmation']}"
    annotations = meta.get("annotations") or {}
    requested = [f"{k}={annotations[k]}" for k in REQUESTS if k in annotations]
    if spec.get("paused"):
        requested.append("spec.paused=true")
    ended = phase in TERMINAL_PHASES
    return {
        "window": window,
        "sources": [("the release's own spec" if s.name == SPEC else s.name) for s in rules.sources],
        "policiesNote": policies_note,
        "queuePosition": st.get("queuePosition") if phase == Phase.QUEUED else None,
        "waitingFor": waiting,
        "approvalExpiresAt": "" if ended else (st.get("batchTimes") or {}).get("approvalExpiresAt") or "",
        "nextCheckAt": "" if ended else (st.get("batchTimes") or {}).get("nextCheckAt") or "",
        "awaitingConfirmation": "" if ended else st.get("awaitingConfirmation") or "",
        "after": [str(a.get("name")) for a in spec.get("after") or []],
        "requested": requested,
    }


def actions(release: Obj) -> dict[str, bool]:
    """Which buttons apply in the release's phase. The server does what it is asked either way (as
    ``kubectl gr`` does): this only spares a click that could do nothing."""
    phase = phase_of(release)
    paused = PAUSE_ANNOTATION in ((release.get("metadata") or {}).get("annotations") or {})
    running = phase not in TERMINAL_PHASES and phase != Phase.ROLLING_BACK
    return {
        "abort": running,
        "pause": running and not paused,
        "resume": paused,
        "promote": phase in UNDER_WAY,
        "promote-full": phase in UNDER_WAY,
        "retry": phase in (Phase.ABORTED, Phase.FAILED),
    }


def detail(
    release: Obj,
    found_events: Sequence[Obj],
    history: History,
    rules: Rules,
    now: datetime,
    *,
    policies_note: str = "",
) -> dict[str, Any]:
    """The page of one release."""
    key = _key(release)
    st = release.get("status") or {}
    return {
        "summary": summary(release),
        "versions": {"stable": st.get("stableVersion") or "", "target": summary(release)["target"]},
        "replicas": {"canary": int(st.get("canaryReplicas") or 0), "stable": int(st.get("stableReplicas") or 0)},
        "batches": batches(release),
        "traffic": _series(history.traffic(key)),
        "gates": gates(release, history.checks(key)),
        "webhooks": webhooks(release),
        "events": events(release, found_events),
        "governance": governance(release, rules_for(release, rules), now, policies_note=policies_note),
        "actions": actions(release),
        "conditions": [
            {k: c.get(k) or "" for k in ("type", "status", "reason", "message")} for c in st.get("conditions") or []
        ],
    }
