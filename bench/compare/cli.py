"""The command line (`python -m bench.compare`): the local cluster with reads audited, both controllers'
CRDs, then the stages in order (the cut-off on real requests, then each size), comparison.json and the
report rewritten after each controller's run."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from e2e.harness.dataplane import DataPlane
from greyrelease.kube.client import KubeClient

from bench import audit
from bench.compare.argo import ArgoContender, argo_binary, argo_crds
from bench.compare.cluster import K8S_VERSION, ROOT, install_crds, new_namespace
from bench.compare.contender import Contender, GreyReleaseContender
from bench.compare.cutoff import CUT_ABORTS, CUT_RATE, run_cutoff
from bench.compare.probes import now
from bench.compare.report import CUTOFF, write_report
from bench.compare.scale import MAX_ABORTS, run_one


def git_commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    return head + ("+uncommitted changes" if dirty.strip() else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = sys.modules["bench.compare"].__doc__  # the package's: what `make compare` does
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 500, 1000])
    parser.add_argument(
        "--cutoff-aborts",
        type=int,
        default=CUT_ABORTS,
        help="aborts per controller on real requests, before the sizes (0: none)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "COMPARISON.md"))
    parser.add_argument("--only", choices=("greyrelease", "argo"), help="run one controller (for trying the harness)")
    return parser.parse_args(argv)


class Results:
    """comparison.json (what earlier runs measured, kept) and the report, rewritten after every run: a large
    size takes an hour, and a run stopped half-way keeps what it measured."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.json_path = out.with_name("comparison.json")
        self.runs: dict[str, Any] = json.loads(self.json_path.read_text()) if self.json_path.exists() else {}

    def save(self, key: str, entry: dict[str, Any]) -> None:
        self.runs[key] = entry
        self.json_path.write_text(json.dumps(self.runs, indent=2) + "\n")
        write_report(self.runs, self.out)


def measure_cutoff(
    contenders: list[Contender], cluster: audit.AuditedCluster, kube: KubeClient, workdir: Path, aborts: int
) -> dict[str, Any]:
    """The cut-off on real requests, each controller in turn; Traefik and the pods' responders run for this
    stage only (the sizes are measured without them)."""
    dataplane = DataPlane(cluster, workdir / "dataplane")
    dataplane.start()
    try:
        cut: dict[str, Any] = {}
        for c in contenders:
            print(f"the abort cut-off on real requests, {c.title} ...", flush=True)
            cut[c.key] = run_cutoff(c, cluster, kube, dataplane, workdir, aborts)
            print(json.dumps(cut[c.key]), flush=True)
        return cut
    finally:
        dataplane.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    binary = argo_binary()
    if args.only != "greyrelease" and not (binary.is_file() and (argo_crds() / "kustomization.yaml").is_file()):
        print(f"error: {binary} or its CRDs missing: run `e2e/build/build.sh argo` first", file=sys.stderr)
        return 2
    contenders: list[Contender] = [GreyReleaseContender(), ArgoContender(binary)]
    contenders = [c for c in contenders if args.only in (None, c.key)]
    command = "python -m bench.compare --sizes " + " ".join(map(str, args.sizes))
    command += f" --cutoff-aborts {args.cutoff_aborts}"
    commit = git_commit()  # before this run writes its results
    workdir = Path(tempfile.mkdtemp(prefix="greyrelease-compare-"))
    results = Results(Path(args.out))
    cluster = audit.AuditedCluster(workdir / "cluster")
    cluster.start()
    try:
        kube = KubeClient.from_environment(str(cluster.kubeconfig))
        kube.user_agent = "bench-compare"  # not a controller's
        install_crds(cluster, kube, None if args.only == "greyrelease" else argo_crds())
        for c in contenders:
            new_namespace(cluster, kube, c.lease_namespace)
        versions = ", ".join(f"{c.title}: {c.version()}" for c in contenders)
        versions += f", Kubernetes v{K8S_VERSION} (local control plane, KWOK nodes)"
        if args.cutoff_aborts > 0:
            cut = measure_cutoff(contenders, cluster, kube, workdir, args.cutoff_aborts)
            results.save(
                CUTOFF,
                {
                    "date": f"{now():%Y-%m-%d}",
                    "commit": commit,
                    "command": command,
                    "versions": versions,
                    "rate": CUT_RATE,
                    "aborts": args.cutoff_aborts,
                    "results": cut,
                },
            )
        for n in args.sizes:
            measured: dict[str, Any] = {}
            for c in contenders:
                print(f"N = {n}, {c.title} ...", flush=True)
                measured[c.key] = run_one(c, cluster, kube, n, workdir)
                print(json.dumps(measured[c.key]), flush=True)
                results.save(
                    str(n),
                    {
                        "date": f"{now():%Y-%m-%d}",
                        "commit": commit,
                        "command": command,
                        "versions": versions,
                        "abort_n": min(MAX_ABORTS, n),
                        "results": measured,
                    },
                )
    finally:
        cluster.stop()
    print(f"wrote {results.out} and {results.json_path}; controller logs in {workdir}")
    return 0
