"""The long-run memory and the shard benchmarks' arithmetic: the slope, the early / late figures, the layout."""

from __future__ import annotations

import math
from collections import Counter

from bench.soak import slope_per_hour, summarize


def test_a_flat_series_has_no_slope_and_a_growing_one_its_rate() -> None:
    assert slope_per_hour([(t, 200.0) for t in range(0, 3600, 60)]) == 0
    assert math.isclose(slope_per_hour([(t, 200.0 + t / 360) for t in range(0, 3600, 60)]), 10.0)
    assert math.isnan(slope_per_hour([(0.0, 1.0)]))


def test_the_summary_compares_the_minutes_after_the_first_round_with_the_last_ones() -> None:
    points = [(float(t), 150.0 if t < 600 else 160.0) for t in range(0, 3610, 10)]
    rounds = [
        {"ended_s": 300.0, "took_s": 300.0, "rss_mib": 150.0},
        {"ended_s": 1800.0, "took_s": 400.0, "rss_mib": 160.0},
        {"ended_s": 3600.0, "took_s": 400.0, "rss_mib": 160.0},
    ]
    s = summarize(rounds, points, n=10, minutes=60)
    assert s["rounds"] == 3 and s["releases"] == 30
    assert s["rss_early_mean_mib"] == 150.0  # t in [300, 600)
    assert s["rss_late_mean_mib"] == 160.0
    assert s["rss_peak_mib"] == 160.0
    assert s["slope_mib_per_hour"] == 0.0  # flat from the second round's end on


def test_the_shard_benchmark_spreads_its_namespaces_evenly_over_the_shards() -> None:
    from bench.shards import balanced_namespaces
    from greyrelease.runtime.shards import shard_of

    names = balanced_namespaces(30, 3)
    assert len(set(names)) == 30
    assert sorted(Counter(shard_of(ns, 3) for ns in names).values()) == [10, 10, 10]
