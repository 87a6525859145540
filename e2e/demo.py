"""`make demo`: releases as a GitOps user makes them, under real traffic through Traefik, on the local cluster.

The app is in a "Git" directory that an emulated Argo CD (e2e/harness/gitops.py) applies every 2 s with
selfHeal, as Argo CD applies with server-side apply (field manager ``argocd-controller``, and the ignore rules
config/gitops/argocd/application.yaml ships): Deployment web (10 pods of app:v1 that answer as themselves,
e2e/harness/responder.py), its Service web-stable, HTTPRoute web on Traefik's Gateway, and GreyRelease web in
follow mode (no ``targetVersion``: batches at 10/25/50/100 % of the traffic, gated on the canary's error
ratio from Traefik's own counters). The controller runs from a terminal with its admission webhook
(``greyrelease run --webhook-port``, e2e/harness/follow.py). A steady load (100 requests/s,
e2e/harness/load.py) goes through Traefik's Gateway, and one line per second shows the release's phase, batch
and weight, Deployment web's state (``held``: paused by the webhook; ``rolling``; ``done``) with the tag its
spec says and the tags its pods run, and what users got: the request rate, and each version's share of the
answers and error ratio. No command is typed at the cluster: every release starts from a commit.

1. A commit of the Deployment with app:v2: the webhook holds it (paused, the pods on v1), the release runs
   the batches, the promotion releases the hold and the Deployment rolls to v2: ``Succeeded``, with no
   failed request.
2. A commit with app:v3-err30 (30 % of its answers are 500s): held, its canary fails the gate at 10 % of the
   traffic and is rolled back with no human action (``Failed``). The Deployment is left held (paused: its
   spec says v3-err30, its pods run v2); ``kubectl get gr``, the Warning Event on the Deployment and
   ``kubectl describe gr`` say so. Then a revert commit to v2 ends it ``Reverted``, no pod restarted.
3. The numbers: failed requests users saw in each release, the time from the first failed canary answer to
   the last canary answer, the revert's, and Git's applies (none refused).

Exits 0 when all of that happened. Starts the local cluster, Prometheus and the data plane itself; with
`make cluster-up`'s exports (KUBECONFIG, GREYRELEASE_GATEWAY_URL, GREYRELEASE_GATEWAY,
GREYRELEASE_PROMETHEUS_URL) it uses those instead (the webhook is served on 127.0.0.1: the API server must
run on this machine).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from greyrelease.admission import HELD_ANNOTATION

from e2e.harness.controller import CRD, POLICY_CRD
from e2e.harness.controlplane import Cluster, LocalCluster, external_cluster
from e2e.harness.dataplane import DataPlane
from e2e.harness.follow import (
    Follower,
    follow_release,
    git_deployment,
    git_route,
    git_service,
    ignore_rules,
    set_up,
    wait_held,
)
from e2e.harness.gitops import ARGOCD, GitOps, file_name
from e2e.harness.load import Load, Record, first, last, summarise
from e2e.harness.observe import Reads, events_of, first_image
from e2e.harness.process import new_workdir
from e2e.harness.prometheus import PrometheusStack

NS = "greyrelease-demo"
RATE = 100.0
REPLICAS = 10
GRACE = 5  # the pods' terminationGracePeriodSeconds: a deleted pod answers until then
GOOD = "v2"
BAD = "v3-err30"  # the responders answer 30 % of this version's requests with a 500
HOST = "web.demo.example"
# Traefik names a Gateway API backend `<namespace>-<Service>-<port name>-<port>@kubernetesgateway`. The
# stable Service is `web-stable`, so the release's canary Service is `web-stable-canary`, and this pattern
# selects exactly one of them for {{track}} = stable or canary.
SERVICE = 'service=~"{{namespace}}-web-(stable-)?{{track}}-http-80@kubernetesgateway"'
ERROR_RATIO = (
    f'(sum(rate(traefik_service_requests_total{{{SERVICE},code=~"5.."}}[10s])) or vector(0))'
    f" / sum(rate(traefik_service_requests_total{{{SERVICE}}}[10s]))"
)
GATE = "error-ratio"
# Batch 1 pauses 10 s, longer than the gate takes to judge a canary (a check every second from one second
# after the batch went live): a bad canary is rolled back while it has 10 % of the traffic, before batch 2.
BATCHES = [
    {"replicas": "10%", "weight": 10, "pause": "10s"},
    {"replicas": "30%", "weight": 25, "pause": "5s"},
    {"replicas": "50%", "weight": 50, "pause": "5s"},
    {"replicas": "100%", "weight": 100, "pause": "5s"},
]


def say(text: str) -> None:
    print(f"\n\033[1m$ {text}\033[0m", flush=True)


def note(text: str) -> None:
    print(f"  --> {text}", flush=True)


def tag(image: str) -> str:
    return image.rsplit(":", 1)[-1]


@dataclass
class Stack:
    cluster: Cluster
    gateway_url: str
    gateway: str  # namespace/name
    prometheus_url: str

    @property
    def parent_ref(self) -> dict[str, str]:
        ns, name = self.gateway.split("/", 1)
        return {"namespace": ns, "name": name}


@contextmanager
def stack() -> Iterator[Stack]:
    """The running environment of `make cluster-up`, or one started (and stopped) here."""
    existing = external_cluster()
    if existing is not None:
        env = {
            k: os.environ.get(k, "")
            for k in ("GREYRELEASE_GATEWAY_URL", "GREYRELEASE_GATEWAY", "GREYRELEASE_PROMETHEUS_URL")
        }
        missing = [k for k, v in env.items() if not v]
        if missing:
            raise SystemExit(
                f"demo: KUBECONFIG reaches a cluster but {', '.join(missing)} is not set: run "
                '`eval "$(python -m e2e.cluster up --with-dataplane)"` or unset KUBECONFIG'
            )
        yield Stack(
            existing, env["GREYRELEASE_GATEWAY_URL"], env["GREYRELEASE_GATEWAY"], env["GREYRELEASE_PROMETHEUS_URL"]
        )
        return
    print("starting the local cluster, Prometheus, Traefik and the pod responders...", flush=True)
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="greyrelease-cluster-")))
    cluster.start()
    prometheus: PrometheusStack | None = None
    plane: DataPlane | None = None
    try:
        prometheus = PrometheusStack(new_workdir("greyrelease-prometheus-"))
        prometheus.start()
        plane = DataPlane(cluster, new_workdir("greyrelease-dataplane-"), prometheus)
        plane.start()
        yield Stack(cluster, plane.gateway_url, plane.gateway, prometheus.url)
    finally:
        if plane is not None:
            plane.stop()
        if prometheus is not None:
            prometheus.close()
        cluster.stop()


# --- what the demo reads -----------------------------------------------------------------------------------


def rolled_out(d: Mapping[str, Any]) -> bool:
    """Whether the Deployment controller is done with Deployment ``d``: not paused, its spec observed, every
    pod of the spec's template and available, none of an older one left."""
    st, want = d.get("status") or {}, d["spec"].get("replicas")
    return (
        not d["spec"].get("paused")
        and st.get("observedGeneration") == d["metadata"]["generation"]
        and st.get("updatedReplicas") == st.get("replicas") == st.get("availableReplicas") == want
    )


def deployment_state(reads: Reads) -> str:
    """Deployment web in a few words: ``held`` (paused by the webhook), ``rolling`` or ``done``; the tag its spec
    says; and its pods, by tag (its ReplicaSets' pods: the canary's are not its own)."""
    d = reads.deployment()
    if d is None:
        return "-"
    state = "held" if d["spec"].get("paused") else "done" if rolled_out(d) else "rolling"
    pods = Counter[str]()
    for rs in reads.replicasets():
        if n := (rs.get("status") or {}).get("replicas") or 0:
            pods[tag(first_image(rs["spec"]["template"]))] += n
    return f"{state:<8}{tag(first_image(d)):<9}pods " + ", ".join(f"{n} {t}" for t, n in sorted(pods.items()))


class TrafficView:
    """One line per second: the release's phase, batch and weight, Deployment web's state, and what users got
    in the last second."""

    def __init__(self, st: Stack, load: Load) -> None:
        self.reads = Reads(st.cluster, NS, agent="demo-view")
        self.load = load
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.time()

    def __enter__(self) -> TrafficView:
        print(
            f"{'time':>5}  {'phase':<12}{'batch':<6}{'weight':>6}  {'deployment web: state, spec, pods':<38}"
            f"{'rate':>6}        per version: share, errors",
            flush=True,
        )
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()

    def _run(self) -> None:
        tick = time.time()
        while not self.stop_event.wait(max(0.0, tick + 1 - time.time())):
            tick += 1
            try:
                status, deployment = self.reads.status(), deployment_state(self.reads)
            except Exception as exc:  # an API server slow to answer: the line says so, the next one reads again
                status, deployment = {}, f"({type(exc).__name__})"
            # The second before the last half second: requests still in flight are not in the records yet.
            s = summarise(self.load.records, tick - 1.5, tick - 0.5, asked_rate=self.load.rate)
            print(
                f"{tick - self.started:4.0f}s  {status.get('phase', '-'):<12}{status.get('batch', '-'):<6}"
                f"{status.get('canaryWeight', 0):>5}%  {deployment:<38}{s.line()}",
                flush=True,
            )


def wait_rolled(reads: Reads, version: str, timeout: float = 180) -> dict[str, Any]:
    """Deployment web once it has rolled ``version`` to every pod."""

    def done() -> dict[str, Any] | None:
        d = reads.deployment()
        return d if d is not None and tag(first_image(d)) == version and rolled_out(d) else None

    return reads.wait(done, timeout, f"deployment/web rolled to {version}", interval=0.5)


def wait_ended(reads: Reads, digest: str, timeout: float) -> dict[str, Any]:
    """The status once the release of template ``digest`` has ended: ``Succeeded``, ``Failed`` or ``Aborted``
    with that template as its ``lastRelease`` (the phase alone may still be the release before's)."""

    def ended(st: dict[str, Any]) -> bool:
        last_release = st.get("lastRelease") or {}
        return st.get("phase") in ("Succeeded", "Failed", "Aborted") and last_release.get("digest") == digest

    return reads.wait_status(ended, timeout, f"the release of template {digest[:8]} ended")


def wait_canary_gone(reads: Reads) -> None:
    reads.wait(
        lambda: reads.deployment("web-canary") is None and not reads.pods(canary=True),
        120,
        "the canary and its pods removed",
        interval=0.5,
    )
    time.sleep(GRACE + 1)  # the last canary pod's grace period: it answers until then


def app(version: str) -> dict[str, Any]:
    """Deployment web as Git has it: 10 pods of app:``version`` that answer HTTP (Ready once they do)."""
    return git_deployment(version, replicas=REPLICAS, serving=True, grace_seconds=GRACE)


def stable_pod_uids(reads: Reads) -> set[str]:
    return {p["metadata"]["uid"] for p in reads.pods(canary=False)}


# --- what a user types and sees ------------------------------------------------------------------------------


def show(cluster: Cluster, *args: str, comment: str = "", start: str = "") -> None:
    """Runs ``kubectl ARGS`` in the demo's namespace and prints it (the command without ``-n``, as with the
    namespace set in the context) and what it printed (with ``start``, from the line that begins with it)."""
    say("kubectl " + " ".join(args) + (f"   # {comment}" if comment else ""))
    out = cluster.kubectl(*args, "-n", NS, check=False)
    printed = (out.stdout or out.stderr).rstrip()
    if start and (at := printed.find("\n" + start)) >= 0:
        printed = printed[at + 1 :]
    print(printed, flush=True)


def commit(gitops: GitOps, manifest: dict[str, Any], command: str, comment: str = "") -> None:
    """A commit of ``manifest`` to the Git directory, printed as ``command`` (a git command) with the lines it
    changes; the emulated Argo CD applies it within its 2 s."""
    path = gitops.repo / file_name(manifest)
    before = path.read_text().splitlines() if path.exists() else []
    gitops.commit(manifest)
    after = path.read_text().splitlines()
    say(f"{command}   # {path.name}{'; ' + comment if comment else ''}; Argo CD applies it within 2 s")
    for line in difflib.unified_diff(before, after, lineterm="", n=0):
        if line[:1] in "+-" and not line.startswith(("+++", "---")):
            print(f"  {line}", flush=True)


# --- the demo -------------------------------------------------------------------------------------------------


def run(st: Stack) -> int:
    cluster = st.cluster
    work = Path(tempfile.mkdtemp(prefix="greyrelease-demo-"))
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/greyreleases.greyrelease.io", "--timeout=30s")
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    cluster.kubectl("create", "namespace", NS)
    cluster.wait_for_namespace_ready(NS)
    reads = Reads(cluster, NS, agent="demo-reads")

    analysis = {
        "prometheus": {"address": st.prometheus_url, "timeout": "2s"},
        "interval": "1s",
        "metrics": [{"name": GATE, "query": ERROR_RATIO, "compare": {"maxIncrease": 1.0, "floor": 0.01}}],
    }
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web-stable"}}
    release = follow_release(BATCHES, trafficRouting=routing, analysis=analysis)
    gitops = GitOps(cluster, NS, work / "git", ARGOCD, ignore=ignore_rules("web-stable"))
    for manifest in (
        app("v1"),
        git_service("web-stable"),
        git_route(HOST, "web-stable", st.parent_ref),
        release,
    ):
        gitops.commit(manifest)
    say(
        "ls git/   # the app as Git declares it: Deployment web (10 pods of app:v1, answering HTTP), Service "
        f"web-stable, HTTPRoute web ({HOST}) on the Gateway {st.gateway}, GreyRelease web"
    )
    print("\n".join(sorted(p.name for p in gitops.repo.glob("*.yaml"))), flush=True)
    say("cat git/greyrelease-web.yaml   # follow mode: no targetVersion; every new template is released")
    print((gitops.repo / file_name(release)).read_text().rstrip(), flush=True)

    follower = Follower(cluster, NS, work / "controller.log")
    say(f"greyrelease run --namespace {NS} --webhook-port {follower.port} &   # with its admission webhook")
    took = follower.start()
    note(f"ready, webhook registered in {took:.1f}s")
    say(
        "Argo CD (emulated): kubectl apply --server-side --field-manager=argocd-controller -f git/, every 2 s "
        "(selfHeal)"
    )
    load = Load(st.gateway_url, RATE, host=HOST)
    ok = False
    bad_end: dict[str, Any] = {}
    try:
        set_up(cluster, NS, gitops, reads)
        note(f"synced: deployment/web {deployment_state(reads)}; GreyRelease web {reads.status().get('phase')}")
        with Load(st.gateway_url, 20, host=HOST, timeout=2) as probe:
            deadline = time.monotonic() + 60
            while not any(r.status == 200 for r in probe.records) and time.monotonic() < deadline:
                time.sleep(0.2)
        with gitops.self_heal():
            say(f"load: {RATE:g} requests/s to {st.gateway_url} (Host: {HOST}), each answer's pod and image recorded")
            load.start()
            time.sleep(2)

            # 1. The good release.
            v1_uids = stable_pod_uids(reads)
            t0 = time.time()
            with TrafficView(st, load):
                commit(gitops, app(GOOD), "git commit -am 'app: v2'")
                digest = wait_held(reads, GOOD)["metadata"]["annotations"][HELD_ANNOTATION]
                note(
                    f"deployment/web held by the webhook {time.time() - t0:.1f}s after the commit: paused, "
                    f"template {digest[:8]} ({GOOD}); pods on v1"
                )
                good_end = wait_ended(reads, digest, 300)
                note(f"GreyRelease web {good_end['phase']}: {good_end.get('message', '')}")
                wait_rolled(reads, GOOD)
                note(f"deployment/web rolled to {GOOD} by its own controller {time.time() - t0:.1f}s after the commit")
                wait_canary_gone(reads)
            t1 = time.time()
            good = summarise(load.records, t0, t1, asked_rate=RATE)
            replaced = not (stable_pod_uids(reads) & v1_uids)
            show(cluster, "get", "gr", "web", "-o", "wide")
            show(cluster, "get", "deployment", "web", "-o", "wide")
            print(
                f"\nrelease {GOOD}: {good_end['phase']}. {good.sent} requests during the release "
                f"({good.rate:.1f}/s), {len(good.failed)} failed; answered by {good.answered_by_image}",
                flush=True,
            )

            # 2. The bad release, rolled back by its gate; then reverted in Git.
            v2_uids = stable_pod_uids(reads)
            t2 = time.time()
            with TrafficView(st, load):
                commit(gitops, app(BAD), "git commit -am 'app: v3-err30'", "a bad version: 30% of its answers are 500s")
                digest = wait_held(reads, BAD)["metadata"]["annotations"][HELD_ANNOTATION]
                note(
                    f"deployment/web held by the webhook {time.time() - t2:.1f}s after the commit: paused, "
                    f"template {digest[:8]} ({BAD}); pods on {GOOD}"
                )
                bad_end = wait_ended(reads, digest, 240)
                note(f"GreyRelease web {bad_end['phase']} {time.time() - t2:.1f}s after the commit, by itself")
                wait_canary_gone(reads)
            t3 = time.time()
            d = reads.deployment() or {}
            left_held = bool(d.get("spec", {}).get("paused")) and tag(first_image(d)) == BAD
            kept = stable_pod_uids(reads) == v2_uids
            show(cluster, "get", "gr", "web", "-o", "wide")
            show(
                cluster,
                "get",
                "deployment",
                "web",
                "-o",
                "custom-columns=NAME:.metadata.name,PAUSED:.spec.paused,SPEC IMAGE:.spec.template.spec.containers[0]"
                ".image,READY:.status.readyReplicas",
                comment="held: its spec says v3-err30",
            )
            show(cluster, "get", "replicasets", "-l", "app=web", "-o", "wide", comment="its pods run v2")
            reads.wait(
                lambda: events_of(cluster, NS, "Deployment", "web", reason="ReleaseFailed"),
                30,
                "the ReleaseFailed Event on deployment/web",
                interval=1.0,
            )
            show(
                cluster,
                "get",
                "events",
                "--field-selector",
                "involvedObject.kind=Deployment,involvedObject.name=web,type=Warning",
                comment="what whoever looks at the Deployment first sees",
            )
            show(cluster, "describe", "gr", "web", comment="the story, in Events", start="Events:")

            t4 = time.time()
            with TrafficView(st, load):
                commit(gitops, app(GOOD), "git revert --no-edit HEAD", "back to v2")
                reverted = reads.wait_status(
                    lambda s: s.get("phase") == "Idle" and (s.get("lastRelease") or {}).get("outcome") == "Reverted",
                    60,
                    "Idle (Reverted) after the revert",
                )
                reverted_after = time.time() - t4
                note(f"GreyRelease web Idle, lastRelease {reverted['lastRelease']['outcome']}")
                wait_rolled(reads, GOOD, timeout=60)
                time.sleep(3)  # what the Deployment controller would do with the revert has been done
            same_pods = stable_pod_uids(reads) == v2_uids
            show(cluster, "get", "gr", "web", "-o", "wide")
            show(cluster, "get", "deployment", "web", "-o", "wide")
        records = load.stop()
        refused = gitops.refused()

        canary_image = f"registry.example/app:{BAD}"
        canary = [r for r in records if t2 <= r.sent < t3 and r.image == canary_image]
        first_failed: Record | None = first(canary, lambda r: r.failed)
        last_answer: Record | None = last(canary, lambda r: True)
        bad = summarise(records, t2, t3, asked_rate=RATE)
        by_gate = bad_end.get("phase") == "Failed" and GATE in str(bad_end.get("message", ""))
        found = re.search(r"batch (\d+)/\d+", str(bad_end.get("message", "")))
        at = f" at batch {found[1]} ({BATCHES[int(found[1]) - 1]['weight']} % of the traffic)" if found else ""
        say("the numbers")
        print(
            f"release {GOOD}: {good_end['phase']}, {len(good.failed)} failed requests of {good.sent} "
            f"({good.rate:.1f} requests/s); held, released in {len(BATCHES)} batches, rolled by the Deployment "
            f"controller ({'every pod replaced' if replaced else 'pods of v1 LEFT'})"
        )
        print(
            f"release {BAD}: {bad_end.get('phase')}{' by its gate' if by_gate else ''}{at}, with no human action; "
            f"the Deployment left {'held' if left_held else 'NOT held'} ({BAD} in its spec, its pods "
            f"{'still' if kept else 'NOT'} the {GOOD} ones)"
        )
        print(f"failed requests users saw: {len(bad.failed)} of {bad.sent} ({bad.rate:.1f} requests/s)")
        if first_failed is not None and last_answer is not None:
            print(
                f"time to cut: {last_answer.sent - first_failed.sent:.2f} s from the first failed canary answer to "
                f"the last canary answer ({len(canary)} canary answers in all)"
            )
        print(
            f"revert to {GOOD} in Git: {reverted['phase']} ({reverted['lastRelease']['outcome']}) "
            f"{reverted_after:.1f}s after the commit, {'no pod restarted' if same_pods else 'pods RESTARTED'}"
        )
        print(f"Git: {len(gitops.applies)} applies by argocd-controller, {len(refused)} refused")
        ok = (
            good_end["phase"] == "Succeeded"
            and not good.failed
            and replaced
            and by_gate
            and first_failed is not None
            and left_held
            and kept
            and same_pods
            and not refused
        )
    finally:
        with contextlib.suppress(RuntimeError):  # a load that failed has said so already
            load.stop()
        follower.stop(log=False)
        if not ok:
            print(f"--- controller log (last lines) ---\n{follower.controller.logs()}", flush=True)
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def main() -> int:
    with stack() as st:
        return run(st)


if __name__ == "__main__":
    sys.exit(main())
