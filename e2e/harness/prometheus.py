"""A real Prometheus (Debian's package, /usr/bin/prometheus) on loopback, scraping the test exporter
(e2e/harness/exporter.py) every second, plus any target the caller adds (e.g. the controller's /metrics).

The exporter is a process of its own, so a test can stop Prometheus alone (stop()/start()) to simulate an
outage while the application's counters keep running.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.harness.process import HERE, Process, free_ports, wait_until

EXPORTER = "e2e.harness.exporter"  # the exporter's module, run as its own process (python -m)
SCRAPE_INTERVAL = "1s"
Expectation = Callable[[float | None], bool] | float | int | None


def find_prometheus() -> str:
    override = os.environ.get("GREYRELEASE_PROMETHEUS_BIN")
    if override:
        return override
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if found is None:
        raise RuntimeError("prometheus not found: install Debian's package (apt-get install -y prometheus)")
    return found


# --- querying --------------------------------------------------------------------------------------------


class PrometheusQueryError(RuntimeError):
    pass


def query(prom_url: str, promql: str, timeout: float = 5.0) -> float | None:
    """The value of an instant query that yields one series or a scalar; None when the result is empty.
    Aggregate (sum(...)) when the expression could yield several series."""
    url = f"{prom_url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as err:
        body = json.loads(err.read() or b"{}")
        raise PrometheusQueryError(f"{promql!r}: {body.get('error', err)}") from None
    if body.get("status") != "success":
        raise PrometheusQueryError(f"{promql!r}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] == "scalar":
        return float(data["result"][1])
    result = data["result"]
    if not result:
        return None
    if len(result) > 1:
        raise PrometheusQueryError(f"{promql!r} returned {len(result)} series; aggregate it to one")
    return float(result[0]["value"][1])


def wait_for_query(
    prom_url: str,
    promql: str,
    expect: Expectation,
    timeout: float = 30.0,
    rel_tolerance: float = 0.1,
    abs_tolerance: float = 1e-9,
    interval: float = 0.5,
) -> float | None:
    """Polls `promql` until its value meets `expect`: a predicate on the value (None = no data), a
    number (equal within rel_tolerance / abs_tolerance), or None (no data). Returns the value; raises
    TimeoutError naming the last value seen."""

    def predicate(v: float | None) -> bool:
        if callable(expect):
            return bool(expect(v))
        if expect is None:
            return v is None
        return v is not None and math.isclose(v, float(expect), rel_tol=rel_tolerance, abs_tol=abs_tolerance)

    deadline = time.monotonic() + timeout
    last: float | None = None
    last_error: Exception | None = None
    while True:
        try:
            last = query(prom_url, promql)
            last_error = None
            if predicate(last):
                return last
        except (OSError, PrometheusQueryError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            seen = f"error {last_error}" if last_error else f"last value {last}"
            raise TimeoutError(f"{promql!r} did not meet {expect!r} within {timeout:.0f}s ({seen})")
        time.sleep(interval)


# --- scrape targets ---------------------------------------------------------------------------------------


def add_file_sd_target(targets_file: Path, host_port: str, job: str, labels: dict[str, str] | None = None) -> None:
    """Adds HOST:PORT to a file_sd file Prometheus re-reads every second; the `job` label comes from the
    target group, so each extra target keeps its own job name."""
    groups: list[dict[str, Any]] = json.loads(targets_file.read_text()) if targets_file.exists() else []
    groups = [g for g in groups if g["targets"] != [host_port]]
    groups.append({"targets": [host_port], "labels": {"job": job, **(labels or {})}})
    tmp = targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2))
    tmp.replace(targets_file)  # atomic: Prometheus never reads half a file


def remove_file_sd_target(targets_file: Path, host_port: str) -> None:
    groups = json.loads(targets_file.read_text()) if targets_file.exists() else []
    tmp = targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps([g for g in groups if g["targets"] != [host_port]], indent=2))
    tmp.replace(targets_file)


# --- the stack ----------------------------------------------------------------------------------------------


class PrometheusStack:
    """Exporter + Prometheus in `workdir` (removed by close()). Ports stay the same across stop()/start(),
    so URLs handed to a controller keep working after an outage."""

    def __init__(self, workdir: Path, prometheus_bin: str | None = None) -> None:
        self.workdir = workdir
        self.prometheus_bin = prometheus_bin or find_prometheus()
        self.port, self.exporter_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.exporter_url = f"http://127.0.0.1:{self.exporter_port}"
        self.targets_file = workdir / "extra-targets.json"
        self._exporter: Process | None = None
        self._prometheus: Process | None = None

    # Lifecycle -----------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Starts the exporter (unless running) and Prometheus (unless running), and waits until
        Prometheus has scraped the exporter once."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if not self.targets_file.exists():
            self.targets_file.write_text("[]")
        if self._exporter is None or not self._exporter.alive():
            self._exporter = Process(
                "exporter",
                [sys.executable, "-m", EXPORTER, "--host", "127.0.0.1", "--port", str(self.exporter_port)],
                self.workdir / "logs" / "exporter.log",
                cwd=HERE.parent,  # so `-m` finds the exporter from any working directory
            )
            self._exporter.start()
            self._wait_http(self._exporter, f"{self.exporter_url}/healthz", timeout)
        if self._prometheus is None or not self._prometheus.alive():
            self._write_config()
            self._prometheus = Process(
                "prometheus",
                [
                    self.prometheus_bin,
                    f"--config.file={self.workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--storage.tsdb.retention.time=2h",
                    "--log.level=warn",
                ],
                self.workdir / "logs" / "prometheus.log",
            )
            self._prometheus.start()
            self._wait_http(self._prometheus, f"{self.url}/-/ready", timeout)
            wait_for_query(self.url, 'up{job="exporter"}', 1, timeout=timeout, interval=0.2)

    def stop(self) -> None:
        """Stops Prometheus only (an outage as the controller sees it); start() brings it back with its data."""
        if self._prometheus is not None:
            self._prometheus.stop()
            self._prometheus = None

    def close(self) -> None:
        self.stop()
        if self._exporter is not None:
            self._exporter.stop()
            self._exporter = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in (self._exporter, self._prometheus) if p and p.popen}

    @property
    def running(self) -> bool:
        return self._prometheus is not None and self._prometheus.alive()

    # What tests use -------------------------------------------------------------------------------------

    def set_rates(
        self,
        namespace: str,
        app: str,
        track: str,
        rps: float,
        error_ratio: float = 0.0,
        latency_seconds: float = 0.05,
    ) -> None:
        self._exporter_call(
            "POST",
            "/config",
            {
                "namespace": namespace,
                "app": app,
                "track": track,
                "rps": rps,
                "error_ratio": error_ratio,
                "latency_seconds": latency_seconds,
            },
        )

    def reset(self, namespace: str | None = None, app: str | None = None, track: str | None = None) -> None:
        """Forgets every series, or the one of namespace/app/track."""
        query_string = ""
        if namespace is not None:
            query_string = "?" + urllib.parse.urlencode({"namespace": namespace, "app": app, "track": track})
        self._exporter_call("DELETE", f"/config{query_string}")

    def add_scrape_target(self, host_port: str, job: str, labels: dict[str, str] | None = None) -> None:
        """Lets Prometheus scrape http://HOST:PORT/metrics under job `job` (picked up within ~1 s)."""
        add_file_sd_target(self.targets_file, host_port, job, labels)

    def remove_scrape_target(self, host_port: str) -> None:
        remove_file_sd_target(self.targets_file, host_port)

    def query(self, promql: str) -> float | None:
        return query(self.url, promql)

    def wait_for_query(self, promql: str, expect: Expectation, timeout: float = 30.0, **kw: Any) -> float | None:
        return wait_for_query(self.url, promql, expect, timeout, **kw)

    # Internals ------------------------------------------------------------------------------------------

    def _write_config(self) -> None:
        config = {
            "global": {
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": SCRAPE_INTERVAL,
                "evaluation_interval": SCRAPE_INTERVAL,
            },
            "scrape_configs": [
                {"job_name": "exporter", "static_configs": [{"targets": [f"127.0.0.1:{self.exporter_port}"]}]},
                {
                    "job_name": "extra",
                    "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": SCRAPE_INTERVAL}],
                },
            ],
        }
        (self.workdir / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML

    def _wait_http(self, proc: Process, url: str, timeout: float) -> None:
        def ok() -> bool:
            proc.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=1) as resp:
                    code: int = resp.status
                return code == 200
            except OSError:
                return False

        wait_until(ok, timeout, f"{proc.name} at {url}", 0.05)

    def _exporter_call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.exporter_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp)
