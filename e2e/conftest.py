"""pytest fixtures for end-to-end tests against a real cluster and a real Prometheus.

- `cluster` (session): the cluster KUBECONFIG points at when it is reachable, else a local one started
  for the session (e2e/cluster.py) and stopped at its end.
- `prometheus` (session): Prometheus + the test exporter (e2e/prom.py).
- `namespace` (function): a fresh namespace, deleted after the test.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import Cluster, LocalCluster, external_cluster
from e2e.prom import PrometheusStack, find_prometheus


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    existing = external_cluster()
    if existing is not None:
        yield existing
        return
    local = LocalCluster(Path(tempfile.mkdtemp(prefix="greyrelease-cluster-")))
    try:
        local.start()
    except FileNotFoundError as exc:
        shutil.rmtree(local.workdir, ignore_errors=True)
        pytest.fail(f"cannot start the local cluster: {exc}")
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
    stack = PrometheusStack(Path(tempfile.mkdtemp(prefix="greyrelease-prometheus-")), binary)
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
