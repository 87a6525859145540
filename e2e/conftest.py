"""pytest fixtures for end-to-end tests against a real cluster and a real Prometheus.

- `cluster` (session): the cluster KUBECONFIG points at when it is reachable, else a local one started
  for the session (e2e/cluster.py) and stopped at its end.
- `prometheus` (session): Prometheus + the test exporter (e2e/prom.py).
- `namespace` (function): a fresh namespace, deleted after the test.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import pytest

from e2e.cluster import Cluster, LocalCluster, external_cluster, new_workdir, sweep_stale_workdirs
from e2e.prom import PrometheusStack, find_prometheus


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
