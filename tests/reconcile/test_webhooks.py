"""The webhook checks' calls against a real HTTP server on 127.0.0.1 (no HTTP mocked): each answer's
verdict (2xx, 5xx, a JSON condition met, not met, its field missing, not JSON, no answer in time, a
redirect not followed), what is sent (the release's state, the placeholders, the credentials from
Secrets), calls side by side within their timeout, and a live confirm driving a whole release through the
reconciler."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from greyrelease.analysis.webhooks import Answer, judge
from greyrelease.api.release import CheckVerdict, GreyReleaseSpec, GreyReleaseStatus, Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.reconcile.record import release_path
from greyrelease.reconcile.webhooks import Webhooks

from tests.support.builders import EVENTS, NS, RELEASE, T0, UID, cluster, release, roll_out, service, stable, status_of
from tests.support.faults import Crash, refuse

#: What each route answers: status, body, extra headers.
ROUTES: dict[str, tuple[int, str, dict[str, str]]] = {
    "/ok": (200, "", {}),
    "/yes": (200, '{"result": {"ok": true}}', {"Content-Type": "application/json"}),
    "/no": (200, '{"result": {"ok": false}}', {"Content-Type": "application/json"}),
    "/empty": (200, "{}", {"Content-Type": "application/json"}),
    "/text": (200, "all good", {"Content-Type": "text/plain"}),
    "/error": (500, "", {}),
    "/forbidden": (403, "", {}),
    "/moved": (302, "", {"Location": "/ok"}),
}


class Endpoint:
    """An HTTP server on 127.0.0.1 answering :data:`ROUTES` (``/hang`` answers nothing for 5 s, ``/gate``
    403 until :attr:`open` is set, then 200), recording every request: method, path, headers, body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.open = threading.Event()
        self.stop = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _answer(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with endpoint.lock:
                    endpoint.requests.append((self.command, self.path, dict(self.headers), raw))
                route = urlsplit(self.path).path
                if route == "/hang":
                    endpoint.stop.wait(5)
                    return
                answer: tuple[int, str, dict[str, str]] = ROUTES.get(route, (404, "", {}))
                if route == "/gate":
                    answer = (200 if endpoint.open.is_set() else 403, "", {})
                status, text, headers = answer
                data = text.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{route}"

    def to(self, route: str) -> list[tuple[str, str, dict[str, str], bytes]]:
        with self.lock:
            return [r for r in self.requests if urlsplit(r[1]).path == route]

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    e = Endpoint()
    yield e
    e.close()


def secret(name: str, **data: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def _spec(*hooks: dict[str, Any], version: str = "v2") -> GreyReleaseSpec:
    return GreyReleaseSpec.model_validate(
        {
            "targetRef": {"name": "web"},
            "targetVersion": version,
            "batchSize": 1,
            "canaryWeight": 50,
            "trafficRouting": {"nginx": {"ingress": "web", "stableService": "web"}},
            "analysis": {"webhooks": list(hooks)},
        }
    )


STATUS = GreyReleaseStatus.model_validate(
    {
        "phase": "Progressing",
        "batchState": "Upscaling",
        "currentBatch": 1,
        "totalBatches": 2,
        "canaryWeight": 0,
        "stableVersion": "v1",
        "targetVersion": "v2",
        "targetName": "web",
    }
)


def _call(kube: MemoryKube, *hooks: dict[str, Any], version: str = "v2") -> tuple[tuple[Answer, ...], GreyReleaseSpec]:
    spec = _spec(*hooks, version=version)
    assert spec.analysis is not None
    obj = release()
    obj["metadata"]["generation"] = 3
    answers = Webhooks(kube).answers(obj, spec, STATUS, tuple(spec.analysis.webhooks), T0)
    return answers, spec


CONDITION = {"field": "result.ok", "equals": "true"}
TABLE: list[tuple[str, str, dict[str, Any] | None, CheckVerdict, str]] = [
    ("2xx", "/ok", None, CheckVerdict.PASS, "answered 200"),
    ("5xx", "/error", None, CheckVerdict.ERROR, "answered 500"),
    ("4xx", "/forbidden", None, CheckVerdict.FAIL, "answered 403"),
    ("condition met", "/yes", CONDITION, CheckVerdict.PASS, "result.ok = true"),
    ("condition not met", "/no", CONDITION, CheckVerdict.FAIL, "result.ok = false, not true"),
    ("field missing", "/empty", CONDITION, CheckVerdict.ERROR, "answered 200 without the field result.ok"),
    ("not JSON", "/text", CONDITION, CheckVerdict.ERROR, "answered 200 without JSON (condition on result.ok)"),
    ("timeout", "/hang", None, CheckVerdict.ERROR, "no answer within 0.3s"),
    ("redirect refused", "/moved", None, CheckVerdict.ERROR, "answered 302: redirects are not followed"),
]


@pytest.mark.parametrize(("route", "condition", "verdict", "why"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_the_verdict_of_a_real_answer(
    endpoint: Endpoint, route: str, condition: dict[str, Any] | None, verdict: CheckVerdict, why: str
) -> None:
    hook: dict[str, Any] = {"name": "smoke", "at": "pre-traffic", "url": endpoint.url(route), "timeout": "0.3s"}
    if condition is not None:
        hook["condition"] = condition
    (answer,), spec = _call(MemoryKube(), hook)
    assert spec.analysis is not None
    got, _, message = judge(spec.analysis.webhooks[0], answer)
    assert (got, message) == (verdict, why)


def test_a_redirect_is_not_followed(endpoint: Endpoint) -> None:
    before = len(endpoint.to("/ok"))
    (answer,), _ = _call(MemoryKube(), {"name": "smoke", "at": "live", "url": endpoint.url("/moved")})
    assert answer.code == 302
    assert len(endpoint.to("/ok")) == before  # the Location was never asked for


def test_what_a_call_sends(endpoint: Endpoint) -> None:
    kube = MemoryKube(secret("token", token="s3cret"), secret("keys", **{"X-Api-Key": "k1"}))
    url = endpoint.url("/ok") + "?release={{namespace}}/{{name}}&version={{version}}&batch={{batch}}&t={{track}}"
    hook = {
        "name": "smoke",
        "at": "pre-traffic",
        "url": url,
        "bearerTokenSecret": {"name": "token", "key": "token"},
        "headersSecret": {"name": "keys"},
    }
    before = len(endpoint.to("/ok"))
    (answer,), _ = _call(kube, hook, version="registry.example/app:v2")
    assert answer.code == 200
    method, target, headers, raw = endpoint.to("/ok")[before]
    assert method == "POST"
    # Each value percent-encoded, so a version with / or : cannot change the URL's shape.
    assert target.endswith("?release=shop/web&version=registry.example%2Fapp%3Av2&batch=1&t=canary")
    assert headers["Authorization"] == "Bearer s3cret" and headers["X-Api-Key"] == "k1"
    assert headers["Content-Type"] == "application/json"
    sent = json.loads(raw)
    assert sent == {
        "apiVersion": "greyrelease.io/v1",
        "kind": "GreyReleaseWebhookCall",
        "webhook": {"name": "smoke", "at": "pre-traffic", "kind": "check"},
        "time": "2026-01-01T12:00:00.000Z",
        "release": {"namespace": NS, "name": "web", "uid": UID, "generation": 3},
        "phase": "Progressing",
        "batch": {"current": 1, "total": 2},
        "weight": 0,
        "versions": {"stable": "v1", "target": "v2"},
    }


def test_a_get_sends_no_body(endpoint: Endpoint) -> None:
    before = len(endpoint.to("/yes"))
    (answer,), _ = _call(MemoryKube(), {"name": "gate", "at": "live", "url": endpoint.url("/yes"), "method": "GET"})
    assert answer.code == 200
    method, _, headers, raw = endpoint.to("/yes")[before]
    assert (method, raw) == ("GET", b"") and "Content-Type" not in headers


def test_a_secret_that_cannot_be_read_is_an_error_naming_it_and_nothing_is_sent(endpoint: Endpoint) -> None:
    before = len(endpoint.requests)
    hook = {
        "name": "smoke",
        "at": "live",
        "url": endpoint.url("/ok"),
        "bearerTokenSecret": {"name": "nope", "key": "t"},
    }
    (answer,), spec = _call(MemoryKube(), hook)
    assert answer == Answer("smoke", error=f"Secret {NS}/nope not found")
    assert spec.analysis is not None and judge(spec.analysis.webhooks[0], answer)[0] == CheckVerdict.ERROR
    assert len(endpoint.requests) == before


def test_calls_run_side_by_side_each_within_its_timeout(endpoint: Endpoint) -> None:
    hooks = [{"name": f"h{i}", "at": "live", "url": endpoint.url("/hang"), "timeout": "0.5s"} for i in range(4)]
    hooks.append({"name": "fine", "at": "live", "url": endpoint.url("/ok"), "timeout": "0.5s"})
    started = time.monotonic()
    answers, _ = _call(MemoryKube(), *hooks)
    took = time.monotonic() - started
    assert [a.webhook for a in answers] == ["h0", "h1", "h2", "h3", "fine"]
    assert all(a.error == "no answer within 0.5s" for a in answers[:4]) and answers[4].code == 200
    assert took < 1.5, took  # one timeout, not four


def test_a_refused_connection_is_an_error_without_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (answer,), _ = _call(MemoryKube(), {"name": "smoke", "at": "live", "url": f"http://127.0.0.1:{port}/x?token=abc"})
    assert answer.error.startswith("could not connect") and "abc" not in answer.error and str(port) not in answer.error


# --- through the reconciler -----------------------------------------------------------------------------


def test_a_live_confirm_holds_the_release_paused_until_it_says_yes(endpoint: Endpoint) -> None:
    endpoint.open.clear()
    hook = {"name": "change-board", "at": "live", "kind": "confirm", "url": endpoint.url("/gate")}
    kube = cluster(analysis={"interval": "5s", "webhooks": [hook]})
    reconciler, now = Reconciler(kube), T0

    def run(passes: int) -> None:
        nonlocal now
        for _ in range(passes):
            outcome = reconciler.reconcile(NS, "web", now=now)
            assert outcome is not None
            roll_out(kube)
            wait = outcome.plan.requeue_after
            now += timedelta(seconds=1.0 if wait is None else max(wait, 0.01))

    run(12)
    st = status_of(kube)
    assert (st["phase"], st["currentBatch"], st["awaitingConfirmation"]) == ("Progressing", 1, "change-board")
    paused = {c["type"]: c["status"] for c in st["conditions"]}["Paused"]
    assert paused == "True"
    called = len(endpoint.to("/gate"))
    assert called >= 2 and st["webhooks"][0]["code"] == 403 and st["webhooks"][0]["verdict"] == "Fail"
    reasons = [e["reason"] for e in kube.objects(EVENTS)]
    assert reasons.count("WaitingForConfirmation") == 1 and "WebhookCheckFailed" not in reasons
    endpoint.open.set()
    for _ in range(40):
        run(1)
        if status_of(kube).get("phase") == "Succeeded":
            break
    st = status_of(kube)
    assert st["phase"] == "Succeeded" and st["awaitingConfirmation"] == ""
    assert "Confirmed" in [e["reason"] for e in kube.objects(EVENTS)]


def test_a_rollback_tells_its_post_rollback_webhook_once(endpoint: Endpoint) -> None:
    hook = {"name": "tell", "at": "post-rollback", "url": endpoint.url("/error")}
    kube = cluster(analysis={"webhooks": [hook]}, batches=[{"replicas": 1, "pause": "manual"}, {"replicas": 4}])
    reconciler, now = Reconciler(kube), T0
    for _ in range(6):
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    obj = kube.get(RELEASE)
    assert obj is not None
    kube.put({**obj, "metadata": {**obj["metadata"], "annotations": {"greyrelease.io/abort": "true"}}})
    before = len(endpoint.to("/error"))
    for _ in range(10):
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    st = status_of(kube)
    assert st["phase"] == "Aborted"
    assert len(endpoint.to("/error")) == before + 1  # once, and not again in the passes after
    assert st["webhooks"][0]["verdict"] == "Error" and st["webhooks"][0]["code"] == 500
    warned = [e for e in kube.objects(EVENTS) if e["reason"] == "WebhookCheckFailed"]
    assert len(warned) == 1 and "webhook tell (post-rollback): answered 500" in warned[0]["message"]


def _renamed(obj: Obj, name: str) -> Obj:
    """``obj`` (of the app ``web``) as the same object of the app ``name``."""
    out: Obj = json.loads(json.dumps(obj).replace('"web"', f'"{name}"').replace('"web-uid"', f'"{name}-uid"'))
    return out


def test_a_hanging_webhook_holds_the_pass_of_its_own_release_only(endpoint: Endpoint) -> None:
    manual = [{"replicas": 1, "pause": "manual"}, {"replicas": 4}]
    slow = {"name": "slow", "at": "live", "url": endpoint.url("/hang"), "timeout": "2s"}
    kube = cluster(analysis={"interval": "60s", "webhooks": [slow]}, batches=manual)
    other = _renamed(release(batches=manual), "api")
    other["metadata"]["uid"] = "api-release-uid"
    for obj in (_renamed(stable(), "api"), _renamed(service(), "api"), other):
        kube.put(obj)
    roll_out(kube)
    reconciler, now = Reconciler(kube), T0
    for _ in range(6):  # both live at batch 1, waiting for approval; the webhook not due for 60 s
        for name in ("web", "api"):
            reconciler.reconcile(NS, name, now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    assert status_of(kube)["batchState"] == "WaitingForApproval"
    before = len(endpoint.to("/hang"))
    took: dict[str, float] = {}

    def web_pass() -> None:
        started = time.monotonic()
        reconciler.reconcile(NS, "web", now=now + timedelta(seconds=60))
        took["web"] = time.monotonic() - started

    hanging = threading.Thread(target=web_pass)
    hanging.start()
    wait_until = time.monotonic() + 2
    while len(endpoint.to("/hang")) == before and time.monotonic() < wait_until:
        time.sleep(0.01)
    assert len(endpoint.to("/hang")) == before + 1  # web's pass is waiting for its webhook
    api = kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api"))
    assert api is not None
    kube.put({**api, "metadata": {**api["metadata"], "annotations": {"greyrelease.io/abort": "true"}}})
    started = time.monotonic()
    reconciler.reconcile(NS, "api", now=now + timedelta(seconds=60))
    aborting = time.monotonic() - started
    assert hanging.is_alive()  # the abort was planned while web's pass still waited
    hanging.join()
    api_status = (kube.get(path("greyrelease.io", "v1", "greyreleases", NS, "api")) or {}).get("status") or {}
    assert api_status.get("phase") == "RollingBack" and aborting < 0.5, aborting
    assert 1.9 <= took["web"] < 3.0, took
    assert status_of(kube)["webhooks"][0]["message"] == "no answer within 2s"


def test_a_pass_killed_before_its_status_calls_again_and_counts_once(endpoint: Endpoint) -> None:
    check = {"name": "load", "at": "live", "url": endpoint.url("/forbidden"), "failureLimit": 3}
    kube = cluster(analysis={"interval": "10s", "webhooks": [check]}, batches=[{"replicas": 1, "pause": "manual"}])
    reconciler, now = Reconciler(kube), T0
    for _ in range(6):
        reconciler.reconcile(NS, "web", now=now)
        roll_out(kube)
        now += timedelta(seconds=1)
    assert status_of(kube)["batchState"] == "WaitingForApproval" and not status_of(kube).get("webhooks")
    before = len(endpoint.to("/forbidden"))
    refuse(kube, Crash, verb="PATCH", path=release_path(NS, "web", "status"), times=1)
    with pytest.raises(Crash):  # the call made, its Event posted, the controller killed before the status
        reconciler.reconcile(NS, "web", now=now + timedelta(seconds=10))
    assert len(endpoint.to("/forbidden")) == before + 1 and not status_of(kube).get("webhooks")
    reconciler.reconcile(NS, "web", now=now + timedelta(seconds=11))  # the restarted controller
    assert len(endpoint.to("/forbidden")) == before + 2  # called again: nothing recorded the first answer
    entry = status_of(kube)["webhooks"][0]
    assert (entry["failures"], entry["code"], entry["verdict"]) == (1, 403, "Fail")  # counted once
    failed = [e for e in kube.objects(EVENTS) if e["reason"] == "WebhookCheckFailed"]
    assert len(failed) == 1  # the repeat's Event has the killed pass's name: posted once
