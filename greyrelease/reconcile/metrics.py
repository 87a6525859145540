"""The controller's own metrics, served on /metrics (prometheus-client).

- ``greyrelease_releases{phase}``: GreyReleases by phase, as last reconciled by this process
- ``greyrelease_batch_transitions_total``: batches that went live
- ``greyrelease_rollbacks_total{reason}``: rollbacks started, by reason (Aborted, AnalysisFailed, ...)
- ``greyrelease_reconcile_duration_seconds``: one pass (observe, decide, act, record)
- ``greyrelease_passes_skipped_total``: resyncs of a release at rest, and polls of one waiting on its
  Deployments, that made no pass, as nothing its last pass read had changed (see ``Runtime.unchanged``)
- ``greyrelease_prometheus_query_duration_seconds`` and ``greyrelease_prometheus_query_errors_total``
- ``greyrelease_gc_pause_seconds{generation}``: Python's cyclic garbage collections, which stop every
  thread of the process while they run (the oldest generation's grow with the objects held in memory)
- ``greyrelease_notifications_{sent,failed,dropped}_total{notification,format}``: notifications the
  receiver took (2xx), that failed (Secret unreadable, an error answer, a timeout, retries spent), and
  that were dropped unsent from a full queue (the oldest first); ``notification`` is the entry's name,
  ``other`` past the first :data:`MAX_NOTIFICATION_LABELS` names seen, so the series stay bounded
- ``greyrelease_notification_send_duration_seconds{format}``: one notification's POSTs, retries included

The per-release series (``greyrelease_release_*{namespace, name}``: phase, batch, weight, gates) are
:mod:`greyrelease.reconcile.release_metrics`'s.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import Counter as _Counter
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from greyrelease.api.release import Phase
from greyrelease.planner import reasons as R
from greyrelease.planner.actions import Plan

RELEASES = Gauge("greyrelease_releases", "GreyReleases by phase.", ["phase"])
TRANSITIONS = Counter("greyrelease_batch_transitions_total", "Batches that went live (canary ready, weight set).")
ROLLBACKS = Counter("greyrelease_rollbacks_total", "Rollbacks started, by reason.", ["reason"])
RECONCILE = Histogram(
    "greyrelease_reconcile_duration_seconds",
    "Duration of one reconcile pass.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PASS_WAIT = Histogram(
    "greyrelease_pass_wait_seconds",
    "How long a reconcile pass waited for a thread: urgent (asked for by a person) or routine (timers,"
    " Deployment changes; held back while aborts come in).",
    ["kind"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10),
)
QUERY = Histogram(
    "greyrelease_prometheus_query_duration_seconds",
    "Duration of one Prometheus query, retries included.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
GC_PAUSE = Histogram(
    "greyrelease_gc_pause_seconds",
    "Duration of one cyclic garbage collection (every thread waits for it), by generation.",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
PASSES_SKIPPED = Counter(
    "greyrelease_passes_skipped_total",
    "Resyncs and polls of a release left without a pass: nothing its last pass read had changed.",
)
QUERY_ERRORS = Counter("greyrelease_prometheus_query_errors_total", "Prometheus queries that failed after retries.")
_NOTIFICATION = ["notification", "format"]
NOTIFICATIONS_SENT = Counter(
    "greyrelease_notifications_sent_total", "Notifications a receiver took (a 2xx answer).", _NOTIFICATION
)
NOTIFICATIONS_FAILED = Counter(
    "greyrelease_notifications_failed_total",
    "Notifications not sent: Secret unreadable, an error answer, a timeout, or retries spent.",
    _NOTIFICATION,
)
NOTIFICATIONS_DROPPED = Counter(
    "greyrelease_notifications_dropped_total",
    "Notifications dropped unsent because the queue was full (the oldest first).",
    _NOTIFICATION,
)
NOTIFICATION_SEND = Histogram(
    "greyrelease_notification_send_duration_seconds",
    "Duration of sending one notification, retries and their waits included.",
    ["format"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
#: Distinct notification names given their own label value; any further one is counted as ``other``.
MAX_NOTIFICATION_LABELS = 50
_notification_names: set[str] = set()
_notification_names_lock = threading.Lock()


def notification_label(name: str) -> str:
    """``name`` as the ``notification`` label: itself while fewer than :data:`MAX_NOTIFICATION_LABELS`
    names have been seen (names are users', and every release may have its own), else ``other``."""
    with _notification_names_lock:
        if name in _notification_names:
            return name
        if len(_notification_names) < MAX_NOTIFICATION_LABELS:
            _notification_names.add(name)
            return name
    return "other"


_ROLLED_BACK = (Phase.ROLLING_BACK, Phase.ABORTED, Phase.FAILED)
_ROLLBACK_REASONS = {
    R.ABORTED,
    R.PROGRESS_DEADLINE,
    R.ANALYSIS_FAILED,
    R.TARGET_DELETED,
    R.CANARY_CONFLICT,
}


class Phases:
    """The phase of each release as last reconciled by this process, behind ``greyrelease_releases``.

    Counted as phases change rather than recounted on each pass: a recount was O(releases) on the event
    loop for every pass, growing with N (bench/README.md, "Phase counts kept as phases change")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._counts: _Counter[str] = _Counter()

    def record(self, key: tuple[str, str], plan: Plan | None) -> None:
        """Count what one reconcile did; ``plan`` None when the release is gone."""
        with self._lock:
            before = self._phases.pop(key, None)
            after = None
            if plan is not None:
                after = self._phases[key] = plan.status.phase or "Pending"
                for event in plan.events:
                    if event.reason == R.BATCH_READY:
                        TRANSITIONS.inc()
                    elif event.reason in _ROLLBACK_REASONS and plan.status.phase in _ROLLED_BACK:
                        ROLLBACKS.labels(reason=event.reason).inc()
            if before == after:
                return
            if before is not None:  # a phase nobody is in any more reads 0, not its last count
                self._counts[before] -= 1
                RELEASES.labels(phase=before).set(self._counts[before])
            if after is not None:
                self._counts[after] += 1
                RELEASES.labels(phase=after).set(self._counts[after])


class _GcClock:
    """Times each collection through ``gc.callbacks``: called at its start and its end, in the thread
    that triggered it. The histogram's children are made here, beforehand: a child made in the callback
    would take the metric's lock, which the same thread may hold if it was making a child when the
    collection began."""

    def __init__(self) -> None:
        self.started = 0.0
        self.by_generation = [GC_PAUSE.labels(str(g)) for g in range(3)]

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self.started)


def time_gc() -> None:
    """Observe every garbage collection in ``greyrelease_gc_pause_seconds`` (once a process)."""
    if not any(isinstance(cb, _GcClock) for cb in gc.callbacks):
        gc.callbacks.append(_GcClock())


def serve(port: int) -> None:
    time_gc()
    start_http_server(port, addr="0.0.0.0")
