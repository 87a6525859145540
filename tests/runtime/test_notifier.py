"""The notification sender against real HTTP receivers on 127.0.0.1 (no HTTP mocked): retries on a 5xx, a
receiver that hangs timing out without holding the others, the oldest dropped from a full queue, a Secret
missing, the order of one receiver's notifications, and a whole release's Events arriving once each."""

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

import pytest
from greyrelease.api.release import Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import path
from greyrelease.reconcile import metrics
from greyrelease.reconcile.notify import NOTIFICATION_FAILED, Delivery
from greyrelease.reconcile.reconciler import Reconciler
from greyrelease.runtime.notifier import Notifier
from prometheus_client import REGISTRY

from tests.support.builders import EVENTS, NS, T0, cluster, release, roll_out, service, stable, status_of

HOME = "greyrelease-system"


class Receiver:
    """An HTTP server on 127.0.0.1 recording every POST as (path, JSON body). ``/ok`` answers 200,
    ``/flaky`` 503 to its first POST then 200, ``/hang`` nothing until :attr:`release` is set, ``/gone``
    404 and ``/moved`` a redirect to ``/ok``."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.posts.append((self.path, json.loads(raw)))
                    seen = sum(1 for p, _ in receiver.posts if p == self.path)
                if self.path == "/hang":
                    receiver.release.wait(10)
                status = {"/gone": 404, "/moved": 302}.get(
                    self.path, 503 if self.path == "/flaky" and seen == 1 else 200
                )
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "/ok")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{route}"

    def to(self, route: str) -> list[Any]:
        with self.lock:
            return [body for p, body in self.posts if p == route]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def secret(name: str, **data: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def world(receiver: Receiver) -> MemoryKube:
    """The release, and a Secret ``hooks`` with a URL per route of the receiver (and one not listening)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    routes = {name: receiver.url(f"/{name}") for name in ("ok", "flaky", "hang", "gone", "moved", "other")}
    return MemoryKube(
        stable(),
        service(),
        release(),
        secret("hooks", **routes, refused=f"http://127.0.0.1:{closed}/", ftp="ftp://example/"),
    )


def delivery(key: str, n: int = 1, *, name: str = "", secret: str = "hooks") -> Delivery:
    return Delivery(
        notification=name or key,
        format="generic",
        source="GreyRelease",
        secret=(NS, secret, key),
        namespace=NS,
        release="web",
        uid="release-uid",
        event=f"web.event{n}",
        reason="AnalysisFailed",
        body=json.dumps({"id": f"web.event{n}"}).encode(),
    )


def counted(kind: str, name: str) -> float:
    value = REGISTRY.get_sample_value(
        f"greyrelease_notifications_{kind}_total", {"notification": name, "format": "generic"}
    )
    return value or 0.0


def notifier(kube: MemoryKube, **options: Any) -> Notifier:
    return Notifier(kube, **{"timeout": 1.0, "backoff": (0.05, 0.1), **options})


def failures(kube: MemoryKube) -> list[Obj]:
    return [e for e in kube.objects(EVENTS) if e["reason"] == NOTIFICATION_FAILED]


def entries(kube: MemoryKube) -> list[Obj]:
    return list(status_of(kube).get("notifications") or [])


def test_a_503_then_200_is_delivered_once(receiver: Receiver) -> None:
    kube = world(receiver)
    sent, failed = counted("sent", "flaky"), counted("failed", "flaky")
    n = notifier(kube).start()
    try:
        n.submit([delivery("flaky")])
        assert n.wait_idle(5)
    finally:
        n.stop()
    assert receiver.to("/flaky") == [{"id": "web.event1"}] * 2  # the 503, then the 200
    assert counted("sent", "flaky") == sent + 1 and counted("failed", "flaky") == failed
    assert failures(kube) == [] and entries(kube) == []  # a notification that works costs no write


def test_a_hanging_receiver_times_out_once_and_holds_no_other_receiver(receiver: Receiver) -> None:
    kube = world(receiver)
    n = notifier(kube, timeout=0.6).start()
    try:
        started = time.monotonic()
        n.submit([delivery("hang", 1), delivery("ok", 2), delivery("other", 3)])
        while len(receiver.to("/ok")) + len(receiver.to("/other")) < 2 and time.monotonic() - started < 5:
            time.sleep(0.01)
        others_at = time.monotonic() - started
        assert n.wait_idle(5)
        hang_done = time.monotonic() - started
    finally:
        n.stop()
    assert others_at < 0.5, f"the other receivers waited {others_at:.2f}s"
    assert 0.6 <= hang_done < 2.0
    assert len(receiver.to("/hang")) == 1  # a timeout waiting for the answer is not tried again
    (event,) = failures(kube)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "web"
    assert (
        "notification hang (GreyRelease) of Event AnalysisFailed web.event1: no answer within 0.6s" in event["message"]
    )
    (entry,) = entries(kube)
    assert entry["name"] == "hang" and entry["result"] == "Failed" and "no answer" in entry["message"]


def test_a_full_queue_drops_the_oldest_and_counts_it(receiver: Receiver) -> None:
    kube = world(receiver)
    dropped = counted("dropped", "ok")
    n = notifier(kube, capacity=2)
    n.submit([delivery("ok", 1), delivery("ok", 2)])
    n.submit([delivery("ok", 3)])  # full: the first is dropped
    assert n.queued() == 2 and counted("dropped", "ok") == dropped + 1
    n.start()
    try:
        assert n.wait_idle(5)
    finally:
        n.stop()
    assert receiver.to("/ok") == [{"id": "web.event2"}, {"id": "web.event3"}]


def test_one_receivers_notifications_arrive_in_order(receiver: Receiver) -> None:
    kube = world(receiver)
    n = notifier(kube).start()
    try:
        n.submit([delivery("ok", i) for i in range(1, 21)])
        assert n.wait_idle(5)
    finally:
        n.stop()
    assert receiver.to("/ok") == [{"id": f"web.event{i}"} for i in range(1, 21)]
    secret_reads = [r for r in kube.requests if r[1].resource == "secrets"]
    assert len(secret_reads) == 1  # the URL is kept


@pytest.mark.parametrize(
    ("key", "secret_name", "why", "posts"),
    [
        ("ok", "missing", "Secret shop/missing not found", 0),
        ("nokey", "hooks", "Secret shop/hooks has no key 'nokey'", 0),
        ("ftp", "hooks", "Secret shop/hooks: key 'ftp' does not hold an http(s) URL", 0),
        ("gone", "hooks", "the receiver answered 404", 1),
        ("moved", "hooks", "the receiver answered 302", 1),
        ("refused", "hooks", "could not connect", 0),
    ],
)
def test_a_notification_that_cannot_be_sent_is_counted_told_in_an_event_and_in_the_status(
    receiver: Receiver, key: str, secret_name: str, why: str, posts: int
) -> None:
    kube = world(receiver)
    name = f"n-{key}"
    failed = counted("failed", name)
    n = notifier(kube, attempts=3).start()
    try:
        started = time.monotonic()
        n.submit([delivery(key, name=name, secret=secret_name)])
        assert n.wait_idle(5)
        took = time.monotonic() - started
    finally:
        n.stop()
    assert counted("failed", name) == failed + 1
    assert len(receiver.to(f"/{key}")) == posts  # an answer other than 5xx is final; redirects not followed
    if key == "refused":
        assert took >= 0.05 + 0.1  # refused three times, waiting between them
    (event,) = failures(kube)
    assert why in event["message"] and "127.0.0.1" not in event["message"]
    (entry,) = entries(kube)
    assert entry == {
        "name": name,
        "source": "GreyRelease",
        "result": "Failed",
        "message": entry["message"],
        "event": "AnalysisFailed web.event1",
        "at": entry["at"],
    }
    assert why in entry["message"]


def test_a_success_after_a_failure_is_recorded_and_the_secret_read_again(receiver: Receiver) -> None:
    kube = world(receiver)
    n = notifier(kube).start()
    try:
        n.submit([delivery("ok", 1, name="team", secret="late")])
        assert n.wait_idle(5)
        assert entries(kube)[0]["result"] == "Failed"
        kube.put({**secret("late", ok=receiver.url("/ok"))})
        n.submit([delivery("ok", 2, name="team", secret="late")])
        assert n.wait_idle(5)
    finally:
        n.stop()
    (entry,) = entries(kube)
    assert entry["result"] == "Sent" and entry["event"] == "AnalysisFailed web.event2" and entry["message"] == ""
    assert receiver.to("/ok") == [{"id": "web.event2"}]
    assert len(failures(kube)) == 1


def test_notification_labels_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_notification_names", set())
    monkeypatch.setattr(metrics, "MAX_NOTIFICATION_LABELS", 2)
    assert [metrics.notification_label(x) for x in ("a", "b", "c", "a", "d")] == ["a", "b", "other", "a", "other"]


def test_a_whole_release_notifies_each_event_once_through_the_reconciler(receiver: Receiver) -> None:
    kube = cluster(notifications=[{"name": "all", "urlSecretRef": {"name": "hooks", "key": "flaky"}, "on": ["Normal"]}])
    kube.put(secret("hooks", flaky=receiver.url("/flaky")))
    n = notifier(kube).start()
    try:
        reconciler, now = Reconciler(kube, notify=n.submit), T0
        for _ in range(60):
            outcome = reconciler.reconcile(NS, "web", now=now)
            assert outcome is not None
            if status_of(kube).get("phase") == "Succeeded":
                break
            roll_out(kube)
            now += timedelta(seconds=1.0 if outcome.plan.requeue_after is None else outcome.plan.requeue_after)
        assert n.wait_idle(10)
    finally:
        n.stop()
    events = sorted(kube.objects(EVENTS), key=lambda e: int(e["metadata"]["resourceVersion"]))
    posted = receiver.to("/flaky")
    assert posted[0] == posted[1]  # the first was answered 503 and sent again
    assert [b["id"] for b in posted[1:]] == [e["metadata"]["name"] for e in events]
    assert [b["reason"] for b in posted[1:]][-1] == "Succeeded"
    assert path("", "v1", "events", NS) == EVENTS
