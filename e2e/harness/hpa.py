"""The HorizontalPodAutoscaler's writes, emulated as the HPA controller makes them.

The HPA controller (in kube-controller-manager, run with ``--use-service-account-credentials``) acts as
``system:serviceaccount:kube-system:horizontal-pod-autoscaler``, whose ClusterRole
``system:controller:horizontal-pod-autoscaler`` allows ``get`` and ``update`` of ``*/scale`` and nothing on
Deployments themselves (no ``patch`` of the scale either). To rescale it GETs the target's scale subresource
and PUTs it back with the new ``spec.replicas`` and the ``resourceVersion`` it read (so a write in between
makes it fail with 409 Conflict, and it tries again at its next sync); it writes nothing when the count is
already right. :meth:`HPA.scale_to` does the same with kubectl impersonating that account (``--as``)::

    kubectl get --raw /apis/apps/v1/namespaces/NS/deployments/NAME/scale
    kubectl replace --raw '/apis/apps/v1/namespaces/NS/deployments/NAME/scale?fieldManager=...' -f -

The real controller sends no ``fieldManager``: the API server names the manager after its user agent,
``kube-controller-manager``. kubectl's user agent would give ``kubectl``, so the parameter is set to what
the real one gets. ``kubectl scale`` and ``kubectl patch --subresource=scale`` under the same account are
refused (the first reads the Deployment, the second patches): see e2e/test_gitops_harness.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from e2e.harness.controlplane import Cluster, KubectlError

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
HPA_FIELD_MANAGER = "kube-controller-manager"


@dataclass(frozen=True)
class ScaleWrite:
    """One rescale: the count read and the count asked, and how the PUT went (no PUT when equal)."""

    at: datetime
    seconds: float
    before: int
    after: int
    resource_version: str
    code: int
    stderr: str

    @property
    def wrote(self) -> bool:
        return self.before != self.after

    @property
    def ok(self) -> bool:
        return self.code == 0


class HPA:
    """The HPA of one Deployment: its reads and writes of ``deployments/NAME/scale`` under its own account."""

    def __init__(
        self, cluster: Cluster, namespace: str, deployment: str, *, field_manager: str = HPA_FIELD_MANAGER
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.deployment = deployment
        self.field_manager = field_manager
        self.path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale"
        self.writes: list[ScaleWrite] = []

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """kubectl as the HPA's account (never raises: look at the return code)."""
        return self.cluster.kubectl(*args, f"--as={HPA_USER}", input=input, check=False, timeout=timeout)

    def get_scale(self) -> dict[str, Any]:
        proc = self.kubectl("get", "--raw", self.path)
        if proc.returncode != 0:
            raise KubectlError(proc.returncode, ["kubectl", "get", "--raw", self.path], proc.stdout, proc.stderr)
        return dict(json.loads(proc.stdout))

    def replicas(self) -> int:
        return int(self.get_scale()["spec"].get("replicas", 0))

    def scale_to(self, replicas: int, *, check: bool = True, syncs: int = 5) -> ScaleWrite:
        """GET the scale, and PUT it back with ``replicas`` if that differs, as the HPA rescales. A PUT refused
        with 409 (the Deployment written between the GET and the PUT: by the Deployment controller's status
        updates, a GitOps sync) is tried again from a new GET, as the HPA does at its next sync, up to
        ``syncs`` times; every attempt is in :attr:`writes`, so a test can count the conflicts."""
        for _ in range(syncs):
            write = self._sync(replicas)
            if write.code == 0 or "Conflict" not in write.stderr:
                break
        if check and not write.ok:
            raise KubectlError(write.code, ["kubectl", "replace", "--raw", self.path], "", write.stderr)
        return write

    def _sync(self, replicas: int) -> ScaleWrite:
        at, started = datetime.now(UTC), time.monotonic()
        scale = self.get_scale()
        before = int(scale["spec"].get("replicas", 0))
        version = str(scale["metadata"].get("resourceVersion", ""))
        code, stderr = 0, ""
        if before != replicas:
            scale["spec"]["replicas"] = replicas
            url = f"{self.path}?fieldManager={self.field_manager}" if self.field_manager else self.path
            proc = self.kubectl("replace", "--raw", url, "-f", "-", input=json.dumps(scale))
            code, stderr = proc.returncode, proc.stderr
        write = ScaleWrite(at, time.monotonic() - started, before, replicas, version, code, stderr)
        self.writes.append(write)
        return write

    @property
    def conflicts(self) -> int:
        """The PUTs refused with 409 (each tried again from a new GET)."""
        return sum(1 for w in self.writes if not w.ok and "Conflict" in w.stderr)

    def can_i(self, verb: str, resource: str, *, subresource: str = "") -> bool:
        """``kubectl auth can-i`` for the HPA's account in this namespace."""
        args = ["auth", "can-i", verb, resource, "-n", self.namespace]
        if subresource:
            args.append(f"--subresource={subresource}")
        return self.kubectl(*args).stdout.strip() == "yes"
