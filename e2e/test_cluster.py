"""The local cluster and Prometheus behave like the real things the controller will meet.

Everything goes through the real kubectl binary, as a user would type it.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.controlplane import Cluster, KubectlError
from e2e.harness.process import wait_until
from e2e.harness.prometheus import PrometheusQueryError, PrometheusStack

pytestmark = pytest.mark.e2e


def deployment(name: str, image: str, replicas: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image, "ports": [{"containerPort": 8080}]}]},
            },
        },
    }


def pod(
    name: str,
    image: str,
    labels: dict[str, str] | None = None,
    restart: str = "Always",
    extra_containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": restart,
            "containers": [{"name": "app", "image": image}, *(extra_containers or [])],
        },
    }


def apply(cluster: Cluster, namespace: str, *objects: dict[str, Any]) -> None:
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return str(cond["status"])
    return None


# --- nodes and workloads -------------------------------------------------------------------------------


def test_kwok_nodes_are_ready(cluster: Cluster) -> None:
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    kwok = [n for n in nodes if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"]
    assert len(kwok) >= 3
    assert all(condition(n, "Ready") == "True" for n in kwok)
    table = cluster.kubectl("get", "nodes", "--no-headers").stdout
    for n in kwok:
        assert any(line.split()[:2] == [n["metadata"]["name"], "Ready"] for line in table.splitlines())


def test_deployment_becomes_ready_serves_endpoints_and_is_garbage_collected(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        deployment("web", "registry.example/web:v1", replicas=3),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")
    dep = cluster.kubectl_json("get", "deployment", "web", "-n", namespace)
    assert dep["status"]["readyReplicas"] == 3
    assert dep["status"]["availableReplicas"] == 3

    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=web")["items"]
    assert len(pods) == 3
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    pod_ips = {p["status"]["podIP"] for p in pods}
    assert len(pod_ips) == 3 and all(pod_ips)

    def slice_ips() -> set[str] | None:
        slices = cluster.kubectl_json("get", "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=web")[
            "items"
        ]
        ips = {
            addr
            for s in slices
            for ep in s.get("endpoints") or []
            if ep.get("conditions", {}).get("ready")
            for addr in ep["addresses"]
        }
        return ips if ips == pod_ips else None

    wait_until(slice_ips, 30, "the pod IPs in the Service's EndpointSlices")

    cluster.kubectl("delete", "deployment", "web", "-n", namespace)
    wait_until(
        lambda: not cluster.kubectl_json("get", "replicasets,pods", "-n", namespace, "-l", "app=web")["items"],
        30,
        "the garbage collector to remove the ReplicaSet and its pods",
    )


def _assert_stays_running_unready(cluster: Cluster, namespace: str, name: str, seconds: float = 5.0) -> None:
    def running() -> dict[str, Any] | None:
        p = cluster.kubectl_json("get", "pod", name, "-n", namespace)
        return p if p["status"].get("phase") == "Running" else None

    wait_until(running, 30, f"pod {name} to run")
    end = time.monotonic() + seconds
    checks = 0
    while time.monotonic() < end:
        p = cluster.kubectl_json("get", "pod", name, "-n", namespace)
        assert p["status"]["phase"] == "Running"
        assert condition(p, "Ready") == "False"
        assert p["status"]["containerStatuses"][0]["ready"] is False
        checks += 1
        time.sleep(0.5)
    assert checks >= 5


@pytest.mark.parametrize(
    ("labels", "image"),
    [
        ({"e2e.greyrelease.io/never-ready": "true"}, "registry.example/app:v1"),
        ({}, "registry.example/app:never-ready"),
        ({}, "registry.example:5000/team/app:never-ready"),
    ],
    ids=["label", "image-tag", "image-tag-registry-port"],
)
def test_never_ready_pod_runs_but_stays_unready(
    cluster: Cluster, namespace: str, labels: dict[str, str], image: str
) -> None:
    apply(cluster, namespace, pod("stuck", image, labels))
    _assert_stays_running_unready(cluster, namespace, "stuck")


def test_never_ready_image_tag_holds_a_deployment_unavailable(cluster: Cluster, namespace: str) -> None:
    apply(cluster, namespace, deployment("canary", "registry.example/app:never-ready", replicas=2))
    wait_until(
        lambda: len(cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=canary")["items"]) == 2,
        30,
        "two canary pods",
    )
    time.sleep(4)
    dep = cluster.kubectl_json("get", "deployment", "canary", "-n", namespace)
    assert dep["status"].get("readyReplicas", 0) == 0
    assert dep["status"].get("unavailableReplicas") == 2


@pytest.mark.parametrize(
    "image",
    ["registry.example:5000/app", "registry.example/app@sha256:" + "0" * 64, "registry.example/app:never-ready-2"],
    ids=["port-no-tag", "digest", "similar-tag"],
)
def test_other_images_become_ready(cluster: Cluster, namespace: str, image: str) -> None:
    # The second container's tag must not matter: the rule looks at the first container only.
    apply(cluster, namespace, pod("fine", image, extra_containers=[{"name": "side", "image": "side:fail"}]))
    cluster.kubectl("wait", "pod/fine", "-n", namespace, "--for=condition=Ready", "--timeout=30s")


def test_failing_pod_fails(cluster: Cluster, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        pod("doomed", "registry.example/app:v1", {"e2e.greyrelease.io/fail": "true"}, restart="Never"),
    )
    cluster.kubectl("wait", "pod/doomed", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "--timeout=30s")
    status = cluster.kubectl_json("get", "pod", "doomed", "-n", namespace)["status"]
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 1 and terminated["reason"] == "Error"


def test_fail_image_tag_crash_loops_in_a_deployment(cluster: Cluster, namespace: str) -> None:
    apply(cluster, namespace, deployment("crashy", "registry.example/app:fail", replicas=2))

    def crashing() -> list[dict[str, Any]] | None:
        pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "app=crashy")["items"]
        waiting = [
            p
            for p in pods
            if p["status"].get("containerStatuses") and p["status"]["containerStatuses"][0]["state"].get("waiting")
        ]
        return waiting if len(waiting) == 2 else None

    for p in wait_until(crashing, 30, "two crash-looping pods"):
        cs = p["status"]["containerStatuses"][0]
        assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert cs["lastState"]["terminated"]["exitCode"] == 1
        assert cs["ready"] is False
        assert condition(p, "Ready") == "False"
    dep = cluster.kubectl_json("get", "deployment", "crashy", "-n", namespace)
    assert dep["status"].get("readyReplicas", 0) == 0


# --- API machinery the controller relies on ----------------------------------------------------------------

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.e2e.greyrelease.io
spec:
  group: e2e.greyrelease.io
  names: {kind: Widget, plural: widgets, singular: widget, shortNames: [wdg]}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Phase, type: string, jsonPath: .status.phase}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
              mode: {type: string}
            x-kubernetes-validations:
            - rule: "!has(self.mode) || self.mode in ['fast', 'slow']"
              message: "mode must be fast or slow"
              fieldPath: .mode
          status:
            type: object
            properties:
              phase: {type: string}
"""


def widget(spec: dict[str, Any]) -> str:
    return json.dumps(
        {"apiVersion": "e2e.greyrelease.io/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": spec}
    )


def test_crd_validation_printer_columns_and_status_subresource(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    try:
        cluster.kubectl("wait", "crd/widgets.e2e.greyrelease.io", "--for=condition=Established", "--timeout=30s")
        # Discovery can lag the Established condition by a moment.
        wait_until(
            lambda: cluster.kubectl("get", "widgets", "-n", namespace, check=False).returncode == 0,
            30,
            "the Widget resource to be served",
        )

        with pytest.raises(KubectlError) as refused:
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget({"size": 0}))
        assert "spec.size" in refused.value.stderr
        assert "greater than or equal to 1" in refused.value.stderr
        with pytest.raises(KubectlError) as refused_cel:
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget({"size": 2, "mode": "warp"}))
        assert "spec.mode" in refused_cel.value.stderr and "mode must be fast or slow" in refused_cel.value.stderr

        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget({"size": 3}))
        cluster.kubectl(
            "patch",
            "widget",
            "w1",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"phase": "Ready"}}',
        )
        table = cluster.kubectl("get", "wdg", "-n", namespace).stdout.splitlines()
        assert table[0].split() == ["NAME", "SIZE", "PHASE", "AGE"]
        assert table[1].split()[:3] == ["w1", "3", "Ready"]

        # Through the main resource, spec changes and a status change is ignored.
        cluster.kubectl(
            "patch",
            "widget",
            "w1",
            "-n",
            namespace,
            "--type=merge",
            "-p",
            '{"spec": {"size": 4}, "status": {"phase": "Tampered"}}',
        )
        obj = cluster.kubectl_json("get", "widget", "w1", "-n", namespace)
        assert obj["spec"]["size"] == 4
        assert obj["status"]["phase"] == "Ready"
        assert obj["metadata"]["generation"] == 2
    finally:
        cluster.kubectl(
            "delete", "crd", "widgets.e2e.greyrelease.io", "--ignore-not-found", "--wait=false", check=False
        )


def test_service_account_token_is_authenticated_and_authorized_by_rbac(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    cluster.kubectl(
        "create", "rolebinding", "reader", "-n", namespace, "--clusterrole=view", f"--serviceaccount={namespace}:reader"
    )
    # The root CA publisher runs: pods could verify the API server.
    wait_until(
        lambda: cluster.kubectl("get", "configmap", "kube-root-ca.crt", "-n", namespace, check=False).returncode == 0,
        30,
        "kube-root-ca.crt",
    )
    sa = Cluster(kubeconfig=cluster.service_account_kubeconfig(namespace, "reader", tmp_path / "sa.kubeconfig"))
    whoami = sa.kubectl_json("auth", "whoami")
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"
    assert sa.kubectl("get", "pods", "-n", namespace).returncode == 0
    denied = sa.kubectl("get", "pods", "-n", "kube-system", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    assert sa.kubectl("auth", "can-i", "create", "pods", "-n", namespace, check=False).stdout.strip() == "no"


def test_apiserver_counts_writes(cluster: Cluster, namespace: str) -> None:
    before = cluster.api_request_total(verb="POST", resource="configmaps")
    for i in range(3):
        cluster.kubectl("create", "configmap", f"c{i}", "-n", namespace)
    after = cluster.api_request_total(verb="POST", resource="configmaps")
    assert after - before >= 3


# --- Prometheus ----------------------------------------------------------------------------------------------


def test_prometheus_returns_the_rates_set_on_the_exporter(prometheus: PrometheusStack) -> None:
    app = f"app-{secrets.token_hex(3)}"
    prometheus.set_rates("demo", app, "canary", rps=5, error_ratio=0.2, latency_seconds=0.3)
    prometheus.set_rates("demo", app, "stable", rps=20, error_ratio=0.0, latency_seconds=0.05)
    try:
        rate = prometheus.wait_for_query(
            f'sum(rate(http_requests_total{{app="{app}",track="canary"}}[5s]))', 5.0, rel_tolerance=0.15
        )
        assert rate is not None and 4.25 <= rate <= 5.75
        prometheus.wait_for_query(
            f'sum(rate(http_requests_total{{app="{app}",track="stable"}}[5s]))', 20.0, rel_tolerance=0.15
        )
        prometheus.wait_for_query(
            f'sum(rate(http_request_errors_total{{app="{app}",track="canary"}}[10s]))'
            f' / sum(rate(http_requests_total{{app="{app}",track="canary"}}[10s]))',
            0.2,
            rel_tolerance=0.2,
        )
        p99 = prometheus.wait_for_query(
            f"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket"
            f'{{app="{app}",track="canary"}}[5s])))',
            lambda v: v is not None and 0.25 < v <= 0.3,
        )
        assert p99 is not None
        assert prometheus.query(f'sum(rate(http_request_errors_total{{app="{app}",track="stable"}}[5s]))') == 0

        # rps 0: the series stays, its rate drops to 0.
        prometheus.set_rates("demo", app, "canary", rps=0)
        prometheus.wait_for_query(f'sum(rate(http_requests_total{{app="{app}",track="canary"}}[3s]))', 0.0)
    finally:
        prometheus.reset("demo", app, "canary")
        prometheus.reset("demo", app, "stable")
    prometheus.wait_for_query(f'sum(http_requests_total{{app="{app}"}})', None, timeout=20)


def test_prometheus_outage_and_extra_scrape_target(prometheus: PrometheusStack) -> None:
    # Prometheus scraping its own /metrics stands in for the controller's endpoint.
    target = f"127.0.0.1:{prometheus.port}"
    prometheus.add_scrape_target(target, "self-check")
    try:
        prometheus.wait_for_query('sum(up{job="self-check"})', 1, timeout=20)
        prometheus.stop()
        with pytest.raises(OSError):
            prometheus.query("up")
        prometheus.start()
        assert prometheus.running
        prometheus.wait_for_query('sum(up{job="exporter"})', 1, timeout=20)
        with pytest.raises(PrometheusQueryError):
            prometheus.query("sum(rate(")
    finally:
        prometheus.remove_scrape_target(target)
