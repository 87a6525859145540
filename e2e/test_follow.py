"""End-to-end: follow mode on the local cluster, with kubectl as the client and the controller run from a
terminal with its admission webhook (``greyrelease run --webhook-port``).

The app is in a "Git" directory applied by the GitOps emulator (e2e/harness/gitops.py) in a self-heal loop
every two seconds, with the ignore rules config/gitops/argocd/application.yaml ships (the stable Service's
``pod-template-hash`` selector key, the HTTPRoute's rules): a Deployment without ``spec.paused``, its Service,
an HTTPRoute on the Traefik Gateway and a GreyRelease without ``targetVersion``. A commit of a new template
is what starts a release. Real requests go through Traefik at a fixed rate (e2e/harness/load.py), each
recorded with the image that answered; the controller's writes are read back from the API server's audit
log by its user agent (e2e/harness/reliability.py); the HPA's writes are emulated under its own account
(e2e/harness/hpa.py).

- a whole release of a commit under load, applied as Argo CD and as Flux apply (server-side): held,
  batches, no drift, promotion as the hold released, the native rollout with the canary keeping its traffic,
  the Deployment equal to Git afterwards, and the controller's writes to the Deployment (only its label and
  the hold's release);
- the same under Argo CD's client-side apply, with the traffic split by replicas (Service mode), so that the
  release writes no field Git declares: no ignore rule, the route in Git and never written by the release;
- an HPA resizing the stable mid-batch, then during the promotion while the Deployment controller rolls the
  template: the canary follows, nothing writes the stable's replicas back;
- a bad template rolled back by a gate on the proxy's error rate (``Failed``, as a gate ends a release): the
  Deployment left held, ``Stalled``, no drift; then a revert in Git ends it ``Reverted`` without restarting a
  pod;
- ten aborts by annotation mid-release under load: the cut, from the annotation to the last canary answer.

Of the figures, only these are asserted: no failed request (but the bad canary's own), no v1 answer once v2
had all the traffic, the load's rate, and the p99 of the cuts within 1 s; the rest is printed (``-s`` shows
it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from greyrelease.admission import HELD_ANNOTATION, template_digest
from greyrelease.api.release import TRACK_LABEL
from greyrelease.kube.client import KubeClient, load_configuration

from e2e.harness.controller import gr, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.follow import Follower, check_deployment_writes, git_route, git_service, ignore_rules, webhook_answers
from e2e.harness.gitops import ARGOCD, ARGOCD_CLIENT_SIDE, FLUX, GitOps, Tool, audited_requests
from e2e.harness.hpa import HPA, HPA_FIELD_MANAGER
from e2e.harness.load import Load, Record, last, percentile, summarise
from e2e.harness.prometheus import PrometheusStack
from e2e.harness.reliability import CONTROLLER_AGENTS, audited_writes, wait_no_leftovers

pytestmark = pytest.mark.e2e

T = TypeVar("T")

RATE = 100.0  # requests/s through Traefik
IMAGE = "registry.example/app"
V1 = f"{IMAGE}:v1"
GRACE_SECONDS = 5  # the pods' terminationGracePeriodSeconds: how long a deleted pod keeps answering
ABORTS = 10
ABORT_LIMIT = 1.0  # seconds, p99 of the cut (the slowest of 10)
CANARY = "greyrelease.io/track=canary"


def image(tag: str) -> str:
    return f"{IMAGE}:{tag}"


# --- watching, in this process (a kubectl started every few tenths of a second would take the CPU) --------


class Watch:
    """A list and watch of one collection, kept in memory: the objects by name, and every change with the
    time it arrived."""

    def __init__(self, cluster: Cluster, path: str) -> None:
        self.client = KubeClient(load_configuration(str(cluster.kubeconfig)), connections=2)
        self.client.user_agent = "e2e-follow-watch"  # not the controller's: the audit log tells them apart
        self.path = path
        self.objects: dict[str, dict[str, Any]] = {}
        self.changes: list[tuple[float, str, dict[str, Any]]] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        with self._cond:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.objects.pop(name, None)
            else:
                self.objects[name] = obj
            self.changes.append((time.time(), kind, obj))
            self._cond.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = self.client.request("GET", self.path)
                rv = listed["metadata"]["resourceVersion"]
                with self._cond:
                    self.objects = {o["metadata"]["name"]: o for o in listed.get("items") or []}
                self._listed.set()
                while not self._stop.is_set():
                    for event in self.client.watch(self.path, resource_version=rv, timeout_seconds=30):
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "ERROR":
                            raise RuntimeError(f"watch of {self.path}: {obj}")
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            self._record(str(kind), obj)
                        if self._stop.is_set():
                            return
            except Exception:  # an expired resourceVersion, a broken stream: list again
                time.sleep(0.2)

    def start(self) -> Watch:
        self._thread.start()
        self._listed.wait(30)
        return self

    def stop(self) -> None:
        self._stop.set()

    def get(self, name: str) -> dict[str, Any] | None:
        with self._cond:
            return self.objects.get(name)

    def values(self) -> list[dict[str, Any]]:
        with self._cond:
            return list(self.objects.values())

    def wait(self, predicate: Callable[[], T | None], timeout: float, what: str) -> T:
        """The first true value of ``predicate``, asked at once and after every change, for ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = predicate()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
                self._cond.wait(min(left, 1.0))


class Scene:
    """The namespace as the tests look at it: watches of the GreyRelease, the Deployments, the pods, the
    ReplicaSets and the HTTPRoutes."""

    def __init__(self, cluster: Cluster, namespace: str, *, routes: bool = True) -> None:
        ns = namespace
        self.releases = Watch(cluster, f"/apis/greyrelease.io/v1/namespaces/{ns}/greyreleases").start()
        self.deployments = Watch(cluster, f"/apis/apps/v1/namespaces/{ns}/deployments").start()
        self.replicasets = Watch(cluster, f"/apis/apps/v1/namespaces/{ns}/replicasets").start()
        self.pods = Watch(cluster, f"/api/v1/namespaces/{ns}/pods").start()
        self.routes = (
            Watch(cluster, f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes").start() if routes else None
        )

    def stop(self) -> None:
        for w in (self.releases, self.deployments, self.replicasets, self.pods, self.routes):
            if w is not None:
                w.stop()

    def status(self, name: str = "web") -> dict[str, Any]:
        gr_obj = self.releases.get(name) or {}
        return dict(gr_obj.get("status") or {})

    def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = self.status()
            return st if st and predicate(st) else None

        try:
            return self.releases.wait(check, timeout, what)
        except AssertionError as exc:
            st = self.status()
            raise AssertionError(f"{exc}; status: phase {st.get('phase')}: {st.get('message')}") from None

    def wait_phase(self, phases: set[str], timeout: float) -> dict[str, Any]:
        return self.wait_status(lambda st: st.get("phase") in phases, timeout, f"GreyRelease web in {phases}")

    def deployment(self, name: str = "web") -> dict[str, Any]:
        found = self.deployments.get(name)
        assert found is not None, f"no Deployment {name}"
        return found

    def app_pods(self, *, canary: bool = False) -> list[dict[str, Any]]:
        """The app's pods not being deleted, stable or canary."""
        return [
            p
            for p in self.pods.values()
            if not p["metadata"].get("deletionTimestamp")
            and (TRACK_LABEL in (p["metadata"].get("labels") or {})) == canary
        ]

    def stable_replicasets(self) -> list[dict[str, Any]]:
        return [r for r in self.replicasets.values() if TRACK_LABEL not in (r["metadata"].get("labels") or {})]


def first_image(obj: dict[str, Any]) -> str:
    spec = obj["spec"]
    pod_spec = spec["template"]["spec"] if "template" in spec else spec
    return str(pod_spec["containers"][0]["image"])


def condition(st: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in st.get("conditions") or [] if c["type"] == kind), "")


def canary_weight(route: dict[str, Any] | None, stable: str) -> int | None:
    """The canary backendRef's weight in the route's rule for ``stable`` (None without one)."""
    for rule in (route or {}).get("spec", {}).get("rules") or []:
        refs = {r["name"]: int(r.get("weight", 1)) for r in rule.get("backendRefs") or []}
        if stable in refs:
            return refs.get(f"{stable}-canary")
    return None


def since_when(changes: list[tuple[float, str, dict[str, Any]]], predicate: Callable[[dict[str, Any]], bool]) -> float:
    """When a change first made ``predicate`` true of the object (0 if never)."""
    return next((t for t, kind, obj in changes if kind != "DELETED" and predicate(obj)), 0.0)


# --- the app in Git -------------------------------------------------------------------------------------


def git_deployment(tag: str, *, replicas: int | None, serving: bool = True) -> dict[str, Any]:
    """Deployment web of pods that answer (Ready only once they do; without ``serving``, Ready at once, for a
    test without the data plane); no spec.paused; no replicas when an HPA owns them. The enrolment label is
    left to the controller: its write is one of the two it may make."""
    d: dict[str, Any] = answering_app("web", replicas or 1, image(tag), grace_seconds=GRACE_SECONDS)["items"][0]
    if replicas is None:
        del d["spec"]["replicas"]
    if not serving:
        del d["spec"]["template"]["spec"]["readinessGates"]
    return d


def slow_rollout(d: dict[str, Any], seconds: int = 3) -> dict[str, Any]:
    """The Deployment rolled one pod at a time, each new pod available ``seconds`` after it is ready: a rollout
    of a few pods lasts long enough to act during it."""
    d["spec"]["minReadySeconds"] = seconds
    d["spec"]["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return d


# --- setting up ----------------------------------------------------------------------------------------------


def set_up(
    cluster: Cluster,
    namespace: str,
    gitops: GitOps,
    scene: Scene,
    *,
    replicas: int,
    host: str | None,
    load: DataPlane | None,
) -> None:
    """The first sync; then the app rolled out, the release Idle (the Deployment enrolled), the webhook
    answering for it, and (with a data plane) Traefik answering from every pod."""
    first = gitops.apply()
    assert first.ok, first
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    scene.wait_phase({"Idle"}, 60)
    wait_for(lambda: webhook_answers(cluster, namespace), 30, "the webhook holding a template of deployment/web")
    if load is None or host is None:
        return

    def all_answer() -> bool:
        with Load(load.gateway_url, 50, host=host, timeout=2) as probe:
            time.sleep(0.5)
        s = probe.summary()
        return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == replicas

    wait_for(all_answer, 60, f"Traefik answering for {host} from {replicas} pods", interval=0.2)


def assert_held(scene: Scene, tag: str, *, stable_uids: set[str] | None = None) -> dict[str, Any]:
    """The Deployment as the webhook leaves a new template: paused, the annotation the digest of the template
    it holds (``tag``), observed by its controller with no new ReplicaSet, the pods on the old one."""

    def observed() -> dict[str, Any] | None:
        d = scene.deployment()
        seen = d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"]
        return d if seen and first_image(d) == image(tag) else None

    d = scene.deployments.wait(observed, 30, f"deployment/web with {tag}, observed")
    assert d["spec"].get("paused") is True, d["spec"]
    assert d["metadata"]["annotations"][HELD_ANNOTATION] == template_digest(d["spec"]["template"])
    sets = scene.stable_replicasets()
    assert len([r for r in sets if r["spec"].get("replicas")]) == 1, [r["metadata"]["name"] for r in sets]
    assert all(first_image(r["spec"]["template"]) != image(tag) for r in sets), "a ReplicaSet of the held template"
    if stable_uids is not None:
        assert {p["metadata"]["uid"] for p in scene.app_pods()} == stable_uids
    return d


def pod_uids(scene: Scene) -> set[str]:
    return {p["metadata"]["uid"] for p in scene.app_pods()}


def assert_equal_to_git(cluster: Cluster, namespace: str, gitops: GitOps) -> None:
    """Every object of the repository but the GreyRelease has the spec (and labels) that the tool's apply
    of Git would give it, ignore rules left out: the release left nothing of its own."""
    plain = GitOps(cluster, namespace, gitops.repo, gitops.tool)
    for obj in plain.dry_run_apply():
        if obj["kind"] == "GreyRelease":
            continue
        name = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        live = json.loads(cluster.kubectl("get", name, "-n", namespace, "-o", "json").stdout)
        assert live["spec"] == obj["spec"], f"{name} differs from Git: {live['spec']} != {obj['spec']}"
        assert live["metadata"].get("labels") == obj["metadata"].get("labels"), name


# --- the audit log -----------------------------------------------------------------------------------------


# --- the load --------------------------------------------------------------------------------------------


def no_old_answer_after_all_new(records: list[Record], old: str, after: float) -> tuple[float | None, list[Record]]:
    """When the new version first had all the traffic (the first whole second after ``after`` in which no
    answer came from ``old``), and the answers from ``old`` after that."""
    answered = sorted((r for r in records if r.image and r.sent >= after), key=lambda r: r.sent)
    start: float | None = None
    since: float | None = None
    for r in answered:
        if r.image == old:
            start = None
            continue
        start = r.sent if start is None else start
        if r.sent - start >= 1.0:
            since = start
            break
    if since is None:
        return None, []
    return since, [r for r in answered if r.image == old and r.sent >= since]


def describe(records: list[Record], t0: float) -> str:
    return "\n".join(
        f"  {r.sent - t0:8.3f}s status {r.status} image {r.image} pod {r.pod} error {r.error}" for r in records[:15]
    )


# --- 1 and 2: a whole release under GitOps and load; the audit log ------------------------------------------

BATCHES = [
    {"replicas": "10%", "weight": 10, "pause": "5s"},
    {"replicas": "25%", "weight": 25, "pause": "5s"},
    {"replicas": "50%", "weight": 50, "pause": "5s"},
    {"replicas": "100%", "weight": 100, "pause": "5s"},
]


def follow_release(routing: dict[str, Any] | None, batches: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {"trafficRouting": routing} if routing else {}
    return gr("web", targetRef={"name": "web"}, batches=batches, progressDeadlineSeconds=180, **extra, **spec)


# Server-side apply as Argo CD and as Flux, with the route's rules under ignore rules. Argo CD's client-side apply
# is the next test: kubectl's three-way merge cannot be made conditional on the resourceVersion the ignored
# fields were read at (it would be kept in the last-applied annotation), so an apply every two seconds of a
# route whose rules the release writes can put back rules it read just before the release wrote new ones, and
# did: a run ended with the route's rules as they were just before the reset. Its users keep the traffic split
# out of what Git declares.
TOOLS = [ARGOCD, FLUX]


@pytest.mark.parametrize("tool", TOOLS, ids=[t.name for t in TOOLS])
def test_a_commit_is_released_in_batches_under_gitops_and_load(
    local_cluster: LocalCluster,
    dataplane: DataPlane,
    namespace: str,
    follower: Follower,
    tmp_path: Path,
    tool: Tool,
) -> None:
    cluster, replicas = local_cluster, 4
    host = f"web.{namespace}.example"
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
    gitops = GitOps(cluster, namespace, tmp_path / "repo", tool, ignore=ignore_rules("web"))
    gitops.commit(git_deployment("v1", replicas=replicas))
    gitops.commit(git_service("web"))
    gitops.commit(git_route(host, "web", dataplane.parent_ref))
    gitops.commit(follow_release(routing, BATCHES))
    since = datetime.now(UTC)
    scene = Scene(cluster, namespace)
    try:
        set_up(cluster, namespace, gitops, scene, replicas=replicas, host=host, load=dataplane)
        v1_uids = pod_uids(scene)
        batches: list[dict[str, Any]] = []
        drifts: list[float] = []
        with gitops.self_heal(), Load(dataplane.gateway_url, RATE, host=host) as load:
            time.sleep(2)
            committed = time.time()
            gitops.commit(git_deployment("v2", replicas=replicas))
            held = assert_held(scene, "v2", stable_uids=v1_uids)
            held_after = time.time() - committed
            digest = held["metadata"]["annotations"][HELD_ANNOTATION]
            for k in range(1, len(BATCHES) + 1):

                def live_or_past(st: dict[str, Any], k: int = k) -> bool:
                    live = st.get("currentBatch") == k and bool((st.get("batchTimes") or {}).get("readyAt"))
                    return live or st.get("phase") in ("Promoting", "Succeeded", "Failed", "Aborted")

                st = scene.wait_status(live_or_past, 120, f"batch {k} live")
                assert st.get("currentBatch") == k and st.get("phase") == "Progressing", st
                seen_at = time.time()
                drift = gitops.drift()
                assert drift.in_sync, f"batch {k}: drift\n{drift.diff}"
                drifts.append(drift.seconds)
                canary = scene.deployment("web-canary")
                d = scene.deployment()
                assert d["spec"].get("paused") is True and d["metadata"]["annotations"][HELD_ANNOTATION] == digest
                assert first_image(canary) == image("v2"), first_image(canary)
                step = BATCHES[k - 1]
                share = int(str(step["replicas"]).rstrip("%")) / 100
                assert canary["spec"]["replicas"] == math.ceil(share * replicas), (k, canary["spec"]["replicas"])
                assert d["spec"]["replicas"] == replicas and st.get("canaryWeight") == step["weight"], (k, st)
                routes = scene.routes
                assert routes is not None

                def at_weight(w: object = step["weight"], watch: Watch = routes) -> bool:
                    return canary_weight(watch.get("web"), "web") == w

                routes.wait(at_weight, 10, f"the route at weight {step['weight']}")
                batches.append(
                    {
                        "batch": k,
                        "at": seen_at - committed,
                        "canary": canary["spec"]["replicas"],
                        "weight": st.get("canaryWeight"),
                        "stable": d["spec"]["replicas"],
                        "route": canary_weight(routes.get("web"), "web"),
                    }
                )
            scene.wait_phase({"Succeeded"}, 180)
            succeeded = time.time()
            scene.deployments.wait(lambda: scene.deployments.get("web-canary") is None, 60, "the canary deleted")
            wait_for(lambda: not scene.app_pods(canary=True), 60, "no canary pod left")
            time.sleep(GRACE_SECONDS + 2)  # the last canary pod has stopped answering; the stable alone serves
        records = load.records
    finally:
        scene.stop()

    # The end: Succeeded, the Deployment rolled, not held, equal to Git; the canary gone.
    st = scene.status()
    assert st["phase"] == "Succeeded" and st["lastRelease"]["outcome"] == "Succeeded", st
    assert st["lastRelease"]["digest"] == digest
    assert (condition(st, "Ready"), condition(st, "Stalled")) == ("True", "False"), st.get("conditions")
    d = json.loads(cluster.kubectl("get", "deployment", "web", "-n", namespace, "-o", "json").stdout)
    assert "paused" not in d["spec"] and HELD_ANNOTATION not in (d["metadata"].get("annotations") or {}), d["spec"]
    assert first_image(d) == image("v2") and d["status"].get("updatedReplicas") == replicas
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=web", "-o", "json").stdout)["items"]
    live_pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert {first_image(p) for p in live_pods} == {image("v2")} and len(live_pods) == replicas
    final_drift = gitops.drift()
    assert final_drift.in_sync, final_drift.diff
    assert_equal_to_git(cluster, namespace, gitops)
    assert wait_no_leftovers(cluster, namespace) == []
    assert not gitops.refused(), [str(a) for a in gitops.refused()]

    # The traffic.
    s = summarise(records, committed - 2, records[-1].sent, asked_rate=RATE)
    t100 = since_when(scene.routes.changes if scene.routes else [], lambda r: canary_weight(r, "web") == 100)
    assert t100, "the route never gave the canary 100 %"
    all_v2, late = no_old_answer_after_all_new(records, V1, t100)
    last_v1 = last(records, lambda r: r.image == V1)
    after_100 = [c for c in scene.deployments.changes if c[0] > t100 and c[2]["metadata"]["name"] == "web"]
    released = since_when(after_100, lambda o: "paused" not in o["spec"])
    rolled = since_when(
        after_100,
        lambda o: (
            "paused" not in o["spec"]
            and o["status"].get("updatedReplicas") == replicas
            and o["status"].get("replicas") == replicas
            and o["status"].get("availableReplicas") == replicas
        ),
    )
    reset = since_when(
        [c for c in scene.routes.changes if c[0] > t100] if scene.routes else [],
        lambda r: canary_weight(r, "web") is None,
    )
    applies = [a for a in gitops.applies if a.at >= datetime.fromtimestamp(committed, UTC)]
    audit = check_deployment_writes(cluster, namespace, since, {digest})
    print(
        f"\n{tool.name}: template {digest} (v2) held {held_after:.2f}s after the commit; "
        f"Succeeded {succeeded - committed:.1f}s after it"
    )
    for b in batches:
        print(
            f"  batch {b['batch']} live at {b['at']:6.1f}s: canary {b['canary']} pods beside {b['stable']}, "
            f"weight {b['weight']}% (route: canary {b['route']})"
        )
    print(
        f"  route at 100 % {t100 - committed:.1f}s, hold released {released - committed:.1f}s, native rollout "
        f"done {rolled - committed:.1f}s, route reset {reset - committed:.1f}s after the commit; last v1 answer "
        f"{(last_v1.sent - t100) if last_v1 else 0:+.2f}s "
        f"from the route at 100 %; v2 alone from {(all_v2 or 0) - t100:+.2f}s; v1 answers after that: {len(late)}"
    )
    print(
        f"  load: {s.sent} requests at {s.rate:.1f}/s, {len(s.failed)} failed, answered by "
        f"{dict(s.answered_by_image)}; latency p50 {s.latency_p50 * 1000:.1f} ms, p99 {s.latency_p99 * 1000:.1f} ms"
    )
    print(
        f"  GitOps: {len(applies)} applies since the commit, none refused, "
        f"{sum(a.conflicts for a in applies)} made again after a write in between; kubectl diff in sync at every "
        f"batch ({min(drifts):.2f}-{max(drifts):.2f}s) and at the end"
    )
    print(f"  {audit}")
    assert s.failed == [], f"{len(s.failed)} failed requests:\n{describe(s.failed, committed)}"
    assert all_v2 is not None and not late, f"v1 answered after v2 had all the traffic:\n{describe(late, committed)}"
    assert s.rate_kept(0.05), f"the load kept {s.rate:.1f} req/s"


# --- 1b: Argo CD's client-side apply, the traffic split by replicas ----------------------------------------------

# The pods' share in Service mode: ceil(share x 4) canary pods beside the stable's 4 (canary / (stable + canary)).
SHARE_BATCHES = [
    {"replicas": "25%", "pause": "3s"},
    {"replicas": "50%", "pause": "3s"},
    {"replicas": "100%", "pause": "3s"},
]


def test_a_commit_is_released_under_client_side_apply_with_the_traffic_split_by_replicas(
    local_cluster: LocalCluster, dataplane: DataPlane, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    """Argo CD's default sync, a client-side ``kubectl apply`` (three-way merge with the last-applied
    annotation), every two seconds. Git holds the Deployment, its Service, an HTTPRoute to that Service and the
    GreyRelease, and no ignore rule: the release splits the traffic by replicas (Service mode), so it writes no
    field Git declares: nothing of the route, and of the Service only a selector key on a rollback, which a
    client-side apply leaves alone (it removes only what its last-applied annotation lists)."""
    cluster, replicas = local_cluster, 4
    host = f"web.{namespace}.example"
    gitops = GitOps(cluster, namespace, tmp_path / "repo", ARGOCD_CLIENT_SIDE)
    gitops.commit(git_deployment("v1", replicas=replicas))
    gitops.commit(git_service("web"))
    gitops.commit(git_route(host, "web", dataplane.parent_ref))
    gitops.commit(follow_release({"service": {"name": "web"}}, SHARE_BATCHES))
    since = datetime.now(UTC)
    scene = Scene(cluster, namespace)
    batches: list[tuple[int, float, int, int, int]] = []  # batch, seconds after the commit, canary, stable, weight
    drifts: list[float] = []
    try:
        set_up(cluster, namespace, gitops, scene, replicas=replicas, host=host, load=dataplane)
        route_before = scene.routes.get("web") if scene.routes else None
        assert route_before is not None
        with gitops.self_heal(), Load(dataplane.gateway_url, RATE, host=host) as load:
            time.sleep(2)
            committed = time.time()
            gitops.commit(git_deployment("v2", replicas=replicas))
            digest = assert_held(scene, "v2")["metadata"]["annotations"][HELD_ANNOTATION]
            for k, step in enumerate(SHARE_BATCHES, start=1):

                def live_or_past(st: dict[str, Any], k: int = k) -> bool:
                    live = st.get("currentBatch") == k and bool((st.get("batchTimes") or {}).get("readyAt"))
                    return live or st.get("phase") in ("Promoting", "Succeeded", "Failed", "Aborted")

                st = scene.wait_status(live_or_past, 120, f"batch {k} live")
                assert st.get("currentBatch") == k and st.get("phase") == "Progressing", st
                drift = gitops.drift()
                assert drift.in_sync, f"batch {k}: drift\n{drift.diff}"
                drifts.append(drift.seconds)
                want = math.ceil(int(str(step["replicas"]).rstrip("%")) / 100 * replicas)
                canary, d = scene.deployment("web-canary"), scene.deployment()
                assert canary["spec"]["replicas"] == want and d["spec"]["replicas"] == replicas, (k, st)
                assert d["spec"].get("paused") is True and st.get("canaryWeight") == round(
                    100 * want / (want + replicas)
                )
                batches.append((k, time.time() - committed, want, replicas, int(st["canaryWeight"])))
            scene.wait_phase({"Succeeded"}, 180)
            succeeded = time.time()
            scene.deployments.wait(lambda: scene.deployments.get("web-canary") is None, 60, "the canary deleted")
            wait_for(lambda: not scene.app_pods(canary=True), 60, "no canary pod left")
            time.sleep(GRACE_SECONDS + 2)  # the last canary pod has stopped answering
        records = load.records
    finally:
        scene.stop()

    st = scene.status()
    assert st["phase"] == "Succeeded" and st["lastRelease"]["digest"] == digest, st
    final_drift = gitops.drift()
    assert final_drift.in_sync, final_drift.diff
    assert_equal_to_git(cluster, namespace, gitops)
    assert not gitops.refused(), [str(a) for a in gitops.refused()]
    route_writes = [
        str(r)
        for r in audited_requests(cluster, namespace, since=since)
        if r.resource == "httproutes" and r.agent.startswith(CONTROLLER_AGENTS)
    ]
    assert not route_writes, route_writes  # the split is the pods': the route is Git's alone
    assert scene.routes is not None and (scene.routes.get("web") or {}).get("spec") == route_before["spec"]

    s = summarise(records, committed - 2, records[-1].sent, asked_rate=RATE)
    released = since_when(
        [c for c in scene.deployments.changes if c[2]["metadata"]["name"] == "web" and c[0] > committed],
        lambda o: "paused" not in o["spec"],
    )
    assert released, "the hold was never released"
    all_v2, late = no_old_answer_after_all_new(records, V1, released)
    shares = []
    for k, at, pods, stable, weight in batches:
        # The batch's pause (3 s) from when it was seen live: the next batch's canary pods come after it.
        start = committed + at
        chosen = [r for r in records if start <= r.sent < start + 3 and r.image]
        got = sum(1 for r in chosen if r.image == image("v2")) / max(len(chosen), 1)
        shares.append((k, pods, stable, weight, got, len(chosen)))
    audit = check_deployment_writes(cluster, namespace, since, {digest})
    print(f"\nargocd-client-side: template {digest} (v2), Succeeded {succeeded - committed:.1f}s after the commit")
    for k, pods, stable, weight, got, n in shares:
        print(f"  batch {k}: canary {pods} pods beside {stable}, weight {weight}%; v2 answered {got:.1%} of {n}")
    print(
        f"  hold released {released - committed:.1f}s after the commit; v2 alone from "
        f"{(all_v2 or 0) - released:+.2f}s after it; v1 answers after that: {len(late)}"
    )
    print(
        f"  load: {s.sent} requests at {s.rate:.1f}/s, {len(s.failed)} failed; GitOps: "
        f"{len([a for a in gitops.applies if a.at >= datetime.fromtimestamp(committed, UTC)])} client-side applies "
        f"since the commit, none refused; kubectl diff in sync at every batch ({min(drifts):.2f}-{max(drifts):.2f}s) "
        f"and at the end; no controller write to the route"
    )
    print(f"  {audit}")
    assert s.failed == [], f"{len(s.failed)} failed requests:\n{describe(s.failed, committed)}"
    assert all_v2 is not None and not late, f"v1 answered after v2 had all the traffic:\n{describe(late, committed)}"
    for k, _, _, weight, got, n in shares:
        # Traefik spreads requests over the pods' endpoints: the share is the pods', within a generous margin.
        assert n > 50 and abs(got * 100 - weight) < 20, (k, weight, got, n)
    assert s.rate_kept(0.05), f"the load kept {s.rate:.1f} req/s"


# --- 3: the HPA resizes the stable mid-batch ------------------------------------------------------------------


def test_the_canary_follows_the_hpa_and_nothing_writes_the_stables_replicas_back(
    local_cluster: LocalCluster, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    cluster = local_cluster
    share = 0.5
    hpa = HPA(cluster, namespace, "web")
    gitops = GitOps(cluster, namespace, tmp_path / "repo", FLUX)
    gitops.commit(slow_rollout(git_deployment("v1", replicas=None, serving=False)))  # no replicas: the HPA's
    gitops.commit(
        follow_release(None, [{"replicas": f"{share:.0%}", "pause": "manual"}, {"replicas": "100%", "pause": "manual"}])
    )
    since = datetime.now(UTC)
    scene = Scene(cluster, namespace, routes=False)
    resized: list[tuple[int, int, float, dict[str, Any]]] = []  # stable, canary, seconds, status then
    rolling: list[tuple[int, float, str]] = []  # during the promotion: stable, seconds, the rollout then

    def canary_at(n: int) -> dict[str, Any] | None:
        c = scene.deployments.get("web-canary")
        return c if c is not None and c["spec"]["replicas"] == n else None

    def stable_pods(n: int) -> bool:
        return len(scene.app_pods()) == n

    def canary_ready(n: int) -> bool:
        c = canary_at(n)
        return c is not None and (c.get("status") or {}).get("readyReplicas") == n and c["status"].get("replicas") == n

    try:
        set_up(cluster, namespace, gitops, scene, replicas=1, host=None, load=None)
        assert hpa.scale_to(4).wrote
        cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")
        v1_uids = pod_uids(scene)
        with gitops.self_heal():
            gitops.commit(slow_rollout(git_deployment("v2", replicas=None, serving=False)))
            digest = assert_held(scene, "v2")["metadata"]["annotations"][HELD_ANNOTATION]
            scene.wait_status(lambda st: st.get("batchState") == "WaitingForApproval", 90, "batch 1 live")
            scene.deployments.wait(lambda: canary_ready(2), 30, "the canary at 2 of 4")
            for stable in (7, 3):
                want = math.ceil(share * stable)
                write = hpa.scale_to(stable)
                assert write.wrote and write.ok
                wrote_at = write.at.timestamp() + write.seconds  # the PUT's answer
                scene.deployments.wait(partial(canary_at, want), 30, f"the canary resized to {want}")
                took = time.time() - wrote_at
                scene.deployments.wait(partial(canary_ready, want), 60, f"{want} canary pods ready")

                def sizes(st: dict[str, Any], s: int = stable, w: int = want) -> bool:
                    return (st.get("stableReplicas"), st.get("canaryReplicas")) == (s, w)

                st = scene.wait_status(sizes, 30, f"the status at {stable} + {want}")
                # Two applies of Git later, the HPA's count stands, and the template is still held.
                gitops.next_apply(after=time.monotonic())
                gitops.next_apply(after=time.monotonic())
                d = scene.deployment()
                assert d["spec"]["replicas"] == stable, d["spec"]["replicas"]
                assert d["spec"].get("paused") is True and d["metadata"]["annotations"][HELD_ANNOTATION] == digest
                wait_for(partial(stable_pods, stable), 60, f"{stable} stable pods")
                assert {first_image(p) for p in scene.app_pods()} == {V1}
                resized.append((stable, want, took, st))
                drift = gitops.drift()
                assert drift.in_sync, drift.diff
            assert v1_uids & pod_uids(scene), "the stable's pods were replaced"

            # Follow mode removes no annotation: each approval names its batch (a new value each time).
            cluster.kubectl("annotate", "gr", "web", "-n", namespace, "--overwrite", "greyrelease.io/promote=1")
            scene.wait_status(
                lambda st: st.get("currentBatch") == 2 and st.get("batchState") == "WaitingForApproval", 90, "batch 2"
            )
            scene.deployments.wait(lambda: canary_ready(3), 60, "the canary at 100 % of 3")
            cluster.kubectl("annotate", "gr", "web", "-n", namespace, "--overwrite", "greyrelease.io/promote=2")

            # The promotion: the hold released, the Deployment controller rolls v2 one pod at a time (maxSurge 1,
            # maxUnavailable 0, each new pod available after 3 s); the HPA resizes the stable meanwhile, and the
            # canary, at the share of its last batch (100 %), follows while the old ReplicaSet still has pods.
            scene.wait_phase({"Promoting"}, 60)
            for stable in (5, 4):
                write = hpa.scale_to(stable)
                assert write.wrote and write.ok
                wrote_at = write.at.timestamp() + write.seconds
                scene.deployments.wait(partial(canary_at, stable), 30, f"the canary resized to {stable} while rolling")
                took = time.time() - wrote_at
                d = scene.deployment()
                old = sum(
                    int(r["status"].get("replicas") or 0)
                    for r in scene.stable_replicasets()
                    if first_image(r["spec"]["template"]) == V1
                )
                st = scene.status()
                assert st.get("phase") == "Promoting" and old > 0, (st.get("phase"), old)  # still rolling
                assert "paused" not in d["spec"] and d["spec"]["replicas"] == stable, d["spec"]
                rolling.append((stable, took, f"{d['status'].get('updatedReplicas')} of {stable} on v2, {old} on v1"))
            scene.wait_phase({"Succeeded"}, 120)
            scene.deployments.wait(lambda: scene.deployments.get("web-canary") is None, 60, "the canary deleted")
            final_drift = gitops.drift()
    finally:
        scene.stop()
    assert final_drift.in_sync, final_drift.diff
    d = json.loads(cluster.kubectl("get", "deployment", "web", "-n", namespace, "-o", "json").stdout)
    assert d["spec"]["replicas"] == 4 and first_image(d) == image("v2") and "paused" not in d["spec"]
    assert_equal_to_git(cluster, namespace, gitops)
    assert not gitops.refused(), [str(a) for a in gitops.refused()]

    # Who wrote the Deployment's replicas: the HPA, through /scale, and nobody else.
    audit = check_deployment_writes(cluster, namespace, since, {digest})
    scale_writes = [
        r for r in audited_requests(cluster, namespace, since=since) if r.resource == "deployments" and r.subresource
    ]
    # Every write the HPA's: five that went through, and any refused with 409 (the Deployment written between
    # its GET and its PUT, as during a rollout: it tried again from a new GET, as the HPA does).
    assert {(r.verb, r.subresource, r.field_manager) for r in scale_writes} == {
        ("update", "scale", HPA_FIELD_MANAGER)
    }, [str(r) for r in scale_writes]
    assert [r.code for r in scale_writes if r.code >= 300] == [409] * hpa.conflicts, [str(r) for r in scale_writes]
    assert len([r for r in scale_writes if r.code < 300]) == 5, [str(r) for r in scale_writes]
    replicas_in_body = [
        str(w)
        for w in audited_writes(cluster, namespace=namespace, agents=(), since=since)
        if w.resource == "deployments"
        and w.name == "web"
        and not w.subresource
        and isinstance(w.body, dict)
        and "replicas" in (w.body.get("spec") or {})
    ]
    assert not replicas_in_body, replicas_in_body
    print(
        "\nHPA: "
        + "; ".join(
            f"stable -> {s}: canary -> {c} ({share:.0%}) {t:.2f}s after the /scale write, status "
            f"{st.get('stableReplicas')} + {st.get('canaryReplicas')}"
            for s, c, t, st in resized
        )
        + "; promoting: "
        + "; ".join(f"stable -> {s}: canary -> {s} {t:.2f}s after the /scale write ({then})" for s, t, then in rolling)
        + f"; Succeeded at the HPA's size (4 on v2). Writes of deployments/web/scale: {len(scale_writes)}, all the "
        f"HPA's ({hpa.conflicts} refused with 409 and made again); no other write names spec.replicas. {audit}"
    )


# --- 4: a bad template, rolled back by its gate; then reverted in Git ----------------------------------------------

# As in e2e/test_traffic_gates.py: the stable Service is web-stable, so the canary's is web-stable-canary, and
# `web-(stable-)?{{track}}` picks either one from Traefik's per-service series.
SERVICE_LABEL = 'service=~"{{namespace}}-web-(stable-)?{{track}}-http-80@kubernetesgateway"'
ERROR_RATIO = (
    f'(sum(rate(traefik_service_requests_total{{{SERVICE_LABEL},code=~"5.."}}[10s])) or vector(0))'
    f" / sum(rate(traefik_service_requests_total{{{SERVICE_LABEL}}}[10s]))"
)
ERROR_GATE = {"name": "canary-error-ratio", "query": ERROR_RATIO, "compare": {"maxIncrease": 1.0, "floor": 0.01}}


def test_a_bad_template_is_left_held_by_its_gate_and_a_revert_restarts_no_pod(
    local_cluster: LocalCluster,
    dataplane: DataPlane,
    prometheus: PrometheusStack,
    namespace: str,
    follower: Follower,
    tmp_path: Path,
) -> None:
    cluster, replicas = local_cluster, 4
    host = f"web.{namespace}.example"
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web-stable"}}
    analysis = {"prometheus": {"address": prometheus.url, "timeout": "2s"}, "interval": "1s", "metrics": [ERROR_GATE]}
    # The first batch holds far longer than the gate needs: only the gate can end it.
    batches = [{"replicas": "25%", "weight": 10, "pause": "300s"}, {"replicas": "100%", "weight": 100}]
    gitops = GitOps(cluster, namespace, tmp_path / "repo", ARGOCD, ignore=ignore_rules("web-stable"))
    gitops.commit(git_deployment("v1", replicas=replicas))
    gitops.commit(git_service("web-stable"))
    gitops.commit(git_route(host, "web-stable", dataplane.parent_ref))
    gitops.commit(follow_release(routing, batches, analysis=analysis))
    since = datetime.now(UTC)
    scene = Scene(cluster, namespace)
    try:
        set_up(cluster, namespace, gitops, scene, replicas=replicas, host=host, load=dataplane)
        v1_uids = pod_uids(scene)
        (v1_set,) = [r["metadata"]["name"] for r in scene.stable_replicasets()]
        with gitops.self_heal(), Load(dataplane.gateway_url, RATE, host=host) as load:
            time.sleep(2)
            committed = time.time()
            gitops.commit(git_deployment("v2-err30", replicas=replicas))
            digest = assert_held(scene, "v2-err30", stable_uids=v1_uids)["metadata"]["annotations"][HELD_ANNOTATION]
            scene.wait_status(lambda st: st.get("batchState") == "Verifying", 90, "batch 1 live")
            live_at = time.time()
            st = scene.wait_phase({"Failed", "Aborted", "Succeeded"}, 120)
            failed_at = time.time()
            scene.deployments.wait(lambda: scene.deployments.get("web-canary") is None, 60, "the canary deleted")
            wait_for(lambda: not scene.app_pods(canary=True), 60, "no canary pod left")
            held = assert_held(scene, "v2-err30", stable_uids=v1_uids)
            stalled_drift = gitops.drift()
            time.sleep(2)  # a self-heal apply or so with the release stopped: still held, nothing restarted
            assert_held(scene, "v2-err30", stable_uids=v1_uids)

            # The revert, in Git.
            reverted_at = time.time()
            gitops.commit(git_deployment("v1", replicas=replicas))
            end = scene.wait_status(
                lambda st: st.get("phase") == "Idle" and (st.get("lastRelease") or {}).get("outcome") == "Reverted",
                60,
                "Idle after the revert",
            )
            idle_at = time.time()
            unheld = scene.deployments.wait(
                lambda: (lambda d: d if "paused" not in d["spec"] else None)(scene.deployment()),
                30,
                "the hold released",
            )
            time.sleep(3)  # what the Deployment controller would do with it has been done
            after_revert_uids = pod_uids(scene)
            sets_after = [r["metadata"]["name"] for r in scene.stable_replicasets()]
            revert_drift = gitops.drift()
        records = load.records
    finally:
        scene.stop()

    print(f"\ngate: {st.get('phase')}: {st.get('message')}")
    values = [(m.get("name"), m.get("value"), m.get("stableValue"), m.get("verdict")) for m in st.get("metrics") or []]
    print(f"  gate values (name, canary, stable, verdict): {values}")
    assert st["phase"] == "Failed", st  # a failed gate ends a release Failed (an annotation, Aborted)
    assert (condition(st, "Stalled"), condition(st, "Ready"), condition(st, "Reconciling")) == (
        "True",
        "False",
        "False",
    )
    message = st["message"]
    assert ERROR_GATE["name"] in message and f"holds {image('v2-err30')} (template {digest[:8]})" in message, message
    assert f"runs ReplicaSet {v1_set} ({V1})" in message, message
    assert st["lastRelease"]["outcome"] == "Failed" and st["lastRelease"]["digest"] == digest, st["lastRelease"]
    assert held["spec"]["template"]["spec"]["containers"][0]["image"] == image("v2-err30")
    assert stalled_drift.in_sync, f"held after the gate: drift\n{stalled_drift.diff}"

    assert end["phase"] == "Idle" and end["lastRelease"]["outcome"] == "Reverted", end
    assert (condition(end, "Ready"), condition(end, "Stalled")) == ("True", "False")
    assert HELD_ANNOTATION not in (unheld["metadata"].get("annotations") or {}) and first_image(unheld) == V1
    assert after_revert_uids == v1_uids, "a pod was restarted by the revert"
    assert sets_after == [v1_set], sets_after
    assert revert_drift.in_sync, revert_drift.diff
    assert_equal_to_git(cluster, namespace, gitops)
    assert not gitops.refused(), [str(a) for a in gitops.refused()]
    # The hold of the reverted template (v1's again) is released as any other.
    audit = check_deployment_writes(cluster, namespace, since, {digest, template_digest(unheld["spec"]["template"])})

    s = summarise(records, committed - 2, records[-1].sent, asked_rate=RATE)
    bad = image("v2-err30")
    canary = [r for r in records if r.image == bad]
    last_canary = last(records, lambda r: r.image == bad)
    print(
        f"  held {digest}; batch 1 live {live_at - committed:.1f}s, Failed seen {failed_at - committed:.1f}s after "
        f"the commit; last canary answer {(last_canary.sent - failed_at) if last_canary else 0:+.2f}s from Failed "
        f"seen; {len(s.failed)} failed requests of {s.sent}, all from the canary ({len(canary)} canary answers)"
    )
    print(
        f"  revert: Idle (Reverted) seen {idle_at - reverted_at:.2f}s after the commit; pods unchanged "
        f"({len(after_revert_uids)} UIDs), ReplicaSets {sets_after}; no drift"
    )
    print(f"  {audit}")
    assert all(r.image == bad and r.status == 500 for r in s.failed), describe(
        [r for r in s.failed if r.image != bad or r.status != 500], committed
    )
    assert len(canary) / max(s.answered, 1) < 0.2


# --- 5: aborts by annotation under load ---------------------------------------------------------------------


def annotation_written(cluster: LocalCluster, namespace: str, t0: float) -> float | None:
    """When the API server received ``kubectl annotate``'s write of the GreyRelease after t0."""
    for r in audited_requests(cluster, namespace, since=datetime.fromtimestamp(t0, UTC)):
        if r.resource == "greyreleases" and r.field_manager == "kubectl-annotate" and r.code < 300:
            return r.at.timestamp()
    return None


def controller_write_after(cluster: LocalCluster, namespace: str, t0: float, resource: str) -> float | None:
    for w in audited_writes(cluster, namespace=namespace, since=datetime.fromtimestamp(t0, UTC)):
        if w.resource == resource and 200 <= w.code < 300:
            return w.at.timestamp()
    return None


def test_an_abort_mid_release_cuts_the_canary_within_a_second_and_leaves_the_template_held(
    local_cluster: LocalCluster, dataplane: DataPlane, namespace: str, follower: Follower, tmp_path: Path
) -> None:
    cluster, replicas = local_cluster, 4
    host = f"web.{namespace}.example"
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
    batches = [{"replicas": "50%", "weight": 30, "pause": "manual"}, {"replicas": "100%", "weight": 100}]
    gitops = GitOps(cluster, namespace, tmp_path / "repo", ARGOCD, ignore=ignore_rules("web"))
    gitops.commit(git_deployment("v1", replicas=replicas))
    gitops.commit(git_service("web"))
    gitops.commit(git_route(host, "web", dataplane.parent_ref))
    gitops.commit(follow_release(routing, batches))
    since = datetime.now(UTC)
    scene = Scene(cluster, namespace)
    cuts: list[float] = []
    parts: list[tuple[float, float, float]] = []  # kubectl, controller's route write, proxy
    digests: set[str] = set()
    try:
        set_up(cluster, namespace, gitops, scene, replicas=replicas, host=host, load=dataplane)
        v1_uids = pod_uids(scene)
        with gitops.self_heal(), Load(dataplane.gateway_url, RATE, host=host) as load:
            for i in range(ABORTS):
                tag = f"v{i + 2}"
                gitops.commit(git_deployment(tag, replicas=replicas))
                digest = assert_held(scene, tag, stable_uids=v1_uids)["metadata"]["annotations"][HELD_ANNOTATION]
                digests.add(digest)

                def batch_live(st: dict[str, Any], d: str = digest) -> bool:
                    return st.get("batchState") == "WaitingForApproval" and (st.get("held") or {}).get("digest") == d

                scene.wait_status(batch_live, 90, f"abort {i + 1}: batch 1 of {tag} live")
                canary_image, live_at = image(tag), time.time()

                def canary_answered(c: str = canary_image, s: float = live_at) -> bool:
                    return sum(1 for r in load.records if r.sent >= s and r.image == c) >= 10

                wait_for(canary_answered, 30, f"abort {i + 1}: canary answers", interval=0.1)
                t0 = time.time()
                # The abort before stays on the object (follow mode removes no annotation): a new value each time.
                subprocess.run(
                    [
                        cluster.kubectl_path,
                        "annotate",
                        "gr",
                        "web",
                        "-n",
                        namespace,
                        "--overwrite",
                        f"greyrelease.io/abort=true@{i + 1}",
                    ],
                    env=cluster.env,
                    check=True,
                    capture_output=True,
                    timeout=30,
                )

                def from_canary(r: Record, c: str = canary_image) -> bool:
                    return r.image == c

                def quiet(c: Callable[[Record], bool] = from_canary) -> bool:
                    # No canary answer for 1.5 s: every request sent before the cut has been answered.
                    found = last(load.records, c)
                    return found is not None and time.time() - found.sent > 1.5

                wait_for(quiet, 30, f"abort {i + 1}: no more canary answers", interval=0.1)
                final = last(load.records, from_canary)
                assert final is not None
                annotated = annotation_written(cluster, namespace, t0)
                assert annotated is not None, "the audit log has no write of the abort annotation"
                routed = controller_write_after(cluster, namespace, t0, "httproutes") or annotated
                cuts.append(final.sent - annotated)
                parts.append((annotated - t0, routed - annotated, final.sent - routed))
                st = scene.wait_phase({"Aborted"}, 60)
                assert (
                    condition(st, "Stalled") == "True"
                    and f"holds {image(tag)} (template {digest[:8]})" in st["message"]
                )
                assert_held(scene, tag, stable_uids=v1_uids)
                drift = gitops.drift()
                assert drift.in_sync, f"abort {i + 1}: drift\n{drift.diff}"
                print(
                    f"\nabort {i + 1} ({tag}): last canary answer {cuts[-1]:.3f}s after the annotation's write "
                    f"(kubectl {parts[-1][0]:.3f}s before it; route written {parts[-1][1]:.3f}s after it; "
                    f"proxy {parts[-1][2]:.3f}s)"
                )
            # The revert ends it: nothing of v2..v11 ever ran outside a canary.
            gitops.commit(git_deployment("v1", replicas=replicas))
            end = scene.wait_status(
                lambda st: st.get("phase") == "Idle" and (st.get("lastRelease") or {}).get("outcome") == "Reverted",
                60,
                "Idle after the revert",
            )
            time.sleep(3)
            assert pod_uids(scene) == v1_uids
            digests.add(template_digest(scene.deployment()["spec"]["template"]))  # the revert's hold, released
            records = load.records
    finally:
        scene.stop()
    failed = [r for r in records if r.failed]
    audit = check_deployment_writes(cluster, namespace, since, digests)
    print(
        f"\n{ABORTS} aborts under {RATE:.0f} req/s: cut p50 {percentile(cuts, 50):.3f}s, "
        f"p99 {percentile(cuts, 99):.3f}s, max {max(cuts):.3f}s; route written p50 "
        f"{percentile([p[1] for p in parts], 50):.3f}s after the annotation, proxy p50 "
        f"{percentile([p[2] for p in parts], 50):.3f}s; {len(failed)} of {len(records)} "
        f"requests failed; then a revert: {end['phase']} ({end['lastRelease']['outcome']}), no pod restarted; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"  {audit}")
    assert not failed, describe(failed, records[0].sent)
    assert percentile(cuts, 99) <= ABORT_LIMIT, f"cuts {sorted(round(c, 3) for c in cuts)}"
