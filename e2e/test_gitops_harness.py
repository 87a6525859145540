"""End-to-end: the GitOps and HPA emulators (e2e/harness/gitops.py, e2e/harness/hpa.py) proved on a plain
Deployment and Service, with kubectl as the only client, on the local cluster. No GreyRelease, no controller.

For each way a tool applies (Argo CD server-side, Flux, Argo CD client-side): the first sync leaves
``kubectl diff`` in sync; a dry run returns an object as stored and creates nothing; a field Git declares,
changed by hand, is drift, and the self-heal loop puts it back; fields Git never declares (``spec.paused``,
an annotation) are not drift and stay; a Service selector extended the way a release narrows it (manager
``greyrelease``) is drift for a server-side apply, which takes it out, and not for a client-side one; a
commit lands with the next apply; no apply is refused; the audit log names the tool's field manager on every
write and dry run. Then the HPA: it rescales through ``/scale`` under its own account, and ``kubectl scale``
under that account is refused.

Figures are printed (``-s`` shows them); only the loop's period is asserted (never shorter than asked).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controller import wait_for
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.gitops import FLUX, TOOLS, GitOps, Tool, audited_requests
from e2e.harness.hpa import HPA, HPA_FIELD_MANAGER, HPA_USER

pytestmark = pytest.mark.e2e

IMAGE = "registry.example/app"
HASH_LABEL = "pod-template-hash"


def deployment(name: str, image: str = f"{IMAGE}:v1", *, replicas: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minReadySeconds": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": image}]},
        },
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec,
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def get(cluster: Cluster, namespace: str, kind: str, name: str, *managed: str) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", kind, name, "-n", namespace, *managed))


def image(d: dict[str, Any]) -> str:
    return str(d["spec"]["template"]["spec"]["containers"][0]["image"])


def owners(obj: dict[str, Any], *path: str) -> dict[str, str]:
    """Managers (with their operation) whose managedFields entry holds ``path`` (e.g. "spec", "selector")."""
    found = {}
    for entry in obj["metadata"].get("managedFields") or []:
        fields = entry.get("fieldsV1") or {}
        for part in path:
            fields = fields.get(f"f:{part}")
            if fields is None:
                break
        else:
            found[entry["manager"]] = entry["operation"]
    return found


@pytest.mark.parametrize("tool", TOOLS, ids=[t.name for t in TOOLS])
def test_self_heal_drift_and_commits(cluster: Cluster, namespace: str, tmp_path: Path, tool: Tool) -> None:
    def k(*args: str, check: bool = True) -> Any:
        return cluster.kubectl(*args, "-n", namespace, check=check)

    since = datetime.now(UTC)
    gitops = GitOps(cluster, namespace, tmp_path / "repo", tool)
    gitops.commit(deployment("web"))
    gitops.commit(service("web"))
    first = gitops.apply()
    assert first.ok, first
    synced = gitops.drift()
    assert synced.in_sync, synced.diff

    # A dry run: the object as the API server would store it, and nothing created.
    gitops.commit(service("extra"))
    dry = {o["metadata"]["name"]: o for o in gitops.dry_run_apply() if o["kind"] == "Service"}
    assert dry["extra"]["spec"]["selector"] == {"app": "extra"} and dry["extra"]["spec"]["type"] == "ClusterIP"
    assert k("get", "service", "extra", check=False).returncode != 0, "a dry run created the Service"
    assert gitops.apply().ok

    # By hand: a field Git declares, two it never declares, and the Service selector extended as a
    # release narrows it (as the manager greyrelease).
    k("patch", "deployment", "web", "--type=merge", "-p", json.dumps({"spec": {"minReadySeconds": 7, "paused": True}}))
    k("annotate", "deployment", "web", "example.com/by-hand=yes")
    narrow = json.dumps({"spec": {"selector": {HASH_LABEL: "abc123"}}})
    k("patch", "service", "web", "--field-manager=greyrelease", "-p", narrow)
    drifted = gitops.drift()
    assert drifted.code == 1, drifted
    changed = drifted.changed_lines()
    assert "-  minReadySeconds: 7" in changed and "+  minReadySeconds: 1" in changed, changed
    assert not [line for line in changed if "paused" in line or "by-hand" in line], changed
    narrowing_is_drift = any(HASH_LABEL in line for line in changed)
    assert narrowing_is_drift == tool.server_side, changed

    def live() -> dict[str, Any]:
        return get(cluster, namespace, "deployment", "web")

    def selector() -> dict[str, str]:
        return dict(get(cluster, namespace, "service", "web")["spec"]["selector"])

    loop_started = time.monotonic()
    with gitops.self_heal():
        wait_for(lambda: live()["spec"]["minReadySeconds"] == 1, 15, "the first apply of the loop")
        first_heal = time.monotonic() - loop_started
        d = live()
        assert d["spec"].get("paused") is True and d["metadata"]["annotations"]["example.com/by-hand"] == "yes"
        if tool.server_side:
            wait_for(lambda: HASH_LABEL not in selector(), 15, "the narrowing taken out")
        else:
            assert selector() == {"app": "web", HASH_LABEL: "abc123"}

        # While the loop runs: a change by hand is put back within a period and an apply.
        changed_at = time.monotonic()
        k("patch", "deployment", "web", "--type=merge", "-p", json.dumps({"spec": {"minReadySeconds": 8}}))
        wait_for(lambda: live()["spec"]["minReadySeconds"] == 1, 15, "self-heal")
        heal = time.monotonic() - changed_at

        # A commit lands with the next apply.
        committed_at = time.monotonic()
        revision = gitops.commit(deployment("web", f"{IMAGE}:v2"))
        landing = gitops.next_apply(after=committed_at, revision=revision)
        assert landing.ok, landing
        wait_for(lambda: image(live()) == f"{IMAGE}:v2", 15, "the commit applied")
        landed = time.monotonic() - committed_at
        in_loop = gitops.drift()
        assert in_loop.in_sync, in_loop.diff  # still paused, still annotated: not drift
    loop = [a for a in gitops.applies if a.started >= loop_started]

    assert not gitops.refused(), [str(a) for a in gitops.refused()]
    periods = [b.started - a.started for a, b in pairwise(loop)]
    assert periods and min(periods) >= gitops.interval - 0.05, periods
    managed = get(cluster, namespace, "deployment", "web", "--show-managed-fields")
    operation = "Apply" if tool.server_side else "Update"
    assert owners(managed, "spec", "minReadySeconds") == {tool.field_manager: operation}

    # A release's narrowing, then its restore, both as greyrelease, then one more sync: greyrelease still
    # owns the selector (an atomic map), beside the tool.
    k("patch", "service", "web", "--field-manager=greyrelease", "-p", narrow)
    k(
        "patch",
        "service",
        "web",
        "--type=merge",
        "--field-manager=greyrelease",
        "-p",
        json.dumps({"spec": {"selector": {HASH_LABEL: None}}}),
    )
    assert gitops.apply().ok
    selector_owners = owners(get(cluster, namespace, "service", "web", "--show-managed-fields"), "spec", "selector")
    assert selector_owners.get("greyrelease") == "Update", selector_owners

    audited = ""
    if isinstance(cluster, LocalCluster):
        writes = [w for w in audited_requests(cluster, namespace, since=since) if w.agent.startswith("kubectl/")]
        deploy = [w for w in writes if (w.resource, w.name, w.subresource) == ("deployments", "web", "")]
        applied = [w for w in deploy if not w.dry_run and w.field_manager == tool.field_manager]
        diffs = [w for w in deploy if w.dry_run]
        assert all(w.code < 400 for w in applied), [str(w) for w in applied]
        assert all(w.force == tool.server_side for w in applied + diffs), [str(w) for w in applied + diffs]
        assert {w.field_manager for w in diffs} == {tool.field_manager}, [str(w) for w in diffs]
        assert {w.field_manager for w in deploy if not w.dry_run} == {
            tool.field_manager,
            "kubectl-patch",
            "kubectl-annotate",
        }
        applies = len(gitops.applies)
        if tool.server_side:  # one patch per object per apply, even when nothing changes
            assert len(applied) == applies, (len(applied), applies)
        else:  # client-side apply sends nothing when its patch is empty: the create, the two heals, v2
            assert 4 <= len(applied) < applies, (len(applied), applies)
        audited = f"; audit: {len(applied)} writes of deployments/web as {tool.field_manager}, {len(diffs)} dry runs"

    seconds = [a.seconds for a in gitops.applies]
    print(
        f"\n{tool.name}: {len(gitops.applies)} applies, none refused, {min(seconds):.2f}-{max(seconds):.2f}s each; "
        f"loop period {min(periods):.2f}-{max(periods):.2f}s; healed {first_heal:.2f}s after the loop started, "
        f"{heal:.2f}s after a change made while it ran; a commit live {landed:.2f}s after it was made; "
        f"kubectl diff {synced.seconds:.2f}s (in sync), {drifted.seconds:.2f}s (drift){audited}"
    )


def test_hpa_rescales_through_the_scale_subresource(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    hpa = HPA(cluster, namespace, "web")
    # What its account may do here: get and update the scale subresource, nothing else on Deployments.
    assert hpa.can_i("get", "deployments", subresource="scale")
    assert hpa.can_i("update", "deployments", subresource="scale")
    assert not hpa.can_i("patch", "deployments", subresource="scale")
    for verb in ("get", "update", "patch"):
        assert not hpa.can_i(verb, "deployments"), verb

    def replicas() -> int:
        return int(get(cluster, namespace, "deployment", "web")["spec"]["replicas"])

    gitops = GitOps(cluster, namespace, tmp_path / "repo", FLUX)
    gitops.commit(deployment("web"))  # no replicas in Git: the HPA owns them
    assert gitops.apply().ok
    since = datetime.now(UTC)
    with gitops.self_heal():
        up = hpa.scale_to(4)
        assert up.wrote and up.before == 1 and replicas() == 4
        after = gitops.next_apply(after=time.monotonic())
        assert after.ok and replicas() == 4, "the loop took the HPA's replicas back"
        assert gitops.drift().in_sync
        assert not hpa.scale_to(4).wrote  # the HPA writes only when the count changes

        # Git that declares replicas fights the HPA: the loop puts its count back.
        gitops.commit(deployment("web", replicas=2))
        wait_for(lambda: replicas() == 2, 15, "Git's replicas applied")
        fought_at = time.monotonic()
        assert hpa.scale_to(5).wrote
        wait_for(lambda: replicas() == 2, 15, "the loop undoing the HPA")
        undone = time.monotonic() - fought_at
    assert not gitops.refused(), [str(a) for a in gitops.refused()]

    # Other ways to scale, under the same account: refused.
    scaled = hpa.kubectl("scale", "deployment/web", "--replicas=7", "-n", namespace)
    assert scaled.returncode != 0 and "forbidden" in scaled.stderr.lower(), scaled.stderr
    patched = hpa.kubectl(
        "patch", "deployment/web", "-n", namespace, "--subresource=scale", "-p", json.dumps({"spec": {"replicas": 7}})
    )
    assert patched.returncode != 0 and 'cannot patch resource "deployments/scale"' in patched.stderr, patched.stderr
    assert replicas() == 2

    audited = ""
    if isinstance(cluster, LocalCluster):
        scale = [w for w in audited_requests(cluster, namespace, since=since) if w.subresource == "scale"]
        puts = [w for w in scale if w.verb == "update"]
        # Two rescales written; a PUT refused with 409 (the Deployment written between the HPA's GET and PUT)
        # is tried again from a new GET, as the HPA does.
        assert [w.code for w in puts if w.code != 409] == [200, 200], [str(w) for w in scale]
        assert sum(w.code == 409 for w in puts) == hpa.conflicts, [str(w) for w in scale]
        assert all(w.impersonated == HPA_USER and w.field_manager == HPA_FIELD_MANAGER for w in puts)
        refused = [w for w in scale if w.code == 403]
        # kubectl scale is refused at its GET of the Deployment, which the audit policy does not log.
        assert [(w.verb, w.impersonated) for w in refused] == [("patch", HPA_USER)], [str(w) for w in scale]
        audited = (
            f"; audit: {len(puts)} PUTs of deployments/web/scale as the HPA's account ({hpa.conflicts} refused "
            "with 409 and tried again), 1 refused PATCH"
        )
    rescales = ", ".join(f"{w.before}->{w.after} {w.seconds:.2f}s" for w in hpa.writes if w.wrote and w.ok)
    print(
        f"\nHPA: rescales {rescales} "
        f"(GET + PUT); with replicas in Git the loop undid 2->5 within {undone:.2f}s{audited}; "
        f"kubectl scale as the HPA: {scaled.stderr.strip()}"
    )
