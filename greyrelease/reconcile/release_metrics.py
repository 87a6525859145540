"""Per-release series on /metrics: where each release is, as the status its last pass recorded says.

Labels ``namespace`` and ``name`` on every series; the gate series add ``gate`` (the metric's name in
``spec.analysis.metrics``).

- ``greyrelease_release_phase{phase}``: 1, for the release's current phase only (``Pending`` before its
  first status). One series a release rather than one per phase: ``count by (phase)`` counts releases,
  and a state timeline shows the phase as its label (Argo Rollouts' ``rollout_info{phase}`` is the same
  shape). A phase change ends one series and starts another; Prometheus marks the ended one stale at once.
- ``greyrelease_release_current_batch`` and ``greyrelease_release_batches``: the batch under way (from 1;
  0 before the first) and the batches of the plan.
- ``greyrelease_release_canary_weight``: the percent of traffic set for the canary.
- ``greyrelease_release_batch_started_timestamp_seconds``: when the current batch began (Unix time;
  absent when none has). ``time() - ...`` is the time in the batch: a timestamp changes once a batch,
  where a duration would change, and need a write, on every pass.
- ``greyrelease_release_gate_value{gate}``: the canary's last value (absent until the gate has one).
- ``greyrelease_release_gate_verdict{gate, verdict}``: 1, for the last check's verdict only (Pass, Fail,
  NoData, Error; Pending before the first check of the batch).
- ``greyrelease_release_gate_threshold{gate, bound}``: the bounds a passing value stays within, ``min``
  and ``max``, each only where the gate has one: ``thresholdRange``'s, and with ``compare`` the stable's
  last value (at least ``floor``) times ``1 + maxIncrease`` (the lower maximum when both apply).

So a release has at most 5 series, plus at most 4 per gate (a spec has at most 20 gates).

The series are not prometheus_client gauges, which keep an object and a lock per series: each release's
series are kept as one tuple, and a collector renders them when /metrics is scraped (bench/README.md,
"Per-release series on /metrics"). An idle pass costs one look-up: the series are worked out again only
when the pass changed the status, or the release's resourceVersion differs from the one last exported (a
write of any kind, the controller's own status writes among them). A release deleted, or no longer this
replica's (a shard handed over, the lease lost), takes its series with it (:meth:`ReleaseSeries.forget`,
:meth:`ReleaseSeries.close`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from greyrelease.analysis.verdicts import compare_limit
from greyrelease.api.release import CheckVerdict, GreyReleaseSpec, GreyReleaseStatus

Key = tuple[str, str]
#: One series: the family's index in :data:`FAMILIES`, the labels after namespace and name, the value.
Series = tuple[int, tuple[str, ...], float]

_RELEASE = ("namespace", "name")
_GATE = (*_RELEASE, "gate")

#: Each family's name, help and labels, by index.
FAMILIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("greyrelease_release_phase", "1 for the release's current phase.", (*_RELEASE, "phase")),
    ("greyrelease_release_current_batch", "The batch under way, from 1 (0: none yet).", _RELEASE),
    ("greyrelease_release_batches", "Batches in the release's plan.", _RELEASE),
    ("greyrelease_release_canary_weight", "Percent of traffic set for the canary.", _RELEASE),
    ("greyrelease_release_batch_started_timestamp_seconds", "When the current batch began (Unix time).", _RELEASE),
    ("greyrelease_release_gate_value", "The canary's last value of the gate's query.", _GATE),
    ("greyrelease_release_gate_verdict", "1 for the verdict of the gate's last check.", (*_GATE, "verdict")),
    (
        "greyrelease_release_gate_threshold",
        "A bound (min or max) a passing value of the gate stays within.",
        (*_GATE, "bound"),
    ),
)
PHASE, CURRENT_BATCH, BATCHES, WEIGHT, BATCH_STARTED, GATE_VALUE, GATE_VERDICT, GATE_THRESHOLD = range(len(FAMILIES))


def series_of(spec: GreyReleaseSpec | None, status: GreyReleaseStatus) -> tuple[Series, ...]:
    """The series of a release with this spec (None when it does not validate: no gate series) and status."""
    out: list[Series] = [
        (PHASE, (status.phase.value if status.phase is not None else "Pending",), 1.0),
        (CURRENT_BATCH, (), float(status.current_batch)),
        (BATCHES, (), float(status.total_batches)),
        (WEIGHT, (), float(status.canary_weight)),
    ]
    started = status.batch_times.started_at
    if started is not None:
        out.append((BATCH_STARTED, (), started.timestamp()))
    if spec is None or spec.analysis is None:
        return tuple(out)
    checked = {m.name: m for m in status.metrics}
    for metric in spec.analysis.metrics:
        gate = metric.name
        last = checked.get(gate)
        if last is not None and last.value is not None and not math.isnan(last.value):
            out.append((GATE_VALUE, (gate,), last.value))
        verdict = last.verdict if last is not None else CheckVerdict.PENDING
        out.append((GATE_VERDICT, (gate, verdict.value), 1.0))
        low = high = None
        if metric.threshold_range is not None:
            low, high = metric.threshold_range.min, metric.threshold_range.max
        if metric.compare is not None and last is not None and last.checked_at is not None:
            limit = compare_limit(metric.compare, last.stable_value)
            high = limit if high is None else min(high, limit)
        if low is not None:
            out.append((GATE_THRESHOLD, (gate, "min"), low))
        if high is not None:
            out.append((GATE_THRESHOLD, (gate, "max"), high))
    return tuple(out)


class ReleaseSeries:
    """The per-release series of the releases one runtime drives. Passes run on many threads and /metrics
    is served on one of its own: the record changes under a lock, and an idle pass's check (the
    resourceVersion last exported) takes none."""

    def __init__(self, collector: ReleaseCollector | None = None) -> None:
        self._lock = threading.Lock()
        #: Per release: the resourceVersion it was last exported at, and its series then.
        self._exported: dict[Key, tuple[str | None, tuple[Series, ...]]] = {}
        self._closed = False
        self._collector = collector if collector is not None else COLLECTOR
        self._collector.add(self)

    def record(self, key: Key, version: str | None, spec: GreyReleaseSpec | None, status: GreyReleaseStatus) -> None:
        """Export the release as ``status`` has it, read at ``version`` (None: a status the pass changed, worked
        out whatever was exported before)."""
        last = self._exported.get(key)
        if last is not None and version is not None and last[0] == version:
            return
        series = series_of(spec, status)
        with self._lock:
            if not self._closed:
                self._exported[key] = (version, series)

    def forget(self, key: Key) -> None:
        """The release is gone: its series go too."""
        with self._lock:
            self._exported.pop(key, None)

    def close(self) -> None:
        """These releases are no longer this runtime's: every series goes, and passes still running
        export nothing more."""
        with self._lock:
            self._closed = True
            self._exported.clear()
        self._collector.discard(self)

    def exported(self) -> list[tuple[Key, tuple[Series, ...]]]:
        """Each release's series as last recorded."""
        with self._lock:
            return [(key, series) for key, (_, series) in self._exported.items()]


class ReleaseCollector:
    """Renders the series of every :class:`ReleaseSeries` of the process (one per runtime: several when
    this replica holds several shards) when the registry is collected."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self._lock = threading.Lock()
        self._sources: list[ReleaseSeries] = []
        if registry is not None:
            registry.register(self)

    def add(self, source: ReleaseSeries) -> None:
        with self._lock:
            self._sources.append(source)

    def discard(self, source: ReleaseSeries) -> None:
        with self._lock:
            self._sources = [s for s in self._sources if s is not source]

    def describe(self) -> Iterator[Metric]:
        for name, doc, labels in FAMILIES:
            yield GaugeMetricFamily(name, doc, labels=labels)

    def collect(self) -> Iterator[Metric]:
        families = [GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in FAMILIES]
        with self._lock:
            sources = list(self._sources)
        for source in sources:
            for key, series in source.exported():
                for family, labels, value in series:
                    families[family].add_metric((*key, *labels), value)
        yield from families


#: The collector of the process's registry, which /metrics serves.
COLLECTOR = ReleaseCollector()
