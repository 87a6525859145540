"""End-to-end: webhook checks against real HTTP endpoints on the test machine, with the controller as its own
process on the same machine (e2e/harness/controller.py) calling them.

- A pre-traffic check that fails blocks the batch before it gets any traffic: under an open-loop load
  through Traefik (e2e/harness/load.py), no request is answered by a canary pod, and the release fails
  naming the webhook.
- A confirm that says no holds the release (Progressing, the Paused condition True, the confirm named in
  ``status.awaitingConfirmation``) until it says yes; then the release goes on to Succeeded.
- A confirm that never answers is aborted at its ``approval.timeout``, not before and not much after.

A :class:`Endpoint` listens on 127.0.0.1 (a free port of its own), records every call (when it came, the
JSON it carried) and answers as it is told: a status code, or nothing at all (it holds the connection).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from e2e.harness.controller import Controller, apply_release, deploy_app, events, gr, status, wait_for, wait_phase
from e2e.harness.controlplane import Cluster
from e2e.harness.dataplane import DataPlane, answering_app
from e2e.harness.load import Load, summarise

pytestmark = pytest.mark.e2e

RATE = 100.0  # requests/s, as the other tests through Traefik send
V1 = "registry.example/app:v1"
GRACE_SECONDS = 5


@dataclass(frozen=True)
class Call:
    """One call an endpoint took: when (time.time(), on arrival), its path and its JSON body."""

    at: float
    path: str
    body: dict[str, Any]


class Endpoint:
    """An HTTP server on 127.0.0.1 answering every call with :attr:`code` (or, with :attr:`hang`, not at
    all: the connection is held until the endpoint closes)."""

    def __init__(self, code: int = 200, *, hang: bool = False) -> None:
        self.code = code
        self.hang = hang
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer._lock:
                    outer._calls.append(Call(time.time(), self.path, json.loads(raw or b"{}")))
                    code, hang = outer.code, outer.hang
                if hang:
                    outer._closing.wait(60)
                    return
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/check"

    def answer(self, code: int) -> None:
        with self._lock:
            self.code, self.hang = code, False

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


def reasons(cluster: Cluster, namespace: str) -> list[str]:
    return [str(e.get("reason")) for e in events(cluster, namespace, "web")]


def conditions(st: dict[str, Any]) -> dict[str, str]:
    return {str(c.get("type")): str(c.get("status")) for c in st.get("conditions") or []}


# --- a failing pre-traffic check: no request reaches the canary -----------------------------------------


def deploy_routed(cluster: Cluster, dataplane: DataPlane, namespace: str, replicas: int) -> str:
    """Deployment `web` (answering pods of V1), its Service `web`, and an HTTPRoute `web` on the Gateway at
    a host of its own. Returns the host once Traefik answers there from every pod."""
    app = answering_app("web", replicas, V1, grace_seconds=GRACE_SECONDS)
    host = f"web.{namespace}.example"
    app["items"].append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web"},
            "spec": {
                "parentRefs": [dataplane.parent_ref],
                "hostnames": [host],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}]}],
            },
        }
    )
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(app))
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s")

    def all_answer() -> bool:
        with Load(dataplane.gateway_url, 50, host=host, timeout=2) as probe:
            time.sleep(0.5)
        s = probe.summary()
        return s.sent > 0 and not s.failed and len({r.pod for r in probe.records}) == replicas

    wait_for(all_answer, 60, f"Traefik answering for {host} from {replicas} pods", interval=0.2)
    return host


def test_a_failing_pre_traffic_check_blocks_the_batch_before_it_gets_traffic(
    cluster: Cluster, dataplane: DataPlane, namespace: str, controller: Controller, endpoint: Endpoint
) -> None:
    host = deploy_routed(cluster, dataplane, namespace, replicas=4)
    endpoint.answer(403)  # the smoke test says no
    body = gr(
        "web",
        targetRef={"name": "web"},
        targetVersion="v2",
        trafficRouting={"gatewayAPI": {"httpRoute": "web", "stableService": "web"}},
        batches=[{"replicas": 1, "weight": 50, "pause": "300s"}, {"replicas": 4, "weight": 100}],
        analysis={"webhooks": [{"name": "smoke", "at": "pre-traffic", "url": endpoint.url, "timeout": "2s"}]},
    )
    load = Load(dataplane.gateway_url, RATE, host=host).start()
    try:
        time.sleep(2)
        applied = time.time()
        apply_release(cluster, namespace, body)
        final = wait_phase(cluster, namespace, "web", {"Failed", "Aborted", "Succeeded"}, timeout=120)
        # The canary pods leave; requests sent meanwhile still go to the stable alone.
        wait_for(lambda: not canary_pods(cluster, namespace), 60, "no canary pod left")
        time.sleep(2)
    finally:
        records = load.stop()
    canary_image = "registry.example/app:v2"
    s = summarise(records, applied - 2, records[-1].sent, asked_rate=RATE)
    calls = endpoint.calls
    print(
        f"\nrelease {final.get('phase')}: {final.get('message')}\n  {len(calls)} call(s) of the smoke webhook; "
        f"{s.sent} requests, answered by {s.answered_by_image}, {len(s.failed)} failed"
    )
    assert final.get("phase") == "Failed", (final, controller.logs())
    assert "webhook smoke: answered 403" in str(final.get("message")), final.get("message")
    assert len(calls) == 1  # failureLimit 0: one no fails the batch
    sent = calls[0].body
    assert sent["webhook"] == {"name": "smoke", "at": "pre-traffic", "kind": "check"}
    assert (sent["phase"], sent["batch"]["current"], sent["weight"]) == ("Progressing", 1, 0)
    assert sent["release"]["namespace"] == namespace and sent["versions"]["target"] == "v2"
    # Called at the pre-traffic point (batch 1 under way, the canary at weight 0); the canary got no request.
    assert s.answered_by_image.get(canary_image, 0) == 0, s.answered_by_image
    assert s.answered_by_image.get(V1, 0) > 0
    assert s.failed == [], f"{len(s.failed)} failed requests"
    assert "WebhookCheckFailed" in reasons(cluster, namespace) and "BatchReady" not in reasons(cluster, namespace)


def canary_pods(cluster: Cluster, namespace: str) -> list[Any]:
    found: list[Any] = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", "greyrelease.io/track=canary")[
        "items"
    ]
    return found


# --- a confirm holds the release until its yes ---------------------------------------------------------


def test_a_confirm_that_says_no_holds_the_release_paused_until_it_says_yes(
    cluster: Cluster, namespace: str, controller: Controller, endpoint: Endpoint
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    endpoint.answer(403)
    confirm = {"name": "change-board", "at": "live", "kind": "confirm", "url": endpoint.url, "timeout": "2s"}
    apply_release(
        cluster,
        namespace,
        gr(
            "web",
            targetRef={"name": "web"},
            targetVersion="v2",
            trafficRouting={"service": {"name": "web"}},
            batches=[{"replicas": 1}, {"replicas": 4}],
            analysis={"interval": "1s", "webhooks": [confirm]},
        ),
    )

    def held() -> dict[str, Any] | None:
        st = status(cluster, namespace, "web")
        return st if st.get("awaitingConfirmation") == "change-board" else None

    st = wait_for(held, 60, "the release held by the confirm")
    assert st.get("phase") == "Progressing" and st.get("currentBatch") == 1, st
    assert conditions(st).get("Paused") == "True", st.get("conditions")
    # It stays held while the answer is no: several calls, batch 1 all along.
    time.sleep(5)
    st = status(cluster, namespace, "web")
    no = len(endpoint.calls)
    assert (st.get("phase"), st.get("currentBatch"), st.get("awaitingConfirmation")) == (
        "Progressing",
        1,
        "change-board",
    ), st
    assert no >= 3, no
    entry = next(w for w in st.get("webhooks") or [] if w.get("name") == "change-board")
    assert (entry.get("code"), entry.get("verdict")) == (403, "Fail"), entry
    assert reasons(cluster, namespace).count("WaitingForConfirmation") == 1
    said_yes = time.time()
    endpoint.answer(200)
    final = wait_phase(cluster, namespace, "web", {"Succeeded", "Failed", "Aborted"}, timeout=120)
    assert final.get("phase") == "Succeeded", (final, controller.logs())
    assert final.get("awaitingConfirmation", "") == "" and conditions(final).get("Paused") == "False"
    assert "Confirmed" in reasons(cluster, namespace)
    # A live confirm asks again at each batch, and each batch goes on at its first yes; once the release
    # has ended, nothing calls it any more.
    assert 2 in {c.body["batch"]["current"] for c in endpoint.calls if c.at >= said_yes}
    after = len(endpoint.calls)
    time.sleep(3)
    assert len(endpoint.calls) == after


# --- a confirm that never answers times out as configured -----------------------------------------------


def test_a_confirm_that_never_answers_times_out_as_configured(
    cluster: Cluster, namespace: str, controller: Controller
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    silent = Endpoint(hang=True)
    try:
        confirm = {
            "name": "change-board",
            "at": "live",
            "kind": "confirm",
            "url": silent.url,
            "timeout": "1s",
            "consecutiveErrorLimit": 100,  # only the approval's timeout may end the wait
            "approval": {"timeout": "10s", "onTimeout": "abort"},
        }
        apply_release(
            cluster,
            namespace,
            gr(
                "web",
                targetRef={"name": "web"},
                targetVersion="v2",
                trafficRouting={"service": {"name": "web"}},
                batches=[{"replicas": 1}, {"replicas": 4}],
                analysis={"interval": "1s", "webhooks": [confirm]},
            ),
        )
        first = wait_for(lambda: status(cluster, namespace, "web").get("awaitingConfirmation"), 60, "the hold")
        assert first == "change-board"
        held_at = time.time()
        ready = status(cluster, namespace, "web").get("batchTimes", {}).get("readyAt")
        st = wait_phase(cluster, namespace, "web", {"RollingBack", "Aborted", "Failed", "Succeeded"}, timeout=60)
        ended_at = time.time()
        final = wait_phase(cluster, namespace, "web", {"Aborted", "Failed", "Succeeded"}, timeout=60)
        calls = silent.calls
    finally:
        silent.close()
    waited = ended_at - held_at
    print(f"\nheld {waited:.1f} s (batch live at {ready}); {len(calls)} calls unanswered; then {st.get('phase')}")
    assert final.get("phase") == "Aborted", (final, controller.logs())
    assert "no yes from webhook change-board within 10s (approval.timeout): aborted" in str(final.get("message"))
    assert "ApprovalExpired" in reasons(cluster, namespace)
    # The hold is recorded as soon as the batch is live (the confirm has not said yes yet), and the wait
    # ends 10 s after the batch went live, seen by a pass that a call under way may hold (1 s); this test
    # sees each through kubectl (about 1 s apart): about 9 to 11 s, with room for a slow machine.
    assert 7 <= waited <= 14, waited
    assert len(calls) >= 3  # called again every interval, each call given up after its 1 s timeout
    entry = next(w for w in final.get("webhooks") or [] if w.get("name") == "change-board")
    assert entry.get("verdict") == "Error" and "no answer within 1s" in str(entry.get("message")), entry
