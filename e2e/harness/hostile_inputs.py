"""A corpus of bad GreyReleases and what must happen to each: refused by the API server with a message
naming the field, or accepted and marked InvalidSpec by the controller with nothing touched.

`python -m e2e.harness.hostile_inputs` prints the table the README carries (a test keeps them in step).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any

BASE: dict[str, Any] = {"targetRef": {"name": "web"}, "targetVersion": "v2", "batchSize": 2, "canaryWeight": 50}
ANALYSIS: dict[str, Any] = {
    "prometheus": {"address": "http://127.0.0.1:9", "timeout": "1s"},
    "interval": "1s",
    "metrics": [{"name": "errors", "query": "sum(rate(x[1m]))", "thresholdRange": {"max": 1}}],
}


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    spec: dict[str, Any] | None  # None: the object has no spec at all
    expect: str  # "refused" or "invalid"
    mentions: str  # text the error or the status message must contain (the field)
    name: str = "hostile"


def with_(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


def batches(*items: dict[str, Any]) -> dict[str, Any]:
    return with_(batchSize=None, canaryWeight=None, batches=list(items))


def analysis(**metric: Any) -> dict[str, Any]:
    a = copy.deepcopy(ANALYSIS)
    a["metrics"][0].update(metric)
    return with_(analysis=a)


CASES: list[Case] = [
    Case("weight-over-100", "canaryWeight: 101", with_(canaryWeight=101), "refused", "spec.canaryWeight"),
    Case("weight-negative", "canaryWeight: -1", with_(canaryWeight=-1), "refused", "spec.canaryWeight"),
    Case("batch-size-zero", "batchSize: 0", with_(batchSize=0), "refused", "spec.batchSize"),
    Case("batch-size-negative", "batchSize: -3", with_(batchSize=-3), "refused", "spec.batchSize"),
    Case("batch-size-huge", "batchSize: 10000000", with_(batchSize=10_000_000), "refused", "spec.batchSize"),
    Case(
        "weights-decrease",
        "batch weights 50 then 10",
        batches({"replicas": 1, "weight": 50}, {"replicas": 2, "weight": 10}),
        "refused",
        "spec.batches",
    ),
    Case(
        "replicas-decrease",
        "batch replicas 5 then 2",
        batches({"replicas": 5}, {"replicas": 2}),
        "refused",
        "spec.batches",
    ),
    Case("replicas-zero", "batch replicas 0", batches({"replicas": 0}), "refused", "spec.batches[0].replicas"),
    Case("replicas-negative", "batch replicas -1", batches({"replicas": -1}), "refused", "spec.batches[0].replicas"),
    Case("percent-zero", 'batch replicas "0%"', batches({"replicas": "0%"}), "refused", "spec.batches[0].replicas"),
    Case(
        "percent-over-100",
        'batch replicas "150%"',
        batches({"replicas": "150%"}),
        "refused",
        "spec.batches[0].replicas",
    ),
    Case(
        "replicas-word", 'batch replicas "many"', batches({"replicas": "many"}), "refused", "spec.batches[0].replicas"
    ),
    Case(
        "batch-weight-over-100",
        "batch weight 150",
        batches({"replicas": 1, "weight": 150}),
        "refused",
        "spec.batches[0].weight",
    ),
    Case("fifty-one-batches", "51 batches", batches(*[{"replicas": 1}] * 51), "refused", "spec.batches"),
    Case("thousands-of-batches", "5000 batches", batches(*[{"replicas": 1}] * 5000), "refused", "spec.batches"),
    Case("no-batches", "batches: []", batches(), "refused", "spec.batches"),
    Case("pause-word", 'pause: "soon"', with_(pause="soon"), "refused", "spec.pause"),
    Case("pause-negative", 'pause: "-5s"', with_(pause="-5s"), "refused", "spec.pause"),
    Case("pause-space", 'pause: "5 s"', with_(pause="5 s"), "refused", "spec.pause"),
    Case("pause-empty", 'pause: ""', with_(pause=""), "refused", "spec.pause"),
    Case(
        "batch-pause-bad",
        'batch pause "1 hour"',
        batches({"replicas": 1, "pause": "1 hour"}),
        "refused",
        "spec.batches[0].pause",
    ),
    Case("unknown-field", "spec.colour: grey", with_(colour="grey"), "refused", "spec.colour"),
    Case(
        "unknown-batch-field",
        "batches[0].speed: fast",
        batches({"replicas": 1, "speed": "fast"}),
        "refused",
        "spec.batches[0].speed",
    ),
    Case("version-with-spaces", 'targetVersion: "v 2"', with_(targetVersion="v 2"), "refused", "spec.targetVersion"),
    Case("version-empty", 'targetVersion: ""', with_(targetVersion=""), "refused", "spec.targetVersion"),
    Case(
        "version-too-long",
        "targetVersion of 300 characters",
        with_(targetVersion="v" * 300),
        "refused",
        "spec.targetVersion",
    ),
    Case(
        "both-forms",
        "batches and batchSize",
        with_(batches=[{"replicas": 1}]),
        "refused",
        "exactly one of batches or batchSize",
    ),
    Case(
        "neither-form",
        "neither batches nor batchSize",
        with_(batchSize=None, canaryWeight=None),
        "refused",
        "exactly one of batches or batchSize",
    ),
    Case(
        "half-shorthand",
        "batchSize without canaryWeight",
        with_(canaryWeight=None),
        "refused",
        "batchSize and canaryWeight go together",
    ),
    Case(
        "both-targets", "targetRef and appName", with_(appName="web"), "refused", "exactly one of targetRef or appName"
    ),
    Case(
        "no-target",
        "neither targetRef nor appName",
        with_(targetRef=None),
        "refused",
        "exactly one of targetRef or appName",
    ),
    Case(
        "target-kind",
        "targetRef.kind: StatefulSet",
        with_(targetRef={"kind": "StatefulSet", "name": "web"}),
        "refused",
        "spec.targetRef.kind",
    ),
    Case(
        "target-name-odd",
        'targetRef.name: "Web_App!"',
        with_(targetRef={"name": "Web_App!"}),
        "refused",
        "spec.targetRef.name",
    ),
    Case(
        "app-name-too-long",
        "appName of 64 characters",
        with_(targetRef=None, appName="a" * 64),
        "refused",
        "spec.appName",
    ),
    Case(
        "two-routers",
        "service and nginx routing",
        with_(trafficRouting={"service": {"name": "web"}, "nginx": {"ingress": "web", "stableService": "web"}}),
        "refused",
        "exactly one of service, nginx or gatewayAPI",
    ),
    Case(
        "empty-routing",
        "trafficRouting: {}",
        with_(trafficRouting={}),
        "refused",
        "exactly one of service, nginx or gatewayAPI",
    ),
    Case(
        "deadline-zero",
        "progressDeadlineSeconds: 0",
        with_(progressDeadlineSeconds=0),
        "refused",
        "spec.progressDeadlineSeconds",
    ),
    Case(
        "deadline-huge",
        "progressDeadlineSeconds: 999999",
        with_(progressDeadlineSeconds=999_999),
        "refused",
        "spec.progressDeadlineSeconds",
    ),
    Case("paused-word", 'paused: "maybe"', with_(paused="maybe"), "refused", "spec.paused"),
    Case(
        "no-data-word", 'onNoData: "maybe"', analysis(onNoData="maybe"), "refused", "spec.analysis.metrics[0].onNoData"
    ),
    Case(
        "failure-limit-negative",
        "failureLimit: -1",
        analysis(failureLimit=-1),
        "refused",
        "spec.analysis.metrics[0].failureLimit",
    ),
    Case(
        "metric-name-spaces",
        'metric name "error rate"',
        analysis(name="error rate"),
        "refused",
        "spec.analysis.metrics[0].name",
    ),
    Case(
        "query-too-long",
        "a query of 5000 characters",
        analysis(query="x" * 5000),
        "refused",
        "spec.analysis.metrics[0].query",
    ),
    Case(
        "interval-word",
        'analysis.interval: "often"',
        with_(analysis={**ANALYSIS, "interval": "often"}),
        "refused",
        "spec.analysis.interval",
    ),
    Case(
        "address-not-url",
        'prometheus.address: "prometheus"',
        with_(analysis={**ANALYSIS, "prometheus": {"address": "prometheus"}}),
        "refused",
        "spec.analysis.prometheus.address",
    ),
    Case(
        "no-metrics",
        "analysis.metrics: []",
        with_(analysis={**ANALYSIS, "metrics": []}),
        "refused",
        "spec.analysis.metrics",
    ),
    Case("no-spec", "no spec at all", None, "refused", "spec"),
    Case(
        "window-empty",
        'window start "09:00", end "09:00"',
        with_(windows=[{"days": ["Mon"], "start": "09:00", "end": "09:00"}]),
        "refused",
        "spec.windows[0].end",
    ),
    Case(
        "window-no-days",
        "window days: []",
        with_(windows=[{"days": [], "start": "09:00", "end": "17:00"}]),
        "refused",
        "spec.windows[0].days",
    ),
    Case(
        "window-bad-day",
        'window days: ["Funday"]',
        with_(windows=[{"days": ["Funday"], "start": "09:00", "end": "17:00"}]),
        "refused",
        "spec.windows[0].days[0]",
    ),
    Case(
        "window-bad-clock",
        'window start "25:00"',
        with_(windows=[{"days": ["Mon"], "start": "25:00", "end": "17:00"}]),
        "refused",
        "spec.windows[0].start",
    ),
    Case(
        "freeze-backwards",
        "a freeze whose to is before its from",
        with_(freezes=[{"from": "2026-12-20T00:00:00Z", "to": "2026-12-19T00:00:00Z"}]),
        "refused",
        "spec.freezes[0].to",
    ),
    Case(
        "approval-without-manual",
        "approval on a batch with pause: 5s",
        batches({"replicas": 2, "pause": "5s", "approval": {"timeout": "1h"}}),
        "refused",
        "spec.batches[0].approval",
    ),
    Case(
        "approval-bad-outcome",
        "approval onTimeout: explode",
        batches({"replicas": 2, "pause": "manual", "approval": {"timeout": "1h", "onTimeout": "explode"}}),
        "refused",
        "spec.batches[0].approval.onTimeout",
    ),
    # Accepted by the schema, refused by the controller: it needs the cluster to know.
    Case(
        "unknown-time-zone",
        "window timeZone: Mars/Olympus",
        with_(windows=[{"days": ["Mon"], "start": "09:00", "end": "17:00", "timeZone": "Mars/Olympus"}]),
        "invalid",
        "spec.windows[0].timeZone: Value error, unknown time zone",
    ),
    Case(
        "after-itself",
        "a release named loop with after: [{name: loop}]",
        with_(after=[{"name": "loop"}]),
        "invalid",
        "spec.after: a cycle of releases waiting for each other: loop -> loop",
        name="loop",
    ),
    Case(
        "app-name-matches-none",
        "appName labels no Deployment",
        with_(targetRef=None, appName="nothing"),
        "invalid",
        "spec.appName: no Deployment",
    ),
    Case(
        "app-name-matches-two",
        "appName labels two Deployments",
        with_(targetRef=None, appName="twin"),
        "invalid",
        "spec.appName: 2 Deployments",
    ),
    Case(
        "target-missing",
        "targetRef names no Deployment",
        with_(targetRef={"name": "nowhere"}),
        "invalid",
        "spec.targetRef.name",
    ),
    Case(
        "container-missing",
        "container: sidecar (not in the pod)",
        with_(container="sidecar"),
        "invalid",
        "spec.container",
    ),
    Case(
        "percent-decreases",
        'batch replicas "50%" then 2 (of 10)',
        batches({"replicas": "50%"}, {"replicas": 2}, {"replicas": 10}),
        "invalid",
        "spec.batches[1].replicas",
    ),
    Case(
        "service-missing",
        "trafficRouting.service names no Service",
        with_(trafficRouting={"service": {"name": "nowhere"}}),
        "invalid",
        "spec.trafficRouting.service.name",
    ),
    Case(
        "longest-name",
        "a GreyRelease name of 253 characters whose target is missing",
        with_(targetRef={"name": "nowhere"}),
        "invalid",
        "spec.targetRef.name",
        name="r" * 253,
    ),
    Case(
        "odd-query",
        "a query full of quotes, braces and a newline, to an unreachable Prometheus",
        {**analysis(query='sum(rate(x{a="\\"}{{name}}\\n"}[1m])) / 0'), "targetRef": {"name": "odd"}},
        "failed",
        "query errors in a row",
    ),
]


def markdown() -> str:
    lines = ["| case | input | outcome |", "| --- | --- | --- |"]
    for c in CASES:
        if c.expect == "refused":
            outcome = f"refused by the API server, naming `{c.mentions}`"
        elif c.expect == "invalid":
            outcome = f"accepted, marked `InvalidSpec`: `{c.mentions}`; nothing touched"
        else:
            outcome = "accepted; the query is sent as written, its errors never pass a batch: `Failed`"
        lines.append(f"| {c.id} | {c.what} | {outcome} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
