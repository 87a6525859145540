"""End-to-end: the admission webhook holds a new pod template of an enrolled Deployment, with kubectl as
the client, on the local API server.

One controller for the module, run from a terminal as a developer would (``greyrelease run
--webhook-port P``: its own certificate for 127.0.0.1, the configuration registered with that URL), so the
API server really calls it and the configuration's CEL matchConditions really filter. Each test has its own
Deployments in the module's namespace. The last test SIGKILLs the controller and starts it again.

Figures are printed (``-s`` shows them), not asserted: the machine is shared.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from greyrelease.admission import (
    CONFIGURATION_NAME,
    FIELD_MANAGER,
    HELD_ANNOTATION,
    WEBHOOK_NAME,
    release_patch,
    template_digest,
)

from e2e.harness.controller import Controller, wait_for
from e2e.harness.controlplane import Cluster, KubectlError
from e2e.harness.hpa import HPA
from e2e.harness.pki import create_ca, serving_pair
from e2e.harness.process import free_port

pytestmark = pytest.mark.e2e

LABEL = "greyrelease.io/release"
IMAGE = "registry.example/app"


@dataclass
class Env:
    cluster: Cluster
    namespace: str
    port: int
    ctl: Controller | None  # None until start()
    log: Path

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, "-n", self.namespace, **kw)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.cluster.kubectl_json("get", "deployment", name, "-n", self.namespace))

    def replica_sets(self, name: str) -> list[dict[str, Any]]:
        items = self.cluster.kubectl_json("get", "rs", "-n", self.namespace, "-l", f"app={name}")["items"]
        return list(items)

    def pods(self, name: str) -> list[dict[str, Any]]:
        return list(self.cluster.kubectl_json("get", "pods", "-n", self.namespace, "-l", f"app={name}")["items"])

    def start(self) -> float:
        """Start the controller; the seconds until the configuration points at its port."""
        started = time.monotonic()
        self.ctl = Controller(self.cluster, self.namespace, self.log, extra_args=["--webhook-port", str(self.port)])
        self.ctl.start()
        wait_for(lambda: registered_port(self.cluster) == self.port and self.answers(), 60, "the webhook registered")
        return time.monotonic() - started

    def answers(self) -> bool:
        """A server-side dry run of a template change on a probe Deployment comes back held."""
        probe = self.dry_run_template_change("probe")
        return probe is not None and bool(probe["spec"].get("paused"))

    def dry_run_template_change(self, name: str) -> dict[str, Any] | None:
        proc = self.kubectl(
            "patch",
            "deployment",
            name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"template": {"metadata": {"annotations": {"probe": secrets.token_hex(4)}}}}}),
            "--dry-run=server",
            "-o",
            "json",
            check=False,
        )
        return json.loads(proc.stdout) if proc.returncode == 0 else None


def registered_port(cluster: Cluster) -> int | None:
    proc = cluster.kubectl("get", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    url = json.loads(proc.stdout)["webhooks"][0]["clientConfig"].get("url", "")
    found = re.match(r"https://127\.0\.0\.1:(\d+)/hold$", url)
    return int(found.group(1)) if found else None


def manifest(name: str, image: str = f"{IMAGE}:v1", *, enrolled: bool = True, replicas: int = 4) -> str:
    labels = {"app": name, **({LABEL: name} if enrolled else {})}
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": image}]},
                },
            },
        }
    )


def deploy(env: Env, name: str, *, enrolled: bool = True, replicas: int = 4) -> None:
    env.kubectl("apply", "-f", "-", input=manifest(name, enrolled=enrolled, replicas=replicas))
    env.kubectl("rollout", "status", f"deployment/{name}", "--timeout=60s")


def settled(env: Env, name: str) -> dict[str, Any]:
    """The Deployment once its controller has seen its latest generation."""

    def seen() -> dict[str, Any] | None:
        d = env.get(name)
        return d if d.get("status", {}).get("observedGeneration") == d["metadata"]["generation"] else None

    return dict(wait_for(seen, 30, f"deployment {name} observed"))


def assert_held(env: Env, name: str, image: str, replica_sets: int = 1) -> dict[str, Any]:
    """Paused, the annotation the digest of the template it holds, the template ``image``, and no new
    ReplicaSet once the Deployment controller has seen it; every pod still on v1."""
    d = settled(env, name)
    assert d["spec"].get("paused") is True, d["spec"]
    assert d["metadata"]["annotations"][HELD_ANNOTATION] == template_digest(d["spec"]["template"])
    assert d["spec"]["template"]["spec"]["containers"][0]["image"] == image
    time.sleep(0.5)
    rs = env.replica_sets(name)
    assert len(rs) == replica_sets, [r["metadata"]["name"] for r in rs]
    assert {p["spec"]["containers"][0]["image"] for p in env.pods(name)} == {f"{IMAGE}:v1"}
    return d


def timed(env: Env, *args: str, **kw: Any) -> tuple[Any, float]:
    started = time.monotonic()
    proc = env.kubectl(*args, **kw)
    return proc, time.monotonic() - started


def webhook_latency(cluster: Cluster) -> tuple[float, int]:
    """The API server's own view: (mean seconds, calls) of apiserver_admission_webhook_admission_duration_seconds
    for our webhook."""
    from prometheus_client.parser import text_string_to_metric_families

    total = count = 0.0
    for family in text_string_to_metric_families(cluster.kubectl("get", "--raw", "/metrics").stdout):
        if family.name != "apiserver_admission_webhook_admission_duration_seconds":
            continue
        for s in family.samples:
            if s.labels.get("name") == WEBHOOK_NAME:
                if s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
    return (total / count if count else 0.0), int(count)


@pytest.fixture(scope="module")
def env(cluster: Cluster, crd: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    namespace = f"e2e-admission-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_namespace_ready(namespace)
    log = tmp_path_factory.mktemp("admission") / "controller.log"
    e = Env(cluster, namespace, free_port(), None, log)
    try:
        deploy(e, "probe", replicas=1)
        print(f"\ncontroller started, webhook registered and answering in {e.start():.2f}s")
        yield e
    finally:
        if e.ctl is not None:
            e.ctl.stop()
            print(f"--- controller log (last lines) ---\n{e.ctl.logs()}")
        mean, calls = webhook_latency(cluster)
        print(f"API server: {calls} calls to {WEBHOOK_NAME}, mean {mean * 1000:.1f} ms")
        # Left registered by the controller on exit, by design: removed here so that no later test meets it.
        cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "--ignore-not-found")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def test_set_image_is_held_with_no_new_replica_set(env: Env) -> None:
    deploy(env, "web")
    proc, seconds = timed(env, "set", "image", "deployment/web", f"app={IMAGE}:v2")
    d = assert_held(env, "web", f"{IMAGE}:v2")
    assert "held" in proc.stderr and "GreyRelease web" in proc.stderr, proc.stderr
    # The same on a Deployment that is not enrolled: the cost of the hold, as kubectl sees it.
    deploy(env, "plain", enrolled=False)
    _, baseline = timed(env, "set", "image", "deployment/plain", f"app={IMAGE}:v2")
    mean, calls = webhook_latency(env.cluster)
    print(
        f"\nkubectl set image: held in {seconds:.3f}s (unenrolled Deployment: {baseline:.3f}s); "
        f"API server's webhook latency so far: mean {mean * 1000:.1f} ms over {calls} calls; "
        f"held digest {d['metadata']['annotations'][HELD_ANNOTATION]}; warning: {proc.stderr.strip()}"
    )


def test_unenrolled_and_bypassed_changes_roll(env: Env) -> None:
    deploy(env, "free", enrolled=False)
    env.kubectl("set", "image", "deployment/free", f"app={IMAGE}:v2")
    env.kubectl("rollout", "status", "deployment/free", "--timeout=60s")
    d = env.get("free")
    assert not d["spec"].get("paused") and HELD_ANNOTATION not in (d["metadata"].get("annotations") or {})
    assert {p["spec"]["containers"][0]["image"] for p in env.pods("free")} == {f"{IMAGE}:v2"}

    deploy(env, "hotfix")
    env.kubectl("annotate", "deployment/hotfix", "greyrelease.io/bypass=true")
    proc = env.kubectl("set", "image", "deployment/hotfix", f"app={IMAGE}:v2")
    assert "held" not in proc.stderr
    env.kubectl("rollout", "status", "deployment/hotfix", "--timeout=60s")
    assert not env.get("hotfix")["spec"].get("paused")
    print("\nunenrolled: rolled to v2, not paused; bypass annotation: rolled to v2, not paused")


def test_gitops_server_side_apply_is_held_and_a_dry_run_creates_nothing(env: Env) -> None:
    apply = ["apply", "--server-side", "--force-conflicts", "--field-manager=argocd-controller", "-f", "-"]
    env.kubectl(*apply, input=manifest("git"))
    env.kubectl("rollout", "status", "deployment/git", "--timeout=60s")
    proc, seconds = timed(env, *apply, input=manifest("git", f"{IMAGE}:v2"))
    held = assert_held(env, "git", f"{IMAGE}:v2")
    assert "held" in proc.stderr, proc.stderr

    # Who owns spec.paused now? (The API server does not record a webhook's change under the requester.)
    fields = env.cluster.kubectl_json("get", "deployment", "git", "-n", env.namespace, "--show-managed-fields")
    owners = [m["manager"] for m in fields["metadata"]["managedFields"] if "f:paused" in json.dumps(m["fieldsV1"])]

    # A re-apply of the same manifest (Argo CD's self-heal) leaves the hold as it is.
    env.kubectl(*apply, input=manifest("git", f"{IMAGE}:v2"))
    assert_held(env, "git", f"{IMAGE}:v2")

    # Server-side dry run of v3: the answer is held, nothing is created or changed.
    rv = env.get("git")["metadata"]["resourceVersion"]
    dry = json.loads(env.kubectl(*apply, "--dry-run=server", "-o", "json", input=manifest("git", f"{IMAGE}:v3")).stdout)
    assert dry["spec"]["paused"] is True
    assert dry["metadata"]["annotations"][HELD_ANNOTATION] == template_digest(dry["spec"]["template"])
    assert dry["metadata"]["annotations"][HELD_ANNOTATION] != held["metadata"]["annotations"][HELD_ANNOTATION]
    live = env.get("git")
    assert live["metadata"]["resourceVersion"] == rv
    assert live["spec"]["template"]["spec"]["containers"][0]["image"] == f"{IMAGE}:v2"
    assert len(env.replica_sets("git")) == 1
    # A manifest that declares spec.paused (false): held all the same, and told why that fights the hold.
    declared = json.loads(manifest("git", f"{IMAGE}:v2"))
    declared["spec"]["paused"] = False
    proc = env.kubectl(*apply, input=json.dumps(declared))
    assert_held(env, "git", f"{IMAGE}:v2")
    assert "declares spec.paused" in proc.stderr and "argocd-controller" in proc.stderr, proc.stderr
    print(
        f"\nserver-side apply as argocd-controller: held in {seconds:.3f}s; "
        f"spec.paused owned by {owners or 'no manager'}; "
        "dry run of v3 answered held with its own digest, the live object untouched"
    )


def test_scale_label_and_pod_deletion_are_never_refused_while_held(env: Env) -> None:
    deploy(env, "busy")
    env.kubectl("set", "image", "deployment/busy", f"app={IMAGE}:v2")
    assert_held(env, "busy", f"{IMAGE}:v2")
    check_scaling_works(env, "busy")
    # Held all along.
    assert_held(env, "busy", f"{IMAGE}:v2")


def check_scaling_works(env: Env, name: str) -> dict[str, float]:
    """kubectl scale, the HPA's way through /scale, a label and a pod deleted: all go through and the
    paused Deployment scales its current ReplicaSet. The seconds each took."""
    took: dict[str, float] = {}
    _, took["kubectl scale"] = timed(env, "scale", f"deployment/{name}", "--replicas=6")
    wait_for(lambda: len(env.pods(name)) == 6, 30, "6 pods")
    # As the HPA rescales: GET and PUT of /scale under its account; a PUT refused with 409 (the Deployment's
    # status written by its controller between the two, which a loaded machine makes likely) is tried again
    # from a new GET, as the HPA does at its next sync.
    hpa = HPA(env.cluster, env.namespace, name)
    started = time.monotonic()
    hpa.scale_to(3)
    took["HPA /scale"] = time.monotonic() - started
    if hpa.conflicts:
        print(f"HPA /scale: {hpa.conflicts} PUTs refused with 409 and tried again from a new GET")
    wait_for(lambda: env.get(name)["spec"]["replicas"] == 3, 10, "replicas 3")
    wait_for(lambda: len([p for p in env.pods(name) if not p["metadata"].get("deletionTimestamp")]) == 3, 30, "3 pods")
    _, took["kubectl label"] = timed(env, "label", f"deployment/{name}", f"team={secrets.token_hex(2)}", "--overwrite")
    victim = env.pods(name)[0]["metadata"]["name"]
    _, took["pod delete"] = timed(env, "delete", "pod", victim, "--wait=false")
    wait_for(
        lambda: (
            victim not in {p["metadata"]["name"] for p in env.pods(name)}
            and len([p for p in env.pods(name) if not p["metadata"].get("deletionTimestamp")]) == 3
        ),
        30,
        "the pod replaced",
    )
    images = {p["spec"]["containers"][0]["image"] for p in env.pods(name)}
    print(f"\n{name}: " + ", ".join(f"{k} {v:.3f}s" for k, v in took.items()) + f"; pod images {sorted(images)}")
    return took


def test_leak_paths_come_back_held(env: Env) -> None:
    deploy(env, "leaky")
    env.kubectl("set", "image", "deployment/leaky", f"app={IMAGE}:v2")
    assert_held(env, "leaky", f"{IMAGE}:v2")
    took: dict[str, float] = {}

    proc, took["rollout resume"] = timed(env, "rollout", "resume", "deployment/leaky")
    assert_held(env, "leaky", f"{IMAGE}:v2")
    assert "put back" in proc.stderr, proc.stderr

    _, took["merge patch paused=null as argocd-server"] = timed(
        env,
        "patch",
        "deployment/leaky",
        "--type=merge",
        "-p",
        '{"spec":{"paused":null}}',
        "--field-manager=argocd-server",
    )
    assert_held(env, "leaky", f"{IMAGE}:v2")

    live = env.get("leaky")
    live["metadata"]["annotations"].pop(HELD_ANNOTATION)
    live["spec"].pop("paused")
    live["metadata"].pop("managedFields", None)
    _, took["kubectl replace"] = timed(env, "replace", "-f", "-", input=json.dumps(live))
    assert_held(env, "leaky", f"{IMAGE}:v2")

    # kubectl replace of a manifest that lacks the enrolment label too: held, and the label put back.
    live = env.get("leaky")
    live["metadata"]["annotations"].pop(HELD_ANNOTATION)
    live["metadata"]["labels"].pop(LABEL)
    live["spec"].pop("paused")
    live["metadata"].pop("managedFields", None)
    proc, took["kubectl replace without the label"] = timed(env, "replace", "-f", "-", input=json.dumps(live))
    d = assert_held(env, "leaky", f"{IMAGE}:v2")
    assert d["metadata"]["labels"][LABEL] == "leaky", proc.stderr
    print("\nre-held: " + ", ".join(f"{k} {v:.3f}s" for k, v in took.items()))


def test_the_controllers_release_is_not_held_again(env: Env) -> None:
    """The planner lifts a hold with greyrelease.admission.release_patch under the field manager
    greyrelease: it goes through, and the Deployment rolls to the template it held."""
    deploy(env, "promoted")
    env.kubectl("set", "image", "deployment/promoted", f"app={IMAGE}:v2")
    digest = assert_held(env, "promoted", f"{IMAGE}:v2")["metadata"]["annotations"][HELD_ANNOTATION]
    # A stale digest (a newer template held in between) fails the patch's test operation.
    stale = env.kubectl(
        "patch",
        "deployment/promoted",
        "--type=json",
        "-p",
        json.dumps(release_patch("0" * 16)),
        f"--field-manager={FIELD_MANAGER}",
        check=False,
    )
    assert stale.returncode != 0 and "invalid" in stale.stderr, stale.stderr
    proc, seconds = timed(
        env,
        "patch",
        "deployment/promoted",
        "--type=json",
        "-p",
        json.dumps(release_patch(digest)),
        f"--field-manager={FIELD_MANAGER}",
    )
    assert "held" not in proc.stderr, proc.stderr
    env.kubectl("rollout", "status", "deployment/promoted", "--timeout=60s")
    d = env.get("promoted")
    assert not d["spec"].get("paused") and HELD_ANNOTATION not in d["metadata"]["annotations"]
    assert {p["spec"]["containers"][0]["image"] for p in env.pods("promoted")} == {f"{IMAGE}:v2"}
    print(f"\nthe controller's release (JSONPatch, field manager greyrelease): let through in {seconds:.3f}s, rolled")


def served_certificate(port: int) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, ctx.wrap_socket(sock) as tls:
        return tls.getpeercert(binary_form=True) or b""


def test_the_shipped_configuration_and_a_cert_dir_reloaded_when_the_files_change(env: Env, tmp_path: Path) -> None:
    """config/webhook/mutating.yaml as shipped, only its clientConfig pointed at a second replica run with
    --webhook-cert-dir (a standby: the Lease is the module controller's); its certificate is rewritten
    by the same CA (as cert-manager or a Secret volume would) and served without a restart."""
    ca = create_ca(tmp_path / "ca", "greyrelease-e2e-webhook-ca")
    certs = tmp_path / "certs"
    certs.mkdir()

    def install(pair_name: str) -> bytes:
        pair = serving_pair(ca, tmp_path / "issued", pair_name, ["127.0.0.1"])
        for src, dst in ((pair.key, "tls.key"), (pair.cert, "tls.crt")):
            tmp = certs / f".{dst}"
            tmp.write_bytes(src.read_bytes())
            tmp.replace(certs / dst)
        return ssl.PEM_cert_to_DER_cert(pair.cert.read_text())

    first = install("one")
    port = free_port()
    standby = Controller(
        env.cluster,
        env.namespace,
        tmp_path / "standby.log",
        extra_args=["--webhook-port", str(port), "--webhook-cert-dir", str(certs)],
    )
    standby.start()
    try:
        wait_for(lambda: _served(port) == first, 30, "the cert-dir replica serving")
        shipped = yaml.safe_load(Path("config/webhook/mutating.yaml").read_text())
        shipped["webhooks"][0]["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/hold",
            "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
        }
        env.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(shipped))
        deploy(env, "rotated")
        env.kubectl("set", "image", "deployment/rotated", f"app={IMAGE}:v2")
        assert_held(env, "rotated", f"{IMAGE}:v2")

        second = install("two")
        written = time.monotonic()
        wait_for(lambda: _served(port) == second, 30, "the rewritten certificate served")
        reloaded = time.monotonic() - written
        env.kubectl("set", "image", "deployment/rotated", f"app={IMAGE}:v3")
        assert_held(env, "rotated", f"{IMAGE}:v3")
        print(
            f"\nshipped configuration (CEL as shipped) answered by a standby with --webhook-cert-dir; "
            f"rewritten certificate served {reloaded:.2f}s after the files changed, holds still answered"
        )
    finally:
        standby.stop()
        print(f"--- standby log (last lines) ---\n{standby.logs()}")
        # The module controller registers its own URL again.
        assert env.ctl is not None
        env.ctl.stop()
        env.start()


def _served(port: int) -> bytes | None:
    try:
        return served_certificate(port)
    except OSError:
        return None


def test_the_controller_down_refuses_only_template_changes_and_holds_again_after_a_restart(env: Env) -> None:
    deploy(env, "outage")
    assert env.ctl is not None
    env.ctl.kill()
    killed = time.monotonic()
    with pytest.raises(KubectlError) as refused:
        env.kubectl("set", "image", "deployment/outage", f"app={IMAGE}:v2")
    error = refused.value.stderr.strip()
    assert f'failed calling webhook "{WEBHOOK_NAME}"' in error, error
    d = settled(env, "outage")
    assert (
        d["spec"]["template"]["spec"]["containers"][0]["image"] == f"{IMAGE}:v1"
        and len(env.replica_sets("outage")) == 1
    )
    # A GitOps apply of the new template is refused the same way.
    apply = ["apply", "--server-side", "--force-conflicts", "--field-manager=argocd-controller", "-f", "-"]
    with pytest.raises(KubectlError) as refused_apply:
        env.kubectl(*apply, input=manifest("outage", f"{IMAGE}:v2"))
    assert WEBHOOK_NAME in refused_apply.value.stderr
    took = check_scaling_works(env, "outage")
    print(f"\ncontroller SIGKILLed; a template change is refused with:\n  {error}\nwhile scaling works: {took}")

    # Back: the same port; the refused apply goes through again, held.
    restarted = env.start()
    proc, seconds = timed(env, *apply, input=manifest("outage", f"{IMAGE}:v2", replicas=3))
    assert_held(env, "outage", f"{IMAGE}:v2")
    assert "held" in proc.stderr
    print(
        f"restarted: registered and answering {restarted:.2f}s after start "
        f"({time.monotonic() - killed:.1f}s after the kill); the re-apply held in {seconds:.3f}s"
    )
    # Every figure the API server has of the webhook, for the run.
    mean, calls = webhook_latency(env.cluster)
    print(f"API server: {calls} calls to {WEBHOOK_NAME} so far, mean {mean * 1000:.1f} ms")
