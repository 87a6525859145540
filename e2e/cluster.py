"""A real local Kubernetes control plane, Prometheus and data plane for the end-to-end tests and the demo.

The harness lives in e2e/harness/ (one module per concern: process supervision, the control plane,
Prometheus, the data plane, the pod network, the pod responders, the command line). This module is the
command line's entry point, `python -m e2e.cluster up|status|down` (see e2e/harness/cli.py), and keeps the
names scripts import from it.
"""

from __future__ import annotations

import sys

from e2e.harness.cli import main
from e2e.harness.controlplane import (
    KWOK_STAGES,
    NODE_NAMES,
    Cluster,
    KubectlError,
    LocalCluster,
    external_cluster,
    find_kubectl,
    start_local_cluster,
)
from e2e.harness.process import free_port, free_ports, new_workdir, sweep_stale_workdirs, wait_until

__all__ = [
    "KWOK_STAGES",
    "NODE_NAMES",
    "Cluster",
    "KubectlError",
    "LocalCluster",
    "external_cluster",
    "find_kubectl",
    "free_port",
    "free_ports",
    "main",
    "new_workdir",
    "start_local_cluster",
    "sweep_stale_workdirs",
    "wait_until",
]

if __name__ == "__main__":
    sys.exit(main())
