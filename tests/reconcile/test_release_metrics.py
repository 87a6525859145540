"""The per-release series on /metrics: worked out from a release's spec and recorded status, following a
release pass by pass, gone with the release (or the gate), and nothing worked out again by an idle pass."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from greyrelease.analysis.verdicts import Check, Sample
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, Obj, parse_time
from greyrelease.kube.memory import MemoryKube
from greyrelease.reconcile import release_metrics
from greyrelease.reconcile.gates import Gates
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.release_metrics import FAMILIES, ReleaseCollector, ReleaseSeries, series_of
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.builders import NS, RELEASE, T0, cluster, roll_out, status_of

WEB = {"namespace": NS, "name": "web"}


class FixedGates(Gates):
    """Every gate reads ``canary`` for the canary and ``stable`` for the stable track."""

    def __init__(self, kube: MemoryKube, canary: float, stable: float = 0.02) -> None:
        super().__init__(kube)
        self.canary, self.stable = canary, stable

    def checks(self, release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus) -> tuple[Check, ...]:
        assert spec.analysis is not None
        return tuple(
            Check(m.name, Sample(self.canary), Sample(self.stable) if m.compare else None)
            for m in spec.analysis.metrics
        )


def exporter() -> tuple[CollectorRegistry, ReleaseSeries]:
    registry = CollectorRegistry()
    return registry, ReleaseSeries(ReleaseCollector(registry))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**WEB, **labels})


def phases(registry: CollectorRegistry) -> list[str]:
    """The phase label of every greyrelease_release_phase series of ``web``."""
    return [
        s.labels["phase"]
        for family in registry.collect()
        for s in family.samples
        if s.name == "greyrelease_release_phase" and s.labels["name"] == "web"
    ]


def series_names(registry: CollectorRegistry) -> set[str]:
    return {s.name for family in registry.collect() for s in family.samples}


BASE: dict[str, Any] = {"targetRef": {"name": "web"}, "targetVersion": "v2", "batches": [{"replicas": 1}]}
ANALYSIS: dict[str, Any] = {
    "prometheus": {"address": "http://prometheus:9090"},
    "interval": "1s",
    "metrics": [
        {"name": "errors", "query": "e", "thresholdRange": {"max": 0.05}},
        {"name": "latency", "query": "l", "thresholdRange": {"min": 0.001, "max": 0.5}, "compare": {"maxIncrease": 1}},
    ],
}


# --- worked out from spec and status ----------------------------------------------------------------------


def test_a_release_mid_way_has_its_phase_batch_weight_start_and_gates() -> None:
    spec = GreyReleaseSpec.model_validate({**BASE, "analysis": ANALYSIS})
    status = GreyReleaseStatus.model_validate(
        {
            "phase": "Progressing",
            "currentBatch": 2,
            "totalBatches": 3,
            "canaryWeight": 20,
            "batchTimes": {"startedAt": "2026-01-01T12:00:00.000Z"},
            "metrics": [
                {
                    "name": "latency",
                    "value": 0.3,
                    "stableValue": 0.2,
                    "verdict": "Pass",
                    "checkedAt": "2026-01-01T12:00:05Z",
                }
            ],
        }
    )
    names = [name for name, _, _ in FAMILIES]
    got = {(names[f], labels): v for f, labels, v in series_of(spec, status)}
    assert got == {
        ("greyrelease_release_phase", ("Progressing",)): 1.0,
        ("greyrelease_release_current_batch", ()): 2.0,
        ("greyrelease_release_batches", ()): 3.0,
        ("greyrelease_release_canary_weight", ()): 20.0,
        ("greyrelease_release_batch_started_timestamp_seconds", ()): T0.timestamp(),
        # Not checked yet in this batch: Pending, no value; its range's bound all the same.
        ("greyrelease_release_gate_verdict", ("errors", "Pending")): 1.0,
        ("greyrelease_release_gate_threshold", ("errors", "max")): 0.05,
        ("greyrelease_release_gate_value", ("latency",)): 0.3,
        ("greyrelease_release_gate_verdict", ("latency", "Pass")): 1.0,
        ("greyrelease_release_gate_threshold", ("latency", "min")): 0.001,
        # The lower of the range's max (0.5) and the stable's 0.2 x (1 + 1).
        ("greyrelease_release_gate_threshold", ("latency", "max")): 0.4,
    }


def test_no_status_yet_reads_pending_and_an_unreadable_spec_has_no_gate_series() -> None:
    status = GreyReleaseStatus.model_validate(
        {"metrics": [{"name": "errors", "value": float("nan"), "verdict": "NoData"}]}
    )
    assert series_of(None, status) == (
        (release_metrics.PHASE, ("Pending",), 1.0),
        (release_metrics.CURRENT_BATCH, (), 0.0),
        (release_metrics.BATCHES, (), 0.0),
        (release_metrics.WEIGHT, (), 0.0),
    )
    spec = GreyReleaseSpec.model_validate({**BASE, "analysis": ANALYSIS})
    gate_values = [s for s in series_of(spec, status) if s[0] == release_metrics.GATE_VALUE]
    assert gate_values == []  # NaN is no value: the series is absent, not NaN


# --- following a release --------------------------------------------------------------------------------


def test_the_series_follow_a_release_through_its_batches_and_go_with_it() -> None:
    kube = cluster(
        batches=[{"replicas": 1, "pause": "10s"}, {"replicas": 2, "pause": "10s"}, {"replicas": 4}], analysis=ANALYSIS
    )
    registry, series = exporter()
    reconciler = Reconciler(kube, gates=FixedGates(kube, canary=0.01), series=series)
    now = T0
    seen: list[tuple[Any, ...]] = []
    for _ in range(60):
        assert reconciler.reconcile(NS, "web", now=now) is not None
        st = status_of(kube)
        assert phases(registry) == [st.get("phase")]
        step = (
            st.get("phase"),
            value(registry, "greyrelease_release_current_batch"),
            value(registry, "greyrelease_release_canary_weight"),
        )
        assert step[1:] == (st.get("currentBatch"), st.get("canaryWeight"))
        assert value(registry, "greyrelease_release_batches") == 3
        started = (st.get("batchTimes") or {}).get("startedAt")
        if started is not None:
            began = parse_time(started)
            assert began is not None
            assert value(registry, "greyrelease_release_batch_started_timestamp_seconds") == began.timestamp()
        if not seen or seen[-1] != step:
            seen.append(step)
        if st.get("phase") == "Succeeded":
            break
        roll_out(kube)
        now += timedelta(seconds=2)
    # Service routing: the weight is the canary's share of the replicas (1, 2, then 4 of 4).
    assert ("Progressing", 1, 25) in seen and ("Progressing", 2, 50) in seen and ("Progressing", 3, 100) in seen, seen
    assert seen[-1][0] == "Succeeded"
    assert value(registry, "greyrelease_release_gate_value", gate="errors") == 0.01
    assert value(registry, "greyrelease_release_gate_verdict", gate="errors", verdict="Pass") == 1
    assert value(registry, "greyrelease_release_gate_threshold", gate="latency", bound="max") == pytest.approx(0.04)

    # A gate removed from the spec takes its series with it.
    body = kube.get(RELEASE)
    assert body is not None
    body["spec"]["analysis"] = {**ANALYSIS, "metrics": ANALYSIS["metrics"][:1]}
    kube.put(body)
    reconciler.reconcile(NS, "web", now=now)
    gates = {
        s.labels["gate"]
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("greyrelease_release_gate_")
    }
    assert gates == {"errors"}

    # Deleted: nothing of it is left.
    kube.delete(RELEASE)
    assert reconciler.reconcile(NS, "web", now=now) is None
    assert not any(name.startswith("greyrelease_release_") for name in series_names(registry))


def test_a_pass_that_plans_a_change_from_a_version_already_exported_exports_it() -> None:
    """Two passes can read the release at one resourceVersion and plan different statuses: the first finds
    nothing to do (the stable still rolling out at promotion), the second, woken by the Deployment, ends the
    release. What the second wrote is exported, though its version was exported already."""
    kube = cluster(batches=[{"replicas": 1, "pause": "2s"}, {"replicas": 4}])
    registry, series = exporter()
    reconciler, now = Reconciler(kube, series=series), T0
    for _ in range(40):
        reconciler.reconcile(NS, "web", now=now)
        now += timedelta(seconds=1)
        st = status_of(kube)
        assert phases(registry) == [st.get("phase")], st.get("phase")
        if st.get("phase") == "Succeeded":
            break
        if st.get("phase") != "Promoting":
            roll_out(kube)
            continue
        # Promoting: a pass while the stable still rolls out (nothing to write), then the rollout ends.
        version = (kube.get(RELEASE) or {})["metadata"]["resourceVersion"]
        reconciler.reconcile(NS, "web", now=now)
        assert (kube.get(RELEASE) or {})["metadata"]["resourceVersion"] == version  # nothing written
        roll_out(kube)
    assert status_of(kube)["phase"] == "Succeeded"
    assert phases(registry) == ["Succeeded"]


def test_an_idle_pass_works_nothing_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = cluster(batches=[{"replicas": 1, "pause": "1h"}, {"replicas": 4}])
    registry, series = exporter()
    reconciler, now = Reconciler(kube, series=series), T0
    for _ in range(10):
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    assert status_of(kube)["phase"] == "Progressing" and value(registry, "greyrelease_release_current_batch") == 1
    calls: list[Any] = []
    real = release_metrics.series_of

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(release_metrics, "series_of", counted)
    for _ in range(20):
        now += timedelta(seconds=1)
        reconciler.reconcile(NS, "web", now=now)
    assert calls == []
    assert value(registry, "greyrelease_release_current_batch") == 1

    # A change of the release (here a promote annotation the pass acts on) is worked out again.
    body = kube.get(RELEASE)
    assert body is not None
    body["metadata"]["annotations"] = {"greyrelease.io/promote": "next"}
    kube.put(body)
    for _ in range(5):
        now += timedelta(seconds=1)
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
    assert calls
    assert value(registry, "greyrelease_release_current_batch") == status_of(kube)["currentBatch"] == 2


def test_forgotten_and_closed_releases_are_not_exported_and_late_passes_do_not_bring_them_back() -> None:
    registry, series = exporter()
    status = GreyReleaseStatus.model_validate({"phase": "Progressing", "currentBatch": 1, "totalBatches": 2})
    series.record((NS, "web"), "1", None, status)
    series.record((NS, "api"), "1", None, status)
    assert value(registry, "greyrelease_release_current_batch") == 1
    series.forget((NS, "web"))
    assert value(registry, "greyrelease_release_current_batch") is None
    assert registry.get_sample_value("greyrelease_release_current_batch", {"namespace": NS, "name": "api"}) == 1
    series.record((NS, "web"), "2", None, status)  # a release seen again (created anew) is exported again
    assert value(registry, "greyrelease_release_current_batch") == 1

    series.close()  # no longer this runtime's (a shard handed over, the lease lost)
    series.record((NS, "web"), "3", None, status)  # a pass that was still running
    assert not any(name.startswith("greyrelease_release_") for name in series_names(registry))


def test_every_family_is_described_even_with_no_release_and_renders_as_gauges() -> None:
    registry, series = exporter()
    text = generate_latest(registry).decode()
    for name, _, _ in FAMILIES:
        assert f"# TYPE {name} gauge" in text
    series.record((NS, "web"), "1", None, GreyReleaseStatus.model_validate({"phase": "Succeeded"}))
    text = generate_latest(registry).decode()
    assert 'greyrelease_release_phase{name="web",namespace="shop",phase="Succeeded"} 1.0' in text


def test_the_series_stay_within_the_documented_bound() -> None:
    """At most 5 per release plus 4 per gate, with the most a spec may hold (20 gates, each with both
    bounds and a compare)."""
    metrics = [
        {"name": f"g{i}", "query": "q", "thresholdRange": {"min": 0, "max": 1}, "compare": {"maxIncrease": 1}}
        for i in range(20)
    ]
    spec = GreyReleaseSpec.model_validate({**BASE, "analysis": {**ANALYSIS, "metrics": metrics}})
    checked = [
        {"name": f"g{i}", "value": 0.5, "stableValue": 0.4, "verdict": "Pass", "checkedAt": "2026-01-01T12:00:00Z"}
        for i in range(20)
    ]
    status = GreyReleaseStatus.model_validate(
        {"phase": "Progressing", "batchTimes": {"startedAt": "2026-01-01T12:00:00Z"}, "metrics": checked}
    )
    assert len(series_of(spec, status)) == 5 + 4 * 20
    assert not any(math.isnan(v) for _, _, v in series_of(spec, status))


def test_two_shards_in_one_process_export_their_own_releases_and_a_shard_given_up_takes_only_its_own() -> None:
    registry = CollectorRegistry()
    collector = ReleaseCollector(registry)
    shard_a, shard_b = ReleaseSeries(collector), ReleaseSeries(collector)
    status = GreyReleaseStatus.model_validate({"phase": "Progressing", "currentBatch": 2, "totalBatches": 3})
    shard_a.record(("team-a", "web"), "1", None, status)
    shard_b.record(("team-b", "web"), "1", None, status)

    def batches() -> dict[str, float | None]:
        return {
            ns: registry.get_sample_value("greyrelease_release_current_batch", {"namespace": ns, "name": "web"})
            for ns in ("team-a", "team-b")
        }

    assert batches() == {"team-a": 2, "team-b": 2}
    shard_a.close()
    assert batches() == {"team-a": None, "team-b": 2}
