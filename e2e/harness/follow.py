"""Follow mode driven as a GitOps user drives it: the app as Git declares it (a Deployment without
``spec.paused`` and a GreyRelease without ``targetVersion``, committed to the GitOps emulator's repository,
e2e/harness/gitops.py), the controller run from a terminal with its admission webhook, and ``kubectl gr``.

- :func:`git_deployment`, :func:`git_service`, :func:`git_route`, :func:`follow_release`: the manifests of
  "Git"; :func:`ignore_rules`: the ignore rules config/gitops/argocd/application.yaml ships, for them;
- :class:`Follower`: ``greyrelease run --webhook-port P`` watching one namespace, its webhook registered on
  127.0.0.1:P; stopped with its log printed (unless told not to), the namespace's GreyReleases dropped and
  the webhook's configuration removed (the controller leaves it registered on exit, by design);
- :func:`set_up`: the first sync, the app rolled out, the release ``Idle`` and the webhook holding a
  template of the enrolled Deployment;
- :func:`wait_held`: the Deployment as the webhook leaves a new template (paused, the digest annotation, no
  ReplicaSet of it);
- :func:`kubectl_gr`: the ``kubectl gr`` plugin, found on PATH as a user has it;
- :func:`check_deployment_writes`: the controller's writes to the Deployment, read back from the audit log:
  its enrolment label and the hold's release, nothing else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from greyrelease.admission import CONFIGURATION_NAME, FIELD_MANAGER, HELD_ANNOTATION, release_patch, template_digest
from greyrelease.api.release import RELEASE_LABEL

from e2e.harness.controller import Controller, drop_releases, gr, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.dataplane import answering_app
from e2e.harness.gitops import GitOps, Ignore, audited_requests
from e2e.harness.observe import Reads, first_image
from e2e.harness.process import free_port
from e2e.harness.reliability import CONTROLLER_AGENTS, audited_writes

IMAGE = "registry.example/app"
BIN = Path(sys.executable).parent  # where `pip install -e .` put the kubectl-gr console script


def image(tag: str) -> str:
    return f"{IMAGE}:{tag}"


# --- Git ---------------------------------------------------------------------------------------------------


def git_deployment(tag: str, *, replicas: int, serving: bool = False, grace_seconds: int = 5) -> dict[str, Any]:
    """Deployment web of ``replicas`` pods of ``tag``, without spec.paused. With ``serving``, its pods answer
    HTTP and are Ready only once they do (the data plane's readiness gate); without, KWOK makes them Ready at
    once. The enrolment label is left to the controller."""
    d: dict[str, Any] = answering_app("web", replicas, image(tag), grace_seconds=grace_seconds)["items"][0]
    if not serving:
        del d["spec"]["template"]["spec"]["readinessGates"]
    return d


def git_service(name: str) -> dict[str, Any]:
    """Service ``name`` in front of Deployment web's pods (port 80 to their port ``http``)."""
    svc: dict[str, Any] = answering_app("web", 1)["items"][1]
    svc["metadata"]["name"] = name
    return svc


def git_route(host: str, service: str, parent_ref: Mapping[str, str]) -> dict[str, Any]:
    """HTTPRoute web: ``host`` on the Gateway ``parent_ref`` (its name and namespace), all of it to ``service``."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web"},
        "spec": {
            "parentRefs": [dict(parent_ref)],
            "hostnames": [host],
            "rules": [{"backendRefs": [{"name": service, "port": 80}]}],
        },
    }


def ignore_rules(service: str) -> list[Ignore]:
    """config/gitops/argocd/application.yaml's rules, for the stable Service ``service`` and HTTPRoute web (its
    jq expressions on the route's rules amount to the rules taken from the live object while a release has
    changed them)."""
    return [
        Ignore("Service", service, "/spec/selector/pod-template-hash"),
        Ignore("HTTPRoute", "web", "/spec/rules"),
    ]


def follow_release(
    batches: list[dict[str, Any]], *, annotations: dict[str, str] | None = None, deadline: int = 180, **spec: Any
) -> dict[str, Any]:
    """GreyRelease web following Deployment web (no targetVersion), with ``annotations`` declared in Git and
    ``deadline`` as its progressDeadlineSeconds."""
    body = gr("web", targetRef={"name": "web"}, batches=batches, progressDeadlineSeconds=deadline, **spec)
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    return body


# --- the controller with its webhook --------------------------------------------------------------------


def registered_port(cluster: Cluster) -> int | None:
    """The port of the webhook a controller run from a terminal registered on 127.0.0.1, if any."""
    proc = cluster.kubectl("get", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    url = json.loads(proc.stdout)["webhooks"][0]["clientConfig"].get("url", "")
    found = re.match(r"https://127\.0\.0\.1:(\d+)/hold$", url)
    return int(found.group(1)) if found else None


class Follower:
    """``greyrelease run --webhook-port P`` watching ``namespace``."""

    def __init__(self, cluster: Cluster, namespace: str, log: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.port = free_port()
        self.controller = Controller(cluster, namespace, log, extra_args=["--webhook-port", str(self.port)])

    def start(self, timeout: float = 90.0) -> float:
        """Starts it; returns once it is ready and its webhook registered (the seconds that took)."""
        started = time.monotonic()
        self.controller.start()
        wait_for(
            lambda: self.controller.ready() and registered_port(self.cluster) == self.port,
            timeout,
            "the controller and its webhook",
        )
        return time.monotonic() - started

    def stop(self, *, log: bool = True) -> None:
        """Stops it (with ``log``, printing the last lines of its log), drops the namespace's GreyReleases and
        removes the webhook's configuration."""
        self.controller.stop()
        if log:
            print(f"--- controller log (last lines) ---\n{self.controller.logs()}")
        drop_releases(self.cluster, self.namespace)
        self.cluster.kubectl("delete", "mutatingwebhookconfiguration", CONFIGURATION_NAME, "--ignore-not-found")


def webhook_answers(cluster: Cluster, namespace: str) -> bool:
    """A server-side dry run of a template change of the enrolled Deployment comes back held."""
    probe = {"spec": {"template": {"metadata": {"annotations": {"e2e/probe": str(time.time())}}}}}
    patch = ["patch", "deployment", "web", "-n", namespace, "--type=merge", "-p", json.dumps(probe)]
    proc = cluster.kubectl(*patch, "--dry-run=server", "-o", "json", check=False)
    return proc.returncode == 0 and json.loads(proc.stdout)["spec"].get("paused") is True


def set_up(cluster: Cluster, namespace: str, gitops: GitOps, reads: Reads) -> None:
    """The first sync; then the app rolled out, the release Idle (the Deployment enrolled) and the webhook
    holding a template of deployment/web."""
    first = gitops.apply()
    assert first.ok, first
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=90s")
    reads.wait_phase({"Idle"}, 60)
    wait_for(lambda: webhook_answers(cluster, namespace), 30, "the webhook holding a template of deployment/web")


# --- the Deployment held ------------------------------------------------------------------------------------


def wait_held(reads: Reads, tag: str, timeout: float = 30.0) -> dict[str, Any]:
    """The Deployment once it holds ``tag``'s template as the webhook leaves it: paused, the annotation the
    digest of that template, observed by the Deployment controller with no ReplicaSet of it."""

    def held() -> dict[str, Any] | None:
        d = reads.deployment()
        if d is None or first_image(d) != image(tag):
            return None
        seen = (d.get("status") or {}).get("observedGeneration") == d["metadata"]["generation"]
        return d if seen else None

    d = reads.wait(held, timeout, f"deployment/web holding {tag}, observed")
    assert d["spec"].get("paused") is True, d["spec"]
    assert d["metadata"]["annotations"][HELD_ANNOTATION] == template_digest(d["spec"]["template"])
    sets = reads.replicasets()
    assert all(first_image(r["spec"]["template"]) != image(tag) for r in sets), "a ReplicaSet of the held template"
    return d


def running_tag(reads: Reads) -> str:
    """The tag of the image the Deployment's pods run (its ReplicaSet with pods)."""
    live = [r for r in reads.replicasets() if (r["spec"].get("replicas") or 0) > 0]
    assert len(live) == 1, [r["metadata"]["name"] for r in live]
    return first_image(live[0]["spec"]["template"]).rsplit(":", 1)[1]


# --- kubectl gr ----------------------------------------------------------------------------------------------


def kubectl_gr(cluster: Cluster, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``kubectl gr ARGS``, the plugin found by kubectl on PATH; fails the test when it exits non-zero."""
    env = {**cluster.env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [cluster.kubectl_path, "gr", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc


# --- the audit log ---------------------------------------------------------------------------------------------


def check_deployment_writes(cluster: LocalCluster, namespace: str, since: datetime, digests: set[str]) -> str:
    """Asserts that the controller's writes to deployments/web since ``since`` were its enrolment label and the
    hold's release of one of ``digests`` (a JSON patch under the field manager ``greyrelease``), none to a
    subresource (``/scale``), and that it released a hold at least once; returns a line saying what they were."""
    label = {"metadata": {"labels": {RELEASE_LABEL: "web"}}}
    releases = [release_patch(d) for d in digests]
    writes = [
        w
        for w in audited_writes(cluster, namespace=namespace, agents=CONTROLLER_AGENTS, since=since)
        if w.resource == "deployments" and w.name == "web"
    ]
    other = [
        f"{w} {json.dumps(w.body)}" for w in writes if w.verb != "patch" or (w.body != label and w.body not in releases)
    ]
    assert not other, "the controller wrote deployments/web otherwise than its label and the hold's release:\n" + (
        "\n".join(other)
    )
    assert not [w for w in writes if w.subresource], [str(w) for w in writes]
    managers = {
        r.field_manager
        for r in audited_requests(cluster, namespace, since=since)
        if r.resource == "deployments" and r.name == "web" and r.agent.startswith(CONTROLLER_AGENTS) and not r.dry_run
    }
    assert managers <= {FIELD_MANAGER}, managers
    kinds = Counter("label" if w.body == label else f"hold release ({w.code})" for w in writes)
    assert kinds["hold release (200)"] >= 1, f"no hold released: {dict(kinds)}"
    everything = Counter(
        f"{w.resource}{'/' + w.subresource if w.subresource else ''} {w.verb}"
        for w in audited_writes(cluster, namespace=namespace, agents=CONTROLLER_AGENTS, since=since)
    )
    return (
        f"controller writes to deployments/web: {dict(kinds)} (field manager {sorted(managers)}); "
        f"all its writes in the namespace: {dict(sorted(everything.items()))}"
    )
