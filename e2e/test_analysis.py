"""End-to-end: batches gated on a real Prometheus scraping an exporter whose rates the tests set."""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e.harness.controller import (
    Controller,
    apply_release,
    deploy_app,
    deployment,
    events,
    gr,
    status,
    wait_for,
    wait_phase,
)
from e2e.harness.controlplane import Cluster
from e2e.harness.prometheus import PrometheusStack

pytestmark = pytest.mark.e2e

SELECTOR = 'namespace="{{namespace}}",app="{{app}}",track="{{track}}"'
ERROR_RATE = (
    f"sum(rate(http_request_errors_total{{{SELECTOR}}}[5s])) / sum(rate(http_requests_total{{{SELECTOR}}}[5s]))"
)
NOTHING = f"sum(rate(greyrelease_e2e_never_exported_total{{{SELECTOR}}}[5s]))"
TERMINAL = {"Succeeded", "Failed", "Aborted", "InvalidSpec"}


def release_with(
    prometheus: PrometheusStack,
    metric: dict[str, Any],
    *,
    batches: list[dict[str, Any]] | None = None,
    interval: str = "1s",
    **spec: Any,
) -> dict[str, Any]:
    return gr(
        "web",
        appName="web",
        targetVersion="v2",
        batches=batches or [{"replicas": 1, "pause": "2s"}, {"replicas": 2, "pause": "2s"}, {"replicas": 4}],
        trafficRouting={"service": {"name": "web"}},
        analysis={
            "prometheus": {"address": prometheus.url, "timeout": "2s"},
            "interval": interval,
            "metrics": [{"name": "error-rate", "query": ERROR_RATE, **metric}],
        },
        **spec,
    )


def serve(prometheus: PrometheusStack, namespace: str, *, stable: float, canary: float) -> None:
    prometheus.set_rates(namespace, "web", "stable", rps=50, error_ratio=stable)
    prometheus.set_rates(namespace, "web", "canary", rps=50, error_ratio=canary)
    q = ERROR_RATE.replace("{{namespace}}", namespace).replace("{{app}}", "web").replace("{{track}}", "canary")
    prometheus.wait_for_query(q, lambda v: v is not None and abs(v - canary) < 0.02, timeout=30)


def test_healthy_canary_succeeds_with_metric_values_in_status(
    cluster: Cluster, namespace: str, controller: Controller, prometheus: PrometheusStack
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    serve(prometheus, namespace, stable=0.01, canary=0.01)
    apply_release(cluster, namespace, release_with(prometheus, {"thresholdRange": {"max": 0.05}}))
    seen: list[dict[str, Any]] = []

    def done() -> bool:
        st = status(cluster, namespace, "web")
        seen.extend(st.get("metrics") or [])
        return st.get("phase") in TERMINAL

    wait_for(done, 90, "release finished", 0.3)
    st = status(cluster, namespace, "web")
    assert st["phase"] == "Succeeded", (st, controller.logs())
    values = [m for m in seen if m.get("name") == "error-rate" and m.get("value") is not None]
    assert values and all(m["verdict"] == "Pass" for m in values), seen[-5:]
    assert all(abs(m["value"] - 0.01) < 0.02 for m in values)
    assert st["metrics"][0]["checkedAt"]


def test_error_rate_raised_in_batch_two_rolls_back_in_time(
    cluster: Cluster, namespace: str, controller: Controller, prometheus: PrometheusStack
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    serve(prometheus, namespace, stable=0.01, canary=0.01)
    interval, failure_limit = 2, 0
    batches: list[dict[str, Any]] = [{"replicas": 1, "pause": "3s"}, {"replicas": 2, "pause": "60s"}, {"replicas": 4}]
    apply_release(
        cluster,
        namespace,
        release_with(
            prometheus,
            {"thresholdRange": {"max": 0.05}, "failureLimit": failure_limit},
            batches=batches,
            interval=f"{interval}s",
        ),
    )
    wait_for(
        lambda: (
            status(cluster, namespace, "web").get("currentBatch") == 2
            and (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt")
        ),
        90,
        "batch 2 live",
    )
    prometheus.set_rates(namespace, "web", "canary", rps=50, error_ratio=0.5)
    t0 = time.monotonic()
    st = wait_phase(cluster, namespace, "web", {"Failed", "Succeeded", "Aborted"}, timeout=60)
    elapsed = time.monotonic() - t0
    assert st["phase"] == "Failed", st
    print(f"rolled back {elapsed:.2f}s after the error rate was raised")
    assert elapsed <= interval * (failure_limit + 1) + 5, f"rolled back {elapsed:.1f}s after the change"
    assert "error-rate" in st["message"] and "> max 0.05" in st["message"]
    described = cluster.kubectl("describe", "gr", "web", "-n", namespace).stdout
    assert "AnalysisFailed" in described and "error-rate" in described
    assert any(e["reason"] == "MetricCheckFailed" for e in events(cluster, namespace, "web"))
    dep = deployment(cluster, namespace, "web")
    assert dep is not None and dep["spec"]["replicas"] == 4
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/app:v1"
    assert deployment(cluster, namespace, "web-canary") is None


@pytest.mark.parametrize("limit", [2, 100], ids=["fails-at-error-limit", "waits-while-down"])
def test_prometheus_down_never_lets_a_batch_pass(
    cluster: Cluster, namespace: str, controller: Controller, prometheus: PrometheusStack, limit: int
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    serve(prometheus, namespace, stable=0.01, canary=0.01)
    apply_release(
        cluster,
        namespace,
        release_with(
            prometheus,
            {"thresholdRange": {"max": 0.05}, "consecutiveErrorLimit": limit},
            batches=[{"replicas": 1, "pause": "1s"}, {"replicas": 4}],
        ),
    )
    wait_for(lambda: (status(cluster, namespace, "web").get("batchTimes") or {}).get("readyAt"), 60, "batch 1 live")
    prometheus.stop()
    try:
        if limit == 2:
            st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=60)
            assert st["phase"] == "Failed" and "query errors in a row" in st["message"], st
            assert st["history"][0]["result"] != "passed"
        else:
            time.sleep(8)
            st = status(cluster, namespace, "web")
            assert st["phase"] == "Progressing" and st["currentBatch"] == 1, st
            assert st["metrics"][0]["verdict"] == "Error" and st["metrics"][0]["consecutiveErrors"] >= 2
    finally:
        prometheus.start()
    if limit == 100:
        st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
        assert st["phase"] == "Succeeded", st


@pytest.mark.parametrize(
    ("on_no_data", "expected"),
    [("fail", "Failed"), ("pass", "Succeeded"), ("wait", "Failed")],
    ids=["fail", "pass", "wait-until-deadline"],
)
def test_no_data_follows_on_no_data(
    cluster: Cluster,
    namespace: str,
    controller: Controller,
    prometheus: PrometheusStack,
    on_no_data: str,
    expected: str,
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    body = release_with(prometheus, {"thresholdRange": {"max": 1}, "onNoData": on_no_data}, progressDeadlineSeconds=8)
    body["spec"]["analysis"]["metrics"][0]["query"] = NOTHING
    apply_release(cluster, namespace, body)
    if on_no_data == "wait":
        wait_for(
            lambda: "waiting for the analysis" in status(cluster, namespace, "web").get("message", ""),
            60,
            "waiting for data",
        )
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
    assert st["phase"] == expected, st
    if on_no_data == "fail":
        assert "no data (onNoData: fail)" in st["message"]
    if on_no_data == "wait":
        assert "progressDeadlineSeconds" in st["message"] and "no data" in st["message"]


@pytest.mark.parametrize(("mode", "expected"), [("threshold", "Succeeded"), ("compare", "Failed")])
def test_comparison_catches_a_canary_worse_than_stable(
    cluster: Cluster, namespace: str, controller: Controller, prometheus: PrometheusStack, mode: str, expected: str
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    serve(prometheus, namespace, stable=0.2, canary=0.3)  # the canary is 50% worse
    metric: dict[str, Any] = {"thresholdRange": {"max": 0.5}}
    if mode == "compare":
        metric["compare"] = {"maxIncrease": 0.2, "floor": 0.001}
    apply_release(cluster, namespace, release_with(prometheus, metric))
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
    assert st["phase"] == expected, st
    if mode == "compare":
        assert "error-rate" in st["message"] and "stable" in st["message"]


def test_bearer_token_comes_from_a_secret_and_a_missing_key_is_an_error(
    cluster: Cluster, namespace: str, controller: Controller, prometheus: PrometheusStack
) -> None:
    deploy_app(cluster, namespace, replicas=4)
    serve(prometheus, namespace, stable=0.01, canary=0.01)
    cluster.kubectl("create", "secret", "generic", "prom-token", "-n", namespace, "--from-literal=token=s3cret")
    body = release_with(prometheus, {"thresholdRange": {"max": 0.05}, "consecutiveErrorLimit": 2})
    body["spec"]["analysis"]["prometheus"]["bearerTokenSecret"] = {"name": "prom-token", "key": "missing"}
    apply_release(cluster, namespace, body)
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=60)
    assert st["phase"] == "Failed" and "bearerTokenSecret" in st["message"], st
    # With the right key the token is sent (this Prometheus ignores it) and the release goes through.
    cluster.kubectl("delete", "gr", "web", "-n", namespace, "--timeout=60s")
    body["spec"]["analysis"]["prometheus"]["bearerTokenSecret"]["key"] = "token"
    apply_release(cluster, namespace, body)
    st = wait_phase(cluster, namespace, "web", TERMINAL, timeout=90)
    assert st["phase"] == "Succeeded", st
