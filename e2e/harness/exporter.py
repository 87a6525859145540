"""A stand-in for the application's own metrics: per-track request counters and a latency histogram whose
rates the tests set over HTTP, scraped by the local Prometheus.

Series (labels namespace, app, track):
    http_requests_total, http_request_errors_total,
    http_request_duration_seconds_bucket / _sum / _count

HTTP API (JSON):
    POST   /config   {"namespace", "app", "track", "rps", "error_ratio", "latency_seconds"}
                     sets the rates of one series set; rps 0 keeps the series but stops it growing
    GET    /config   the current settings
    DELETE /config   forget everything (all series disappear); with ?namespace=&app=&track= only that one
    GET    /metrics  Prometheus exposition
    GET    /healthz

    python -m e2e.harness.exporter --port 9100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

TICK_SECONDS = 0.1
LABELS = ("namespace", "app", "track")
# Bucket bounds around typical latency thresholds (50 ms .. 2 s), so histogram_quantile() lands close to
# the latency a test sets (it interpolates linearly inside the bucket that holds the quantile).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)

Key = tuple[str, str, str]


@dataclass
class TrackConfig:
    namespace: str
    app: str
    track: str
    rps: float = 0.0
    error_ratio: float = 0.0
    latency_seconds: float = 0.05

    @property
    def key(self) -> Key:
        return (self.namespace, self.app, self.track)


class Simulator:
    """Turns the configured rates into counter increments, one tick every 100 ms. Fractions carry over
    between ticks so that e.g. 0.5 rps is exactly one request every two seconds."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("http_requests", "Requests served.", LABELS, registry=self.registry)
        self.errors = Counter("http_request_errors", "Requests answered with an error.", LABELS, registry=self.registry)
        self.latency = Histogram(
            "http_request_duration_seconds", "Request latency.", LABELS, buckets=BUCKETS, registry=self.registry
        )
        self.configs: dict[Key, TrackConfig] = {}
        self.carry: dict[Key, tuple[float, float]] = {}  # unsent fractions of (requests, errors)
        self.lock = threading.Lock()

    def set(self, config: TrackConfig) -> None:
        if config.rps < 0 or not 0 <= config.error_ratio <= 1 or config.latency_seconds < 0:
            raise ValueError("need rps >= 0, 0 <= error_ratio <= 1, latency_seconds >= 0")
        with self.lock:
            self.configs[config.key] = config
            self.carry.setdefault(config.key, (0.0, 0.0))
            # Create every series at 0 at once: rate() and error ratios are defined from the first scrape.
            self.requests.labels(*config.key).inc(0)
            self.errors.labels(*config.key).inc(0)
            self.latency.labels(*config.key)

    def delete(self, key: Key | None = None) -> None:
        with self.lock:
            keys = list(self.configs) if key is None else [key]
            for k in keys:
                self.configs.pop(k, None)
                self.carry.pop(k, None)
                for metric in (self.requests, self.errors, self.latency):
                    with contextlib.suppress(KeyError):
                        metric.remove(*k)

    def tick(self, seconds: float) -> None:
        with self.lock:
            for key, cfg in self.configs.items():
                req_carry, err_carry = self.carry[key]
                req_carry += cfg.rps * seconds
                n = int(req_carry)
                req_carry -= n
                err_carry += n * cfg.error_ratio
                errors = int(err_carry)
                err_carry -= errors
                self.carry[key] = (req_carry, err_carry)
                if n:
                    self.requests.labels(*key).inc(n)
                    hist = self.latency.labels(*key)
                    for _ in range(n):
                        hist.observe(cfg.latency_seconds)
                if errors:
                    self.errors.labels(*key).inc(errors)

    def run(self, stop: threading.Event) -> None:
        last = time.monotonic()
        while not stop.wait(TICK_SECONDS):
            now = time.monotonic()
            self.tick(now - last)
            last = now


def make_handler(sim: Simulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # scrapes every second: stay quiet
            pass

        def _send(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, value: object) -> None:
            self._send(code, json.dumps(value).encode())

        def do_GET(self) -> None:  # http.server's naming
            path = urlparse(self.path).path
            if path == "/metrics":
                self._send(200, generate_latest(sim.registry), CONTENT_TYPE_LATEST)
            elif path == "/config":
                with sim.lock:
                    self._json(200, [asdict(c) for c in sim.configs.values()])
            elif path == "/healthz":
                self._send(200, b"ok", "text/plain")
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            if urlparse(self.path).path != "/config":
                self._json(404, {"error": "not found"})
                return
            try:
                raw = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                config = TrackConfig(
                    namespace=str(raw["namespace"]),
                    app=str(raw["app"]),
                    track=str(raw["track"]),
                    rps=float(raw.get("rps", 0.0)),
                    error_ratio=float(raw.get("error_ratio", 0.0)),
                    latency_seconds=float(raw.get("latency_seconds", 0.05)),
                )
                sim.set(config)
            except (ValueError, KeyError, TypeError) as exc:
                self._json(400, {"error": f"bad config: {exc}"})
                return
            self._json(200, asdict(config))

        def do_DELETE(self) -> None:
            url = urlparse(self.path)
            if url.path != "/config":
                self._json(404, {"error": "not found"})
                return
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            if query:
                try:
                    sim.delete((query["namespace"], query["app"], query["track"]))
                except KeyError:
                    self._json(400, {"error": "give all of namespace, app, track, or none"})
                    return
            else:
                sim.delete()
            self._json(200, {"deleted": True})

    return Handler


def serve(host: str, port: int) -> None:
    sim = Simulator()
    stop = threading.Event()
    threading.Thread(target=sim.run, args=(stop,), daemon=True, name="ticker").start()
    server = ThreadingHTTPServer((host, port), make_handler(sim))
    try:
        server.serve_forever()
    finally:
        stop.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.host, args.port)


if __name__ == "__main__":
    main()
