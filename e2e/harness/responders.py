"""Pod responder supervision: a watch on every pod of the cluster drives the responder server
(`python -m e2e.harness.responder`, run inside the pod network's namespace), so each Running pod answers HTTP at its
pod IP and container port.

    python -m e2e.harness.responders --kubeconfig K --netns NS --pod-cidr CIDR

The protocol with the server is JSON lines (see e2e/harness/responder.py): on its stdin
    {"op": "serve", "uid", "ip", "port", "pod", "namespace", "image"}
    {"op": "stop", "uid", "after": seconds}     keep answering `after` seconds, then close everything
and on its stdout {"event": "listening" | "stopped" | "error", "uid", ...}.

Which pod is served, and when:
- a pod is served once it is Running with a pod IP inside this cluster's pod CIDR (not hostNetwork), on the
  first containerPort of its containers (8080 when none is declared), answering as its first container's
  image;
- a pod with a deletionTimestamp, a deleted pod, and a pod that left Running (Failed, Succeeded) get a stop
  with `after` = its terminationGracePeriodSeconds (at most MAX_GRACE_SECONDS; 0 when it is not Running), as
  a container that drains and exits. KWOK reuses pod IPs: the server itself stops an old pod at once when a
  new one is served at its address.

Readiness without a race: a pod that lists the readiness gate `e2e.greyrelease.io/listening` in
`spec.readinessGates` is left not Ready by KWOK (e2e/kwok/pod.yaml, stage pod-ready-gated). Once the server
reports `listening` for it, this watcher sets the gate's condition and Ready to True in the pod's status, as
a kubelet does when the last readiness gate passes; only then does the EndpointSlice controller give it to
the proxy, so the proxy never sees a refused connection from a pod that is starting. Pods without the gate
become Ready at once, as before (tests that send no traffic need nothing new).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import urllib3
from greyrelease.kube.client import STRATEGIC, ApiError, Conflict, KubeClient, NotFound, load_configuration

from e2e.harness.process import HERE, die_with_parent

GATE = "e2e.greyrelease.io/listening"
DEFAULT_PORT = 8080
MAX_GRACE_SECONDS = 30.0
DEFAULT_GRACE_SECONDS = 30.0  # Kubernetes' default terminationGracePeriodSeconds

log = logging.getLogger("e2e.responders")


class WatcherClient(KubeClient):
    # Not "greyrelease": the API server's audit log tells the controller's writes by their user agent.
    user_agent = "e2e-pod-responders"


def has_gate(pod: dict[str, Any]) -> bool:
    return any(g.get("conditionType") == GATE for g in pod.get("spec", {}).get("readinessGates") or [])


def gate_passed(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == GATE and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or []
    )


def first_port(pod: dict[str, Any]) -> int:
    for container in pod.get("spec", {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("containerPort"):
                return int(port["containerPort"])
    return DEFAULT_PORT


def grace_seconds(pod: dict[str, Any]) -> float:
    grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return min(float(DEFAULT_GRACE_SECONDS if grace is None else grace), MAX_GRACE_SECONDS)


class Supervisor:
    """Owns the server process and the record of what it serves; `on_pod` is fed by the watch."""

    def __init__(self, client: KubeClient, command: list[str], pod_cidr: str) -> None:
        self.client = client
        self.network = ipaddress.ip_network(pod_cidr)
        self.lock = threading.Lock()
        self.served: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.stopping: set[str] = set()
        self.listening: set[str] = set()
        self.gate_set: set[str] = set()
        self.patcher = ThreadPoolExecutor(4, thread_name_prefix="gate")
        self.child = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=HERE.parent,
            preexec_fn=die_with_parent,
        )
        threading.Thread(target=self._read_events, name="events", daemon=True).start()

    # Commands ------------------------------------------------------------------------------------------

    def _send(self, command: dict[str, Any]) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(json.dumps(command) + "\n")
        self.child.stdin.flush()

    def serving_address(self, pod: dict[str, Any]) -> str | None:
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or spec.get("hostNetwork"):
            return None
        try:
            return ip if ipaddress.ip_address(ip) in self.network else None
        except ValueError:
            return None

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return
        with self.lock:
            if event == "DELETED" or meta.get("deletionTimestamp"):
                if uid in self.served and uid not in self.stopping:
                    self.stopping.add(uid)
                    self._send({"op": "stop", "uid": uid, "after": grace_seconds(pod)})
                return
            ip = self.serving_address(pod)
            if ip is None:
                if uid in self.served and uid not in self.stopping:  # left Running: its container is gone
                    self.stopping.add(uid)
                    self._send({"op": "stop", "uid": uid, "after": 0})
                return
            if uid not in self.served:
                self._send(
                    {
                        "op": "serve",
                        "uid": uid,
                        "ip": ip,
                        "port": first_port(pod),
                        "pod": meta.get("name"),
                        "namespace": meta.get("namespace"),
                        "image": ((pod["spec"].get("containers") or [{}])[0]).get("image", ""),
                    }
                )
            self.served[uid] = pod
            if uid in self.listening and has_gate(pod) and not gate_passed(pod) and uid not in self.gate_set:
                self._pass_gate(pod)

    def forget_missing(self, present: set[str]) -> None:
        """After a fresh list: pods served but no longer in the cluster were deleted while unwatched."""
        with self.lock:
            gone = [uid for uid in self.served if uid not in present]
        for uid in gone:
            self.on_pod("DELETED", self.served[uid])

    # Events from the server ----------------------------------------------------------------------------

    def _read_events(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                log.warning("responder said: %s", line.rstrip())
                continue
            uid, kind = event.get("uid"), event.get("event")
            with self.lock:
                if kind == "listening" and uid in self.served:
                    self.listening.add(uid)
                    pod = self.served[uid]
                    if uid not in self.stopping and has_gate(pod) and not gate_passed(pod):
                        self._pass_gate(pod)
                elif kind == "stopped":
                    self.served.pop(uid, None)
                    self.stopping.discard(uid)
                    self.listening.discard(uid)
                    self.gate_set.discard(uid)
                elif kind == "error":
                    log.warning("responder error for %s: %s", uid, event.get("message"))
        log.error("the responder server exited (%s)", self.child.wait())

    def _pass_gate(self, pod: dict[str, Any]) -> None:
        """Called with the lock held: the patch runs on a pool thread."""
        self.gate_set.add(pod["metadata"]["uid"])
        self.patcher.submit(self._patch_ready, pod)

    def _patch_ready(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"uid": meta["uid"]},  # a precondition: never the pod that now holds the name
            "status": {
                "conditions": [
                    {"type": GATE, "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now, "reason": None, "message": None},
                ]
            },
        }
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            self.client.patch(path, body, patch_type=STRATEGIC)
        except (NotFound, Conflict):
            pass  # deleted, or replaced by a pod of the same name
        except (ApiError, OSError) as exc:
            log.warning("setting %s Ready failed: %s", meta["name"], exc)
            with self.lock:
                self.gate_set.discard(meta["uid"])  # the next event of the pod tries again

    def close(self) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()  # the server stops everything at the end of its input
        try:
            self.child.wait(10)
        except subprocess.TimeoutExpired:
            self.child.kill()
        self.patcher.shutdown(wait=False)


def run(client: KubeClient, supervisor: Supervisor) -> None:
    """List, then watch from the list's resourceVersion; list again when the watch expires (410 Gone)."""
    resource_version: str | None = None
    while supervisor.child.poll() is None:
        try:
            if resource_version is None:
                listed = client.request("GET", "/api/v1/pods")
                present = set()
                for pod in listed.get("items") or []:
                    present.add(pod["metadata"]["uid"])
                    supervisor.on_pod("ADDED", pod)
                supervisor.forget_missing(present)
                resource_version = listed["metadata"]["resourceVersion"]
            for event in client.watch("/api/v1/pods", resource_version=resource_version):
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    resource_version = None  # expired: list again
                    break
                resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    supervisor.on_pod(event["type"], obj)
        except (ApiError, OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            # The API server may end a watch's stream mid-chunk (urllib3's ProtocolError): list and watch
            # again. A watcher that died here would leave every pod unserved for the rest of the session.
            log.warning("pod watch: %s; listing again", exc)
            resource_version = None
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.harness.responders",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--netns", required=True, help="the pod network's namespace (ip netns)")
    parser.add_argument("--pod-cidr", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    client = WatcherClient(load_configuration(args.kubeconfig), connections=8)
    command = ["ip", "netns", "exec", args.netns, sys.executable, "-m", "e2e.harness.responder"]
    supervisor = Supervisor(client, command, args.pod_cidr)
    try:
        run(client, supervisor)
    finally:
        supervisor.close()
    return 1  # only reached when the server died


if __name__ == "__main__":
    sys.exit(main())
