"""What a release did, read back: the objects of a namespace read in this process, the Events a release
posted (in the order the API server stored them), and the times the audit log gives to writes.

- :class:`Reads`: GETs with the controller's own client, under a user agent of the tests (so the audit log
  never counts them as the controller's), polled in this process: a kubectl started every few tenths of a
  second would take the CPU the controller and the proxy need;
- :func:`events_of`: ``kubectl get events --field-selector involvedObject.kind=...,involvedObject.name=...``,
  in the order the API server created them (their resourceVersion: the Events of one release are posted one
  after another, so that is the order a pass posted them in);
- :func:`first_write_after`: when the API server received the first write of a resource after a moment, by a
  user agent or a field manager: the abort cut's start (the annotation's write) and its middle (the
  controller's write of the route or the Service);
- :func:`request_annotation_writes`: the controller's writes to a GreyRelease that set or remove one of the
  request annotations (follow mode removes none).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

from greyrelease.api.release import ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION, TRACK_LABEL
from greyrelease.kube.client import KubeClient, load_configuration

from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.gitops import audited_requests
from e2e.harness.reliability import CONTROLLER_AGENTS, Write, audited_writes

T = TypeVar("T")

#: The annotations a person (or Git) writes to ask a release for something.
REQUEST_ANNOTATIONS = (ABORT_ANNOTATION, PROMOTE_ANNOTATION, RETRY_ANNOTATION)


class Reads:
    """The namespace's GreyReleases, Deployments and pods, read in this process."""

    def __init__(self, cluster: Cluster, namespace: str, *, agent: str = "e2e-reads") -> None:
        self.client = KubeClient(load_configuration(str(cluster.kubeconfig)), connections=2)
        self.client.user_agent = agent  # not the controller's ("greyrelease"): the audit log tells them apart
        self.namespace = namespace

    def release(self, name: str = "web") -> dict[str, Any] | None:
        return self.client.get(f"/apis/greyrelease.io/v1/namespaces/{self.namespace}/greyreleases/{name}")

    def status(self, name: str = "web") -> dict[str, Any]:
        return dict((self.release(name) or {}).get("status") or {})

    def deployment(self, name: str = "web") -> dict[str, Any] | None:
        return self.client.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}")

    def pods(self, *, canary: bool) -> list[dict[str, Any]]:
        """The pods not being deleted, of the canary or not."""
        return [
            p
            for p in self.client.list(f"/api/v1/namespaces/{self.namespace}/pods")
            if not p["metadata"].get("deletionTimestamp")
            and (TRACK_LABEL in (p["metadata"].get("labels") or {})) == canary
        ]

    def replicasets(self) -> list[dict[str, Any]]:
        """The ReplicaSets of the Deployments that are not a canary."""
        return [
            r
            for r in self.client.list(f"/apis/apps/v1/namespaces/{self.namespace}/replicasets")
            if TRACK_LABEL not in (r["metadata"].get("labels") or {})
        ]

    def wait(self, read: Callable[[], T | None], timeout: float, what: str, *, interval: float = 0.2) -> T:
        """The first true value of ``read``, asked every ``interval`` seconds for ``timeout``."""
        deadline = time.monotonic() + timeout
        last: T | None = None
        while True:
            last = read()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
            time.sleep(interval)

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str, *, name: str = "web"
    ) -> dict[str, Any]:
        """The release's status once ``predicate`` holds of it; the phase and message when it never does."""

        def check() -> dict[str, Any] | None:
            st = self.status(name)
            return st if st and predicate(st) else None

        try:
            return self.wait(check, timeout, what)
        except AssertionError:
            st = self.status(name)
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; status: phase {st.get('phase')}, batch "
                f"{st.get('currentBatch')} {st.get('batchState')}: {st.get('message')}"
            ) from None

    def wait_phase(self, phases: set[str], timeout: float, *, name: str = "web") -> dict[str, Any]:
        return self.wait_status(lambda st: st.get("phase") in phases, timeout, f"GreyRelease {name} in {phases}")


def condition(st: dict[str, Any], kind: str) -> str:
    """The status ("True", "False") of a condition of a status; "" without it."""
    return next((str(c["status"]) for c in st.get("conditions") or [] if c["type"] == kind), "")


def first_image(obj: dict[str, Any]) -> str:
    """The first container's image of a Deployment, a ReplicaSet or a pod."""
    spec = obj["spec"]
    pod_spec = spec["template"]["spec"] if "template" in spec else spec
    return str(pod_spec["containers"][0]["image"])


# --- Events ------------------------------------------------------------------------------------------------


def events_of(
    cluster: Cluster, namespace: str, kind: str, name: str, *, reason: str | None = None
) -> list[dict[str, Any]]:
    """The Events about ``kind``/``name`` (of ``reason`` when given), in the order they were created."""
    selector = f"involvedObject.kind={kind},involvedObject.name={name}" + (f",reason={reason}" if reason else "")
    items = cluster.kubectl_json("get", "events", "-n", namespace, "--field-selector", selector)["items"]
    return sorted(items, key=lambda e: int(e["metadata"]["resourceVersion"]))


def event_line(e: dict[str, Any]) -> str:
    return f"{e['type']} {e['reason']} {e['metadata']['name']}: {e['message'][:160]}"


# --- the audit log --------------------------------------------------------------------------------------


def first_write_after(
    cluster: LocalCluster,
    namespace: str,
    t0: float,
    resource: str,
    *,
    agents: Iterable[str] = (),
    field_manager: str | None = None,
) -> float | None:
    """When (time.time()) the API server received the first successful write of ``resource`` in ``namespace``
    after ``t0``: by a client whose user agent starts with one of ``agents`` (any, when empty), or with the
    field manager ``field_manager`` (kubectl's commands name themselves there: ``kubectl-annotate``)."""
    since = datetime.fromtimestamp(t0, UTC)
    if field_manager is not None:
        for r in audited_requests(cluster, namespace, since=since):
            if r.resource == resource and r.field_manager == field_manager and 200 <= r.code < 300 and not r.dry_run:
                return r.at.timestamp()
        return None
    for w in audited_writes(cluster, namespace=namespace, agents=tuple(agents), since=since):
        if w.resource == resource and 200 <= w.code < 300:
            return w.at.timestamp()
    return None


def _touches_requests(body: Any) -> bool:
    """Whether a patch sets or removes a request annotation: a merge patch naming one under
    metadata.annotations (null removes it), or a JSON patch whose path reaches one (or all of them)."""
    if isinstance(body, dict):
        annotations = (body.get("metadata") or {}).get("annotations")
        return isinstance(annotations, dict) and any(k in annotations for k in REQUEST_ANNOTATIONS)
    if isinstance(body, list):
        escaped = {"/metadata/annotations/" + k.replace("~", "~0").replace("/", "~1") for k in REQUEST_ANNOTATIONS}
        for op in body:
            where = str((op or {}).get("path", "")) if isinstance(op, dict) else ""
            if where in escaped or where in ("/metadata/annotations", "/metadata"):
                return True
    return False


def request_annotation_writes(cluster: LocalCluster, namespace: str, since: datetime) -> list[str]:
    """The controller's patches of a GreyRelease (not of its status) since ``since`` that set or remove a
    request annotation, one line each; follow mode makes none. (The controller patches its releases; it never
    replaces one whole.)"""
    found: list[Write] = [
        w
        for w in audited_writes(cluster, namespace=namespace, agents=CONTROLLER_AGENTS, since=since)
        if w.resource == "greyreleases"
        and w.subresource != "status"
        and w.verb == "patch"
        and _touches_requests(w.body)
    ]
    return [f"{w} {json.dumps(w.body)[:300]}" for w in found]
