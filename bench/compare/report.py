"""The report: bench/COMPARISON.md's measured part (a table per size and one for the cut-off, the memory
fitted and extrapolated) rewritten from comparison.json, and comparison.png beside it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.compare.scale import IDLE_SECONDS

ROWS: list[tuple[str, str, str]] = [
    # (key, label, unit)
    ("completion_s", "completion of all N releases (first release written -> last seen promoted)", "s"),
    ("lag_p50_s", "step after the 2 s pause: lag beyond the pause, p50", "s"),
    ("lag_p99_s", "step after the 2 s pause: lag beyond the pause, p99", "s"),
    ("own_lag_p50_s", "the same by the controller's own record (GreyRelease: history; Argo keeps none), p50", "s"),
    ("own_lag_p99_s", "the same by the controller's own record, p99", "s"),
    ("abort_p50_s", "abort -> canary out of the Service's endpoints (replica ratio), p50", "s"),
    ("abort_p99_s", "abort -> canary out of the Service's endpoints (replica ratio), p99", "s"),
    ("abort_own_p50_s", "of which: abort -> the controller's write that cuts the canary off, p50", "s"),
    ("abort_own_p99_s", "of which: abort -> the controller's write that cuts the canary off, p99", "s"),
    ("abort_cpu_s", "controller CPU while those aborts were cut", "s"),
    ("abort_nginx_p50_s", "abort -> canary weight 0 (nginx canary Ingress), p50", "s"),
    ("abort_nginx_p99_s", "abort -> canary weight 0 (nginx canary Ingress), p99", "s"),
    ("rss_base_mib", "controller RSS at start (empty namespaces)", "MiB"),
    ("peak_rss_mib", "controller peak RSS (whole run)", "MiB"),
    ("rss_per_release_kib", "RSS per release: (peak during the releases - at start) / N", "KiB"),
    ("cpu_s", "controller CPU during the releases", "s"),
    ("kcm_cpu_s", "kube-controller-manager CPU during the releases", "s"),
    ("apiserver_cpu_s", "kube-apiserver CPU during the releases", "s"),
    ("requests_per_transition", "controller API requests per batch transition (reads + writes, Leases apart)", ""),
    ("writes_per_transition", "controller API writes per batch transition (Leases apart)", ""),
    ("idle_writes", f"controller API writes while idle ({IDLE_SECONDS} s, Leases apart)", ""),
    ("idle_requests", f"controller API requests while idle ({IDLE_SECONDS} s, Leases apart)", ""),
    ("idle_lease_writes", f"leader election while idle ({IDLE_SECONDS} s): Lease writes", ""),
    ("idle_lease_reads", f"leader election while idle ({IDLE_SECONDS} s): Lease reads", ""),
]


CUTOFF = "cutoff"  # comparison.json's key of the cut-off on real requests (the other keys are the sizes)
CUT_ROWS: list[tuple[str, str, str]] = [
    ("cut_p50_s", "abort write -> last request answered by a canary pod, p50", "s"),
    ("cut_p99_s", "abort write -> last request answered by a canary pod, p99", "s"),
    ("cut_max_s", "abort write -> last request answered by a canary pod, max", "s"),
    ("controller write_p50_s", "of which: abort write -> the controller's first write (p50)", "s"),
    ("EndpointSlice update_p50_s", "of which: -> the canary out of the EndpointSlices (p50)", "s"),
    ("proxy_p50_s", "of which: -> the last canary answer, Traefik's part (p50)", "s"),
    ("failed", "requests failed (of all sent during the aborts)", ""),
    ("requests", "requests sent", ""),
]


def sizes(runs: dict[str, Any]) -> list[str]:
    return sorted((k for k in runs if k.isdigit()), key=int)


def ratio(a: Any, b: Any) -> str:
    """a / b; none where it means nothing (a figure missing or below 0, such as a pause ended early)."""
    if not isinstance(a, int | float) or not isinstance(b, int | float) or a < 0 or b < 0:
        return "-"
    if b == 0:
        return "-" if a == 0 else "inf"
    return f"{a / b:.2f}"


def table(pair: dict[str, dict[str, Any]], rows: list[tuple[str, str, str]] = ROWS) -> list[str]:
    gr, argo = pair.get("greyrelease", {}), pair.get("argo", {})
    lines = ["| figure | GreyRelease | Argo Rollouts | ratio GR / Argo |", "| --- | --- | --- | --- |"]
    for key, label, unit in rows:
        a, b = gr.get(key, "-"), argo.get(key, "-")
        u = f" {unit}" if unit else ""
        lines.append(f"| {label} | {a}{u if a != '-' else ''} | {b}{u if b != '-' else ''} | {ratio(a, b)} |")
    return lines


EXTRAPOLATE_TO = 10_000
MEMORY_GOAL_MIB = 1024  # GreyRelease's goal: at most 1 GiB at 10,000 releases in one process


def memory_fit(runs: dict[str, Any], who: str) -> tuple[float, float, list[int]] | None:
    """Peak RSS during the releases as a line in N (least squares over the measured sizes of 100 and up,
    where the process' fixed size no longer dominates): (MiB at N = 0, KiB per release, the sizes used)."""
    points = [
        (int(n), runs[n]["results"][who]["peak_rss_release_mib"])
        for n in sizes(runs)
        if int(n) >= 100 and "peak_rss_release_mib" in runs[n]["results"].get(who, {})
    ]
    if len({n for n, _ in points}) < 2:
        return None
    mean_n = sum(n for n, _ in points) / len(points)
    mean_m = sum(m for _, m in points) / len(points)
    slope = sum((n - mean_n) * (m - mean_m) for n, m in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return mean_m - slope * mean_n, slope * 1024, [n for n, _ in points]


def memory_section(runs: dict[str, Any]) -> list[str]:
    fits = {who: memory_fit(runs, who) for who in ("greyrelease", "argo")}
    if not any(fits.values()):
        return []
    lines = [
        f"### Memory at scale: extrapolated to N = {EXTRAPOLATE_TO:,}",
        "",
        "Peak RSS during the releases, fitted as a line in N over the measured sizes of 100 and up (least "
        "squares), then extended. The slope is the memory each release adds; the intercept is the process' "
        f"fixed size. GreyRelease's goal: at most {MEMORY_GOAL_MIB} MiB at {EXTRAPOLATE_TO:,} releases.",
        "",
        "| figure | GreyRelease | Argo Rollouts | ratio GR / Argo |",
        "| --- | --- | --- | --- |",
    ]
    cells: dict[str, tuple[Any, ...]] = {}
    for label, pick in (
        ("sizes fitted", lambda f: " / ".join(map(str, f[2]))),
        ("memory per release (slope)", lambda f: round(f[1], 1)),
        ("fixed size (intercept)", lambda f: round(f[0], 1)),
        (f"peak RSS at N = {EXTRAPOLATE_TO:,}, extrapolated", lambda f: round(f[0] + f[1] * EXTRAPOLATE_TO / 1024)),
    ):
        cells[label] = tuple(pick(fits[w]) if fits[w] else "-" for w in ("greyrelease", "argo"))
    units = {"memory per release (slope)": " KiB", "fixed size (intercept)": " MiB"}
    units[f"peak RSS at N = {EXTRAPOLATE_TO:,}, extrapolated"] = " MiB"
    for label, (a, b) in cells.items():
        u = units.get(label, "")
        r = ratio(a, b) if u else "-"
        lines.append(f"| {label} | {a}{u if a != '-' else ''} | {b}{u if b != '-' else ''} | {r} |")
    gr = fits["greyrelease"]
    if gr:
        at = gr[0] + gr[1] * EXTRAPOLATE_TO / 1024
        verdict = "within" if at <= MEMORY_GOAL_MIB else "over"
        lines += [
            "",
            f"GreyRelease at {EXTRAPOLATE_TO:,} releases, extrapolated: {at:.0f} MiB, {verdict} the "
            f"{MEMORY_GOAL_MIB} MiB goal.",
        ]
    return [*lines, ""]


def cutoff_table(pair: dict[str, dict[str, Any]]) -> list[str]:
    return table(pair, CUT_ROWS)


def write_report(runs: dict[str, Any], out: Path) -> None:
    """Rewrites the measured part of ``out`` (between the markers) and the PNG beside it; the prose
    outside the markers is kept."""
    # The markers as bench/COMPARISON.md has them since this was bench/compare.py (kept: the rewrite finds them).
    begin, end = "<!-- measured: begin (bench/compare.py writes this part) -->", "<!-- measured: end -->"
    lines = [begin, ""]
    cut = runs.get(CUTOFF)
    if cut:
        lines += [
            "### The abort cut-off on real requests",
            "",
            f"Measured {cut['date']} at commit `{cut['commit']}`, `{cut['command']}`: one app of 4 answering pods "
            f"behind an Ingress of class traefik, {cut['rate']:g} requests/s through Traefik, released to 1 "
            f"canary pod of 4 and aborted, {cut['aborts']} times per controller.",
            "",
            *cutoff_table(cut["results"]),
            "",
        ]
    for n in sizes(runs):
        run = runs[n]
        lines += [
            f"### N = {n}",
            "",
            f"Measured {run['date']} at commit `{run['commit']}`, `{run['command']}`; {run['abort_n']} aborts at once.",
            "",
            *table(run["results"]),
            "",
            "Controller API requests per batch transition, by verb and resource (audit log):",
            "",
            "| request | GreyRelease | Argo Rollouts |",
            "| --- | --- | --- |",
        ]
        gr, argo = (run["results"].get(k, {}).get("requests_by_kind", {}) for k in ("greyrelease", "argo"))
        for kind in sorted(set(gr) | set(argo)):
            lines.append(f"| {kind} | {gr.get(kind, 0)} | {argo.get(kind, 0)} |")
        lines.append("")
        commands = {k: " ".join(r["command"]) for k, r in run["results"].items()}
        lines += [f"Run as: {', '.join(f'`{v}`' for v in commands.values())}; versions: {run['versions']}.", ""]
    lines += memory_section(runs)
    lines.append(end)
    text = out.read_text() if out.exists() else f"# GreyRelease and Argo Rollouts side by side\n\n{begin}\n{end}\n"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    out.write_text(head + "\n".join(lines) + tail)
    plot(runs, out.parent / "comparison.png")


def plot(runs: dict[str, Any], png: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", file=sys.stderr)
        return
    measured = sizes(runs)
    panels = [
        ("abort_p99_s", "abort p99, replica ratio (s)"),
        ("abort_nginx_p99_s", "abort p99, nginx Ingress (s)"),
        ("lag_p99_s", "lag after the pause, p99 (s)"),
        ("peak_rss_mib", "controller peak RSS (MiB)"),
        ("cpu_s", "controller CPU, releases (s)"),
        ("writes_per_transition", "API writes per transition"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    width = 0.38
    for ax, (key, title) in zip(axes.flat, panels, strict=True):
        xs = range(len(measured))
        for i, (who, label) in enumerate((("greyrelease", "GreyRelease"), ("argo", "Argo Rollouts"))):
            vals = [runs[s]["results"].get(who, {}).get(key, float("nan")) for s in measured]
            ax.bar([x + (i - 0.5) * width for x in xs], vals, width, label=label)
        ax.set_xticks(list(xs), [f"N = {s}" for s in measured])
        ax.set_title(title, fontsize=10)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
