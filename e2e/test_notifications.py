"""End-to-end: notifications posted to real HTTP servers on the test machine, where the controller (a process on
the same machine) reaches them at 127.0.0.1, their URLs in Secrets of the release's namespace.

- under 100 requests/s through Traefik, five aborts with a receiver that never answers configured (and holding
  a request at each abort): the cut, from the annotation's write to the last canary answer, stays within 1 s
  (p99), and a receiver that answers is told of each abort;
- then one app and one GreyRelease for the rest of the module (pinned releases, pods Ready at once), with four
  notifications: ``every`` (generic, every Event), ``chat`` (slack, the default ``on``), ``flaky`` (generic,
  every Event, its receiver answering 503 to the first POST of each notification) and ``late`` (the default
  ``on``, its Secret missing at first):
  - a good release: one notification per Event, in the Events' order, the ids the Events' names; the default
    ``on`` gets WaitingForApproval and Succeeded; the flaky receiver gets each once more after its 503 and
    takes each once; the missing Secret: ``late`` Failed in status.notifications, a NotificationFailed Warning
    per Event it was for, the release Succeeded all the same;
  - an aborted release: the same, the Aborted Warning with the canary's weight already 0; the Secret now
    there, ``late`` gets its notifications and its status entry turns to Sent;
  - a release failed by its metric gate (a real Prometheus scraping the test exporter): the failing metric's
    name, value and verdict in the notification of the Event that failed it, in both formats.

The figures (the cuts, how long after its Event each notification came) are printed; ``-s`` shows them.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from greyrelease.api.release import NOTIFY_DEFAULT_ON
from greyrelease.reconcile.notify import ATTENTION, DANGER, GOOD, METRIC_REASONS, NOTIFICATION_FAILED

from e2e.harness.controller import Controller, apply_release, deploy_app, drop_releases, gr, wait_for
from e2e.harness.controlplane import Cluster, LocalCluster
from e2e.harness.dataplane import DataPlane, routed_app
from e2e.harness.load import Load, Record, last, percentile
from e2e.harness.observe import Reads, event_line, events_of, first_write_after
from e2e.harness.prometheus import PrometheusStack
from e2e.harness.receivers import Post, Receiver, url_secret
from e2e.harness.reliability import CONTROLLER_AGENTS

pytestmark = pytest.mark.e2e

IMAGE = "registry.example/app"
RATE = 100.0  # requests/s through Traefik
ABORTS = 5
ABORT_LIMIT = 1.0  # seconds, p99 of the cut
EVERY_EVENT = ["Normal", "Warning"]
ABORT = "greyrelease.io/abort=true"
HANG = 15.0  # seconds a hanging receiver holds a request, far past the sender's 5 s timeout


def image(tag: str) -> str:
    return f"{IMAGE}:{tag}"


def hook(name: str, secret: str, key: str, *, on: list[str] | None = None, fmt: str = "generic") -> dict[str, Any]:
    """A GreyRelease's notification; ``on`` left out takes the default."""
    entry: dict[str, Any] = {"name": name, "format": fmt, "urlSecretRef": {"name": secret, "key": key}}
    if on is not None:
        entry["on"] = on
    return entry


# --- 1: a receiver that hangs, and the abort cut under load ---------------------------------------------------


def test_a_receiver_that_hangs_does_not_delay_the_abort_cut(
    local_cluster: LocalCluster, dataplane: DataPlane, namespace: str, controller: Controller
) -> None:
    cluster, replicas = local_cluster, 4
    routing = {"gatewayAPI": {"httpRoute": "web", "stableService": "web"}}
    reads = Reads(cluster, namespace, agent="e2e-notifications")
    cuts: list[float] = []
    parts: list[tuple[float, float]] = []  # the controller's route write after the annotation, the proxy after it
    holding: list[int] = []  # requests the hanging receiver held at each abort
    ages: list[float] = []  # how long before each abort its newest request came (the sender waits 5 s on one)
    told: list[float] = []  # the answering receiver's Aborted notification, after the annotation's write
    with Receiver("hang", hang=HANG) as hang, Receiver("ok") as ok:
        url_secret(cluster, namespace, "hooks", {"hang": hang.url, "ok": ok.url})
        notifications = [hook("hang", "hooks", "hang", on=EVERY_EVENT), hook("ok", "hooks", "ok", on=EVERY_EVENT)]
        host = routed_app(cluster, dataplane, namespace, replicas, image("v1"), grace_seconds=2)
        controller.wait_ready()
        with Load(dataplane.gateway_url, RATE, host=host) as load:
            for i in range(ABORTS):
                version = f"v{i + 2}"
                body = gr(
                    "web",
                    targetRef={"name": "web"},
                    targetVersion=version,
                    batches=[{"replicas": 2, "weight": 30, "pause": "manual"}, {"replicas": 4, "weight": 100}],
                    trafficRouting=routing,
                    notifications=notifications,
                )
                apply_release(cluster, namespace, body)

                def live(st: dict[str, Any], v: str = version) -> bool:
                    return (
                        st.get("targetVersion") == v
                        and st.get("phase") == "Progressing"
                        and st.get("batchState") == "WaitingForApproval"
                    )

                reads.wait_status(live, 90, f"abort {i + 1}: batch 1 of {version} live")
                canary, seen = image(version), time.time()

                def canary_answered(c: str = canary, s: float = seen) -> bool:
                    return sum(1 for r in load.records if r.sent >= s and r.image == c) >= 10

                wait_for(canary_answered, 30, f"abort {i + 1}: canary answers", interval=0.1)
                t0 = time.time()
                holding.append(hang.in_flight)
                newest = max((p.at for p in hang.posts()), default=0.0)
                ages.append(t0 - newest)
                subprocess.run(
                    [cluster.kubectl_path, "annotate", "gr", "web", "-n", namespace, "--overwrite", ABORT],
                    env=cluster.env,
                    check=True,
                    capture_output=True,
                    timeout=30,
                )

                def from_canary(r: Record, c: str = canary) -> bool:
                    return r.image == c

                def quiet(c: Callable[[Record], bool] = from_canary) -> bool:
                    # No canary answer for 1.5 s: every request sent before the cut has been answered. Only the
                    # records are read meanwhile: polling the API would take the CPU the cut needs.
                    found = last(load.records, c)
                    return found is not None and time.time() - found.sent > 1.5

                wait_for(quiet, 30, f"abort {i + 1}: no more canary answers", interval=0.1)
                final = last(load.records, from_canary)
                assert final is not None
                annotated = first_write_after(cluster, namespace, t0, "greyreleases", field_manager="kubectl-annotate")
                assert annotated is not None, "the audit log has no write of the abort annotation"
                routed = first_write_after(cluster, namespace, t0, "httproutes", agents=CONTROLLER_AGENTS) or annotated
                cuts.append(final.sent - annotated)
                parts.append((routed - annotated, final.sent - routed))
                reads.wait_phase({"Aborted"}, 60)

                def aborted_told(s: float = t0) -> Post | None:
                    return next((p for p in ok.answered(s) if p.reason == "Aborted"), None)

                told.append(wait_for(aborted_told, 30, f"abort {i + 1}: the Aborted notification").at - annotated)
                reads.wait(lambda: reads.deployment("web-canary") is None, 60, f"abort {i + 1}: the canary removed")
                print(
                    f"\nabort {i + 1} ({version}): last canary answer {cuts[-1]:.3f}s after the annotation's write "
                    f"(route written {parts[-1][0]:.3f}s after it, proxy {parts[-1][1]:.3f}s); hanging receiver "
                    f"holding {holding[-1]} request(s) then, the newest sent {ages[-1]:.1f}s before the abort; "
                    f"Aborted notified {told[-1]:.2f}s after the annotation"
                )
        records = load.records
        hung = hang.posts()
    timeouts = [
        e
        for e in events_of(cluster, namespace, "GreyRelease", "web", reason=NOTIFICATION_FAILED)
        if "notification hang " in e["message"]
    ]
    failed = [r for r in records if r.failed]
    print(
        f"\n{ABORTS} aborts under {RATE:.0f} req/s with a receiver that never answers: cut p50 "
        f"{percentile(cuts, 50):.3f}s, p99 {percentile(cuts, 99):.3f}s, max {max(cuts):.3f}s; route written p50 "
        f"{percentile([p[0] for p in parts], 50):.3f}s after the annotation; the answering receiver told of each "
        f"abort p50 {percentile(told, 50):.2f}s, max {max(told):.2f}s after it; the hanging one took {len(hung)} "
        f"POSTs, {len(timeouts)} NotificationFailed so far; {len(failed)} of {len(records)} requests failed"
    )
    if timeouts:
        print(f"  {event_line(timeouts[0])}")
    assert all(n > 0 for n in holding), f"the hanging receiver held no request at some abort: {holding}"
    # No answer is not tried again: the receiver has the request.
    assert set(Counter(p.id for p in hung).values()) == {1}, Counter(p.id for p in hung).most_common(3)
    assert timeouts and all("no answer within 5s" in e["message"] for e in timeouts), [event_line(e) for e in timeouts]
    assert all("http://" not in e["message"] for e in timeouts), "a URL (a credential) in an Event"
    assert len(told) == ABORTS
    assert percentile(cuts, 99) <= ABORT_LIMIT, f"cuts {sorted(round(c, 3) for c in cuts)}"


# --- 2-4: one app, one GreyRelease, four notifications ----------------------------------------------------------


@dataclass
class Env:
    cluster: Cluster
    namespace: str
    reads: Reads
    every: Receiver  # generic, every Event
    chat: Receiver  # slack, the default on
    flaky: Receiver  # generic, every Event; 503 to the first POST of each notification
    late: Receiver  # generic, the default on; its Secret made only before the second release


NOTIFICATIONS = [
    hook("every", "hooks", "every", on=EVERY_EVENT),
    hook("chat", "hooks", "chat", fmt="slack"),
    hook("flaky", "hooks", "flaky", on=EVERY_EVENT),
    hook("late", "late-hook", "url"),
]


@pytest.fixture(scope="module")
def env(cluster: Cluster, crd: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    namespace = f"e2e-notifications-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_namespace_ready(namespace)
    ctl = Controller(cluster, namespace, tmp_path_factory.mktemp("notifications") / "controller.log")
    receivers = [
        Receiver("every").start(),
        Receiver("chat").start(),
        Receiver("flaky", fail_first=1).start(),
        Receiver("late").start(),
    ]
    every, chat, flaky, late = receivers
    try:
        url_secret(cluster, namespace, "hooks", {"every": every.url, "chat": chat.url, "flaky": flaky.url})
        deploy_app(cluster, namespace, replicas=2)
        ctl.start()
        ctl.wait_ready()
        yield Env(cluster, namespace, Reads(cluster, namespace, agent="e2e-notifications"), every, chat, flaky, late)
    finally:
        ctl.stop()
        print(f"--- controller log (last lines) ---\n{ctl.logs()}")
        for r in receivers:
            r.close()
        drop_releases(cluster, namespace)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def release(version: str, **spec: Any) -> dict[str, Any]:
    """GreyRelease web to ``version``: batch 1 (one pod) waits for an approval, batch 2 is the whole app."""
    return gr(
        "web",
        appName="web",
        targetVersion=version,
        batches=[{"replicas": 1, "pause": "manual"}, {"replicas": 2}],
        trafficRouting={"service": {"name": "web"}},
        notifications=NOTIFICATIONS,
        **spec,
    )


def release_events(env: Env) -> list[dict[str, Any]]:
    """The release's own Events but its NotificationFailed ones, in the order they were created."""
    return [
        e for e in events_of(env.cluster, env.namespace, "GreyRelease", "web") if e["reason"] != NOTIFICATION_FAILED
    ]


def names_of(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["metadata"]["name"]) for e in events]


def by_default(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Events a notification with the default ``on`` is for."""
    return [e for e in events if e["type"] in NOTIFY_DEFAULT_ON or e["reason"] in NOTIFY_DEFAULT_ON]


def delivered(receiver: Receiver, since: float, n: int) -> list[Post]:
    """The notifications ``receiver`` took since ``since``, once it took at least ``n``."""

    def enough() -> list[Post] | None:
        got = receiver.answered(since)
        return got if len(got) >= n else None

    try:
        return wait_for(enough, 45, f"{n} notifications at {receiver.name}")
    except AssertionError:
        got = [(p.reason, p.id) for p in receiver.answered(since)]
        raise AssertionError(f"{receiver.name} took {len(got)} notifications of {n} within 45s: {got}") from None


def run_release(env: Env, version: str, *, end: str, **spec: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Applies the release of ``version`` and drives it: an approval at batch 1 for ``Succeeded``, an abort
    there for ``Aborted``, nothing for an end its gate decides. Returns its final status and the Events it
    posted (its own, not the NotificationFailed ones), oldest first."""
    before = set(names_of(release_events(env)))
    apply_release(env.cluster, env.namespace, release(version, **spec))
    if end in ("Succeeded", "Aborted"):

        def waits(st: dict[str, Any]) -> bool:
            return (
                st.get("targetVersion") == version
                and st.get("phase") == "Progressing"
                and st.get("batchState") == "WaitingForApproval"
            )

        env.reads.wait_status(waits, 60, f"batch 1 of {version} waiting for approval")
        request = "greyrelease.io/promote=1" if end == "Succeeded" else ABORT
        env.cluster.kubectl("annotate", "gr", "web", "-n", env.namespace, "--overwrite", request)
    st = env.reads.wait_status(
        lambda st: st.get("targetVersion") == version and st.get("phase") in ("Succeeded", "Aborted", "Failed"),
        120,
        f"the release of {version} ended",
    )
    assert st["phase"] == end, (st.get("phase"), st.get("message"))
    env.reads.wait(lambda: env.reads.deployment("web-canary") is None, 60, "the canary removed")
    events = [e for e in release_events(env) if e["metadata"]["name"] not in before]
    return st, events


def check_one_per_event(env: Env, events: list[dict[str, Any]], since: float) -> list[Post]:
    """``every`` took one notification per Event, in the Events' order, each the Event's own; ``flaky`` each
    one twice (503, then 200 about a second later) and took each once; ``chat`` the default ``on``'s, in the
    Slack format. Returns ``every``'s."""
    names = names_of(events)
    got = delivered(env.every, since, len(names))
    assert [p.id for p in got] == names, "\n".join(
        [f"received {[(p.id, p.reason) for p in got]}", *(event_line(e) for e in events)]
    )
    rel = env.reads.release()
    assert rel is not None
    for p, e in zip(got, events, strict=True):
        doc = p.payload
        assert (doc["reason"], doc["type"], doc["message"]) == (e["reason"], e["type"], e["message"]), (doc, e)
        assert doc["kind"] == "GreyReleaseEvent" and doc["apiVersion"] == "greyrelease.io/v1", doc
        assert doc["release"]["name"] == "web" and doc["release"]["namespace"] == env.namespace, doc["release"]
        assert doc["release"]["uid"] == rel["metadata"]["uid"], doc["release"]

    took = delivered(env.flaky, since, len(names))
    assert [p.id for p in took] == names, [(p.id, p.reason) for p in took]
    tries: dict[str, list[Post]] = defaultdict(list)
    for p in env.flaky.posts(since):
        tries[p.id].append(p)
    assert {i: [p.status for p in ps] for i, ps in tries.items()} == {n: [503, 200] for n in names}
    gaps = [ps[1].at - ps[0].at for ps in tries.values()]
    assert min(gaps) >= 0.8, f"tried again after {min(gaps):.2f}s: the backoff is 1 s"
    assert all(ps[0].body == ps[1].body for ps in tries.values()), "the retry posted another body"

    wanted = by_default(events)
    chat = delivered(env.chat, since, len(wanted))
    assert [p.id for p in chat] == names_of(wanted), [(p.id, p.reason) for p in chat]
    for p, e in zip(chat, wanted, strict=True):
        attachment = p.payload["attachments"][0]
        assert p.payload["text"] == f"GreyRelease {env.namespace}/web: {e['reason']}", p.payload["text"]
        if e["type"] == "Warning":
            assert attachment["color"] == DANGER, attachment
    lags = [p.at - _seconds(p.payload["time"]) for p in got]
    print(
        f"  {len(names)} Events, {len(got)} notifications to every ({[p.reason for p in got]}), {len(chat)} to "
        f"chat ({[p.reason for p in chat]}); flaky: {len(env.flaky.posts(since))} POSTs, the second of each "
        f"{min(gaps):.2f}-{max(gaps):.2f}s after its 503; every's notification came p50 "
        f"{percentile(lags, 50):.3f}s, max {max(lags):.3f}s after its Event's time"
    )
    return got


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_a_good_release_notifies_each_event_once_in_order_and_a_missing_secret_fails_only_its_notification(
    env: Env,
) -> None:
    since = time.time()
    st, events = run_release(env, "v2", end="Succeeded")
    print(f"\ngood release: {st['phase']}")
    got = check_one_per_event(env, events, since)
    reasons = [p.reason for p in got]
    assert reasons[0] == "ReleaseStarted" and reasons[-1] == "Succeeded", reasons
    assert reasons.index("WaitingForApproval") < reasons.index("Succeeded"), reasons
    assert got[-1].payload["phase"] == "Succeeded" and got[-1].payload["versions"]["target"] == "v2", got[-1].payload
    assert all(p.payload["type"] == "Normal" for p in got), [(p.reason, p.payload["type"]) for p in got]
    chat = env.chat.answered(since)
    assert [p.reason for p in chat] == ["WaitingForApproval", "Succeeded"], [p.reason for p in chat]
    assert [p.payload["attachments"][0]["color"] for p in chat] == [ATTENTION, GOOD]

    # The missing Secret: that notification alone fails, told in the status and by an Event per Event it was
    # for; the release went on (Succeeded above).
    wanted = by_default(events)

    def failed_entry(st: dict[str, Any]) -> bool:
        return any(n.get("name") == "late" and n.get("result") == "Failed" for n in st.get("notifications") or [])

    st = env.reads.wait_status(failed_entry, 30, "notification late Failed in status.notifications")
    entries = st["notifications"]
    assert [e["name"] for e in entries] == ["late"], entries
    entry = entries[0]
    assert entry["source"] == "GreyRelease" and f"Secret {env.namespace}/late-hook not found" in entry["message"]
    assert entry["event"].split(" ")[1] in names_of(wanted), entry

    def failures() -> list[dict[str, Any]] | None:
        found = [
            e
            for e in events_of(env.cluster, env.namespace, "GreyRelease", "web", reason=NOTIFICATION_FAILED)
            if "notification late " in e["message"]
        ]
        return found if len(found) >= len(wanted) else None

    told = env.reads.wait(failures, 30, f"{len(wanted)} NotificationFailed Events for late", interval=1.0)
    assert len(told) == len(wanted), [event_line(e) for e in told]
    for e, w in zip(told, wanted, strict=True):
        assert e["type"] == "Warning" and w["metadata"]["name"] in e["message"], (event_line(e), event_line(w))
        assert f"Secret {env.namespace}/late-hook not found" in e["message"] and "http" not in e["message"]
    assert not env.late.posts(since)
    print(
        f"  late: {entry['result']}: {entry['message']}; {len(told)} NotificationFailed Events, "
        f"e.g. {event_line(told[0])}"
    )


def test_an_aborted_release_notifies_the_abort_and_a_secret_made_later_is_used(env: Env) -> None:
    url_secret(env.cluster, env.namespace, "late-hook", {"url": env.late.url})
    since = time.time()
    st, events = run_release(env, "v3", end="Aborted")
    print(f"\naborted release: {st['phase']}: {st.get('message')}")
    got = check_one_per_event(env, events, since)
    aborted = [p for p in got if p.reason == "Aborted"]
    assert len(aborted) == 1, [p.reason for p in got]
    doc = aborted[0].payload
    assert doc["type"] == "Warning" and doc["weight"] == 0, doc  # the canary's traffic cut in that same pass
    assert doc["phase"] in ("RollingBack", "Aborted") and doc["versions"]["target"] == "v3", doc
    chat = env.chat.answered(since)
    assert "Aborted" in [p.reason for p in chat], [p.reason for p in chat]

    # The Secret is there now: late takes what the default on sends, and its entry says Sent.
    wanted = by_default(events)
    late = delivered(env.late, since, len(wanted))
    assert [p.id for p in late] == names_of(wanted), [(p.id, p.reason) for p in late]
    st = env.reads.wait_status(
        lambda st: [(n.get("name"), n.get("result")) for n in st.get("notifications") or []] == [("late", "Sent")],
        30,
        "notification late Sent in status.notifications",
    )
    print(f"  late: {[p.reason for p in late]}; status.notifications {st['notifications']}")


def test_a_release_failed_by_its_gate_notifies_the_failing_metrics_value(env: Env, prometheus: PrometheusStack) -> None:
    selector = 'namespace="{{namespace}}",app="{{app}}",track="{{track}}"'
    error_rate = (
        f"sum(rate(http_request_errors_total{{{selector}}}[5s])) / sum(rate(http_requests_total{{{selector}}}[5s]))"
    )
    analysis = {
        "prometheus": {"address": prometheus.url, "timeout": "2s"},
        "interval": "1s",
        "metrics": [{"name": "error-rate", "query": error_rate, "thresholdRange": {"max": 0.05}}],
    }
    try:
        prometheus.set_rates(env.namespace, "web", "stable", rps=50, error_ratio=0.01)
        prometheus.set_rates(env.namespace, "web", "canary", rps=50, error_ratio=0.3)
        canary_rate = error_rate.replace("{{namespace}}", env.namespace).replace("{{app}}", "web")
        prometheus.wait_for_query(
            canary_rate.replace("{{track}}", "canary"), lambda v: v is not None and abs(v - 0.3) < 0.02, timeout=30
        )
        since = time.time()
        st, events = run_release(env, "v4", end="Failed", analysis=analysis)
    finally:
        prometheus.reset(env.namespace)
    print(f"\nfailed release: {st['phase']}: {st.get('message')}")
    got = check_one_per_event(env, events, since)
    about_metric = [p for p in got if p.reason in METRIC_REASONS]
    assert [p.reason for p in about_metric][-1] == "AnalysisFailed", [p.reason for p in got]
    for p in about_metric:
        metric = p.payload.get("metric")
        assert metric is not None, p.payload
        assert metric["name"] == "error-rate" and metric["verdict"] == "Fail", metric
        assert metric["value"] is not None and abs(metric["value"] - 0.3) < 0.1, metric
    failed = about_metric[-1]
    assert failed.payload["type"] == "Warning" and "error-rate" in failed.payload["message"], failed.payload
    chat = {p.id: p for p in env.chat.answered(since)}
    assert failed.id in chat, "the Event that failed the release did not reach the default on"
    fields = {f["title"]: f["value"] for f in chat[failed.id].payload["attachments"][0]["fields"]}
    assert fields["Metric"].startswith("error-rate = 0.") and fields["Metric"].endswith("(Fail)"), fields
    counted = Counter(p.reason for p in got)
    print(
        f"  {failed.reason}: metric {failed.payload['metric']}; slack field Metric: {fields['Metric']}; "
        f"{counted['MetricCheckFailed']} MetricCheckFailed notifications before it"
    )
