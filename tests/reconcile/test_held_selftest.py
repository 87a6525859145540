"""The hold's self-test on the in-memory API server, with the webhook's real decision in front of the
Deployments (:class:`~tests.support.follow_cluster.HeldKube`): a dry-run template change held is ``True``;
without the webhook, or with it down, ``False`` with what was found; nothing to test on, ``Unknown``. The
dry run leaves the Deployment as it was, and a follow-mode release shows the result as its ``Held``
condition, written when the result changes and never by an idle pass."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from greyrelease.admission.configuration import configuration, url_client_config
from greyrelease.admission.probe import SELFTEST_ANNOTATION
from greyrelease.api.release import RELEASE_LABEL, Obj
from greyrelease.kube.memory import MemoryKube
from greyrelease.kube.protocol import ApiError, Ref
from greyrelease.planner.observed import UNTESTED
from greyrelease.reconcile.held import CONFIGURATION, HeldSelfTest
from greyrelease.reconcile.reconciler import Reconciler

from tests.support.builders import NS, T0, status_of
from tests.support.follow_cluster import WEB, HeldKube, cluster, commit, roll_out

DOWN = (
    'Internal error occurred: failed calling webhook "hold.deployments.greyrelease.io": failed to call webhook: '
    'Post "https://greyrelease-webhook.greyrelease-system.svc:443/hold?timeout=5s": no endpoints available for '
    'service "greyrelease-webhook"'
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def selftest(kube: MemoryKube, *, confirmations: int = 0, clock: Clock | None = None) -> HeldSelfTest:
    """The self-test of a process whose one runtime finds its Deployments by listing them."""
    nonces = iter(f"n{i}" for i in range(1000))
    tester = HeldSelfTest(kube, confirmations=confirmations, clock=clock or Clock(), nonce=lambda: next(nonces))
    tester.attach(lambda: next(iter(kube.list(WEB.collection, label_selector=RELEASE_LABEL)), None), lambda: None)
    return tester


def webhook_down(kube: HeldKube) -> None:
    """Every replica of the webhook down: the API server refuses what it would have called it for (what
    the webhook would have changed), naming it."""
    admit = kube.admit
    assert admit is not None
    hold: Callable[[Obj], Obj] = admit

    def refuse(obj: Obj) -> Obj:
        if hold(obj) is not obj:
            raise ApiError(500, "InternalError", DOWN)
        return obj

    kube.admit = refuse


def register(kube: MemoryKube, **changes: object) -> None:
    config = configuration(url_client_config("https://127.0.0.1:9443", b"ca"))
    config["webhooks"][0].update(changes)
    kube.put(config)


def held_condition(kube: MemoryKube) -> dict[str, str] | None:
    return next((c for c in status_of(kube).get("conditions") or [] if c["type"] == "Held"), None)


def test_a_template_change_held_by_the_webhook_is_true_and_leaves_the_deployment_as_it_was() -> None:
    kube = cluster()
    before = kube.get(WEB)
    kube.requests.clear()
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("True", "DryRunHeld")
    assert result.message == f"a dry-run change of the pod template of Deployment {NS}/web came back held"
    assert [verb for verb, ref in kube.requests if ref == WEB] == [MemoryKube.DRY_RUN]
    assert kube.get(WEB) == before  # not paused, no annotation, the same resourceVersion
    assert kube.writes == [] and kube.writes_to == []
    assert "hold" in kube.decisions  # the webhook's decision was made, on the dry run


def test_without_the_webhook_a_change_is_not_held_and_the_test_says_what_the_api_server_lacks() -> None:
    kube = cluster()
    kube.admit = None  # nothing mutates the Deployments
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("False", "NoWebhookConfiguration")
    assert "there is no MutatingWebhookConfiguration greyrelease-hold" in result.message
    # A configuration that does not match (here: its objectSelector) is named with what differs.
    register(kube, objectSelector={"matchLabels": {"team": "a"}})
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("False", "WebhookNotMatched")
    assert result.message == (
        f"a dry-run change of the pod template of Deployment {NS}/web was not held: it came back not paused; the "
        "webhook hold.deployments.greyrelease.io of MutatingWebhookConfiguration greyrelease-hold differs from "
        "this controller's in objectSelector"
    )

    # The configuration unreadable (RBAC): what was seen is said all the same.
    def forbidden(verb: str, ref: Ref) -> None:
        if ref == CONFIGURATION:
            raise ApiError(403, "Forbidden", "cannot get mutatingwebhookconfigurations")

    kube.before = forbidden
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("False", "WebhookNotMatched")
    assert "could not be read: 403 Forbidden" in result.message


def test_the_webhook_down_is_false_with_the_api_server_s_message_once_confirmed() -> None:
    kube = cluster()
    clock = Clock()
    tester = selftest(kube, confirmations=2, clock=clock)
    assert tester.run().status == "True"
    webhook_down(kube)
    before = kube.get(WEB)
    # A refusal after a result that was not one is tested again twice, 15 s apart, before it is shown.
    for _ in range(2):
        clock.now += 15
        assert tester.run().status == "True"  # still shown: the refusal waits to be confirmed
        assert tester.due_in() == 15
    clock.now += 15
    result = tester.run()
    assert (result.status, result.reason) == ("False", "WebhookRefused")
    assert result.message == f"the API server refuses a template change of Deployment {NS}/web: {DOWN}"
    assert tester.due_in() == 300  # shown: the next test at the usual interval
    assert kube.get(WEB) == before and kube.writes == []


def test_nothing_to_test_on_or_a_dry_run_not_allowed_is_unknown() -> None:
    kube = cluster(enrolled=False)
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("Unknown", "NoEnrolledDeployment")
    kube = cluster()

    def forbidden(verb: str, ref: Ref) -> None:
        if verb == MemoryKube.DRY_RUN:
            raise ApiError(403, "Forbidden", 'deployments.apps "web" is forbidden')

    kube.before = forbidden
    result = selftest(kube).run()
    assert (result.status, result.reason) == ("Unknown", "NotTested")
    assert result.message.endswith('answered 403: deployments.apps "web" is forbidden')
    # No runtime takes part (a standby): nothing is sent, nothing shown.
    lone = HeldSelfTest(kube)
    kube.requests.clear()
    assert lone.run() is UNTESTED and kube.requests == []


def test_a_change_of_the_result_is_told_once_and_a_pass_tests_first_only_when_the_last_test_is_old() -> None:
    kube = cluster()
    clock = Clock()
    told: list[str] = []
    tester = HeldSelfTest(kube, confirmations=0, clock=clock, nonce=lambda: "n")
    tester.attach(lambda: kube.get(WEB), lambda: told.append(tester.result.status or ""))
    tester.run()
    tester.run()
    assert told == ["True"]
    kube.requests.clear()
    clock.now += 299
    assert tester.check(starting=True).status == "True" and kube.requests == []  # fresh enough
    assert tester.check().status == "True" and kube.requests == []
    clock.now += 1
    kube.admit = None
    assert tester.check(starting=True).status == "False"  # 300 s old: tested first
    assert told == ["True", "False"] and (MemoryKube.DRY_RUN, WEB) in kube.requests


def test_a_follow_mode_release_shows_the_result_as_its_held_condition_written_only_when_it_changes() -> None:
    kube = cluster()
    register(kube)
    clock = Clock()
    tester = selftest(kube, clock=clock)
    reconciler = Reconciler(kube, held=tester)
    reconciler.reconcile(NS, "web", now=T0)
    assert held_condition(kube) is None  # not tested yet: nothing said
    tester.run()
    reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=1))
    first = held_condition(kube)
    assert first is not None and (first["status"], first["reason"]) == ("True", "DryRunHeld")
    # Idle passes, the result the same: no write, whatever new tests were made.
    kube.requests.clear()
    for minutes in (6, 11):
        clock.now += 300
        tester.run()
        reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=minutes))
    assert kube.writes == []
    # The webhook goes: one write, the condition False since then.
    kube.admit = None
    clock.now += 300
    tester.run()
    reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=16))
    reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=17))
    written = [ref for verb, ref in kube.writes if ref.resource == "greyreleases"]
    assert len(written) == 1
    down = held_condition(kube)
    assert down is not None and (down["status"], down["reason"]) == ("False", "WebhookNotMatched")
    assert down["lastTransitionTime"] != first["lastTransitionTime"]
    # The same status for another reason: the reason and message change, not the time of the transition.
    kube.delete(CONFIGURATION)
    clock.now += 300
    tester.run()
    reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=21))
    gone = held_condition(kube)
    assert gone is not None and (gone["status"], gone["reason"]) == ("False", "NoWebhookConfiguration")
    assert gone["lastTransitionTime"] == down["lastTransitionTime"]
    # A controller started again has not tested yet: its passes leave the condition recorded as it is.
    kube.requests.clear()
    Reconciler(kube, held=selftest(kube)).reconcile(NS, "web", now=T0 + timedelta(minutes=22))
    assert kube.writes == [] and held_condition(kube) == gone


def test_a_release_about_to_start_tests_first_when_the_last_test_is_old() -> None:
    kube = cluster()
    clock = Clock()
    tester = selftest(kube, clock=clock)
    reconciler = Reconciler(kube, held=tester)
    tester.run()
    reconciler.reconcile(NS, "web", now=T0)
    clock.now += 600
    commit(kube, "app:v2")
    kube.requests.clear()
    reconciler.reconcile(NS, "web", now=T0 + timedelta(minutes=10))
    assert (MemoryKube.DRY_RUN, WEB) in kube.requests
    # Dry runs leave no trace on the Deployment: the template held is Git's, without the self-test's change.
    template = (kube.get(WEB) or {})["spec"]["template"]
    assert SELFTEST_ANNOTATION not in (template.get("metadata") or {}).get("annotations", {})


def test_a_pinned_release_has_no_held_condition() -> None:
    kube = cluster(enrolled=False, targetVersion="v2", container="app")
    tester = selftest(kube)
    tester.run()
    reconciler = Reconciler(kube, held=tester)
    for hours in range(3):
        reconciler.reconcile(NS, "web", now=T0 + timedelta(hours=hours))
        roll_out(kube)
    assert status_of(kube).get("conditions") and held_condition(kube) is None
