"""What the per-release series on /metrics cost: N releases exported in this process, measured with
tracemalloc, and one scrape of them rendered.

No cluster and no controller: a :class:`~greyrelease.reconcile.release_metrics.ReleaseSeries` on a registry
of its own records N releases mid-way (Progressing, batch 2 of 3 at 20 %, a batch start time) with
``--gates`` gates each (a ``thresholdRange`` gate and a ``compare`` gate, alternately, each checked once:
a value, a verdict, one bound). Each release's spec and status are parsed from JSON of their own, as a
pass parses them, so that no string is shared between releases that would not be in the controller;
they are dropped after the release is recorded, and only what the exporter keeps counts. The traced
total is split by where it was allocated: the exporter's record of each release (a tuple of its series),
and the rest (the strings of the labels, allocated where the release was parsed). Then the registry is
rendered as a scrape would (``generate_latest``): its size and the best time of 5.

``make bench`` runs it at N = 1,000 (:func:`measure`, in ``bench/RESULTS.md``); figures in
bench/README.md, "Per-release series on /metrics".

Usage: python -m bench.series [--n 1000] [--gates 2]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from typing import Any

from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus
from greyrelease.reconcile.release_metrics import ReleaseCollector, ReleaseSeries
from prometheus_client import CollectorRegistry, generate_latest


def _release(i: int, gates: int) -> tuple[GreyReleaseSpec, GreyReleaseStatus]:
    metrics: list[dict[str, Any]] = []
    checked: list[dict[str, Any]] = []
    for g in range(gates):
        name = f"gate-{g}"  # a string of its own per release, as parsed from each release's JSON
        gate: dict[str, Any] = {"name": name, "query": f"sum(rate(errors_total{{app='r{i}'}}[1m]))"}
        if g % 2:
            gate["compare"] = {"maxIncrease": 0.5, "floor": 0.01}
        else:
            gate["thresholdRange"] = {"max": 0.05}
        metrics.append(gate)
        checked.append(
            {
                "name": name,
                "value": 0.01 + i / 1e6,
                "stableValue": 0.02,
                "verdict": "Pass",
                "checkedAt": "2026-01-01T12:00:05.000Z",
                "successes": 1,
            }
        )
    spec = GreyReleaseSpec.model_validate(
        {
            "targetRef": {"name": f"app-{i}"},
            "targetVersion": "v2",
            "batches": [{"replicas": 1, "weight": 10}, {"replicas": 2, "weight": 20}, {"replicas": 4, "weight": 100}],
            **(
                {"analysis": {"prometheus": {"address": "http://prometheus:9090"}, "metrics": metrics}} if gates else {}
            ),
        }
    )
    status = GreyReleaseStatus.model_validate(
        {
            "phase": "Progressing",
            "currentBatch": 2,
            "totalBatches": 3,
            "canaryWeight": 20,
            "batchTimes": {"startedAt": "2026-01-01T12:00:00.000Z"},
            "metrics": checked,
        }
    )
    return spec, status


def measure(n: int = 1000, gates: int = 2) -> dict[str, Any]:
    """The memory the series of ``n`` releases hold, the scrape they make, and how long it takes."""
    registry = CollectorRegistry()
    exporter = ReleaseSeries(ReleaseCollector(registry))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(n):
            spec, status = _release(i, gates)
            exporter.record((f"ns-{i % 50}", f"release-{i}"), str(i), spec, status)
            del spec, status
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    by_file: dict[str, int] = {}
    for stat in after.compare_to(before, "filename"):
        where = stat.traceback[0].filename
        part = (
            "prometheus_client"
            if "prometheus_client" in where
            else "exporter"
            if "release_metrics" in where
            else "other"
        )
        by_file[part] = by_file.get(part, 0) + stat.size_diff
    total = sum(by_file.values())
    series = sum(len(family.samples) for family in registry.collect())
    renders = []
    for _ in range(5):
        start = time.perf_counter()
        body = generate_latest(registry)
        renders.append(time.perf_counter() - start)
    return {
        "n": n,
        "gates": gates,
        "series": series,
        "series_per_release": round(series / n, 2),
        "bytes_per_release": round(total / n),
        "bytes_per_series": round(total / series),
        "exporter_bytes_per_release": round(by_file.get("exporter", 0) / n),
        "other_bytes_per_release": round(by_file.get("other", 0) / n),
        "total_mib": round(total / 2**20, 2),
        "scrape_kib": round(len(body) / 1024, 1),
        "scrape_render_ms": round(1000 * min(renders), 1),
    }


def lines(result: dict[str, Any]) -> list[str]:
    """The figures as Markdown, for bench/RESULTS.md."""
    r = result
    return [
        f"## Per-release series on /metrics (N = {r['n']}, in-process)",
        "",
        f"{r['n']} releases mid-way with {r['gates']} gates each, exported by the controller's exporter on a "
        "registry of its own and measured with tracemalloc (`python -m bench.series`):",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| series | {r['series']} ({r['series_per_release']:g} per release) |",
        f"| memory held | {r['total_mib']} MiB: {r['bytes_per_release']} B per release, "
        f"{r['bytes_per_series']} B per series |",
        f"| of which the exporter's record / the rest (labels' strings) | "
        f"{r['exporter_bytes_per_release']} B / {r['other_bytes_per_release']} B per release |",
        f"| one scrape of them: size; rendered in | {r['scrape_kib']} KiB; {r['scrape_render_ms']} ms |",
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--gates", type=int, default=2)
    args = parser.parse_args()
    print("\n".join(lines(measure(args.n, args.gates))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
