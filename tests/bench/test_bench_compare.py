"""The report of `make compare` (bench/compare.py): its arithmetic and the file it rewrites. The measuring
itself runs on a live cluster (`make compare SIZES=20`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import compare


def runs_with(points: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """comparison.json with peak RSS during the releases (GreyRelease, Argo) at each N."""
    return {
        str(n): {"results": {"greyrelease": {"peak_rss_release_mib": gr}, "argo": {"peak_rss_release_mib": argo}}}
        for n, (gr, argo) in points.items()
    }


def test_the_memory_fit_recovers_a_line_and_leaves_out_the_small_sizes() -> None:
    # GreyRelease 80 MiB + 0.25 MiB/release; Argo 60 MiB + 1 MiB/release. N = 20 is off the line and left out.
    runs = runs_with({20: (500.0, 500.0), 100: (105.0, 160.0), 500: (205.0, 560.0), 1000: (330.0, 1060.0)})
    runs["cutoff"] = {"results": {}}  # not a size
    gr, argo = compare.memory_fit(runs, "greyrelease"), compare.memory_fit(runs, "argo")
    assert gr is not None and argo is not None
    assert gr[0] == pytest.approx(80.0) and gr[1] == pytest.approx(256.0) and gr[2] == [100, 500, 1000]
    assert argo[0] == pytest.approx(60.0) and argo[1] == pytest.approx(1024.0)
    section = "\n".join(compare.memory_section(runs))
    assert "| memory per release (slope) | 256.0 KiB | 1024.0 KiB | 0.25 |" in section
    assert "| peak RSS at N = 10,000, extrapolated | 2580 MiB | 10060 MiB | 0.26 |" in section
    assert "2580 MiB, over the 1024 MiB goal" in section


def test_one_size_is_not_enough_to_extrapolate() -> None:
    runs = runs_with({20: (90.0, 90.0), 100: (120.0, 110.0)})
    assert compare.memory_fit(runs, "greyrelease") is None
    assert compare.memory_section(runs) == []


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [(1.0, 4.0, "0.25"), (0, 0, "-"), (3, 0, "inf"), (-0.5, 1.0, "-"), ("-", 2.0, "-")],
)
def test_ratio(a: Any, b: Any, expected: str) -> None:
    assert compare.ratio(a, b) == expected


def test_the_report_rewrites_only_its_measured_part(tmp_path: Path) -> None:
    out = tmp_path / "COMPARISON.md"
    out.write_text(
        "# Title\n\nprose before\n\n<!-- measured: begin (bench/compare.py writes this part) -->\nold\n"
        "<!-- measured: end -->\n\nprose after\n"
    )
    figures = {"cut_p50_s": 0.5, "cut_p99_s": 0.9, "cut_max_s": 1.0, "failed": 0, "requests": 4000}
    runs = {
        "cutoff": {
            "date": "2026-12-03",
            "commit": "abc1234",
            "command": "python -m bench.compare",
            "rate": 100.0,
            "aborts": 10,
            "results": {"greyrelease": figures, "argo": {**figures, "cut_p99_s": 3.6}},
        },
    }
    compare.write_report(runs, out)
    text = out.read_text()
    assert text.startswith("# Title\n\nprose before\n\n") and text.endswith("\n\nprose after\n")
    assert "old" not in text
    assert "| abort write -> last request answered by a canary pod, p99 | 0.9 s | 3.6 s | 0.25 |" in text
    assert "100 requests/s through Traefik" in text


def test_the_cutting_write_of_each_abort_is_read_from_the_audit_log(tmp_path: Path) -> None:
    """Argo's cut is its canary ReplicaSet's scale-down, not the stable's scale-up beside it; only writes
    after the app's own abort count."""

    def event(at: float, resource: str, name: str, agent: str = "rollouts-controller/v1.10.2") -> str:
        stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
        return json.dumps(
            {
                "verb": "update",
                "userAgent": agent,
                "requestReceivedTimestamp": stamp,
                "objectRef": {"resource": resource, "namespace": "ns", "name": name},
                "responseStatus": {"code": 200},
            }
        )

    t = 1_800_000_000.0
    (tmp_path / "audit.log").write_text(
        "\n".join(
            [
                event(t + 0.5, "replicasets", "web-canaryhash"),  # before web's abort: not its cut
                event(t + 1.2, "replicasets", "web-stablehash"),  # the stable scaled up: not a cut
                event(t + 1.4, "replicasets", "web-canaryhash"),
                event(
                    t + 1.3, "replicasets", "api-canaryhash", agent="kube-controller-manager"
                ),  # not the controller's
                event(t + 2.0, "replicasets", "api-canaryhash"),
            ]
        )
        + "\n"
    )
    cluster: Any = SimpleNamespace(audit_log=tmp_path / "audit.log")
    argo = compare.ArgoContender(tmp_path / "rollouts-controller")
    canaries = {"web": {"web-canaryhash-abcde"}, "api": {"api-canaryhash-fghij"}}
    written = {"web": t + 1.0, "api": t + 1.1}
    cuts = compare.cutting_writes(argo, cluster, "ns", written, t, canaries)
    assert cuts == pytest.approx({"web": t + 1.4, "api": t + 2.0})
    assert sorted(round(x, 3) for x in compare.latencies(written, cuts)) == [0.4, 0.9]
