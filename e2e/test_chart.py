"""The Helm chart (charts/greyrelease): linted, rendered against the kustomize install, and installed.

Without a cluster: `helm lint --strict` with every values file under the chart's ci/; `helm template` with the
default values gives the objects of `kubectl kustomize config/default` (its Namespace aside: a chart installs
into the release's namespace, which must exist before `helm install`), the sharded values those of
config/sharded, and the webhook turned off those of config/ without its webhook Component, object by object
with the labels and the annotation the chart adds left out; the values reach the Deployment; bad values are
refused naming the field; the CRDs are the generated ones, in the packaged chart too.

On the cluster: a server-side dry run of every values file; then a real `helm install`, the controller run
as the chart's ServiceAccount (a TokenRequest token, as in a pod: the local cluster's pods run nothing) driving
a release to the end with its webhook certificate made as in a pod, and never denied; `helm upgrade` with
other values; `helm uninstall`, which leaves the CRDs and their GreyReleases and nothing else of the chart.
"""

from __future__ import annotations

import base64
import difflib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.controller import ROOT, Controller, apply_release, deploy_app, deployment, drop_releases, gr, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster, find_kubectl
from e2e.harness.process import bin_dir, free_port
from e2e.harness.reliability import audit_events
from e2e.test_install import DENIED_IN_LOG

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "greyrelease"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "greyrelease"
KUSTOMIZE_NAMESPACE = "greyrelease-system"
SERVICE_ACCOUNT = "greyrelease-controller"
#: What the chart adds to the objects of config/: Helm's usual labels, and the CRDs' resource policy.
HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}
HELM_ANNOTATIONS = {"helm.sh/resource-policy"}
SERVICEMONITOR_CRD = (
    bin_dir().parent / "crd" / "prometheus-operator-v0.85.0" / "monitoring.coreos.com_servicemonitors.yaml"
)

Obj = dict[str, Any]
Key = tuple[str, str, str]


def find_helm() -> str:
    """helm as e2e/build/build.sh builds it (GREYRELEASE_HELM overrides), then PATH."""
    override = os.environ.get("GREYRELEASE_HELM")
    if override:
        return override
    built = bin_dir() / "helm"
    if built.is_file() and os.access(built, os.X_OK):
        return str(built)
    found = shutil.which("helm")
    if found is None:
        raise RuntimeError(f"helm not found in {bin_dir()} nor on PATH: run e2e/build/build.sh (make deps)")
    return found


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's cache, configuration and data in a directory of the test run, not the user's."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(env: dict[str, str], *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [find_helm(), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def docs(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def render(env: dict[str, str], *args: str, namespace: str = KUSTOMIZE_NAMESPACE, chart: Path = CHART) -> list[Obj]:
    """`helm template` of the chart into `namespace`, as objects."""
    return docs(helm(env, "template", RELEASE, str(chart), "--namespace", namespace, *args).stdout)


def kustomize(directory: Path) -> list[Obj]:
    built = subprocess.run([find_kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=True)
    return docs(built.stdout)


def key(obj: Obj) -> Key:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def without_helm_metadata(obj: Obj) -> Obj:
    """`obj` less the labels and annotations the chart adds (an emptied map goes too)."""
    out: Obj = json.loads(json.dumps(obj))
    meta = out["metadata"]
    for field, added in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        kept = {k: v for k, v in (meta.get(field) or {}).items() if k not in added}
        if kept:
            meta[field] = kept
        else:
            meta.pop(field, None)
    return out


def by_key(objects: list[Obj]) -> dict[Key, Obj]:
    keyed = {key(o): o for o in objects}
    assert len(keyed) == len(objects), f"an object rendered twice: {[key(o) for o in objects]}"
    return keyed


def differences(expected: list[Obj], rendered: list[Obj]) -> str:
    """Kind/namespace/name missing, extra, or not the same (a unified diff of each), or '' when equal."""
    want = by_key(expected)
    got = {k: without_helm_metadata(o) for k, o in by_key(rendered).items()}
    lines: list[str] = []
    for k in sorted(want.keys() - got.keys()):
        lines.append(f"missing from the chart: {'/'.join(k)}")
    for k in sorted(got.keys() - want.keys()):
        lines.append(f"only in the chart: {'/'.join(k)}")
    for k in sorted(want.keys() & got.keys()):
        if want[k] != got[k]:
            a = yaml.safe_dump(want[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(got[k], sort_keys=True).splitlines()
            diff = difflib.unified_diff(a, b, "kustomize", "helm", lineterm="", n=2)
            lines.append(f"differs: {'/'.join(k)}\n" + "\n".join(diff))
    return "\n".join(lines)


def kustomize_less_namespace(directory: Path) -> list[Obj]:
    """The kustomize install less its Namespace, which the chart does not make (see the module docstring)."""
    objects = kustomize(directory)
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    assert [o["metadata"]["name"] for o in namespaces] == [KUSTOMIZE_NAMESPACE]
    return [o for o in objects if o["kind"] != "Namespace"]


def resource(obj: Obj) -> str:
    """What kubectl calls the object's type, group-qualified: deployment.apps, serviceaccount."""
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}.{group}" if group else obj["kind"].lower()


def the(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, (kind, name, [key(o) for o in objects])
    return found[0]


# --- without a cluster ----------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_strict(helm_env: dict[str, str], values: Path | None) -> None:
    args = ["--values", str(values)] if values else []
    proc = helm(helm_env, "lint", "--strict", str(CHART), *args)
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout, proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_default_values_render_config_default(helm_env: dict[str, str]) -> None:
    expected = kustomize_less_namespace(ROOT / "config" / "default")
    rendered = render(helm_env)
    assert differences(expected, rendered) == ""
    print(f"\n{len(rendered)} objects, the same as config/default's {len(expected)} (its Namespace aside)")
    # Every object carries Helm's labels.
    for obj in rendered:
        assert set(obj["metadata"]["labels"]) >= HELM_LABELS, key(obj)


def test_sharded_values_render_config_sharded(helm_env: dict[str, str]) -> None:
    expected = kustomize_less_namespace(ROOT / "config" / "sharded")
    rendered = render(helm_env, "--values", str(CHART / "ci" / "sharded-values.yaml"))
    assert differences(expected, rendered) == ""
    assert the(rendered, "Deployment")["spec"]["replicas"] == 3


def test_webhook_off_renders_config_without_its_webhook_component(helm_env: dict[str, str], tmp_path: Path) -> None:
    """config/default lists config/webhook as a Component: without it, what is left is the chart with
    webhook.enabled=false."""
    parts = [os.path.relpath(ROOT / "config" / d, tmp_path) for d in ("crd", "rbac", "manager")]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": parts}))
    expected = kustomize_less_namespace(tmp_path)
    rendered = render(helm_env, "--set", "webhook.enabled=false")
    assert differences(expected, rendered) == ""
    assert not {"MutatingWebhookConfiguration", "Service"} & {o["kind"] for o in rendered}


def test_the_comparison_sees_a_difference(helm_env: dict[str, str]) -> None:
    """The comparison above is not blind: one flag, one label or one object more shows, each named."""
    expected = kustomize_less_namespace(ROOT / "config" / "default")
    found = differences(expected, render(helm_env, "--set", "extraArgs={--verbose}", "--set", "podLabels.team=a"))
    assert "differs: Deployment/greyrelease-system/greyrelease-controller" in found, found
    added = {line[1:].strip() for line in found.splitlines() if line.startswith("+ ")}
    assert added == {"- --verbose", "team: a"}, found
    found = differences(expected, render(helm_env, "--set", "metrics.service.enabled=true"))
    assert found == "only in the chart: Service/greyrelease-system/greyrelease-metrics", found


def test_values_reach_the_deployment_and_the_service_monitor(helm_env: dict[str, str]) -> None:
    values_file = CHART / "ci" / "monitoring-and-scheduling-values.yaml"
    values = yaml.safe_load(values_file.read_text())
    rendered = render(helm_env, "--values", str(values_file), namespace="platform")
    dep = the(rendered, "Deployment")
    pod = dep["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == "registry.example/platform/greyrelease:0.1.0"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert container["args"][-2:] == ["--max-progressing=3", "--lease-seconds=15"], container["args"]
    assert "--leader-election-namespace=$(POD_NAMESPACE)" in container["args"]
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    assert container["resources"] == values["resources"]
    for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
        assert pod["spec"][field] == values[field], field
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/name": "greyrelease",
        "app.kubernetes.io/component": "controller",
        "team": "platform",
    }
    assert pod["metadata"]["annotations"] == {"example.com/owner": "platform"}
    assert the(rendered, "ServiceAccount")["metadata"]["annotations"] == {"example.com/purpose": "releases"}
    # Everything in the release's namespace, and the bindings name the ServiceAccount there.
    assert {o["metadata"].get("namespace") for o in rendered if "namespace" in o["metadata"]} == {"platform"}
    for binding in (o for o in rendered if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": "platform"}]
    hook = the(rendered, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]
    assert hook["namespace"] == "platform" and hook["name"] == "greyrelease-webhook"
    # The ServiceMonitor scrapes the metrics Service, which selects the controller's pods by their port.
    monitor = the(rendered, "ServiceMonitor")
    metrics = the(rendered, "Service", "greyrelease-metrics")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert metrics["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert metrics["spec"]["ports"] == [{"name": "metrics", "port": 8090, "targetPort": "metrics", "protocol": "TCP"}]
    assert {"name": "metrics", "containerPort": 8090, "protocol": "TCP"} in container["ports"]


def test_webhook_with_a_certificate_from_a_secret(helm_env: dict[str, str]) -> None:
    rendered = render(helm_env, "--values", str(CHART / "ci" / "webhook-own-certificate-values.yaml"))
    dep = the(rendered, "Deployment")
    [container] = dep["spec"]["template"]["spec"]["containers"]
    assert "--webhook-cert-dir=/etc/greyrelease/webhook-tls" in container["args"]
    assert not any(a.startswith("--webhook-service") for a in container["args"])
    assert {"name": "webhook-tls", "secret": {"secretName": "greyrelease-webhook-cert"}} in dep["spec"]["template"][
        "spec"
    ]["volumes"]
    assert {"name": "webhook-tls", "mountPath": "/etc/greyrelease/webhook-tls", "readOnly": True} in container[
        "volumeMounts"
    ]
    # No Secret of its own to make, and the caBundle is the injector's: read-only on the configuration.
    assert not [o for o in rendered if o["kind"] == "Role" and o["metadata"]["name"] == "greyrelease-webhook"]
    assert the(rendered, "ClusterRole", "greyrelease-webhook")["rules"][0]["verbs"] == ["get"]
    config = the(rendered, "MutatingWebhookConfiguration")
    assert config["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "greyrelease-system/greyrelease-webhook"
    }
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    config = the(
        render(helm_env, "--set", f"webhook.certificate.secretName=s,webhook.certificate.caBundle={ca}"),
        "MutatingWebhookConfiguration",
    )
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == ca


def test_no_webhook_and_no_crds(helm_env: dict[str, str]) -> None:
    rendered = render(helm_env, "--values", str(CHART / "ci" / "no-webhook-values.yaml"))
    kinds = {o["kind"] for o in rendered}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"}
    [container] = the(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "--health-port=8080",
        "--metrics-port=8090",
        "--leader-election-namespace=$(POD_NAMESPACE)",
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert [p["name"] for p in container["ports"]] == ["health", "metrics"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--set", "shards=0"], "at '/shards': minimum"),
        (["--set", "shards=3,replicas=2"], "replicas: 2 is fewer than shards (3)"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["--set", "maxProgressing=0"], "at '/maxProgressing'"),
        (["--set", "webhook.port=70000"], "at '/webhook/port'"),
        (["--set", "replica=3"], "additional properties 'replica' not allowed"),
        (["--set", "image.repository="], "at '/image/repository'"),
    ],
    ids=lambda v: v if isinstance(v, str) else " ".join(v),
)
def test_bad_values_are_refused_naming_the_field(helm_env: dict[str, str], args: list[str], named: str) -> None:
    proc = helm(helm_env, "template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0, proc.stdout[:500]
    assert named in proc.stderr, proc.stderr


def test_the_crds_are_the_generated_ones_and_kept(helm_env: dict[str, str], tmp_path: Path) -> None:
    """The chart reads crds/ through its link files/crds; `helm package` stores the files themselves."""
    generated = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("greyrelease.io_*.yaml"))}
    assert len(generated) == 2
    rendered = [o for o in render(helm_env) if o["kind"] == "CustomResourceDefinition"]
    assert sorted(without_helm_metadata(o)["metadata"]["name"] for o in rendered) == sorted(
        d["metadata"]["name"] for d in generated.values()
    )
    for crd in rendered:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert without_helm_metadata(crd) in generated.values()
    assert not [o for o in render(helm_env, "--set", "crds.install=false") if o["kind"] == "CustomResourceDefinition"]
    for crd in (o for o in render(helm_env, "--set", "crds.keep=false") if o["kind"] == "CustomResourceDefinition"):
        assert "annotations" not in crd["metadata"]

    helm(helm_env, "package", str(CHART), "--destination", str(tmp_path))
    [package] = tmp_path.glob("greyrelease-*.tgz")
    with tarfile.open(package) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert not [m.name for m in members.values() if m.issym() or m.islnk()]
        for name in generated:
            member = members[f"greyrelease/files/crds/{name}"]
            stored = tar.extractfile(member)
            assert stored is not None and stored.read() == (ROOT / "crds" / name).read_bytes(), name
        assert "greyrelease/files/crds/kustomization.yaml" not in members
        assert {f"greyrelease/ci/{p.name}" for p in CI_VALUES} <= members.keys()
    assert render(helm_env, chart=package) == render(helm_env)
    print(f"\npackaged {package.name}: {package.stat().st_size} bytes, {len(members)} files")


# --- on the cluster -----------------------------------------------------------------------------------------


@dataclass
class Install:
    namespace: str  # the release's namespace, where the controller runs
    env: dict[str, str]  # helm's environment, bound to the cluster


def create_restricted_namespace(cluster: Cluster, name: str) -> None:
    """A namespace enforcing the "restricted" Pod Security Standard, as config/manager's Namespace does."""
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    cluster.wait_for_namespace_ready(name)


@pytest.fixture(scope="module")
def chart_namespace(cluster: Cluster, helm_env: dict[str, str]) -> Iterator[Install]:
    name = f"e2e-chart-{os.urandom(3).hex()}"
    create_restricted_namespace(cluster, name)
    env = {**helm_env, "KUBECONFIG": str(cluster.kubeconfig)}
    try:
        yield Install(name, env)
    finally:
        helm(env, "uninstall", RELEASE, "--namespace", name, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture(scope="module")
def servicemonitor_crd(cluster: Cluster) -> None:
    if not SERVICEMONITOR_CRD.is_file():
        pytest.fail(f"no ServiceMonitor CRD at {SERVICEMONITOR_CRD}: run e2e/build/build.sh (make deps)")
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", str(SERVICEMONITOR_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com", "--timeout=30s")


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda v: v.name)
def test_every_values_file_passes_a_server_side_dry_run(
    cluster: Cluster, chart_namespace: Install, servicemonitor_crd: None, values: Path
) -> None:
    started = time.monotonic()
    rendered = helm(
        chart_namespace.env,
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        chart_namespace.namespace,
        "-f",
        str(values),
    ).stdout
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    lines = proc.stdout.splitlines()
    objects = docs(rendered)
    for obj in objects:
        name = f"{resource(obj)}/{obj['metadata']['name']}"
        assert any(line.startswith(f"{name} ") and line.endswith("(server dry run)") for line in lines), (name, lines)
    assert "PodSecurity" not in proc.stderr, proc.stderr
    print(f"\n{values.name}: {len(objects)} objects accepted in {time.monotonic() - started:.1f} s")


def release_manifest(install: Install) -> list[Obj]:
    return docs(helm(install.env, "get", "manifest", RELEASE, "--namespace", install.namespace).stdout)


@pytest.fixture(scope="module")
def installed(cluster: Cluster, crd: Path, chart_namespace: Install) -> Install:
    """The chart installed with its defaults over the CRDs applied with kubectl (`crd`, as a kustomize
    install or an earlier test of the session leaves them): --take-ownership adopts them."""
    # A controller run from a terminal leaves its own greyrelease-hold registered (a URL on this host).
    cluster.kubectl("delete", "mutatingwebhookconfiguration", "greyrelease-hold", "--ignore-not-found")
    started = time.monotonic()
    proc = helm(
        chart_namespace.env,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        chart_namespace.namespace,
        "--take-ownership",
        "--wait=watcher",
        "--timeout=60s",
    )
    print(f"\nhelm install: {time.monotonic() - started:.1f} s")
    assert "STATUS: deployed" in proc.stdout, proc.stdout
    assert "PodSecurity" not in proc.stderr, proc.stderr
    return chart_namespace


def test_install_creates_what_the_chart_renders(cluster: Cluster, installed: Install) -> None:
    manifest = release_manifest(installed)
    expected = render(installed.env, namespace=installed.namespace)
    assert sorted(map(key, manifest)) == sorted(map(key, expected))
    for obj in manifest:
        _, namespace, name = key(obj)
        live = cluster.kubectl_json("get", resource(obj), name, *(["--namespace", namespace] if namespace else []))
        assert live["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", key(obj)
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE, key(obj)
    dep = cluster.kubectl_json("get", "deployment", "greyrelease-controller", "--namespace", installed.namespace)
    assert dep["status"].get("readyReplicas") == 1, dep["status"]  # KWOK's pod: Ready, running nothing


def test_a_release_runs_as_the_chart_service_account(
    cluster: Cluster, installed: Install, namespace: str, tmp_path: Path
) -> None:
    """The controller with the install's flags (its Lease and webhook Secret in the release's namespace),
    authenticated as the chart's ServiceAccount: it makes the webhook certificate, fills the chart's caBundle,
    and drives a release to the end, never denied."""
    kubeconfig = cluster.service_account_kubeconfig(installed.namespace, SERVICE_ACCOUNT, tmp_path / "sa.kubeconfig")
    args = [
        f"--leader-election-namespace={installed.namespace}",
        f"--webhook-port={free_port()}",
        "--webhook-service=greyrelease-webhook",
    ]
    ctl = Controller(cluster, namespace, tmp_path / "controller.log", {"KUBECONFIG": str(kubeconfig)}, args)
    started = time.monotonic()
    ctl.start()
    try:
        wait_for(ctl.ready, 60, f"the controller's /readyz\n{ctl.logs()}")
        deploy_app(cluster, namespace, replicas=4)
        body = gr(
            "web",
            targetRef={"name": "web"},
            targetVersion="v2",
            batches=[{"replicas": 2, "pause": "1s"}, {"replicas": 4}],
            trafficRouting={"service": {"name": "web"}},
        )
        apply_release(cluster, namespace, body)

        def done() -> dict[str, Any] | None:
            denied = [line for line in ctl.logs().splitlines() if DENIED_IN_LOG.search(line)]
            assert not denied, "\n".join(denied)
            st: dict[str, Any] = cluster.kubectl_json("get", "gr", "web", "-n", namespace).get("status") or {}
            return st if st.get("phase") in {"Succeeded", "Failed", "Aborted", "InvalidSpec"} else None

        st = wait_for(done, 90, "the release's end", interval=0.5)
        assert st["phase"] == "Succeeded", (st, ctl.logs())
        dep = deployment(cluster, namespace, "web")
        assert (
            dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v2"
        )
        config = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "greyrelease-hold")
        secret = cluster.kubectl_json("get", "secret", "greyrelease-webhook-tls", "-n", installed.namespace)
        assert config["webhooks"][0]["clientConfig"].get("caBundle") == secret["data"]["ca.crt"]
        time.sleep(1)  # the last lines into the log
        denied = [line for line in ctl.log.read_text(errors="replace").splitlines() if DENIED_IN_LOG.search(line)]
        assert denied == [], ctl.logs()
        print(f"\nrelease v2 over 4 replicas as the chart's ServiceAccount: {time.monotonic() - started:.1f} s")
        if isinstance(cluster, LocalCluster):  # the API server's own record of every write, refused or not
            user = f"system:serviceaccount:{installed.namespace}:{SERVICE_ACCOUNT}"
            writes = [
                e
                for e in audit_events(cluster.audit_log)
                if e.get("stage") == "ResponseComplete" and (e.get("user") or {}).get("username") == user
            ]
            refused = [f"{e['verb']} {e['requestURI']}" for e in writes if e["responseStatus"].get("code") == 403]
            assert refused == []
            done_by = {(e["objectRef"]["resource"], e["verb"]) for e in writes if e.get("objectRef")}
            for needed in (("secrets", "create"), ("mutatingwebhookconfigurations", "update"), ("leases", "create")):
                assert needed in done_by, (needed, sorted(done_by))
            print(f"{len(writes)} writes as {user} in the audit log, none refused")
    finally:
        ctl.stop()
        drop_releases(cluster, namespace)


def test_upgrade_with_other_values(cluster: Cluster, installed: Install) -> None:
    """Flags and resources change the Deployment; a caBundle the controller set stays (the chart leaves it)."""
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nset by the controller\n-----END CERTIFICATE-----\n").decode()
    patch = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca}]
    cluster.kubectl("patch", "mutatingwebhookconfiguration", "greyrelease-hold", "--type=json", "-p", json.dumps(patch))
    started = time.monotonic()
    helm(
        installed.env,
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        installed.namespace,
        "--set",
        "maxProgressing=2,extraArgs={--lease-seconds=20},resources.limits.memory=1Gi,resources.requests.cpu=100m",
        "--set-string",
        "podAnnotations.example\\.com/rev=2",
    )
    print(f"\nhelm upgrade: {time.monotonic() - started:.1f} s")
    dep = cluster.kubectl_json("get", "deployment", "greyrelease-controller", "-n", installed.namespace)
    pod = dep["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["args"][-2:] == ["--max-progressing=2", "--lease-seconds=20"], container["args"]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    }
    assert pod["metadata"]["annotations"] == {"example.com/rev": "2"}
    assert dep["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    history = json.loads(helm(installed.env, "history", RELEASE, "-n", installed.namespace, "-o", "json").stdout)
    assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")]
    config = cluster.kubectl_json("get", "mutatingwebhookconfiguration", "greyrelease-hold")
    assert config["webhooks"][0]["clientConfig"]["caBundle"] == ca


def test_uninstall_leaves_the_crds_and_nothing_else(cluster: Cluster, installed: Install, namespace: str) -> None:
    manifest = release_manifest(installed)
    crds = [o for o in manifest if o["kind"] == "CustomResourceDefinition"]
    others = [o for o in manifest if o["kind"] != "CustomResourceDefinition"]
    assert len(crds) == 2 and others
    # A GreyRelease, with no controller to act on it: it must outlive the uninstall.
    apply_release(
        cluster, namespace, gr("kept", targetRef={"name": "web"}, targetVersion="v3", batches=[{"replicas": 1}])
    )
    started = time.monotonic()
    proc = helm(installed.env, "uninstall", RELEASE, "--namespace", installed.namespace, "--wait")
    print(f"\nhelm uninstall: {time.monotonic() - started:.1f} s")
    for crd in crds:
        assert crd["metadata"]["name"] in proc.stdout, proc.stdout  # "These resources were kept ..."

    def gone(obj: Obj) -> bool:
        _, ns, name = key(obj)
        got = cluster.kubectl("get", resource(obj), name, *(["-n", ns] if ns else []), check=False)
        return got.returncode != 0 and "NotFound" in got.stderr

    for obj in others:
        wait_for(partial(gone, obj), 30, f"{'/'.join(key(obj))} deleted")
    for crd in crds:
        cluster.kubectl("get", "crd", crd["metadata"]["name"])
    assert cluster.kubectl_json("get", "gr", "kept", "-n", namespace)["spec"]["targetVersion"] == "v3"
    assert json.loads(helm(installed.env, "list", "-n", installed.namespace, "-o", "json").stdout) == []
    drop_releases(cluster, namespace)
    print(f"removed {len(others)} objects, kept {len(crds)} CRDs and the GreyRelease in them")
