"""End-to-end: `kubectl gr`, found by kubectl's plugin discovery on PATH as a user would have it, against a
real release with the controller running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent  # where `pip install -e .` put the kubectl-gr console script
SERVICE = {"service": {"name": "web"}}


def plugin_env(cluster: Cluster) -> dict[str, str]:
    return {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def gr_cmd(cluster: Cluster, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """`kubectl gr ARGS`."""
    proc = subprocess.run(
        [cluster.kubectl_path, "gr", *args], capture_output=True, text=True, env=plugin_env(cluster), timeout=timeout
    )
    if check:
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


def _interruptible() -> None:
    """In the child before it runs: SIGINT as a terminal's Ctrl-C finds it. A process started with SIGINT
    ignored (a background job of a non-interactive shell, and so everything it starts) passes that on,
    and Python then installs no KeyboardInterrupt handler: the watch would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def gr_watch(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [cluster.kubectl_path, "gr", "status", "-w", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(cluster),
        preexec_fn=_interruptible,
    )


def field(text: str, name: str) -> str:
    """The value of ``Name:`` in `kubectl gr status` output (its last frame)."""
    lines = [line for line in text.splitlines() if line.startswith(f"{name}:")]
    assert lines, text
    return lines[-1].split(":", 1)[1].strip()


def annotations_of(cluster: Cluster, namespace: str) -> dict[str, str]:
    found: dict[str, str] = (
        cluster.kubectl_json("get", "gr", "web", "-n", namespace)["metadata"].get("annotations") or {}
    )
    return found


def test_kubectl_discovers_the_plugin(cluster: Cluster) -> None:
    assert (BIN / "kubectl-gr").exists(), "pip install -e . installs the kubectl-gr console script"
    found = subprocess.run(
        [cluster.kubectl_path, "plugin", "list"], capture_output=True, text=True, env=plugin_env(cluster)
    )
    assert str(BIN / "kubectl-gr") in found.stdout, (found.stdout, found.stderr)
    assert "status" in gr_cmd(cluster, "--help").stdout


def test_every_subcommand_on_a_real_release(
    cluster: Cluster, namespace: str, controller: Controller, tmp_path: Path
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    manual = [
        {"replicas": 1, "pause": "manual"},
        {"replicas": 2, "pause": "manual"},
        {"replicas": 3, "pause": "manual"},
        {"replicas": 4},
    ]
    body = gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=manual, trafficRouting=SERVICE)
    release_file = tmp_path / "release.yaml"
    release_file.write_text(json.dumps(body))

    # plan: offline with --replicas, and with the replicas read from the cluster.
    offline = gr_cmd(cluster, "plan", "-f", str(release_file), "--replicas", "8").stdout.splitlines()
    assert offline[0] == "GreyRelease web: v2 over 8 replicas, traffic by service"
    # The last batch is all of the replicas and all of the traffic.
    assert [row.split()[:4] for row in offline[2:6]] == [
        ["1", "1", "7", "12%"],
        ["2", "2", "6", "25%"],
        ["3", "3", "5", "38%"],
        ["4", "8", "0", "100%"],
    ]
    live = gr_cmd(cluster, "plan", "-f", str(release_file), "-n", namespace).stdout
    assert live.splitlines()[0] == "GreyRelease web: v2 over 4 replicas, traffic by service", live

    # status of a release waiting for approval at batch 1.
    apply_release(cluster, namespace, body)
    wait_for(
        lambda: "waiting for approval" in status(cluster, namespace, "web").get("message", ""),
        60,
        "manual pause at batch 1",
    )
    out = gr_cmd(cluster, "status", "web", "-n", namespace).stdout
    assert field(out, "Phase").startswith("Progressing")
    assert field(out, "Batch") == "[##--------] 1/4"
    assert field(out, "Replicas") == "canary 1, stable 3"
    assert field(out, "Versions") == "stable v1 -> target v2"
    assert "waiting for approval" in field(out, "Message")
    assert "Events:" in out and "BatchReady" in out

    # -w without a change draws once and ends quietly on Ctrl-C.
    watch = gr_watch(cluster, "web", "-n", namespace)
    time.sleep(3)
    watch.send_signal(signal.SIGINT)
    frames, err = watch.communicate(timeout=10)
    assert watch.returncode == 0, err
    assert frames.count("Name:") == 1, frames

    # pause / resume.
    gr_cmd(cluster, "pause", "web", "-n", namespace)
    wait_phase(cluster, namespace, "web", {"Paused"}, timeout=15)
    assert field(gr_cmd(cluster, "status", "web", "-n", namespace).stdout, "Requested") == "greyrelease.io/pause=true"
    gr_cmd(cluster, "resume", "web", "-n", namespace)
    wait_phase(cluster, namespace, "web", {"Progressing"}, timeout=15)
    assert "greyrelease.io/pause" not in annotations_of(cluster, namespace)

    # promote: batch 2; then promote --full while `status -w` watches, which ends by itself at Succeeded.
    gr_cmd(cluster, "promote", "web", "-n", namespace)
    wait_for(lambda: status(cluster, namespace, "web").get("currentBatch") == 2, 30, "batch 2")
    wait_for(
        lambda: "waiting for approval" in status(cluster, namespace, "web").get("message", ""),
        60,
        "manual pause at batch 2",
    )
    watch = gr_watch(cluster, "web", "-n", namespace)
    time.sleep(1.5)
    gr_cmd(cluster, "promote", "web", "--full", "-n", namespace)
    frames, err = watch.communicate(timeout=90)
    assert watch.returncode == 0, err
    # Redrawn as the release moved. The watch polls, so a short Promoting step may fall between two
    # polls: what is certain is the waiting frame first and the Succeeded frame last.
    phases = [line.split()[1] for line in frames.splitlines() if line.startswith("Phase:")]
    assert len(phases) >= 2 and phases[0] == "Progressing" and phases[-1] == "Succeeded", phases
    assert field(frames, "Batch") == "[#####-----] 2/4"  # promoted in full from batch 2
    assert field(frames, "Versions") == "stable v2 -> target v2"

    # abort a new version, then retry it.
    apply_release(cluster, namespace, {**body, "spec": {**body["spec"], "targetVersion": "v3"}})
    wait_for(
        lambda: (
            status(cluster, namespace, "web").get("targetVersion") == "v3"
            and "waiting for approval" in status(cluster, namespace, "web").get("message", "")
        ),
        60,
        "v3 at batch 1",
    )
    aborted = gr_cmd(cluster, "abort", "web", "-n", namespace).stdout
    assert aborted.strip().startswith("greyrelease.greyrelease.io/web annotated (greyrelease.io/abort=true@"), aborted
    wait_phase(cluster, namespace, "web", {"Aborted"}, timeout=60)
    out = gr_cmd(cluster, "status", "web", "-n", namespace).stdout
    assert field(out, "Phase").startswith("Aborted") and field(out, "Weight") == "0% to the canary"
    assert "Aborted" in out.split("Events:")[1]
    gr_cmd(cluster, "retry", "web", "-n", namespace)
    wait_for(
        lambda: (
            status(cluster, namespace, "web").get("phase") == "Progressing"
            and "waiting for approval" in status(cluster, namespace, "web").get("message", "")
        ),
        60,
        "v3 retried",
    )
    left = annotations_of(cluster, namespace)
    assert "greyrelease.io/abort" not in left and "greyrelease.io/retry" not in left  # consumed by the retry
    assert "Retried" in gr_cmd(cluster, "status", "web", "-n", namespace).stdout


def test_errors_read_like_kubectl(cluster: Cluster, namespace: str, crd: Path) -> None:
    missing = gr_cmd(cluster, "status", "nope", "-n", namespace, check=False)
    assert missing.returncode == 1
    assert missing.stderr.startswith("Error from server (NotFound):") and '"nope" not found' in missing.stderr
    assert gr_cmd(cluster, "abort", "nope", "-n", namespace, check=False).returncode == 1
    usage = gr_cmd(cluster, "promote", check=False)
    assert usage.returncode == 2 and "usage: kubectl gr promote" in usage.stderr
