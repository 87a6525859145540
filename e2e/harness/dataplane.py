"""The data plane: Traefik Proxy in front of pods that answer.

`DataPlane(cluster, workdir, prometheus).start()`:
1. installs the Gateway API standard-channel CRDs (v1.4.1, copied from the sigs.k8s.io/gateway-api module
   by e2e/build/build.sh), Traefik's RBAC, the GatewayClass `traefik` (controllerName
   traefik.io/gateway-controller), the IngressClass `traefik` (controller traefik.io/ingress-controller)
   and the Gateway traefik/web, whose one HTTP listener accepts HTTPRoutes from every namespace;
2. brings up the pod network (e2e/harness/podnet.py) and the pod responders (e2e/harness/responders.py);
3. starts Traefik (built by e2e/build/build.sh) as a local process with the Kubernetes Gateway and Ingress
   providers, its HTTP entry point `web` on a free loopback port (the Gateway's listener port is that port:
   Traefik attaches a listener to the entry point of the same port) and its metrics and ping on another;
4. waits until the Gateway is Programmed, and has Prometheus (when given) scrape Traefik as job `traefik`.

Traefik's metrics carry `entrypoint` and `service` labels (a Gateway API backend's service is named
`<namespace>-<service>-http-<port>@kubernetesgateway`, an Ingress backend's
`<namespace>-<service>-<port>@kubernetes` with the port as the Ingress names it), with latency histograms
(`traefik_service_request_duration_seconds`) on the buckets below.

`answering_app()` writes a Deployment of pods that answer and its Service; `routed_app()` applies one behind
an HTTPRoute on the Gateway and returns once Traefik answers from every pod.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from e2e.harness.controller import wait_for
from e2e.harness.controlplane import LocalCluster
from e2e.harness.load import Load
from e2e.harness.podnet import PodNetwork
from e2e.harness.process import HERE, Process, bin_dir, reserve_ports, wait_until
from e2e.harness.prometheus import PrometheusStack
from e2e.harness.responders import GATE

TRAEFIK_VERSION = "3.6.12"
GATEWAY_API_VERSION = "1.4.1"
GATEWAY_NAMESPACE = "traefik"
GATEWAY_NAME = "web"
GATEWAY_CLASS = "traefik"
GATEWAY_CONTROLLER = "traefik.io/gateway-controller"
INGRESS_CLASS = "traefik"
INGRESS_CONTROLLER = "traefik.io/ingress-controller"
SERVICE_ACCOUNT = "traefik"
# Traefik gathers provider changes for this long before it rebuilds its routing. Its default (2 s) would
# dominate every traffic shift we measure (an abort must cut a canary within a second); with none at all, a
# rollout's burst of EndpointSlice changes would rebuild the configuration once per change. 100 ms merges a
# burst and adds at most a tenth of a second to a shift.
PROVIDERS_THROTTLE = "100ms"
# Latency buckets (seconds) of Traefik's histograms: fine around the 0.25-0.5 s that latency gates use.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0, 2.5, 5.0)
#: Metric job name of Traefik in Prometheus.
PROMETHEUS_JOB = "traefik"

# What the Kubernetes Gateway and Ingress providers read and write, as Traefik's documentation lists it
# (kubernetes-gateway-rbac.yml for the Gateway provider; Ingresses, IngressClasses and, for
# NodePort load balancing, Nodes for the Ingress provider).
RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["namespaces", "nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services", "secrets", "configmaps"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["ingresses", "ingressclasses"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses/status"], "verbs": ["update"]},
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": [
            "gatewayclasses",
            "gateways",
            "httproutes",
            "grpcroutes",
            "tcproutes",
            "tlsroutes",
            "referencegrants",
            "backendtlspolicies",
        ],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": [
            "gatewayclasses/status",
            "gateways/status",
            "httproutes/status",
            "grpcroutes/status",
            "tcproutes/status",
            "tlsroutes/status",
            "referencegrants/status",
            "backendtlspolicies/status",
        ],
        "verbs": ["update"],
    },
]


def traefik_binary() -> Path:
    return bin_dir() / "traefik"


def gateway_api_crd_dir() -> Path:
    """Where e2e/build/build.sh copies the module's config/crd/standard."""
    return bin_dir().parent / "crd" / f"gateway-api-v{GATEWAY_API_VERSION}"


def gateway_api_crds() -> list[Path]:
    found = sorted(gateway_api_crd_dir().glob("gateway.networking.k8s.io_*.yaml"))
    if not found:
        raise RuntimeError(f"no Gateway API CRDs in {gateway_api_crd_dir()}: run e2e/build/build.sh first")
    return found


def install_gateway_api_crds(cluster: Any) -> list[Path]:
    """Applies the standard-channel CRDs (server-side: the HTTPRoute CRD is too big for the annotation a
    client-side apply keeps) and waits until they are Established."""
    crds = gateway_api_crds()
    args = [a for path in crds for a in ("-f", str(path))]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=e2e", *args)
    names = [f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.gateway.networking.k8s.io" for p in crds]
    cluster.kubectl("wait", "--for=condition=Established", *names, "--timeout=60s")
    return crds


def _objects(web_port: int) -> list[dict[str, Any]]:
    meta = {"namespace": GATEWAY_NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEWAY_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "e2e-traefik"},
            "rules": RBAC_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-traefik"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-traefik"},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": GATEWAY_NAMESPACE}],
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": GATEWAY_CLASS},
            "spec": {"controllerName": GATEWAY_CONTROLLER},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "IngressClass",
            "metadata": {"name": INGRESS_CLASS},
            "spec": {"controller": INGRESS_CONTROLLER},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": GATEWAY_NAME, **meta},
            "spec": {
                "gatewayClassName": GATEWAY_CLASS,
                "listeners": [
                    {
                        "name": "web",
                        "protocol": "HTTP",
                        "port": web_port,
                        "allowedRoutes": {"namespaces": {"from": "All"}},
                    }
                ],
            },
        },
    ]


class DataPlane:
    """Traefik, the pod network and the pod responders of one local cluster (see the module's docstring)."""

    def __init__(self, cluster: LocalCluster, workdir: Path, prometheus: PrometheusStack | None = None) -> None:
        if not isinstance(cluster, LocalCluster) or cluster.pod_slot is None:
            raise RuntimeError("the data plane needs a local cluster started by this harness (its pods' network)")
        self.cluster = cluster
        self.workdir = workdir
        self.prometheus = prometheus
        self.network = PodNetwork(cluster.pod_slot)
        self.processes: list[Process] = []
        self.web_port = 0
        self.admin_port = 0

    @property
    def gateway_url(self) -> str:
        """Traefik's HTTP entry point: the Gateway's listener, and where Ingresses of class traefik answer."""
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def gateway(self) -> str:
        return f"{GATEWAY_NAMESPACE}/{GATEWAY_NAME}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/metrics"

    @property
    def parent_ref(self) -> dict[str, str]:
        """An HTTPRoute parentRef to the Gateway."""
        return {"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE}

    @property
    def serving_gate(self) -> dict[str, str]:
        return serving_gate()

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.admin_port}"

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self.processes if p.popen is not None}

    # Lifecycle -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        binary = traefik_binary()
        if not binary.is_file():
            raise RuntimeError(f"missing {binary}: run e2e/build/build.sh first")
        PodNetwork.check_prerequisites()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        try:
            held = reserve_ports(2)
            self.web_port, self.admin_port = (int(s.getsockname()[1]) for s in held)
            install_gateway_api_crds(self.cluster)
            self.cluster.kubectl(
                "apply",
                "-f",
                "-",
                input=json.dumps({"apiVersion": "v1", "kind": "List", "items": _objects(self.web_port)}),
            )
            token = self.cluster.kubectl(
                "create", "token", SERVICE_ACCOUNT, "-n", GATEWAY_NAMESPACE, "--duration=8760h"
            ).stdout.strip()
            token_file = self.workdir / "token"
            token_file.write_text(token)
            token_file.chmod(0o600)
            self.network.up()
            self._start_responders()
            for s in held:
                s.close()
            self._start_traefik(binary, token_file)
            self._wait_ready(deadline)
            if self.prometheus is not None:
                self.prometheus.add_scrape_target(self.metrics_target, PROMETHEUS_JOB)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.prometheus is not None and self.admin_port:
            self.prometheus.remove_scrape_target(self.metrics_target)
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()
        self.network.down()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def check_alive(self) -> None:
        for proc in self.processes:
            proc.check_alive()

    # Steps ----------------------------------------------------------------------------------------------

    def _start_responders(self) -> None:
        proc = Process(
            "responders",
            [
                sys.executable,
                "-m",
                "e2e.harness.responders",
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "--netns",
                self.network.slot.netns,
                "--pod-cidr",
                self.cluster.pod_cidr,
            ],
            self.workdir / "logs" / "responders.log",
            cwd=HERE.parent,
        )
        proc.start()
        self.processes.append(proc)

    def _start_traefik(self, binary: Path, token_file: Path) -> None:
        # Traefik's client for a cluster it does not run in takes an endpoint, a bearer token and a CA (no
        # client certificate). We give it a ServiceAccount token (TokenRequest API) bound to the RBAC its
        # documentation lists, rather than `kubectl proxy` in front of the API server: no extra process in
        # the path of every watch event, and Traefik runs with the rights it would have in a cluster.
        client = {
            "endpoint": self.cluster.server,
            "token": str(token_file),
            "certAuthFilePath": str(self.cluster.ca_cert),
        }
        provider_args = [
            f"--providers.{provider}.{key}={value}"
            for provider in ("kubernetesgateway", "kubernetesingress")
            for key, value in client.items()
        ]
        proc = Process(
            "traefik",
            [
                str(binary),
                "--global.checkNewVersion=false",
                "--global.sendAnonymousUsage=false",
                f"--entryPoints.web.address=127.0.0.1:{self.web_port}",
                f"--entryPoints.admin.address=127.0.0.1:{self.admin_port}",
                "--ping=true",
                "--ping.entryPoint=admin",
                "--metrics.prometheus=true",
                "--metrics.prometheus.entryPoint=admin",
                "--metrics.prometheus.addEntryPointsLabels=true",
                "--metrics.prometheus.addServicesLabels=true",
                f"--metrics.prometheus.buckets={','.join(f'{b:g}' for b in LATENCY_BUCKETS)}",
                f"--providers.providersThrottleDuration={PROVIDERS_THROTTLE}",
                "--providers.kubernetesgateway=true",
                "--providers.kubernetesgateway.statusAddress.ip=127.0.0.1",
                "--providers.kubernetesingress=true",
                f"--providers.kubernetesingress.ingressClass={INGRESS_CLASS}",
                *provider_args,
                "--log.level=INFO",
            ],
            self.workdir / "logs" / "traefik.log",
        )
        proc.start()
        self.processes.append(proc)

    def _wait_ready(self, deadline: float) -> None:
        def ping() -> bool:
            self.check_alive()
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ping", timeout=1) as resp:
                code: int = resp.status
            return code == 200

        wait_until(ping, max(deadline - time.monotonic(), 0.1), "Traefik's /ping", 0.1)

        def programmed() -> bool:
            self.check_alive()
            gw = self.cluster.kubectl_json("get", "gateway", GATEWAY_NAME, "-n", GATEWAY_NAMESPACE)
            conditions = {c["type"]: c["status"] for c in gw.get("status", {}).get("conditions") or []}
            return conditions.get("Accepted") == "True" and conditions.get("Programmed") == "True"

        try:
            wait_until(programmed, max(deadline - time.monotonic(), 0.1), f"Gateway {self.gateway} Programmed", 0.2)
        except TimeoutError as exc:
            logs = "\n".join(f"--- {p.name}\n{p.tail(15)}" for p in self.processes)
            raise TimeoutError(f"{exc}\n{logs}") from None


def answering_app(
    name: str,
    replicas: int,
    image: str = "registry.example/app:v1",
    *,
    port: int = 8080,
    grace_seconds: int = 5,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment whose pods answer HTTP on `port` (Ready only once they do) and its Service (port 80),
    as a `kind: List` to `kubectl apply`. The grace period is how long a deleted pod keeps answering."""
    labels = {"app": name, **(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {"name": "app", "image": image, "ports": [{"containerPort": port, "name": "http"}]}
                            ],
                            "readinessGates": [serving_gate()],
                            "terminationGracePeriodSeconds": grace_seconds,
                        },
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name},
                "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": "http", "name": "http"}]},
            },
        ],
    }


def serving_gate() -> dict[str, str]:
    """The readiness gate a pod template lists so its pods become Ready only once their responder listens
    (see e2e/harness/responders.py): `spec.readinessGates: [serving_gate()]`."""
    return {"conditionType": GATE}


def routed_app(
    cluster: LocalCluster,
    plane: DataPlane,
    namespace: str,
    replicas: int,
    image: str = "registry.example/app:v1",
    *,
    grace_seconds: int = 5,
) -> str:
    """`answering_app("web", ...)` behind an HTTPRoute `web` on the Gateway, at a host of its own; returns the
    host once Traefik answers there from every pod."""
    host = f"web.{namespace}.example"
    app = answering_app("web", replicas, image, grace_seconds=grace_seconds)
    app["items"].append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web"},
            "spec": {
                "parentRefs": [plane.parent_ref],
                "hostnames": [host],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}]}],
            },
        }
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(app))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")

    def all_answer() -> bool:
        with Load(plane.gateway_url, 50, host=host, timeout=2) as probe:
            time.sleep(0.5)
        s = probe.summary()
        return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == replicas

    wait_for(all_answer, 60, f"Traefik answering for {host} from {replicas} pods", interval=0.2)
    return host
