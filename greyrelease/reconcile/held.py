"""The hold's self-test: would the API server hold a new pod template of an enrolled Deployment now?

Follow mode rests on the admission webhook (:mod:`greyrelease.admission.hold`): without it, a commit rolls
into the running pods unreleased, and nothing in a release's own passes would notice (a template that is
not held is, to them, a template already rolled). So the controller tries one: a server-side dry run
(``dryRun=All``) of a merge patch that changes the pod template of an enrolled Deployment
(:mod:`greyrelease.admission.probe`). The API server admits it as a real change, mutating webhooks
included, and answers with what it would have stored, storing nothing. Its result, one of:

- **held** (``True``): the answer is paused and ``greyrelease.io/held`` names the new template;
- **not held** (``False``): no MutatingWebhookConfiguration ``greyrelease-hold``, or one that did not hold
  the change (what differs from the controller's definition, when something does);
- **refused** (``False``): the API server refused the change because the webhook could not be called
  (``failurePolicy: Fail``; no replica answering); its message, which names the webhook;
- **not tested** (``Unknown``): no enrolled Deployment to try it on, or the dry run could not be sent
  (RBAC, the API server away).

**One test for the process, not one per release.** A :class:`HeldSelfTest` serves every release the
process drives (every shard's): the runtime tests at start, then every ``--held-selftest-seconds`` (300 s
by default), and a pass about to start the release of a held template tests first when the last result
is older than that (on its own thread: one request). Each follow-mode release shows the last result as
its ``Held`` condition (:func:`greyrelease.planner.passes._conditions`), and a release's pass writes it
only when it changed: a cluster of thousands of releases at rest costs one dry run every five minutes and
no write. When the result changes, the runtime wakes every follow-mode release so that their status says
so (:meth:`attach`'s listener).

A dry run stores nothing, but it is a request to the API server and to the webhook: each is counted
(``greyrelease_held_selftests_total{result}``), and the webhook logs it as a dry run. A result ``False``
right after one that was not is tried again :data:`CONFIRM_SECONDS` later (or the interval, when
shorter), up to :data:`CONFIRMATIONS` times, before it is shown: a replica of a one-replica install is not
an endpoint of its own Service until it is ready, and one webhook call lost in a rolling update says
nothing of the hold.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Literal

from prometheus_client import Counter

from greyrelease.admission import probe
from greyrelease.admission.configuration import CONFIGURATION_NAME, WEBHOOK_NAME
from greyrelease.api.release import RELEASE_LABEL, Obj
from greyrelease.kube.protocol import ApiError, Kube, path
from greyrelease.planner.observed import UNTESTED, HeldCheck

log = logging.getLogger("greyrelease.held")

SELFTESTS = Counter(
    "greyrelease_held_selftests_total",
    "Dry-run template changes sent by the hold's self-test, by result (True: held, False, Unknown: not tested).",
    ["result"],
)

#: The default interval between two tests (``greyrelease run --held-selftest-seconds``).
EVERY_SECONDS = 300.0
#: A result False after one that was not is tested again this much later before it is shown, ...
CONFIRM_SECONDS = 15.0
#: ... this many times.
CONFIRMATIONS = 4
#: A pass asks for a test at most this often, whatever it asks for.
MIN_SECONDS = 10.0

# The reasons of the Held condition.
HELD_BY_WEBHOOK = "DryRunHeld"  # True: a dry-run template change came back held
NO_WEBHOOK_CONFIGURATION = "NoWebhookConfiguration"  # False: the API server has no greyrelease-hold
WEBHOOK_NOT_MATCHED = "WebhookNotMatched"  # False: it has one, and the change came back not held
WEBHOOK_REFUSED = "WebhookRefused"  # False: the API server refused the change (no webhook replica answered)
NO_ENROLLED_DEPLOYMENT = "NoEnrolledDeployment"  # Unknown: nothing to try a change on
NOT_TESTED = "NotTested"  # Unknown: the dry run was not answered as a test (RBAC, the API server away)

CONFIGURATION = path("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", None, CONFIGURATION_NAME)

#: Where an enrolled Deployment to test with comes from (a runtime's store); None when it has none.
Finder = Callable[[], Obj | None]
#: Told (on the testing thread) when the result shown changes.
Listener = Callable[[], None]


def _check(status: Literal["True", "False", "Unknown"], reason: str, message: str) -> HeldCheck:
    return HeldCheck(status, reason, message)


class HeldSelfTest:
    """The self-test of one controller process, shared by its runtimes; thread-safe. ``kube`` sends the dry
    run and reads the configuration (the controller gives it a client that tries each call once: the next
    test is the retry)."""

    def __init__(
        self,
        kube: Kube,
        *,
        every: float = EVERY_SECONDS,
        confirm_seconds: float = CONFIRM_SECONDS,
        confirmations: int = CONFIRMATIONS,
        clock: Callable[[], float] = time.monotonic,
        nonce: Callable[[], str] = lambda: uuid.uuid4().hex[:16],
    ) -> None:
        self.kube = kube
        self.every = every
        self.confirm_seconds = confirm_seconds
        self.confirmations = confirmations
        self.clock = clock
        self.nonce = nonce
        self._testing = threading.Lock()  # one test at a time
        self._guard = threading.Lock()  # the finders and listeners
        self._finders: list[Finder] = []
        self._listeners: list[Listener] = []
        self._shown: HeldCheck = UNTESTED
        self._tested_at: float | None = None
        self._tests = 0  # tests made so far
        self._doubts = 0  # results False in a row not shown yet

    # --- who uses it ----------------------------------------------------------------------------------

    def attach(self, finder: Finder, listener: Listener) -> None:
        """A runtime: where it finds an enrolled Deployment, and what wakes its follow-mode releases."""
        with self._guard:
            self._finders.append(finder)
            self._listeners.append(listener)

    def detach(self, finder: Finder, listener: Listener) -> None:
        with self._guard:
            if finder in self._finders:
                self._finders.remove(finder)
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def attached(self) -> bool:
        with self._guard:
            return bool(self._finders)

    # --- what passes read ------------------------------------------------------------------------------

    @property
    def result(self) -> HeldCheck:
        """The result shown (``UNTESTED`` until the first one)."""
        return self._shown

    def check(self, *, starting: bool = False, enrolled: bool = False) -> HeldCheck:
        """The result a follow-mode pass shows. Tested first, on the caller's thread, when the release is
        about to start the release of a held template (``starting``) and the last test is older than
        :attr:`every`, or when the last test found no enrolled Deployment and the caller's is
        (``enrolled``, just labelled); never more often than every :data:`MIN_SECONDS`."""
        shown = self._shown
        unfound = enrolled and shown.reason == NO_ENROLLED_DEPLOYMENT
        if not starting and not unfound:  # nearly every pass
            return shown
        age = self.age()
        if age is None or (age >= MIN_SECONDS and (unfound or age >= self.every)):
            return self.run()
        return shown

    def age(self) -> float | None:
        """Seconds since the last test; None before the first."""
        tested = self._tested_at
        return None if tested is None else self.clock() - tested

    def due_in(self) -> float:
        """Seconds until the next test is due: :attr:`every` after the last, or :attr:`confirm_seconds`
        while a result False waits to be confirmed; 0 when none was made."""
        age = self.age()
        if age is None:
            return 0.0
        return (self.confirm_seconds if self._doubts else self.every) - age

    # --- the test ----------------------------------------------------------------------------------------

    def run(self) -> HeldCheck:
        """Test now and show the result (see the module for when a result False waits); the result shown.
        A caller that arrives while another tests gets that test's result."""
        asked = self._tests
        with self._testing:
            if self._tests != asked:
                return self._shown  # tested meanwhile
            found = self._test()
            self._tests += 1
            self._tested_at = self.clock()
            if found is None:  # no runtime to test for
                return self._shown
            SELFTESTS.labels(found.status).inc()
            before = self._shown
            if found.status == "False" and before.status != "False" and self._doubts < self.confirmations:
                self._doubts += 1
                log.warning(
                    f"hold self-test: {found.message}; tested again in {self.confirm_seconds:g}s before it is shown"
                )
                return before
            self._doubts = 0
            self._shown = found
        if found != before:
            level = logging.INFO if found.status == "True" else logging.WARNING
            log.log(level, f"hold self-test: Held={found.status} ({found.reason}): {found.message}")
            with self._guard:
                listeners = list(self._listeners)
            for listener in listeners:
                listener()
        return found

    def _find(self) -> tuple[bool, Obj | None]:
        with self._guard:
            finders = list(self._finders)
        for finder in finders:
            found = finder()
            if found is not None:
                return True, found
        return bool(finders), None

    def _test(self) -> HeldCheck | None:
        attached, deployment = self._find()
        if deployment is None:
            if not attached:
                return None
            return _check(
                "Unknown",
                NO_ENROLLED_DEPLOYMENT,
                f"no Deployment to try a template change on: none is enrolled (label {RELEASE_LABEL}) with "
                "replicas above 0 and without greyrelease.io/bypass",
            )
        meta = deployment.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        where = f"Deployment {namespace}/{name}"
        nonce = self.nonce()
        try:
            answer = self.kube.patch(
                path("apps", "v1", "deployments", namespace, name), probe.patch(nonce), dry_run=True
            )
        except ApiError as err:
            return self._refused(where, err)
        except Exception as err:  # the API server unreachable
            return _check("Unknown", NOT_TESTED, f"a dry-run template change of {where} could not be sent: {err}")
        why = probe.held(answer, nonce)
        if not why:
            return _check("True", HELD_BY_WEBHOOK, f"a dry-run change of the pod template of {where} came back held")
        try:
            stored = self.kube.get(CONFIGURATION)
        except Exception as err:  # forbidden, or the API server away: what was seen is said
            return _check(
                "False",
                WEBHOOK_NOT_MATCHED,
                f"a dry-run change of the pod template of {where} was not held: {why} "
                f"(MutatingWebhookConfiguration {CONFIGURATION_NAME} could not be read: {err})",
            )
        lacks = probe.why_not_held(stored)
        if stored is None:
            return _check("False", NO_WEBHOOK_CONFIGURATION, f"new templates are not held: {lacks}")
        return _check(
            "False",
            WEBHOOK_NOT_MATCHED,
            f"a dry-run change of the pod template of {where} was not held: {why}; "
            + (
                lacks
                or f"the webhook {WEBHOOK_NAME} is as this controller defines it: another mutating webhook may "
                "undo the hold"
            ),
        )

    @staticmethod
    def _refused(where: str, err: ApiError) -> HeldCheck:
        """A dry run the API server answered with an error: the webhook not called (``False``), or the test
        not made (``Unknown``: not allowed, the Deployment gone, another admission check's refusal)."""
        if err.status >= 500 and "webhook" in err.message.lower():
            return _check(
                "False",
                WEBHOOK_REFUSED,
                f"the API server refuses a template change of {where}: {err.message}",
            )
        return _check(
            "Unknown", NOT_TESTED, f"a dry-run template change of {where} was answered {err.status}: {err.message}"
        )
