"""metrics-server on the local cluster, behind the API server's aggregation layer, scraping KWOK's simulated
kubelets: what the HorizontalPodAutoscaler controller of kube-controller-manager reads to scale.

- :class:`MetricsServer`: ``metrics-server`` (built by e2e/build/build.sh) as a process on 127.0.0.1, and what
  makes the API server serve ``metrics.k8s.io`` through it: the Service ``kube-system/metrics-server`` of type
  ExternalName (127.0.0.1: the aggregator sends to an ExternalName's host and the APIService's port, where
  the cluster has no kube-proxy to reach a ClusterIP) and the APIService ``v1beta1.metrics.k8s.io``. The
  aggregator authenticates to it with the front proxy's client certificate (the API server's
  ``--proxy-client-cert-file``), which it checks against the request-header CA that the API server publishes
  in ``kube-system/extension-apiserver-authentication``; it asks the API server whether the user the
  aggregator names may read the metrics. It scrapes each node at its InternalIP (127.0.0.1: KWOK's
  ``--node-ip``) on KWOK's server port, at the path the node's ``metrics.k8s.io/resource-metrics-path``
  annotation names, every ``--metric-resolution`` (10 s, the least it takes); KWOK's certificate there is
  its own self-signed one (``--kubelet-insecure-tls``).
- :func:`set_cpu`: the CPU every container of a namespace's pods uses from now on, as KWOK computes it
  (e2e/kwok/metrics.yaml reads it from an annotation on the Nodes, so pods created later use it too);
  :func:`pod_metrics`: what ``metrics.k8s.io`` says of a namespace's pods now.

A pod's CPU is a rate over two scrapes: a change of usage shows in ``metrics.k8s.io`` after 10-20 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from e2e.harness.controlplane import KubectlError, LocalCluster
from e2e.harness.process import Process, ProcessDied, free_port, wait_until

APISERVICE = "v1beta1.metrics.k8s.io"
SERVICE = "metrics-server"
CPU_ANNOTATION = "e2e.greyrelease.io/cpu."  # + the namespace: see e2e/kwok/metrics.yaml
RESOLUTION_SECONDS = 10


def _registration(port: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": SERVICE, "namespace": "kube-system"},
                    "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
                },
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": APISERVICE},
                    "spec": {
                        "group": "metrics.k8s.io",
                        "version": "v1beta1",
                        "service": {"name": SERVICE, "namespace": "kube-system", "port": port},
                        # metrics-server serves a certificate it makes itself at start.
                        "insecureSkipTLSVerify": True,
                        "groupPriorityMinimum": 100,
                        "versionPriority": 100,
                    },
                },
            ],
        }
    )


class MetricsServer:
    """``metrics-server`` for ``cluster``, its log and serving certificate in ``workdir``."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.port = 0
        self.process: Process | None = None

    def start(self, timeout: float = 60.0) -> float:
        """Starts it and registers it; returns once the API server answers a request for pod metrics through it
        (the aggregation layer, metrics-server's authentication of it, its authorization), in seconds. (A node
        without pods has no complete metrics: KWOK's are its pods' sums.) Started again on another port when
        another process took its port between the pick and its bind."""
        binary = self.cluster.bin / "metrics-server"
        if not binary.is_file():
            raise RuntimeError(f"missing {binary}: run e2e/build/build.sh first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for attempt in range(3):
            try:
                self._start_once(binary, timeout)
                break
            except ProcessDied as exc:
                if not exc.port_in_use or attempt == 2:
                    raise
        return time.monotonic() - started

    def _start_once(self, binary: Path, timeout: float) -> None:
        self.port = free_port()
        kubeconfig = str(self.cluster.kubeconfig)  # the admin's: its own RBAC is not what a test looks at
        self.process = Process(
            name="metrics-server",
            args=[
                str(binary),
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={self.workdir / 'certs'}",
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-port={self.cluster.ports['kwok']}",
                "--kubelet-insecure-tls",
                f"--metric-resolution={RESOLUTION_SECONDS}s",
                "--kubelet-request-timeout=5s",
                "--v=1",
            ],
            log=self.workdir / "metrics-server.log",
        )
        self.process.start()
        self.cluster.kubectl("apply", "-f", "-", input=_registration(self.port))

        def served() -> bool:
            self.process_alive()
            path = "/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods"
            proc = self.cluster.kubectl("get", "--raw", path, check=False)
            return proc.returncode == 0 and json.loads(proc.stdout).get("kind") == "PodMetricsList"

        try:
            wait_until(served, timeout, "metrics-server serving pod metrics through the API server", 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n--- metrics-server log ---\n{self.logs()}") from None

    def process_alive(self) -> None:
        assert self.process is not None
        self.process.check_alive()

    def logs(self, lines: int = 30) -> str:
        return self.process.tail(lines) if self.process is not None else "(not started)"

    def stop(self) -> None:
        """Unregisters it (the API server then serves no metrics.k8s.io) and stops it."""
        self.cluster.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        self.cluster.kubectl("delete", "service", SERVICE, "-n", "kube-system", "--ignore-not-found", check=False)
        if self.process is not None:
            self.process.stop()


def set_cpu(cluster: LocalCluster, namespace: str, quantity: str | None) -> None:
    """Every container of ``namespace``'s pods uses ``quantity`` of CPU from now on (``None``: the 1m default),
    as KWOK's metrics say: the annotation on every Node that e2e/kwok/metrics.yaml reads."""
    key = CPU_ANNOTATION + namespace
    value = f"{key}={quantity}" if quantity is not None else f"{key}-"
    cluster.kubectl("annotate", "nodes", "--all", "--overwrite", value)


def pod_metrics(cluster: LocalCluster, namespace: str) -> dict[str, dict[str, Any]]:
    """``metrics.k8s.io``'s PodMetrics of ``namespace``, by pod name (none while no scrape has two points)."""
    path = f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods"
    proc = cluster.kubectl("get", "--raw", path, check=False)
    if proc.returncode != 0:
        raise KubectlError(proc.returncode, ["kubectl", "get", "--raw", path], proc.stdout, proc.stderr)
    return {p["metadata"]["name"]: p for p in json.loads(proc.stdout).get("items") or []}


def millicores(quantity: str) -> float:
    """A CPU quantity as metrics.k8s.io writes it (``250m``, ``1``, ``123456n``, ``12u``) in millicores."""
    units = {"n": 1e-6, "u": 1e-3, "m": 1.0}
    if quantity and quantity[-1] in units:
        return float(quantity[:-1]) * units[quantity[-1]]
    return float(quantity) * 1000
