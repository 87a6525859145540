"""`python -m bench.soak`: does the controller's memory stay flat over a long run of repeated releases?

N two-replica apps, one controller process, and one release after another for each app (v1 -> v2 -> v3
...: batch 1 = 1 canary pod with a 2 s pause, batch 2 = all pods, then promotion), for ``--minutes``. The
controller's resident memory is sampled every 10 s. Memory that grows with history (Events, status
history, watch bookmarks, per-release state left behind, caches of objects the controller does not need)
shows as a slope across the rounds; a flat line is what the controller should draw.

Usage: python -m bench.soak --n 1000 --minutes 60 [--out bench/SOAK.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from e2e.harness.process import free_port
from greyrelease.kube.client import KubeClient, path

from bench.run import ROOT, ProcStats, bench_cluster, namespace_of_apps, parallel, release, wait

SAMPLE_EVERY = 10.0


class RssSeries(threading.Thread):
    """The process's resident memory every ``SAMPLE_EVERY`` seconds, as (seconds since start, MiB)."""

    def __init__(self, stats: ProcStats) -> None:
        super().__init__(daemon=True)
        self.stats = stats
        self.points: list[tuple[float, float]] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.points.append((time.monotonic() - self.t0, self.stats.rss() / 2**20))
            except OSError:
                return
            self._stop.wait(SAMPLE_EVERY)

    def stop(self) -> None:
        self._stop.set()


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of MiB over time, in MiB per hour."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 3600 * sum((t - mt) * (v - mv) for t, v in points) / var if var else float("nan")


def summarize(
    rounds: list[dict[str, Any]], points: list[tuple[float, float]], n: int, minutes: float
) -> dict[str, Any]:
    """The figures of the report: memory in the first minutes (after the first round, once every app has
    released once) against the last ones, and the slope over the rounds' ends."""
    first_end = rounds[0]["ended_s"] if rounds else 0.0
    early = [v for t, v in points if first_end <= t < first_end + 300]
    late = [v for t, v in points if t >= points[-1][0] - 300] if points else []
    ends = [(r["ended_s"], r["rss_mib"]) for r in rounds[1:]]
    return {
        "n": n,
        "minutes": minutes,
        "rounds": len(rounds),
        "releases": n * len(rounds),
        "rss_first_round_end_mib": round(rounds[0]["rss_mib"], 1) if rounds else None,
        "rss_early_mean_mib": round(sum(early) / len(early), 1) if early else None,
        "rss_late_mean_mib": round(sum(late) / len(late), 1) if late else None,
        "rss_peak_mib": round(max(v for _, v in points), 1) if points else None,
        "slope_mib_per_hour": round(slope_per_hour(ends), 1),
        "round_ends": rounds,
    }


def report(summary: dict[str, Any], out: Path, command: str) -> None:
    s = summary
    lines = [
        "# Memory over a long run",
        "",
        f"Produced by `{command}` on the local cluster (KWOK nodes), 2 cores: {s['n']} apps of 2 replicas,",
        "one release after another for each (batch 1 = 1 canary pod, 2 s pause; batch 2 = all pods; then",
        f"promotion) for {s['minutes']:g} minutes; the controller's resident memory sampled every {SAMPLE_EVERY:g} s.",
        "",
        "| | |",
        "| --- | --- |",
        f"| rounds (every app released once per round) | {s['rounds']} ({s['releases']} releases) |",
        f"| RSS at the end of the first round | {s['rss_first_round_end_mib']} MiB |",
        f"| RSS, mean of the 5 minutes after the first round | {s['rss_early_mean_mib']} MiB |",
        f"| RSS, mean of the last 5 minutes | {s['rss_late_mean_mib']} MiB |",
        f"| RSS, peak | {s['rss_peak_mib']} MiB |",
        f"| slope of the RSS at the rounds' ends (after the first) | {s['slope_mib_per_hour']} MiB per hour |",
        "",
        "| round | ended (s) | took (s) | RSS at its end (MiB) |",
        "| --- | --- | --- | --- |",
        *(
            f"| {i + 1} | {r['ended_s']:.0f} | {r['took_s']:.0f} | {r['rss_mib']:.1f} |"
            for i, r in enumerate(s["round_ends"])
        ),
        "",
    ]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")


def soak(cluster: Any, kube: KubeClient, n: int, minutes: float, workdir: Path) -> dict[str, Any]:
    ns = f"soak-{n}"
    gr_path = path("greyrelease.io", "v1", "greyreleases", ns)
    names = namespace_of_apps(cluster, kube, ns, n)
    log = (workdir / f"controller-soak-{n}.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "greyrelease",
            "run",
            "--namespace",
            ns,
            "--no-leader-elect",
            "--metrics-port",
            str(free_port()),
        ],
        cwd=ROOT,
        env=cluster.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    stats = ProcStats(proc.pid)
    series = RssSeries(stats)
    rounds: list[dict[str, Any]] = []
    batches: list[dict[str, Any]] = [{"replicas": 1, "pause": "2s"}, {"replicas": 2}]
    try:
        time.sleep(5)
        series.start()
        version = 1
        while series.points == [] or series.points[-1][0] < minutes * 60 or not rounds:
            version += 1
            target, started = f"v{version}", time.monotonic()

            def create(name: str, t: str = target) -> dict[str, Any]:
                return kube.create(gr_path, release(name, t, batches))

            def retarget(name: str, t: str = target) -> dict[str, Any]:
                return kube.patch(f"{gr_path}/{name}", {"spec": {"targetVersion": t}})

            parallel(create if version == 2 else retarget, names)

            def done(target: str = target) -> bool:
                items = kube.list(gr_path)
                return (
                    sum(
                        1
                        for g in items
                        if (g.get("status") or {}).get("targetVersion") == target
                        and (g.get("status") or {}).get("phase") == "Succeeded"
                    )
                    == n
                )

            wait(done, 3600, f"round {version - 1}: {n} releases of {target} succeeded", 2)
            rounds.append(
                {
                    "ended_s": round(time.monotonic() - series.t0, 1),
                    "took_s": round(time.monotonic() - started, 1),
                    "rss_mib": round(stats.rss() / 2**20, 1),
                }
            )
            print(f"round {version - 1}: {rounds[-1]}", flush=True)
        return summarize(rounds, series.points, n, minutes)
    finally:
        series.stop()
        stats.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for g in kube.list(gr_path):
            kube.patch(f"{gr_path}/{g['metadata']['name']}", {"metadata": {"finalizers": None}})
        kube.delete(path("", "v1", "namespaces", name=ns))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "SOAK.md"))
    args = parser.parse_args()
    command = f"python -m bench.soak --n {args.n} --minutes {args.minutes:g}"
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-soak-"))
    with bench_cluster(workdir) as (cluster, kube):
        summary = soak(cluster, kube, args.n, args.minutes, workdir)
        report(summary, Path(args.out), command)
        print(json.dumps({k: v for k, v in summary.items() if k != "round_ends"}), flush=True)
    print(f"wrote {args.out}; controller log in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
