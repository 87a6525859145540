"""The open-loop load generator (e2e/harness/load.py) against pod responders on loopback, and its summaries on
known records. Needs no cluster."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from e2e.harness.load import Load, Record, first, last, per_second, percentile, summarise, window
from e2e.harness.responder_client import ResponderProcess, free_port_at


@pytest.fixture
def pods() -> Iterator[ResponderProcess]:
    proc = ResponderProcess()
    try:
        yield proc
    finally:
        proc.close()


def test_keeps_200_requests_per_second_for_5s_and_records_each_answer(pods: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    pods.serve("u1", "127.0.0.2", port, image="registry.example/app:v1", pod="web-1")
    load = Load(f"http://127.0.0.2:{port}", rate=200).start()
    time.sleep(5)
    records = load.stop()
    assert load.started is not None  # set before start() returned
    s = summarise(records, load.started, load.started + 5, asked_rate=200)
    lags = [r.lag for r in records]
    lag_p50, lag_p99 = percentile(lags, 50), percentile(lags, 99)
    print(
        f"asked 200/s for 5 s: sent {s.sent} ({s.rate:.1f}/s); send lag p50 {lag_p50 * 1000:.1f} ms, "
        f"p99 {lag_p99 * 1000:.1f} ms, max {s.max_lag * 1000:.1f} ms; "
        f"latency p50 {s.latency_p50 * 1000:.1f} ms, p99 {s.latency_p99 * 1000:.1f} ms"
    )
    assert s.rate_kept(0.03), s.rate
    # Most requests go out on time; the tail is the process waiting for a CPU on a shared machine, and the
    # overdue requests go out at once, so the rate holds.
    assert lag_p50 < 0.01
    assert s.max_lag < 1.0
    assert s.failed == [] and s.answered == s.sent
    assert s.answered_by_image == {"registry.example/app:v1": s.sent}
    assert all(r.status == 200 and r.pod == "web-1" and r.error is None and r.latency is not None for r in records)
    assert [r.sent for r in records] == sorted(r.sent for r in records)


def test_open_loop_a_slow_backend_does_not_slow_the_load(pods: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    pods.serve("slow", "127.0.0.2", port, image="registry.example/app:v1-slow500ms")
    with Load(f"http://127.0.0.2:{port}", rate=100) as load:
        time.sleep(2)
    s = load.summary(load.started, (load.started or 0) + 2)
    print(f"500 ms backend, asked 100/s: sent {s.rate:.1f}/s, latency p50 {s.latency_p50:.3f} s")
    assert s.rate_kept(0.05)
    assert s.latency_p50 >= 0.5


def test_records_500s_with_the_pod_and_connection_errors_with_their_text(pods: ResponderProcess) -> None:
    port = free_port_at("127.0.0.2")
    pods.serve("bad", "127.0.0.2", port, image="registry.example/app:v2-err50", pod="web-bad")
    with Load(f"http://127.0.0.2:{port}", rate=50) as load:
        time.sleep(1)
    s = load.summary()
    assert s.sent >= 45
    assert {r.status for r in load.records} == {200, 500}
    assert abs(s.failed_by_image["registry.example/app:v2-err50"] - s.sent / 2) <= 1  # every second answer
    assert all(r.failed and r.pod == "web-bad" and r.error is None for r in s.failed)
    assert s.error_ratio("registry.example/app:v2-err50") == pytest.approx(0.5, abs=0.03)

    refused = Load(f"http://127.0.0.3:{free_port_at('127.0.0.3')}", rate=20).start()
    time.sleep(0.5)
    records = refused.stop()
    assert records and all(r.status is None and r.failed and r.latency is None for r in records)
    assert all(r.error and "Connect" in r.error for r in records), records[0].error


class _Closer:
    """Accepts connections and closes each one after reading the request, or never answers."""

    def __init__(self, *, answer: bool) -> None:
        self.sock = socket.create_server(("127.0.0.4", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(4096)
            if self.answer:
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_records_a_server_closing_the_connection_and_a_timeout() -> None:
    closer = _Closer(answer=True)
    try:
        with Load(f"http://127.0.0.4:{closer.port}", rate=20) as load:
            time.sleep(0.5)
    finally:
        closer.close()
    assert load.records and all(r.status is None and r.error for r in load.records)
    assert "ServerDisconnectedError" in (load.records[0].error or ""), load.records[0].error

    silent = _Closer(answer=False)
    try:
        with Load(f"http://127.0.0.4:{silent.port}", rate=10, timeout=0.3) as load:
            time.sleep(0.5)
    finally:
        silent.close()
    assert load.records and all(r.status is None and r.error == "timeout after 0.3s" for r in load.records)


def test_sends_the_host_header_and_path() -> None:
    seen: list[tuple[str, str]] = []

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.headers["Host"], self.path))
            body = json.dumps({"pod": "echo", "image": "echo:v1"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.5", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Load(f"http://127.0.0.5:{server.server_address[1]}/", rate=20, host="web.example", path="/api/x"):
            time.sleep(0.3)
    finally:
        server.shutdown()
        server.server_close()
    assert seen and set(seen) == {("web.example", "/api/x")}


def _record(sent: float, status: int | None, image: str | None, *, lag: float = 0.0) -> Record:
    return Record(
        scheduled=sent - lag,
        sent=sent,
        latency=0.01 if status else None,
        status=status,
        error=None if status else "ClientConnectorError: refused",
        pod=image and f"pod-{image}",
        image=image,
    )


def test_summaries_of_known_records() -> None:
    records = (
        [_record(100 + i * 0.01, 200, "app:v1") for i in range(70)]  # 100.00 .. 100.69
        + [_record(100.7 + i * 0.01, 200, "app:v2") for i in range(20)]  # 100.70 .. 100.89
        + [_record(100.9 + i * 0.01, 500, "app:v2", lag=0.02) for i in range(5)]  # 100.90 .. 100.94
        + [_record(100.95 + i * 0.01, None, None) for i in range(3)]  # 100.95 .. 100.97
        + [_record(100.98 + i * 0.01, 502, None) for i in range(2)]  # 100.98, 100.99 (the proxy's own 502)
    )
    s = summarise(records, 100.0, 101.0, asked_rate=100)
    assert s.sent == 100 and s.rate == pytest.approx(100)
    assert s.rate_kept(0.01) and not summarise(records, 100.0, 101.0, asked_rate=120).rate_kept(0.05)
    assert s.answered_by_image == {"app:v1": 70, "app:v2": 25}
    assert s.answered == 95
    assert s.share("app:v2") == pytest.approx(25 / 95) and s.share("app:v3") == 0
    assert s.error_ratio("app:v2") == pytest.approx(5 / 25) and s.error_ratio("app:v1") == 0
    assert s.failed_by_image == {"app:v2": 5, None: 5}
    assert len(s.failed) == 10 and all(r.failed for r in s.failed)
    assert s.max_lag == pytest.approx(0.02)
    assert "no answer/proxy error 5" in s.line() and "v2  26% err  20%" in s.line()

    assert len(window(records, 100.5, 100.7)) == 20  # [start, end)
    half = summarise(records, 100.5, 101.0, asked_rate=100)
    assert half.sent == 50 and half.share("app:v1") == pytest.approx(20 / 45)
    open_ended = summarise(records, asked_rate=100)  # the records' own span: 100 requests over 1 s
    assert open_ended.rate == pytest.approx(100)
    assert summarise([], 0, 1).sent == 0 and summarise([], 0, 1).share("x") == 0

    v2_failed = first(records, lambda r: r.image == "app:v2" and r.failed)
    v2_last = last(records, lambda r: r.image == "app:v2")
    assert v2_failed is not None and v2_last is not None
    assert v2_last.sent - v2_failed.sent == pytest.approx(0.04)
    assert first(records, lambda r: r.image == "app:v9") is None
    assert percentile([3, 1, 2, 4], 50) == 2 and percentile([3, 1, 2, 4], 99) == 4 and math.isnan(percentile([], 50))


def test_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="rate must be > 0"):
        Load("http://127.0.0.1:1", rate=0)


def test_per_second_lines_cover_the_run() -> None:
    """The per-second view (the demo's lines) adds up to the whole."""
    records = [
        Record(scheduled=10 + i / 10, sent=10 + i / 10, latency=0.01, status=200, error=None, pod="p", image="app:v1")
        for i in range(35)
    ]
    seconds = per_second(records, 10, 13.5, asked_rate=10)
    assert [x.sent for x in seconds] == [10, 10, 10, 5]
    assert sum(x.sent for x in seconds) == len(records)
