"""pytest fixtures for end-to-end tests against a real cluster, a real Prometheus and a real proxy.

- `cluster` (session): the cluster KUBECONFIG points at when it is reachable, else a local one started
  for the session (e2e/harness/controlplane.py) and stopped at its end.
- `prometheus` (session): Prometheus + the test exporter (e2e/harness/prometheus.py). When the session also
  uses `dataplane`, the same Prometheus scrapes Traefik (job `traefik`), so a test can query the exporter's
  and the proxy's series alike.
- `gateway_api_crds` (session): the Gateway API v1.4.1 standard-channel CRDs installed and Established.
- `dataplane` (session): Traefik in front of pods that answer HTTP (e2e/harness/dataplane.py), started only
  for sessions with a test that asks for it (Traefik costs CPU in every session that runs it); needs the
  local cluster (skipped on a cluster reached through KUBECONFIG, whose pods it cannot serve) and root.
  Gives `.gateway_url` (Traefik's HTTP entry point: the Gateway's listener, and Ingresses of class
  `traefik`), `.gateway` ("namespace/name" of the Gateway, for an HTTPRoute's parentRefs), `.metrics_url`
  (Traefik's /metrics), `.parent_ref` (an HTTPRoute parentRef to the Gateway), `.serving_gate` (the
  readiness gate a pod template lists so its pods become Ready only once they answer; `answering_app()` in
  e2e/harness/dataplane.py writes such a Deployment and its Service).
- `metrics_server` (session): metrics-server behind the API server's aggregation layer, scraping KWOK's
  simulated kubelets (e2e/harness/metrics_server.py), started only for sessions with a test that asks for it;
  needs the local cluster.
- `namespace` (function): a fresh namespace, deleted after the test.
- `crd` (session): the CRDs that ship (crds/: GreyRelease and GreyReleasePolicy), applied and Established.
- `controller` (function): `greyrelease run` as its own process watching `namespace` (e2e/harness/controller.py);
  stopped after the test, its log printed, and the namespace's GreyReleases dropped.
- `local_cluster` (function): `cluster`, for tests that need the local one (its audit log, its processes);
  skipped on a cluster reached through KUBECONFIG.
- `follower` (function): `greyrelease run --webhook-port P` watching `namespace`, ready and its admission
  webhook registered (e2e/harness/follow.py); stopped after the test, its log printed, its webhook removed.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.controller import CRD, POLICY_CRD, Controller, drop_releases
from e2e.harness.controlplane import Cluster, LocalCluster, external_cluster
from e2e.harness.dataplane import DataPlane, install_gateway_api_crds
from e2e.harness.follow import Follower
from e2e.harness.metrics_server import MetricsServer
from e2e.harness.process import new_workdir, sweep_stale_workdirs
from e2e.harness.prometheus import PrometheusStack, find_prometheus


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = external_cluster()
    if existing is not None:
        yield existing
        return
    sweep_stale_workdirs()
    local = LocalCluster(new_workdir("greyrelease-cluster-"))
    local.start()  # removes its work directory itself when it fails
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusStack]:
    try:
        binary = find_prometheus()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    stack = PrometheusStack(new_workdir("greyrelease-prometheus-"), binary)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="session")
def gateway_api_crds(cluster: Cluster) -> list[Path]:
    return install_gateway_api_crds(cluster)


@pytest.fixture(scope="session")
def dataplane(cluster: Cluster, prometheus: PrometheusStack, gateway_api_crds: list[Path]) -> Iterator[DataPlane]:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the data plane serves the pods of the local cluster only; KUBECONFIG reaches another one")
    plane = DataPlane(cluster, new_workdir("greyrelease-dataplane-"), prometheus)
    try:
        plane.start()
    except RuntimeError as exc:
        pytest.fail(f"the data plane did not start: {exc}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def metrics_server(cluster: Cluster) -> Iterator[MetricsServer]:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("metrics-server scrapes the local cluster's simulated kubelets; KUBECONFIG reaches another one")
    server = MetricsServer(cluster, cluster.workdir / "metrics-server")
    try:
        took = server.start()
    except (RuntimeError, TimeoutError) as exc:
        server.stop()
        pytest.fail(f"metrics-server did not start: {exc}")
    print(f"\nmetrics-server serving metrics.k8s.io in {took:.1f}s")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")
    base = re.sub(r"^test-", "", base)[:40].strip("-")
    name = f"e2e-{base}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for_namespace_ready(name)
    try:
        yield name
    finally:
        # Not waiting: the namespace controller and KWOK finish the cleanup while the next test runs.
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> Path:
    """The CRDs that ship, applied with kubectl and established."""
    cluster.kubectl("apply", "-f", str(CRD), "-f", str(POLICY_CRD))
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/greyreleases.greyrelease.io",
        "crd/greyreleasepolicies.greyrelease.io",
        "--timeout=30s",
    )
    return CRD


@pytest.fixture
def controller(cluster: Cluster, crd: Path, namespace: str, tmp_path: Path) -> Iterator[Controller]:
    ctl = Controller(cluster, namespace, tmp_path / "controller.log")
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()
        # pytest shows a test's captured output only when it fails: then the controller's log helps.
        print(f"--- controller log (last lines) ---\n{ctl.logs()}")
        drop_releases(cluster, namespace)


@pytest.fixture
def local_cluster(cluster: Cluster) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("needs the local cluster (its audit log, its processes); KUBECONFIG reaches another one")
    return cluster


@pytest.fixture
def follower(local_cluster: LocalCluster, crd: Path, namespace: str, tmp_path: Path) -> Iterator[Follower]:
    f = Follower(local_cluster, namespace, tmp_path / "controller.log")
    took = f.start()
    print(f"\ncontroller and webhook ready in {took:.1f}s")
    try:
        yield f
    finally:
        f.stop()
