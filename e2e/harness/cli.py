"""The command line of the local test environment (`python -m e2e.cluster ...`).

Commands (stdout carries only `export` lines, so `eval "$(python -m e2e.cluster up)"` works):

    python -m e2e.cluster up [--with-prometheus] [--with-dataplane]
                                     start in the background; last line: export KUBECONFIG=...
                                     --with-dataplane (make cluster-up) also starts Prometheus, Traefik and
                                     the pod responders, and exports GREYRELEASE_GATEWAY_URL,
                                     GREYRELEASE_GATEWAY and GREYRELEASE_PROMETHEUS_URL
    python -m e2e.cluster status     print the export lines of the running cluster
    python -m e2e.cluster down       stop it and remove its files
    python -m e2e.cluster add-scrape-target HOST:PORT [--job NAME]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import LocalCluster, external_cluster
from e2e.harness.dataplane import DataPlane
from e2e.harness.podnet import sweep_stale_netns
from e2e.harness.process import HERE, pid_alive, run_dir, wait_until
from e2e.harness.prometheus import PrometheusStack, add_file_sd_target


def _state_file() -> Path:
    return run_dir() / "state.json"


def _read_state() -> dict[str, Any] | None:
    try:
        return dict(json.loads(_state_file().read_text()))
    except (OSError, ValueError):
        return None


def _export_lines(state: Mapping[str, Any]) -> list[str]:
    lines = []
    if state.get("gateway_url"):
        lines.append(f"export GREYRELEASE_GATEWAY_URL={state['gateway_url']}")
        lines.append(f"export GREYRELEASE_GATEWAY={state['gateway']}")
    if state.get("prometheus_url"):
        lines.append(f"export GREYRELEASE_PROMETHEUS_URL={state['prometheus_url']}")
        lines.append(f"export GREYRELEASE_EXPORTER_URL={state['exporter_url']}")
    lines.append(f"export KUBECONFIG={state['kubeconfig']}")  # the last line, by contract
    return lines


def _serve(with_prometheus: bool, with_dataplane: bool) -> int:
    """The detached supervisor: owns the processes, writes the state file, stops all on SIGTERM."""
    stopping = False
    ready = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if not ready:  # still starting: abandon the start at once; `finally` below cleans up
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise SystemExit(1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    cluster = LocalCluster(run_dir() / "cluster")
    prom: PrometheusStack | None = None
    dataplane: DataPlane | None = None
    try:
        started = time.monotonic()
        cluster.start()
        state: dict[str, Any] = {
            "pid": os.getpid(),
            "kubeconfig": str(cluster.kubeconfig),
            "server": cluster.server,
            "pids": cluster.pids(),
            "started_in_seconds": round(time.monotonic() - started, 2),
        }
        if with_prometheus or with_dataplane:
            prom = PrometheusStack(run_dir() / "prometheus")
            prom.start()
            state["pids"].update(prom.pids())
            state.update(
                prometheus_url=prom.url, exporter_url=prom.exporter_url, scrape_targets_file=str(prom.targets_file)
            )
        if with_dataplane:
            dataplane = DataPlane(cluster, run_dir() / "dataplane", prom)
            dataplane.start()
            state["pids"].update(dataplane.pids())
            state.update(
                gateway_url=dataplane.gateway_url, gateway=dataplane.gateway, traefik_metrics_url=dataplane.metrics_url
            )
        tmp = _state_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(_state_file())
        ready = True
        print(f"cluster ready in {state['started_in_seconds']}s", flush=True)
        while not stopping:
            time.sleep(0.5)
            for proc in [*cluster.processes, *(dataplane.processes if dataplane else [])]:
                if not proc.alive():
                    print(f"{proc.name} exited; last log lines:\n{proc.tail()}", flush=True)
                    stopping = True
        return 0
    finally:
        if dataplane is not None:
            dataplane.stop()
        if prom is not None:
            prom.close()
        cluster.stop()
        _state_file().unlink(missing_ok=True)


def cmd_up(with_prometheus: bool, with_dataplane: bool, timeout: float) -> int:
    state = _read_state()
    if state and pid_alive(int(state["pid"])):
        if with_prometheus and not state.get("prometheus_url"):
            print("the running cluster has no Prometheus: `down`, then `up --with-prometheus`", file=sys.stderr)
            return 1
        if with_dataplane and not state.get("gateway_url"):
            print("the running cluster has no data plane: `down`, then `up --with-dataplane`", file=sys.stderr)
            return 1
        print("\n".join(_export_lines(state)))
        return 0
    if state:
        cmd_down(quiet=True)  # a stale state file from a supervisor that died
    if not (with_prometheus or with_dataplane):
        external = external_cluster()
        if external is not None:
            print(f"using the reachable cluster at {external.server} (KUBECONFIG)", file=sys.stderr)
            print(f"export KUBECONFIG={external.kubeconfig}")
            return 0
    run_dir().mkdir(parents=True, exist_ok=True)
    log = run_dir() / "supervisor.log"
    started = time.monotonic()
    with open(log, "wb") as out:
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e2e.cluster",
                "_serve",
                *(["--with-prometheus"] if with_prometheus else []),
                *(["--with-dataplane"] if with_dataplane else []),
            ],
            cwd=HERE.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: survives the shell that ran `up`
        )
    print(f"starting the local cluster (log: {log})", file=sys.stderr)
    deadline = time.monotonic() + timeout
    while True:
        state = _read_state()
        if state and state.get("pid") == supervisor.pid:
            break
        if supervisor.poll() is not None:
            print(f"the local cluster failed to start:\n{log.read_text(errors='replace')}", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"the local cluster did not start within {timeout:.0f}s; see {log}", file=sys.stderr)
            os.killpg(supervisor.pid, signal.SIGTERM)
            return 1
        time.sleep(0.1)
    print(f"local cluster ready in {time.monotonic() - started:.1f}s: {state['server']}", file=sys.stderr)
    print("\n".join(_export_lines(state)))
    return 0


def cmd_down(quiet: bool = False) -> int:
    state = _read_state()
    if state is None:
        if not quiet:
            print("no local cluster is running", file=sys.stderr)
        shutil.rmtree(run_dir(), ignore_errors=True)
        return 0
    pid = int(state["pid"])
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not pid_alive(pid), 30, "the supervisor to stop", 0.1)
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
    # Components have their own process groups; anything the supervisor failed to stop goes now.
    for cpid in state.get("pids", {}).values():
        if pid_alive(cpid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cpid, signal.SIGKILL)
    shutil.rmtree(run_dir(), ignore_errors=True)
    sweep_stale_netns()  # the pod network of a supervisor that could not clean up
    if not quiet:
        print("local cluster stopped", file=sys.stderr)
    return 0


def cmd_status() -> int:
    state = _read_state()
    if state is None or not pid_alive(int(state["pid"])):
        print("no local cluster is running", file=sys.stderr)
        return 1
    print("\n".join(_export_lines(state)))
    return 0


def cmd_add_scrape_target(host_port: str, job: str) -> int:
    state = _read_state()
    if state is None or not state.get("scrape_targets_file"):
        print("no local cluster with Prometheus is running (`up --with-prometheus`)", file=sys.stderr)
        return 1
    add_file_sd_target(Path(state["scrape_targets_file"]), host_port, job)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the local cluster in the background")
    up.add_argument(
        "--with-prometheus",
        action="store_true",
        help="also start Prometheus and the test exporter (needs /usr/bin/prometheus)",
    )
    up.add_argument(
        "--with-dataplane",
        action="store_true",
        help="also Prometheus, Traefik with the Gateway API, and pods that answer HTTP (needs root)",
    )
    up.add_argument("--timeout", type=float, default=120.0)
    sub.add_parser("down", help="stop the local cluster and remove its files")
    sub.add_parser("status", help="print the export lines of the running local cluster")
    target = sub.add_parser("add-scrape-target", help="let the local Prometheus scrape HOST:PORT/metrics")
    target.add_argument("host_port")
    target.add_argument("--job", default="extra")
    serve = sub.add_parser("_serve")  # internal: the detached supervisor
    serve.add_argument("--with-prometheus", action="store_true")
    serve.add_argument("--with-dataplane", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "up":
        return cmd_up(args.with_prometheus, args.with_dataplane, args.timeout)
    if args.command == "down":
        return cmd_down()
    if args.command == "status":
        return cmd_status()
    if args.command == "add-scrape-target":
        return cmd_add_scrape_target(args.host_port, args.job)
    return _serve(args.with_prometheus, args.with_dataplane)
