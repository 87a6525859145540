"""End-to-end: the install of config/default, and the controller running with exactly its RBAC.

The controller runs as a local process authenticated as the ServiceAccount of config/rbac (a
TokenRequest token, as in a pod), so every API call it makes goes through the ClusterRole that ships; a
missing permission fails the release, and any 403 in its log fails the test.

What is applied is `kubectl kustomize config/default` minus the controller Deployment: its image is not
in this cluster (KWOK would only pretend to run it), and a second controller would race the one under
test. Everything else is applied exactly as `kubectl apply -k config/default` would; the Deployment is
checked by the API server with a server-side dry run of the whole kustomization.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.controller import (
    ROOT,
    Controller,
    apply_release,
    deploy_app,
    deployment,
    drop_releases,
    events,
    gr,
    status,
    wait_for,
)
from e2e.harness.controlplane import Cluster, find_kubectl
from e2e.harness.process import free_port

pytestmark = pytest.mark.e2e

SYSTEM_NAMESPACE = "greyrelease-system"
SERVICE_ACCOUNT = "greyrelease-controller"
AS_CONTROLLER = f"--as=system:serviceaccount:{SYSTEM_NAMESPACE}:{SERVICE_ACCOUNT}"
SERVICE = {"service": {"name": "web"}}
# A refused request as kopf and the controller log it ("403 Forbidden: ...", kopf's "Not enough
# permissions"); not the milliseconds of a timestamp ("12:00:01,403").
DENIED_IN_LOG = re.compile(r"(?<![,.:\d])403\b|[Ff]orbidden|Not enough permissions")


def install_manifests(cluster: Cluster) -> list[dict[str, Any]]:
    """`kubectl kustomize config/default`, as objects."""
    built = cluster.kubectl("kustomize", str(ROOT / "config" / "default")).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc]


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> list[dict[str, Any]]:
    """config/default applied, except the controller Deployment (see the module docstring)."""
    objects = [o for o in install_manifests(cluster) if o["kind"] != "Deployment"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    cluster.kubectl("wait", "--for=condition=Established", "crd/greyreleases.greyrelease.io", "--timeout=30s")
    wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", SERVICE_ACCOUNT, "-n", SYSTEM_NAMESPACE, check=False).returncode
            == 0
        ),
        10,
        "the controller's ServiceAccount",
    )
    return objects


class ControllerAsServiceAccount(Controller):
    """`greyrelease run` with the ServiceAccount's kubeconfig, as the pod runs it (its Lease in
    greyrelease-system), but watching only the test's namespace."""

    def __init__(
        self, cluster: Cluster, namespace: str, log: Path, kubeconfig: Path, extra_args: list[str] | None = None
    ) -> None:
        # The base class picks the health port and passes it in its arguments.
        super().__init__(cluster, namespace, log, extra_env={"KUBECONFIG": str(kubeconfig)}, extra_args=extra_args)

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "greyrelease",
                "run",
                "--namespace",
                self.namespace,
                "--health-port",
                str(self.health_port),
                f"--leader-election-namespace={SYSTEM_NAMESPACE}",
                *self.args,
            ],
            cwd=ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def healthy(self) -> bool:
        return self.health() is not None

    def health(self) -> str | None:
        """The body of /healthz (it names the replica's role), None while it does not answer 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return resp.read().decode() if resp.status == 200 else None
        except OSError:
            return None

    def denials(self) -> list[str]:
        return [line for line in self.log.read_text(errors="replace").splitlines() if DENIED_IN_LOG.search(line)]

    def wait_phase(self, name: str, phases: set[str], timeout: float) -> dict[str, Any]:
        """Like e2e.harness.controller.wait_phase, but a permission denied in the log fails at once."""

        def check() -> dict[str, Any] | None:
            denied = self.denials()
            assert not denied, "\n".join(denied)
            st = status(self.cluster, self.namespace, name)
            return st if st.get("phase") in phases else None

        return wait_for(check, timeout, f"GreyRelease {name} in {phases}")


@pytest.fixture
def sa_controller(
    cluster: Cluster, installed: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> Iterator[ControllerAsServiceAccount]:
    kubeconfig = cluster.service_account_kubeconfig(SYSTEM_NAMESPACE, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig")
    ctl = ControllerAsServiceAccount(cluster, namespace, tmp_path / "controller.log", kubeconfig)
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        drop_releases(cluster, namespace)


def test_default_kustomization_passes_a_server_side_dry_run(cluster: Cluster, installed: list[dict[str, Any]]) -> None:
    proc = cluster.kubectl("apply", "-k", str(ROOT / "config" / "default"), "--dry-run=server")
    assert "deployment.apps/greyrelease-controller created (server dry run)" in proc.stdout, proc.stdout
    for kind in (
        "namespace",
        "customresourcedefinition.apiextensions.k8s.io",
        "serviceaccount",
        "clusterrole.rbac.authorization.k8s.io",
        "clusterrolebinding.rbac.authorization.k8s.io",
    ):
        assert f"{kind}/" in proc.stdout, proc.stdout
    # The pod meets the namespace's enforced "restricted" Pod Security level: no warning about it.
    assert "PodSecurity" not in proc.stderr, proc.stderr
    assert deployment(cluster, SYSTEM_NAMESPACE, "greyrelease-controller") is None  # a dry run it was


def test_the_manager_deployment_is_locked_down() -> None:
    built = subprocess.run(
        [find_kubectl(), "kustomize", str(ROOT / "config" / "default")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    [dep] = [o for o in yaml.safe_load_all(built) if o and o["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "greyrelease:0.1.0"
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT and dep["metadata"]["namespace"] == SYSTEM_NAMESPACE
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert set(container["resources"]) == {"requests", "limits"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "health", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert container["args"] == [
        "--health-port=8080",
        "--metrics-port=8090",
        "--leader-election-namespace=$(POD_NAMESPACE)",
        "--webhook-port=9443",
        "--webhook-service=greyrelease-webhook",
    ]
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    assert {"name": "metrics", "containerPort": 8090, "protocol": "TCP"} in container["ports"]
    assert container["env"] == [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]


def test_the_cluster_role_has_no_wildcards(installed: list[dict[str, Any]]) -> None:
    roles = [o for o in installed if o["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (role["metadata"]["name"], rule)


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("watch", "greyreleases.greyrelease.io", True),
        ("patch", "greyreleases.greyrelease.io/status", True),
        ("delete", "deployments.apps", True),
        ("list", "replicasets.apps", True),
        ("watch", "services", True),
        ("create", "events", True),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", True),
        ("get", "secrets", True),
        ("watch", "greyreleasepolicies.greyrelease.io", True),
        ("create", "greyreleasepolicies.greyrelease.io", False),
        ("delete", "greyreleases.greyrelease.io", False),
        ("update", "deployments.apps", False),
        ("list", "secrets", False),
        ("create", "pods", False),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io", False),
        ("create", "clusterroles.rbac.authorization.k8s.io", False),
    ],
    ids=lambda v: str(v),
)
def test_service_account_may_do_its_job_and_no_more(
    cluster: Cluster, installed: list[dict[str, Any]], verb: str, resource: str, allowed: bool
) -> None:
    proc = cluster.kubectl("auth", "can-i", verb, resource, "--all-namespaces", AS_CONTROLLER, check=False)
    assert proc.stdout.strip() == ("yes" if allowed else "no"), (verb, resource, proc.stdout, proc.stderr)


def test_leases_only_in_the_controller_namespace(cluster: Cluster, installed: list[dict[str, Any]]) -> None:
    def can(ns: str) -> str:
        return cluster.kubectl(
            "auth", "can-i", "update", "leases.coordination.k8s.io", "-n", ns, AS_CONTROLLER, check=False
        ).stdout.strip()

    assert can(SYSTEM_NAMESPACE) == "yes" and can("default") == "no"


def _review() -> dict[str, Any]:
    def dep(image: str) -> dict[str, Any]:
        template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": image}]}}
        labels = {"app": "web", "greyrelease.io/release": "web"}
        return {"metadata": {"name": "web", "labels": labels}, "spec": {"replicas": 2, "template": template}}

    request = {
        "uid": "e2e",
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "operation": "UPDATE",
        "object": dep("registry.example/app:v2"),
        "oldObject": dep("registry.example/app:v1"),
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def test_the_webhook_installs_and_answers_with_only_the_shipped_rbac(
    cluster: Cluster, installed: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> None:
    """config/webhook: the controller, as the ServiceAccount and with the flags the install gives it, makes
    its CA and certificate into the Secret greyrelease-webhook-tls and puts the CA into the shipped
    configuration's caBundle; the webhook answers over TLS verified as the API server verifies it (the
    Service's DNS name, that caBundle). The local API server cannot reach a Service (no kube-proxy), so the
    review is posted here; e2e/test_admission.py has the API server call the same configuration by URL."""
    kubeconfig = cluster.service_account_kubeconfig(SYSTEM_NAMESPACE, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig")
    port = free_port()
    args = ["--webhook-port", str(port), "--webhook-service", "greyrelease-webhook"]
    ctl = ControllerAsServiceAccount(cluster, namespace, tmp_path / "controller.log", kubeconfig, args)
    ctl.start()
    try:

        def bundle() -> str | None:
            config = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "greyrelease-hold")
            ca_bundle: str | None = config["webhooks"][0]["clientConfig"].get("caBundle")
            return ca_bundle

        ca = base64.b64decode(wait_for(bundle, 60, "the caBundle set by the controller"))
        secret = cluster.kubectl_json("get", "secret", "greyrelease-webhook-tls", "-n", SYSTEM_NAMESPACE)
        assert base64.b64decode(secret["data"]["ca.crt"]) == ca
        body = json.dumps(_review()).encode()
        context = ssl.create_default_context(cadata=ca.decode())
        host = f"greyrelease-webhook.{SYSTEM_NAMESPACE}.svc"
        raw = socket.create_connection(("127.0.0.1", port), timeout=5)
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(
                b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
        response = json.loads(answer.partition(b"\r\n\r\n")[2])["response"]
        assert response["allowed"] is True and response["patchType"] == "JSONPatch", response
        time.sleep(1)  # let the last lines reach the log
        assert ctl.denials() == [], ctl.logs()
    finally:
        ctl.stop()
        # failurePolicy Fail towards a Service this cluster cannot reach: gone, so no later test meets it.
        cluster.kubectl("delete", "mutatingwebhookconfiguration", "greyrelease-hold", "--ignore-not-found")


def test_release_and_abort_with_only_the_shipped_rbac(
    cluster: Cluster, namespace: str, sa_controller: ControllerAsServiceAccount
) -> None:
    try:
        wait_for(sa_controller.healthy, 30, "the controller's /healthz")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{sa_controller.logs()}") from None
    deploy_app(cluster, namespace, replicas=4)

    # A whole release, to the end.
    batches = [{"replicas": 2, "pause": "1s"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v2", batches=batches, trafficRouting=SERVICE),
    )
    st = sa_controller.wait_phase("web", {"Succeeded", "Failed", "Aborted", "InvalidSpec"}, timeout=90)
    assert st["phase"] == "Succeeded", (st, sa_controller.logs())
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v2"
    assert deployment(cluster, namespace, "web-canary") is None

    # The next version, aborted while it waits for approval: everything back to v2.
    batches = [{"replicas": 2, "pause": "manual"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        gr("web", targetRef={"name": "web"}, targetVersion="v3", batches=batches, trafficRouting=SERVICE),
    )
    wait_for(
        lambda: (
            (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt")
            and status(cluster, namespace, "web").get("targetVersion") == "v3"
        ),
        60,
        "batch 1 of v3 live",
    )
    cluster.kubectl("annotate", "gr", "web", "-n", namespace, "greyrelease.io/abort=true")
    st = sa_controller.wait_phase("web", {"Aborted"}, timeout=60)
    wait_for(lambda: deployment(cluster, namespace, "web-canary") is None, 30, "canary removed")
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v2"
    assert cluster.kubectl_json("get", "service", "web", "-n", namespace)["spec"]["selector"] == {"app": "web"}

    # Deleting it: the controller lets its finalizer go.
    cluster.kubectl("delete", "gr", "web", "-n", namespace, "--wait=false")
    wait_for(
        lambda: cluster.kubectl("get", "gr", "web", "-n", namespace, check=False).returncode != 0, 30, "release deleted"
    )

    # Events were posted by the controller itself, as the ServiceAccount.
    reasons = [e["reason"] for e in events(cluster, namespace, "web")]
    assert "Succeeded" in reasons and "Aborted" in reasons, reasons
    time.sleep(1)  # let the last lines reach the log
    assert sa_controller.denials() == [], sa_controller.logs()
    assert sa_controller.proc is not None and sa_controller.proc.poll() is None, sa_controller.logs()


def test_the_sharded_install_passes_a_server_side_dry_run(cluster: Cluster, installed: list[dict[str, Any]]) -> None:
    built = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(ROOT / "config" / "sharded")).stdout) if d]
    manager = next(d for d in built if d["kind"] == "Deployment")
    args = manager["spec"]["template"]["spec"]["containers"][0]["args"]
    assert manager["spec"]["replicas"] == 3 and "--shards=3" in args
    proc = cluster.kubectl("apply", "-k", str(ROOT / "config" / "sharded"), "--dry-run=server")
    assert "deployment.apps/greyrelease-controller created (server dry run)" in proc.stdout, proc.stdout


def test_a_sharded_replica_runs_a_release_with_only_the_shipped_rbac(
    cluster: Cluster, installed: list[dict[str, Any]], namespace: str, tmp_path: Path
) -> None:
    """One replica run with --shards 2 holds both shards (its Leases, its member Lease, the sharded lists and
    watches), runs a release to the end, and is never denied anything."""
    kubeconfig = cluster.service_account_kubeconfig(SYSTEM_NAMESPACE, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig")
    ctl = ControllerAsServiceAccount(cluster, namespace, tmp_path / "controller.log", kubeconfig, ["--shards", "2"])
    ctl.start()
    try:
        wait_for(lambda: (ctl.health() or "").find("shards 0,1 of 2") >= 0, 60, "both shards held")
        deploy_app(cluster, namespace, replicas=4)
        apply_release(
            cluster,
            namespace,
            gr(
                "web",
                targetRef={"name": "web"},
                targetVersion="v2",
                batches=[{"replicas": 2, "pause": "1s"}, {"replicas": 4}],
                trafficRouting=SERVICE,
            ),
        )
        st = ctl.wait_phase("web", {"Succeeded", "Failed", "Aborted", "InvalidSpec"}, timeout=90)
        assert st["phase"] == "Succeeded", (st, ctl.logs())
        time.sleep(1)  # let the last lines reach the log
        assert ctl.denials() == [], ctl.logs()
    finally:
        ctl.stop()
        drop_releases(cluster, namespace)
    members = cluster.kubectl_json("get", "leases", "-n", SYSTEM_NAMESPACE, "-l", "greyrelease.io/member")["items"]
    assert members == [], "the member Lease is deleted on a clean stop"
