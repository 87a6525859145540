"""The controller's own metrics, served on /metrics (prometheus-client).

- ``greyrelease_releases{phase}``: GreyReleases by phase, as last reconciled by this process
- ``greyrelease_batch_transitions_total``: batches that went live
- ``greyrelease_rollbacks_total{reason}``: rollbacks started, by reason (Aborted, AnalysisFailed, ...)
- ``greyrelease_reconcile_duration_seconds``: one pass (observe, decide, act, record)
- ``greyrelease_prometheus_query_duration_seconds`` and ``greyrelease_prometheus_query_errors_total``
"""

from __future__ import annotations

import threading
from collections import Counter as _Counter

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from . import reasons as R
from .actions import Plan
from .api import Phase

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
QUERY_ERRORS = Counter("greyrelease_prometheus_query_errors_total", "Prometheus queries that failed after retries.")

_ROLLED_BACK = (Phase.ROLLING_BACK, Phase.ABORTED, Phase.FAILED)
_ROLLBACK_REASONS = {
    R.ABORTED, R.PROGRESS_DEADLINE, R.ANALYSIS_FAILED, R.TARGET_DELETED, R.CANARY_CONFLICT,
}  # fmt: skip
class Phases:
    """The phase of each release as last reconciled by this process, behind ``greyrelease_releases``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str], str] = {}
        self._seen: set[str] = set()

    def record(self, key: tuple[str, str], plan: Plan | None) -> None:
        """Count what one reconcile did; ``plan`` None when the release is gone."""
        with self._lock:
            if plan is None:
                self._phases.pop(key, None)
            else:
                self._phases[key] = plan.status.phase or "Pending"
                for event in plan.events:
                    if event.reason == R.BATCH_READY:
                        TRANSITIONS.inc()
                    elif event.reason in _ROLLBACK_REASONS and plan.status.phase in _ROLLED_BACK:
                        ROLLBACKS.labels(reason=event.reason).inc()
            counts = _Counter(self._phases.values())
            self._seen.update(counts)
            for phase in self._seen:  # a phase nobody is in any more reads 0, not its last count
                RELEASES.labels(phase=phase).set(counts.get(phase, 0))


def serve(port: int) -> None:
    start_http_server(port, addr="0.0.0.0")
