"""The one retry policy of API calls: what is sent again, what is not, how long it waits, and the bound;
on scripted failures, then through the real client against a small HTTP server that answers as scripted."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import urllib3
import urllib3.connection
import urllib3.exceptions
from greyrelease.kube.cache import CachedKube, NotHeld
from greyrelease.kube.client import KubeClient
from greyrelease.kube.protocol import ApiError, Conflict, NotFound, path
from greyrelease.kube.retry import API, ONCE, RetryPolicy, checked, transient
from kubernetes import client as k8s_client

WEB = path("apps", "v1", "deployments", "shop", "web")


class Script:
    """A call that fails with each of ``failures`` in turn, then answers ``answer``; counts its calls."""

    def __init__(self, *failures: BaseException, answer: Any = "done") -> None:
        self.failures = list(failures)
        self.answer = answer
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


def recorded(**kw: Any) -> tuple[RetryPolicy, list[float]]:
    """The API policy (or one with ``kw`` changed) waiting for nothing: its waits are recorded."""
    waits: list[float] = []
    fields = {f: getattr(API, f) for f in ("attempts", "deadline", "first_wait", "jitter", "max_wait")}
    return RetryPolicy(**{**fields, **kw}, sleep=waits.append), waits


#: The connection pool urllib3's errors name (made, never connected).
POOL = urllib3.HTTPConnectionPool("127.0.0.1", 1)


def refused() -> urllib3.exceptions.NewConnectionError:
    return urllib3.exceptions.NewConnectionError(
        urllib3.connection.HTTPConnection("127.0.0.1", 1), "Failed to establish a new connection: [Errno 111] refused"
    )


RETRIED = [
    pytest.param(ApiError(429, "TooManyRequests", "slow down"), id="429"),
    pytest.param(ApiError(500, "InternalError", "etcd"), id="500"),
    pytest.param(ApiError(503, "ServiceUnavailable", "starting"), id="503"),
    pytest.param(ApiError(504, "Timeout", "request did not complete"), id="504"),
    pytest.param(ConnectionRefusedError(111, "refused"), id="connection-refused"),
    pytest.param(ConnectionResetError(104, "reset"), id="connection-reset"),
    pytest.param(TimeoutError("timed out"), id="timeout"),
    pytest.param(refused(), id="urllib3-new-connection"),
    pytest.param(urllib3.exceptions.ReadTimeoutError(POOL, "/", "read timed out"), id="urllib3-read-timeout"),
    pytest.param(urllib3.exceptions.ProtocolError("Connection aborted."), id="urllib3-protocol"),
    pytest.param(urllib3.exceptions.MaxRetryError(POOL, "/", refused()), id="urllib3-max-retry-refused"),
]

NOT_RETRIED = [
    pytest.param(ApiError(400, "BadRequest", "no"), id="400"),
    pytest.param(ApiError(403, "Forbidden", "no"), id="403"),
    pytest.param(NotFound(404, "NotFound", "gone"), id="404"),
    pytest.param(Conflict(409, "Conflict", "the object has been modified"), id="409-conflict"),
    pytest.param(Conflict(409, "AlreadyExists", "taken"), id="409-exists"),
    pytest.param(ApiError(410, "Expired", "too old"), id="410"),
    pytest.param(ApiError(422, "Invalid", "bad"), id="422"),
    pytest.param(urllib3.exceptions.SSLError("certificate verify failed"), id="tls"),
    pytest.param(urllib3.exceptions.MaxRetryError(POOL, "/", urllib3.exceptions.SSLError("bad")), id="max-retry-tls"),
    pytest.param(NotHeld("shard given up"), id="not-held"),
    pytest.param(ValueError("a bug"), id="other"),
]


@pytest.mark.parametrize("error", RETRIED)
def test_transient_failures_are_sent_again(error: BaseException) -> None:
    assert transient(error)
    policy, waits = recorded()
    call = Script(error, answer={"kind": "Deployment"})
    assert policy.call(call) == {"kind": "Deployment"}
    assert call.calls == 2 and len(waits) == 1


@pytest.mark.parametrize("error", NOT_RETRIED)
def test_other_failures_are_raised_at_once(error: BaseException) -> None:
    assert not transient(error)
    policy, waits = recorded()
    call = Script(error)
    with pytest.raises(type(error)) as raised:
        policy.call(call)
    assert raised.value is error and call.calls == 1 and waits == []


def test_the_bound_is_four_attempts_then_the_last_error_as_it_came() -> None:
    policy, waits = recorded()
    errors = [ApiError(503, "ServiceUnavailable", f"attempt {n}") for n in range(1, 6)]
    call = Script(*errors)
    with pytest.raises(ApiError) as raised:
        policy.call(call)
    assert call.calls == 4 and raised.value is errors[3]  # not tenacity's RetryError
    # Exponential waits with up to 0.1 s of jitter: 0.1, 0.2, 0.4 s.
    assert len(waits) == 3
    for wait, base in zip(waits, (0.1, 0.2, 0.4), strict=True):
        assert base <= wait <= base + 0.1


def test_waits_stop_growing_at_two_seconds() -> None:
    policy, waits = recorded(attempts=8, deadline=60.0)
    with pytest.raises(ApiError):
        policy.call(Script(*[ApiError(500, "InternalError", "etcd")] * 8))
    assert len(waits) == 7 and max(waits) == 2.0 and waits[-1] == 2.0


def test_retry_after_is_waited_within_the_cap() -> None:
    policy, waits = recorded()
    slow = ApiError(429, "TooManyRequests", "slow down", retry_after=1.5)
    long = ApiError(503, "ServiceUnavailable", "starting", retry_after=30)
    assert policy.call(Script(slow, long)) == "done"
    assert waits == [1.5, 2.0]


def test_no_retry_after_the_deadline() -> None:
    policy = RetryPolicy(attempts=1000, deadline=0.2, first_wait=0.01, jitter=0.0, max_wait=0.05)
    call = Script(*[ConnectionRefusedError(111, "refused")] * 1000)
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        policy.call(call)
    assert time.monotonic() - started < 2.0
    assert 2 <= call.calls < 30  # the waits alone (0.01, 0.02, 0.04, then 0.05) pass 0.2 s within 7


def test_once_sends_a_call_once() -> None:
    call = Script(ApiError(503, "ServiceUnavailable", "starting"))
    with pytest.raises(ApiError):
        ONCE.call(call)
    assert call.calls == 1


def test_checks_run_before_each_attempt() -> None:
    allowed = [True]

    def check() -> None:
        if not allowed[0]:
            raise NotHeld("no longer held")

    call = Script(ApiError(503, "ServiceUnavailable", "starting"))
    policy = RetryPolicy(sleep=lambda seconds: allowed.__setitem__(0, False))  # lost while waiting
    with checked(check), pytest.raises(NotHeld):
        policy.call(call)
    assert call.calls == 1
    # Outside the block, no check runs.
    assert policy.call(Script()) == "done"


# --- through the client, on a scripted HTTP server ---------------------------------------------------


Answer = tuple[int, dict[str, str], bytes]


def answer(status: int, body: Any = None, **headers: str) -> Answer:
    data = b"" if body is None else json.dumps(body).encode()
    return status, {"Content-Type": "application/json", **headers}, data


def failure(status: int, reason: str, **headers: str) -> Answer:
    return answer(status, {"kind": "Status", "code": status, "reason": reason, "message": reason}, **headers)


class Server:
    """An HTTP server on localhost answering each request with the next of ``answers`` (the last one
    again once they run out); ``seen`` logs ``(method, path)`` of each request."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.seen: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                server.seen.append((self.command, self.path))
                status, headers, data = server.answers.pop(0) if len(server.answers) > 1 else server.answers[0]
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def client(self, policy: RetryPolicy | None = None) -> KubeClient:
        cfg = k8s_client.Configuration(host=self.url)
        return KubeClient(cfg, retry=policy) if policy else KubeClient(cfg)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def test_the_client_sends_a_request_again_after_503_and_429(server: Server) -> None:
    deployment = {"kind": "Deployment", "metadata": {"name": "web"}}
    server.answers = [
        failure(503, "ServiceUnavailable"),
        failure(429, "TooManyRequests", **{"Retry-After": "1"}),
        answer(200, deployment),
    ]
    policy, waits = recorded()
    assert server.client(policy).patch(WEB, {"spec": {"replicas": 2}}) == deployment
    assert server.seen == [("PATCH", WEB.path)] * 3
    assert len(waits) == 2 and 0.1 <= waits[0] <= 0.2 and waits[1] == 1.0  # the 429's Retry-After


@pytest.mark.parametrize(
    ("status", "reason", "call", "expected"),
    [
        (404, "NotFound", lambda kube: kube.get(WEB), None),
        (409, "Conflict", lambda kube: kube.replace(WEB, {}), Conflict),
        (409, "AlreadyExists", lambda kube: kube.create(WEB.collection, {}), Conflict),
        (403, "Forbidden", lambda kube: kube.delete(WEB), ApiError),
        (422, "Invalid", lambda kube: kube.patch(WEB, {}), ApiError),
    ],
)
def test_the_client_leaves_other_answers_to_the_caller(
    server: Server, status: int, reason: str, call: Callable[[KubeClient], Any], expected: type[Exception] | None
) -> None:
    server.answers = [failure(status, reason)]
    policy, waits = recorded()
    kube = server.client(policy)
    if expected is None:
        assert call(kube) is None
    else:
        with pytest.raises(expected) as raised:
            call(kube)
        assert isinstance(raised.value, ApiError) and (raised.value.status, raised.value.reason) == (status, reason)
    assert len(server.seen) == 1 and waits == []


def test_a_refused_connection_is_tried_four_times_then_raised() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy, waits = recorded()
    kube = KubeClient(k8s_client.Configuration(host=f"http://127.0.0.1:{port}"), retry=policy)
    with pytest.raises(urllib3.exceptions.HTTPError) as raised:
        kube.get(WEB)
    assert transient(raised.value) and len(waits) == 3  # four attempts; urllib3 made none of its own


def test_the_opening_of_a_watch_is_retried(server: Server) -> None:
    event = {"type": "ADDED", "object": {"metadata": {"name": "web", "resourceVersion": "7"}}}
    server.answers = [failure(500, "InternalError"), (200, {}, json.dumps(event).encode() + b"\n")]
    policy, waits = recorded()
    events = list(server.client(policy).watch(WEB.collection, resource_version="5", timeout_seconds=1))
    assert events == [event] and len(server.seen) == 2 and len(waits) == 1


def test_a_shard_write_is_not_sent_again_once_the_shard_is_lost(server: Server) -> None:
    """The write was allowed when first sent; while the client waits to send it again, the replica stops
    holding the shard: the retry is refused, not sent."""
    held = [True]
    server.answers = [failure(503, "ServiceUnavailable"), answer(200, {"metadata": {"name": "web"}})]
    policy = RetryPolicy(sleep=lambda seconds: held.__setitem__(0, False))
    kube = CachedKube(server.client(policy), writable=lambda: held[0])
    with pytest.raises(NotHeld):
        kube.patch(WEB, {"spec": {"replicas": 2}})
    assert server.seen == [("PATCH", WEB.path)]
