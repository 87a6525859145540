"""The pod responder (e2e/harness/responder.py) on loopback addresses, driven over its stdin/stdout protocol as the
harness drives it. Needs no cluster."""

from __future__ import annotations

import http.client
import itertools
import json
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness.responder import Behaviour, behaviour_from_image, fails, image_tag
from e2e.harness.responder_client import ResponderProcess, free_port_at


@pytest.fixture
def responder() -> Iterator[ResponderProcess]:
    proc = ResponderProcess()
    try:
        yield proc
    finally:
        proc.close()


def get(conn: http.client.HTTPConnection, method: str = "GET", path: str = "/") -> tuple[int, dict[str, Any], str]:
    conn.request(method, path, body=b"{}" if method == "POST" else None)
    response = conn.getresponse()
    body = response.read()
    return response.status, (json.loads(body) if body else {}), response.getheader("Connection") or ""


def closed_by_peer(conn: http.client.HTTPConnection, timeout: float) -> bool:
    """Whether the server closed this idle kept-alive connection within `timeout` seconds."""
    assert conn.sock is not None
    conn.sock.settimeout(timeout)
    try:
        return conn.sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    ("image", "tag", "behaviour"),
    [
        ("registry.example/app:v1", "v1", Behaviour()),
        ("registry.example:5000/team/app", "", Behaviour()),
        ("app:v3-err30", "v3-err30", Behaviour(error_percent=30)),
        ("app:v3-slow300ms", "v3-slow300ms", Behaviour(delay_seconds=0.3)),
        ("app:v3-slow300ms-err10", "v3-slow300ms-err10", Behaviour(error_percent=10, delay_seconds=0.3)),
        ("app:v3-err10-slow50ms@sha256:abc", "v3-err10-slow50ms", Behaviour(error_percent=10, delay_seconds=0.05)),
        ("registry.example:5000/app:err30-v1", "err30-v1", Behaviour()),
    ],
    ids=["plain", "no-tag-registry-port", "err", "slow", "slow-then-err", "err-then-slow-digest", "err-not-a-suffix"],
)
def test_behaviour_from_image_tag(image: str, tag: str, behaviour: Behaviour) -> None:
    assert image_tag(image) == tag
    assert behaviour_from_image(image) == behaviour


def test_error_percent_over_100_is_refused_naming_the_image() -> None:
    with pytest.raises(ValueError, match="image 'app:v1-err101'"):
        behaviour_from_image("app:v1-err101")


@pytest.mark.parametrize("percent", [0, 1, 10, 30, 50, 99, 100])
def test_errors_are_spread_exactly(percent: int) -> None:
    pattern = [fails(n, percent) for n in range(1000)]
    for start in range(0, 900, 37):  # any 100 consecutive requests
        assert sum(pattern[start : start + 100]) == percent
    if 0 < percent < 50:  # spread, not bunched: never two failures in a row
        assert not any(a and b for a, b in itertools.pairwise(pattern))


def test_each_pod_answers_as_itself_on_any_method_and_path(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("u1", "127.0.0.2", port, image="registry.example/app:v1", pod="web-a")
    responder.serve("u2", "127.0.0.3", port, image="registry.example/app:v2", pod="web-b")
    for ip, pod, image, uid in [
        ("127.0.0.2", "web-a", "registry.example/app:v1", "u1"),
        ("127.0.0.3", "web-b", "registry.example/app:v2", "u2"),
    ]:
        conn = http.client.HTTPConnection(ip, port, timeout=5)
        for method, path in [("GET", "/"), ("POST", "/orders/7?x=1"), ("GET", "/health")]:
            status, body, _ = get(conn, method, path)
            assert status == 200
            assert body["pod"] == pod and body["namespace"] == "ns" and body["image"] == image and body["uid"] == uid
        conn.request("HEAD", "/")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        conn.close()


def test_err_tag_fails_its_share_with_the_pod_named_and_slow_tag_delays(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("bad", "127.0.0.2", port, image="registry.example/app:v3-err30")
    conn = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    answers = [get(conn) for _ in range(100)]
    assert sum(1 for status, _, _ in answers if status == 500) == 30
    assert all(body["image"] == "registry.example/app:v3-err30" and body["pod"] == "pod-bad" for _, body, _ in answers)

    responder.serve("slow", "127.0.0.3", port, image="registry.example/app:v3-slow300ms-err50")
    conn = http.client.HTTPConnection("127.0.0.3", port, timeout=5)
    statuses, latencies = [], []
    for _ in range(4):
        t0 = time.monotonic()
        statuses.append(get(conn)[0])
        latencies.append(time.monotonic() - t0)
    print(f"slow300ms latencies: {[round(x, 3) for x in latencies]}")
    assert sorted(statuses) == [200, 200, 500, 500]
    assert min(latencies) >= 0.3 and max(latencies) < 1.0


def test_stop_after_drains_then_closes_kept_alive_connections(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("old", "127.0.0.2", port)
    idle = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(idle)[0] == 200  # a connection the proxy keeps alive, idle from now on
    used = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(used)[2].lower() != "close"

    t0 = time.monotonic()
    responder.send(op="stop", uid="old", after=1.5)
    time.sleep(0.3)
    status, body, connection = get(used)  # still answering through the grace period, asking to close
    assert status == 200 and body["uid"] == "old" and connection.lower() == "close"
    fresh = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(fresh)[0] == 200
    assert not closed_by_peer(idle, timeout=0.5)  # not before the grace period ends

    assert responder.event(timeout=5) == {"event": "stopped", "uid": "old"}
    stopped_after = time.monotonic() - t0
    print(f"stopped {stopped_after:.2f}s after a stop with after=1.5")
    assert 1.5 <= stopped_after < 2.5
    assert closed_by_peer(idle, timeout=1.0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()

    responder.send(op="stop", uid="old", after=0)  # idempotent: a pod no longer served is stopped
    assert responder.event() == {"event": "stopped", "uid": "old"}


def test_a_request_in_flight_at_the_end_of_the_grace_period_is_cut(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("slow", "127.0.0.2", port, image="app:v1-slow2000ms")
    conn = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    responder.send(op="stop", uid="slow", after=0.5)
    t0 = time.monotonic()
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        get(conn)
    assert time.monotonic() - t0 < 1.5
    assert responder.event() == {"event": "stopped", "uid": "slow"}


def test_a_new_uid_at_a_reused_address_stops_the_old_pod_and_its_connections_at_once(
    responder: ResponderProcess,
) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("old", "127.0.0.2", port, pod="web-old")
    kept = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(kept)[1]["pod"] == "web-old"
    responder.send(op="stop", uid="old", after=30)  # draining, far from its deadline

    responder.send(op="serve", uid="new", ip="127.0.0.2", port=port, pod="web-new", namespace="ns", image="app:v2")
    assert responder.event() == {"event": "stopped", "uid": "old"}
    assert responder.event() == {"event": "listening", "uid": "new", "ip": "127.0.0.2", "port": port}
    assert closed_by_peer(kept, timeout=1.0)  # the old pod's kept connection cannot answer any more
    fresh = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(fresh)[1]["pod"] == "web-new"

    # Not draining this time: the same, at once.
    responder.send(op="serve", uid="newer", ip="127.0.0.2", port=port, pod="web-newer", namespace="ns", image="app:v2")
    assert responder.event() == {"event": "stopped", "uid": "new"}
    assert responder.event()["event"] == "listening"
    assert closed_by_peer(fresh, timeout=1.0)
    assert get(http.client.HTTPConnection("127.0.0.2", port, timeout=5))[1]["pod"] == "web-newer"

    responder.serve("newer", "127.0.0.2", port, pod="web-newer", image="app:v2")  # repeated: idempotent
    assert responder.events.empty()


def test_garbage_requests_and_bad_commands_get_errors_and_the_server_goes_on(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("p", "127.0.0.2", port)
    tls_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)
    bad_length = b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
    for garbage in [b"NOT HTTP AT ALL\r\n\r\n", bad_length, tls_hello, b"GET /\x00 HTTP/9.9\r\n\r\n"]:
        with socket.create_connection(("127.0.0.2", port), timeout=5) as s:
            s.sendall(garbage)
            answer = b""
            while chunk := s.recv(4096):
                answer += chunk
        assert answer == b"" or re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:80]
    assert get(http.client.HTTPConnection("127.0.0.2", port, timeout=5))[0] == 200

    responder.send_raw("this is not json")
    assert responder.event()["event"] == "error"
    responder.send(op="serve", uid="q", ip="127.0.0.2", port=port + 0, pod="x", namespace="ns")
    assert responder.event() == {
        "event": "error",
        "uid": "q",
        "message": "serve: field 'image' must be a non-empty string, got None",
    }
    responder.send(op="serve", uid="q", ip="127.0.0.3", port="80", pod="x", namespace="ns", image="a:v1")
    assert "field 'port'" in responder.event()["message"]
    responder.send(op="stop", uid="q", after=-1)
    assert "field 'after'" in responder.event()["message"]
    responder.send(op="restart", uid="q")
    assert "field 'op'" in responder.event()["message"]
    responder.send(op="serve", uid="q", ip="127.0.0.3", port=port, pod="x", namespace="ns", image="a:v1-err200")
    assert "image 'a:v1-err200'" in responder.event()["message"]
    with socket.socket() as taken:  # an address another process holds
        taken.bind(("127.0.0.4", 0))
        taken.listen()
        responder.send(
            op="serve", uid="q", ip="127.0.0.4", port=taken.getsockname()[1], pod="x", namespace="ns", image="a:v1"
        )
        event = responder.event()
        assert event["event"] == "error" and event["uid"] == "q" and "OSError" in event["message"]
    assert get(http.client.HTTPConnection("127.0.0.2", port, timeout=5))[1]["uid"] == "p"  # still serving


def test_end_of_stdin_stops_every_pod_and_exits_0(responder: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    responder.serve("a", "127.0.0.2", port)
    responder.serve("b", "127.0.0.3", port)
    kept = http.client.HTTPConnection("127.0.0.2", port, timeout=5)
    assert get(kept)[0] == 200
    responder.send(op="stop", uid="b", after=60)
    assert responder.proc.stdin is not None
    responder.proc.stdin.close()
    assert responder.proc.wait(timeout=5) == 0
    assert {responder.event()["uid"], responder.event()["uid"]} == {"a", "b"}
    assert closed_by_peer(kept, timeout=1.0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
