"""End-to-end: the controller survives crashes, an API server restart, users editing what it manages,
a slow Prometheus and objects deleted under it, and is quiet when there is nothing to do.

The quiet-when-idle window (5 minutes) starts when the module does and runs alongside the other tests
here, in namespaces of its own; the last test reads it back.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    deployment,
    drop_releases,
    events,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.process import free_port
from e2e.harness.reliability import (
    Chaos,
    SlowPrometheus,
    audited_writes,
    batch_ready_counts,
    deploy_apps,
    now,
    release_events,
    wait_no_leftovers,
)

pytestmark = pytest.mark.e2e

SERVICE = {"service": {"name": "web"}}
TERMINAL = {"Succeeded", "Failed", "Aborted", "InvalidSpec"}
V1, V2 = "registry.example/app:v1", "registry.example/app:v2"
QUIET_WINDOW = 300.0
#: The idle window's controllers look at each release again this often (``--resync-seconds``; 900 by default):
#: the window then holds two resyncs of each release, which must write nothing either. The controller
#: without leader election passes a release in full at every one of them (``--full-resync-seconds`` 60); the
#: other, with the default (3600), leaves them without a pass, nothing its releases read having changed.
QUIET_RESYNC = 120.0
QUIET_FULL_RESYNC = {"no-leader-elect": 60.0, "leader-elect": 3600.0}
#: Figures the tests report (printed at the end of the module; the README's Reliability section quotes them).
FIGURES: dict[str, Any] = {}


def local_only(cluster: Cluster, why: str) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip(f"{why} needs the local cluster started by the tests; KUBECONFIG points at another one")
    return cluster


@pytest.fixture
def ctl(cluster: Cluster, crd: Path, namespace: str, tmp_path: Path) -> Iterator[Controller]:
    """A controller without leader election, so a restarted one acts at once."""
    controller = Controller(cluster, namespace, tmp_path / "controller.log", extra_args=["--no-leader-elect"])
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()
        drop_releases(cluster, namespace)


def image_of(dep: dict[str, Any] | None) -> str:
    spec = (dep or {}).get("spec", {}).get("template", {}).get("spec", {})
    image: str = spec.get("containers", [{}])[0].get("image", "")
    return image


# --- quiet when idle: set up first, read back last ---------------------------------------------------------


@dataclass
class IdleWindow:
    started: datetime
    namespaces: dict[str, str]  # mode -> namespace
    metrics_ports: dict[str, int]  # mode -> the controller's /metrics
    passes_at_start: dict[str, float]  # mode -> passes the controller had made when the window started
    unchanged_at_start: dict[str, float]  # mode -> its resyncs without a pass by then


@pytest.fixture(scope="module", autouse=True)
def idle_window(
    cluster: Cluster, crd: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IdleWindow | None]:
    """Two namespaces, each with one Succeeded and one Paused release: one watched by a controller without
    leader election, one by a controller with it (its Lease in that namespace). The window starts once
    both have settled."""
    wanted = any(item.name == "test_quiet_when_idle" for item in request.session.items)
    if not wanted or not isinstance(cluster, LocalCluster):
        yield None
        return
    suffix = os.urandom(3).hex()
    namespaces = {"no-leader-elect": f"e2e-quiet-{suffix}", "leader-elect": f"e2e-quiet-lease-{suffix}"}
    logs = tmp_path_factory.mktemp("quiet")
    controllers = []
    ports = {mode: free_port() for mode in namespaces}
    try:
        for mode, ns in namespaces.items():
            cluster.kubectl("create", "namespace", ns)
            cluster.wait_for_namespace_ready(ns)
            # --lease-seconds 30: the API server restart of another test must not cost this one its lease.
            args = ["--no-leader-elect"] if mode == "no-leader-elect" else ["--lease-seconds", "30"]
            args += ["--resync-seconds", f"{QUIET_RESYNC:g}", "--full-resync-seconds", f"{QUIET_FULL_RESYNC[mode]:g}"]
            args += ["--metrics-port", str(ports[mode])]
            c = Controller(cluster, ns, logs / f"{mode}.log", extra_args=args)
            c.start()
            controllers.append(c)
            deploy_apps(cluster, ns, {"done": 2, "held": 2})
            apply_release(
                cluster,
                ns,
                gr(
                    "done",
                    targetRef={"name": "done"},
                    targetVersion="v2",
                    batches=[{"replicas": 1}, {"replicas": 2}],
                    trafficRouting={"service": {"name": "done"}},
                ),
            )
            apply_release(
                cluster,
                ns,
                gr(
                    "held",
                    targetRef={"name": "held"},
                    targetVersion="v2",
                    batches=[{"replicas": 1, "pause": "manual"}, {"replicas": 2}],
                    trafficRouting={"service": {"name": "held"}},
                ),
            )
            # A manual pause holds batch 1 until the pause annotation lands (a timed one could end first).

            def waiting_for_approval(ns: str = ns) -> bool:
                return status(cluster, ns, "held").get("batchState") == "WaitingForApproval"

            wait_for(waiting_for_approval, 60, "held: batch 1 live, waiting for approval")
            cluster.kubectl("annotate", "gr", "held", "-n", ns, "greyrelease.io/pause=true")
        for ns in namespaces.values():
            assert wait_phase(cluster, ns, "done", TERMINAL, timeout=60)["phase"] == "Succeeded"
            assert wait_phase(cluster, ns, "held", {"Paused"}, timeout=30)["currentBatch"] == 1
        time.sleep(3)  # the last event posts and status writes land
        yield IdleWindow(
            started=now(),
            namespaces=namespaces,
            metrics_ports=ports,
            passes_at_start={mode: passes_made(port) for mode, port in ports.items()},
            unchanged_at_start={mode: passes_made(port, UNCHANGED_METRIC) for mode, port in ports.items()},
        )
    finally:
        for c in controllers:
            c.stop()
        for ns in namespaces.values():
            drop_releases(cluster, ns)
            cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        if FIGURES:
            print("\nreliability figures: " + json.dumps(FIGURES, sort_keys=True))


PASSES_METRIC = "greyrelease_reconcile_duration_seconds_count"
UNCHANGED_METRIC = "greyrelease_passes_skipped_total"


def passes_made(metrics_port: int, metric: str = PASSES_METRIC) -> float:
    """The passes a controller has made (``greyrelease_reconcile_duration_seconds_count`` on its /metrics), or
    another count of it (``metric``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(metric + " ")]
    assert counts, f"no {metric} on the controller's /metrics"
    return counts[0]


# --- crash and resume ----------------------------------------------------------------------------------------


RELEASES = 30
IN_FLIGHT = 5
#: Kills that must land while releases are in flight. The kill schedule runs on the clock and the releases on
#: the cluster's speed, so the releases are paced by the kills: release i is applied only after
#: (i + 1) * KILLS // RELEASES kills, and the last one after KILLS. On a quick cluster the releases used to
#: finish before the schedule had killed 20 times (16 kills in one CI run).
KILLS = 20


@dataclass
class Planned:
    name: str
    replicas: int
    batches: list[dict[str, Any]]
    abort_after: float | None  # seconds after apply; the release holds at a manual batch until then

    @property
    def expected(self) -> str:
        return "Aborted" if self.abort_after is not None else "Succeeded"


def plan_release(rng: random.Random, i: int) -> Planned:
    replicas = rng.randint(2, 4)
    n = rng.randint(2, min(4, replicas))
    batches: list[dict[str, Any]] = []
    for k in range(1, n + 1):
        batch: dict[str, Any] = {"replicas": -(-k * replicas // n)}
        if k < n:
            batch["pause"] = rng.choice(["1s", "2s"])
        batches.append(batch)
    abort_after = None
    if i % 5 == 4:  # every fifth release is aborted while it waits at a manual batch
        batches[rng.randrange(n)]["pause"] = "manual"
        abort_after = rng.uniform(2.0, 12.0)
    return Planned(f"r{i:02d}", replicas, batches, abort_after)


def test_crash_and_resume_30_releases_with_random_sigkills(
    cluster: Cluster, crd: Path, namespace: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("GREYRELEASE_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"\nchaos seed {seed} (GREYRELEASE_CHAOS_SEED={seed} replays the plan and the kill schedule)")
    rng = random.Random(seed)
    plans = [plan_release(rng, i) for i in range(RELEASES)]
    deploy_apps(cluster, namespace, {p.name: p.replicas for p in plans})
    controller = Controller(cluster, namespace, tmp_path / "controller.log", extra_args=["--no-leader-elect"])
    controller.start()
    chaos = Chaos(controller, random.Random(seed + 1), up=(0.4, 2.5), down=(0.0, 0.5))
    chaos.start()
    try:
        pending = list(plans)
        running: dict[str, tuple[Planned, float]] = {}
        aborted: set[str] = set()
        phases: dict[str, str] = {}
        deadline = time.monotonic() + 420

        def paced(i: int) -> int:
            """The kills to wait for before release i is applied."""
            return (i + 1) * KILLS // RELEASES

        while pending or running:
            assert time.monotonic() < deadline, (
                f"releases still running after 420s: {sorted(running)}, {len(pending)} not applied; "
                f"{chaos.kills} kills (the next release waits for {paced(RELEASES - len(pending))})"
            )
            while pending and len(running) < IN_FLIGHT and chaos.kills >= paced(RELEASES - len(pending)):
                p = pending.pop(0)
                apply_release(
                    cluster,
                    namespace,
                    gr(
                        p.name,
                        targetRef={"name": p.name},
                        targetVersion="v2",
                        batches=p.batches,
                        trafficRouting={"service": {"name": p.name}},
                    ),
                )
                running[p.name] = (p, time.monotonic())
            items = cluster.kubectl_json("get", "gr", "-n", namespace)["items"]
            phases = {i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in items}
            for name, (p, applied) in list(running.items()):
                if p.abort_after is not None and name not in aborted and time.monotonic() - applied >= p.abort_after:
                    cluster.kubectl("annotate", "gr", name, "-n", namespace, "greyrelease.io/abort=true")
                    aborted.add(name)
                if phases.get(name) in TERMINAL and (p.abort_after is None or name in aborted):
                    del running[name]
            time.sleep(0.5)
    finally:
        chaos.stop()
    print(f"{chaos.kills} SIGKILLs (up, down seconds, counted from /readyz): {chaos.schedule}")
    print(f"seconds from each start to /readyz: {chaos.startups}")
    try:
        problems: list[str] = []
        evs = release_events(cluster, namespace)
        for p in plans:
            st = status(cluster, namespace, p.name)
            n = len(p.batches)
            if st.get("phase") != p.expected:
                problems.append(f"{p.name}: {st.get('phase')} ({st.get('message')}), expected {p.expected}")
                continue
            history = [h["batch"] for h in st.get("history") or []]
            mine = evs.get(p.name, Counter())
            ready = batch_ready_counts(mine)
            if p.expected == "Succeeded":
                if history != list(range(1, n + 1)):
                    problems.append(f"{p.name}: history batches {history}, expected 1..{n}")
                if ready != {k: 1 for k in range(1, n + 1)}:
                    problems.append(f"{p.name}: BatchReady Events per batch {ready}, expected one for each of 1..{n}")
            else:
                manual = next(k for k, b in enumerate(p.batches, 1) if b.get("pause") == "manual")
                if history != list(range(1, len(history) + 1)) or len(history) > manual:
                    problems.append(f"{p.name}: history batches {history} (manual pause at {manual})")
                if any(v != 1 for v in ready.values()) or not set(ready) <= set(history):
                    problems.append(f"{p.name}: BatchReady Events per batch {ready}, history {history}")
            twice = {k: v for k, v in mine.items() if v > 1}
            if twice:
                problems.append(f"{p.name}: Events posted more than once: {twice}")
            dep = deployment(cluster, namespace, p.name) or {}
            want_image = V2 if p.expected == "Succeeded" else V1
            if dep.get("spec", {}).get("replicas") != p.replicas or image_of(dep) != want_image:
                problems.append(
                    f"{p.name}: stable at {dep.get('spec', {}).get('replicas')} x {image_of(dep)}, "
                    f"expected {p.replicas} x {want_image}"
                )
            if deployment(cluster, namespace, f"{p.name}-canary") is not None:
                problems.append(f"{p.name}: canary Deployment left")

        def unready() -> dict[str, tuple[int, int | None, int]]:
            """The stables not ready at full size: (wanted, spec.replicas, readyReplicas)."""
            items = cluster.kubectl_json("get", "deployments", "-n", namespace)["items"]
            have = {d["metadata"]["name"]: d for d in items}
            out = {}
            for p in plans:
                d = have.get(p.name) or {}
                ready = (d.get("status") or {}).get("readyReplicas") or 0
                if ready != p.replicas:
                    out[p.name] = (p.replicas, (d.get("spec") or {}).get("replicas"), ready)
            return out

        try:
            wait_for(lambda: not unready(), 60, "every stable ready at full size", 0.5)
        except AssertionError as err:
            # Say which, and what else was wrong, so a run that fails here can be told apart from a slow cluster.
            raise AssertionError(f"{err}: {unready()}\n" + "\n".join(problems) + f"\n(seed {seed})") from None
        left = wait_no_leftovers(cluster, namespace)
        FIGURES.update(
            crash_releases=len(plans),
            crash_kills=chaos.kills,
            crash_seed=seed,
            crash_aborted=sum(p.abort_after is not None for p in plans),
            crash_leaks=len(left),
        )
        print(f"{len(plans)} releases ({FIGURES['crash_aborted']} aborted), {chaos.kills} kills, {len(left)} leftovers")
        assert not problems, "\n".join(problems) + f"\n(seed {seed})\n{controller.logs()}"
        assert not left, left
    finally:
        controller.stop()
        drop_releases(cluster, namespace)


# --- API server restart ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("down", "args"), [(1.0, []), (20.0, ["--no-leader-elect"])], ids=["short-outage-leader-elect", "long-outage"]
)
def test_api_server_restart_mid_release(
    cluster: Cluster, crd: Path, namespace: str, tmp_path: Path, down: float, args: list[str]
) -> None:
    local = local_only(cluster, "restarting the API server")
    # With leader election (the default), an outage shorter than the lease's renewal window (8 s) keeps
    # the lease; a longer one makes the controller step down and exit (its Deployment restarts it).
    controller = Controller(cluster, namespace, tmp_path / "controller.log", extra_args=args)
    controller.start()
    try:
        deploy_app(cluster, namespace, replicas=4)
        batches = [
            {"replicas": 1, "pause": "2s"},
            {"replicas": 2, "pause": "2s"},
            {"replicas": 3, "pause": "2s"},
            {"replicas": 4},
        ]
        apply_release(
            cluster,
            namespace,
            gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
        )
        wait_for(
            lambda: (
                (s := status(cluster, namespace, "web")).get("currentBatch") == 2
                and (s.get("batchTimes") or {}).get("readyAt")
            ),
            60,
            "batch 2 live",
        )
        before = status(cluster, namespace, "web")
        t_stop = time.monotonic()
        local.stop_apiserver()
        time.sleep(down)  # with the ~3 s the API server takes to start, batch 2's pause runs out meanwhile
        ready_at = local.start_apiserver()
        outage = ready_at - t_stop

        def changed() -> dict[str, Any] | None:
            st = status(cluster, namespace, "web")
            return st if st != before else None

        after = wait_for(changed, 60, "the next status change", 0.1)
        latency = time.monotonic() - ready_at
        print(
            f"API server down {outage:.1f}s; next status change {latency:.2f}s after it was ready again "
            f"({before.get('message')!r} -> {after.get('message')!r})"
        )
        FIGURES[f"apiserver_outage_{outage:.0f}s_resumed_after_s"] = round(latency, 2)
        assert latency <= 15, f"the release moved on {latency:.1f}s after the API server was back"
        assert controller.proc is not None and controller.proc.poll() is None, "the controller exited"
        # The rest also waits for the controller-manager and KWOK, whose watches reconnect with their own
        # backoff (up to a minute after a long outage).
        try:
            st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=180)
        except AssertionError:
            # Which side stood still: the release's last word, and what the API server holds of the canary
            # (the controller-manager's and KWOK's part) against what the controller logged.
            print("release:", status(cluster, namespace, "web").get("message"))
            shown = cluster.kubectl("-n", namespace, "get", "deploy,rs,pods", "-o", "wide", check=False)
            print(shown.stdout, shown.stderr)
            canary = cluster.kubectl("-n", namespace, "get", "deploy", "web-canary", "-o", "json", check=False)
            print("web-canary status:", json.loads(canary.stdout or "{}").get("status"))
            print(controller.logs()[-3000:])
            raise
        assert st["phase"] == "Succeeded", (st, controller.logs())
        assert [h["batch"] for h in st["history"]] == [1, 2, 3, 4]
        assert batch_ready_counts(release_events(cluster, namespace).get("web", {})) == {1: 1, 2: 1, 3: 1, 4: 1}
        assert wait_no_leftovers(cluster, namespace, 30) == []
    finally:
        controller.stop()
        drop_releases(cluster, namespace)


# --- a user scales the stable during a release -------------------------------------------------------------------


def test_user_scaling_the_stable_mid_release_is_reverted_once_per_transition(
    cluster: Cluster, namespace: str, ctl: Controller
) -> None:
    local = local_only(cluster, "counting the controller's writes in the audit log")
    deploy_app(cluster, namespace, replicas=6)
    started = now()
    batches = [{"replicas": 2, "pause": "5s"}, {"replicas": 4, "pause": "3s"}, {"replicas": 6}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    st = status(cluster, namespace, "web")
    assert st["restore"]["replicas"] == 6 and (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 4
    edited = now()
    cluster.kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=10")
    time.sleep(2)
    # Not fought while the batch holds: the user's size stands until the next batch transition.
    assert (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 10
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
    assert st["phase"] == "Succeeded", (st, ctl.logs())
    dep = deployment(cluster, namespace, "web") or {}
    assert dep["spec"]["replicas"] == 6 and image_of(dep) == V2  # the size recorded when the release began

    writes = [
        w
        for w in audited_writes(local, namespace=namespace, since=started)
        if w.resource == "deployments" and w.name == "web"
    ]
    assert all(w.agent.startswith("greyrelease") for w in writes), [str(w) for w in writes]
    during_hold = [w for w in writes if w.at < edited + timedelta(seconds=2)]
    sizes = [(w.at, ((w.body or {}).get("spec") or {}).get("replicas")) for w in writes]
    after_edit = [n for at, n in sizes if at > edited and n is not None]
    print(
        "controller writes to the stable's spec.replicas: before the edit "
        f"{[n for at, n in sizes if at <= edited]}, after {after_edit}"
    )
    # After the edit: batch 2 puts the stable back to batch 1's size until its canary is ready (the one
    # revert), then batch 2's size, batch 3's, and the recorded size at promotion. Nothing else, no flapping.
    assert not [w for w in during_hold if w.at > edited], [str(w) for w in during_hold]
    assert after_edit == [4, 2, 0, 6], after_edit
    transitions = 2  # batch 1 -> 2, batch 2 -> 3
    reverts = after_edit.count(4)
    assert reverts <= transitions
    FIGURES.update(scale_edit_controller_writes=len(after_edit), scale_edit_reverts=reverts)


# --- Prometheus slower than its timeout ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delay", "timeout", "expected"),
    [(3.0, "1s", "Failed"), (0.3, "2s", "Succeeded")],
    ids=["slower-than-timeout-fails", "slow-within-timeout-passes"],
)
def test_slow_prometheus_never_passes_a_batch(
    cluster: Cluster, namespace: str, ctl: Controller, delay: float, timeout: str, expected: str
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    with SlowPrometheus(delay) as prom:
        apply_release(
            cluster,
            namespace,
            gr(
                "web",
                targetRef={"name": "web"},
                targetVersion="v2",
                batches=[{"replicas": 1, "pause": "1s"}, {"replicas": 4}],
                trafficRouting=SERVICE,
                analysis={
                    "prometheus": {"address": prom.url, "timeout": timeout},
                    "interval": "1s",
                    "metrics": [
                        {
                            "name": "error-rate",
                            "query": "sum(rate(errors[1m]))",
                            "thresholdRange": {"max": 0.05},
                            "consecutiveErrorLimit": 2,
                        }
                    ],
                },
            ),
        )
        st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
        asked = prom.requests
    print(
        f"Prometheus answering after {delay}s, timeout {timeout}: {st['phase']} after {asked} queries: {st['message']}"
    )
    assert st["phase"] == expected, st
    if expected == "Failed":
        assert "query errors in a row" in st["message"] and "error-rate" in st["message"], st
        assert st["currentBatch"] == 1 and st["history"][0].get("result") != "passed", st
        assert "time" in (st["metrics"][0].get("message") or "").lower(), st["metrics"]
        dep = deployment(cluster, namespace, "web") or {}
        assert dep["spec"]["replicas"] == 4 and image_of(dep) == V1
    assert wait_no_leftovers(cluster, namespace, 30) == []


# --- deletions mid-release ----------------------------------------------------------------------------------------


def test_release_deleted_while_the_controller_is_down_is_cleaned_up_on_restart(
    cluster: Cluster, namespace: str, ctl: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    batches = [{"replicas": 2, "pause": "manual"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    ctl.kill()
    cluster.kubectl("delete", "gr", "web", "-n", namespace, "--wait=false")
    time.sleep(2)
    # The finalizer holds the release until a controller has put the app back.
    assert cluster.kubectl_json("get", "gr", "web", "-n", namespace)["metadata"].get("deletionTimestamp")
    assert (deployment(cluster, namespace, "web") or {})["spec"]["replicas"] == 2
    ctl.start()
    cluster.kubectl("wait", "--for=delete", "gr/web", "-n", namespace, "--timeout=60s")
    dep = deployment(cluster, namespace, "web") or {}
    assert dep["spec"]["replicas"] == 4 and image_of(dep) == V1
    assert cluster.kubectl_json("get", "service", "web", "-n", namespace)["spec"]["selector"] == {"app": "web"}
    assert wait_no_leftovers(cluster, namespace, 30) == []


def test_target_deleted_mid_release_fails_and_leaves_nothing(cluster: Cluster, namespace: str, ctl: Controller) -> None:
    deploy_app(cluster, namespace, replicas=4)
    # Noticed at once, even while the batch holds on a long pause: a Deployment deleted wakes its release.
    batches = [{"replicas": 2, "pause": "60s"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    cluster.kubectl("delete", "deployment", "web", "-n", namespace)
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=30)
    assert st["phase"] == "Failed" and "target Deployment 'web' is gone" in st["message"], st
    reasons = [e["reason"] for e in events(cluster, namespace, "web")]
    assert "TargetDeleted" in reasons and "RolledBack" in reasons
    assert deployment(cluster, namespace, "web-canary") is None
    assert cluster.kubectl_json("get", "service", "web", "-n", namespace)["spec"]["selector"] == {"app": "web"}
    assert wait_no_leftovers(cluster, namespace, 30) == []
    wait_for(
        lambda: not cluster.kubectl_json("get", "replicasets,pods", "-n", namespace)["items"],
        30,
        "no pods or ReplicaSets left",
    )


def test_canary_deleted_mid_release_is_recreated_and_the_release_completes(
    cluster: Cluster, namespace: str, ctl: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    pause = 4  # the deletion is noticed at once, not when this pause ends
    batches = [{"replicas": 2, "pause": f"{pause}s"}, {"replicas": 4, "pause": "1s"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    old = (deployment(cluster, namespace, "web-canary") or {})["metadata"]["uid"]
    t0 = time.monotonic()
    cluster.kubectl("delete", "deployment", "web-canary", "-n", namespace)

    def recreated() -> dict[str, Any] | None:
        dep = deployment(cluster, namespace, "web-canary")
        return dep if dep is not None and dep["metadata"]["uid"] != old else None

    dep = wait_for(recreated, 30, "the canary recreated", 0.2)
    took = time.monotonic() - t0
    st = status(cluster, namespace, "web")
    print(f"canary recreated {took:.1f}s after it was deleted, at batch {st['currentBatch']} ({st['message']})")
    # Batch 1 is grown again (2 pods), not skipped: the next batch starts only after it is live again.
    assert dep["spec"]["replicas"] == 2 and st["currentBatch"] == 1, (dep["spec"], st)
    assert took < pause, f"noticed only after {took:.1f}s"
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
    assert st["phase"] == "Succeeded", (st, ctl.logs())
    assert [h["batch"] for h in st["history"]] == [1, 2, 3]
    reasons = [e["reason"] for e in events(cluster, namespace, "web")]
    assert "CanaryLost" in reasons
    dep = deployment(cluster, namespace, "web") or {}
    assert dep["spec"]["replicas"] == 4 and image_of(dep) == V2
    assert wait_no_leftovers(cluster, namespace, 30) == []
    FIGURES.update(canary_recreated_s=round(took, 1))


# --- quiet when idle -------------------------------------------------------------------------------------------


def test_quiet_when_idle(cluster: Cluster, idle_window: IdleWindow | None) -> None:
    local = local_only(cluster, "counting writes by user agent in the audit log")
    assert idle_window is not None
    remaining = idle_window.started.timestamp() + QUIET_WINDOW - time.time()
    if remaining > 0:
        print(f"\nwaiting {remaining:.0f}s more for the {QUIET_WINDOW:.0f}s idle window")
        time.sleep(remaining)
    until = idle_window.started + timedelta(seconds=QUIET_WINDOW)
    # Each release was looked at again in the window (at least twice at one resync every 108-132 s), and
    # those looks are among what wrote nothing below: under the controller without leader election every
    # resync comes after its 60 s full resync, a full pass (a wake-up sooner than that which finds nothing
    # changed is left without one); under the other, passes only where something a release read changed
    # (the first resync after its last status write), the others without one.
    ports = idle_window.metrics_ports
    passes = {m: passes_made(p) - idle_window.passes_at_start[m] for m, p in ports.items()}
    unchanged = {m: passes_made(p, UNCHANGED_METRIC) - idle_window.unchanged_at_start[m] for m, p in ports.items()}
    print(
        f"in the window (2 releases, --resync-seconds {QUIET_RESYNC:g}): passes {passes}, "
        f"resyncs without a pass {unchanged}"
    )
    resyncs = {m: passes[m] + unchanged[m] for m in ports}
    assert all(n >= 4 for n in resyncs.values()), resyncs
    assert passes["no-leader-elect"] >= 2 and unchanged["leader-elect"] >= 2, (passes, unchanged)
    quiet, leased = idle_window.namespaces["no-leader-elect"], idle_window.namespaces["leader-elect"]
    # Whoever wrote (any client): the releases, apps and Events of these namespaces are nobody else's.
    anyone = audited_writes(local, namespace=quiet, agents=(), since=idle_window.started, until=until)
    print(f"{QUIET_WINDOW:.0f}s idle, no leader election: {len(anyone)} writes")
    assert anyone == [], "\n".join(map(str, anyone))
    lease_ns = audited_writes(local, namespace=leased, agents=(), since=idle_window.started, until=until)
    other = [w for w in lease_ns if w.resource != "leases"]
    renewals = len(lease_ns) - len(other)
    print(f"{QUIET_WINDOW:.0f}s idle, leader election: {renewals} Lease renewals, {len(other)} other writes")
    assert other == [], "\n".join(map(str, other))
    assert 0.3 * QUIET_WINDOW / 2 <= len(lease_ns) <= QUIET_WINDOW / 2 + 5, len(lease_ns)
    FIGURES.update(
        idle_window_s=QUIET_WINDOW,
        idle_writes=len(anyone),
        idle_lease_renewals=len(lease_ns),
        idle_resync_passes=resyncs,
    )
    for ns in idle_window.namespaces.values():
        assert status(cluster, ns, "done")["phase"] == "Succeeded" and status(cluster, ns, "held")["phase"] == "Paused"
