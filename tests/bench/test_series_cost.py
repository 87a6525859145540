"""The per-release series' memory benchmark measures what it says: the releases' series, each counted."""

from __future__ import annotations

from bench.series import lines, measure


def test_the_series_benchmark_counts_every_releases_series_and_what_they_hold() -> None:
    r = measure(50, gates=2)
    assert (r["series"], r["series_per_release"]) == (50 * 11, 11)
    assert 0 < r["exporter_bytes_per_release"] <= r["bytes_per_release"]
    assert r["scrape_kib"] > 0
    none = measure(50, gates=0)
    assert none["series_per_release"] == 5 and none["bytes_per_release"] < r["bytes_per_release"]
    assert lines(r)[0] == "## Per-release series on /metrics (N = 50, in-process)"
