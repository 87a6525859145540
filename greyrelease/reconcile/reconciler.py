"""One reconcile of one GreyRelease: observe, decide (pure), execute, post the Events, record the status.

The order is what makes a crash harmless: the actions of a plan are applied first, in order, then its
Events are posted (named after the transition's number, see :mod:`.record`), and the status is written
last. A controller killed in between plans again from the old status; every action is idempotent, so
re-applying it is a no-op, the Events get the same names whatever else the repeat reads and are not posted
twice, and the transition is recorded on the next pass. The status is written only when it differs, so an
idle release costs reads, never writes. Each step is a unit of its own: :mod:`.observe`,
:func:`~greyrelease.planner.machine.decide`, :mod:`.execute`, :mod:`.record`, with the metric queries and
the webhook calls in :mod:`.gates` and a refused spec in :mod:`.invalid`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pydantic import ValidationError

from greyrelease.analysis.webhooks import due as webhooks_due
from greyrelease.api.release import GreyReleaseSpec, GreyReleaseStatus, Obj
from greyrelease.kube.protocol import MERGE, Kube, PatchBody, Ref
from greyrelease.kube.workload import canary_name
from greyrelease.planner.actions import Event, Plan
from greyrelease.planner.invalid import invalid_spec
from greyrelease.planner.machine import decide
from greyrelease.reconcile.deployments import deployments_path
from greyrelease.reconcile.execute import execute
from greyrelease.reconcile.gates import Gates, due
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.notify import Delivery, deliveries
from greyrelease.reconcile.observe import Scene, observe
from greyrelease.reconcile.policies import POLICIES_PATH, Governing, governed_by
from greyrelease.reconcile.record import numbered, post_events, release_path, write_status
from greyrelease.reconcile.release_metrics import ReleaseSeries

__all__ = ["Inputs", "Outcome", "ReadLog", "Reconciler", "deployments_path", "inputs_of", "release_path"]

log = logging.getLogger("greyrelease")

#: Where the notifications of the Events a pass created go: the sender's queue (it must not block).
Notify = Callable[[list[Delivery]], None]


@dataclass(frozen=True, slots=True)  # one per release at rest
class Inputs:
    """What a pass that found nothing to do read, by resourceVersion: the release's, and each of its
    Deployments' by name (None: absent). Another pass from the same versions, with the same self-test
    result and policies, before any timer of its plan, plans the same: the runtime's resync or poll then
    leaves it out (see :meth:`~greyrelease.runtime.controller.Runtime.unchanged`)."""

    release: str
    deployments: tuple[tuple[str, str | None], ...]
    #: The policies that governed the release, by name and resourceVersion, as the pass listed them.
    policies: tuple[tuple[str, str], ...] = ()


class ReadLog:
    """The API a pass observes and acts through: what it reads (verb and path) is noted, to tell afterwards
    whether the pass read anything :class:`Inputs` do not name, and its writes are counted (dry runs too), to
    tell whether its actions changed anything: an action finds what it would write already there (a canary
    at its size while its pods start) and writes nothing."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.reads: list[tuple[str, Ref]] = []
        self.writes = 0
        #: The policies as the pass listed them (the last list of them).
        self.policies: list[Obj] = []

    def get(self, ref: Ref) -> Obj | None:
        self.reads.append(("GET", ref))
        return self.kube.get(ref)

    def list(self, ref: Ref, *, label_selector: str | None = None) -> list[Obj]:
        self.reads.append(("LIST", ref))
        found = self.kube.list(ref, label_selector=label_selector)
        if ref == POLICIES_PATH:
            self.policies = found
        return found

    def create(self, ref: Ref, body: Obj) -> Obj:
        self.writes += 1
        return self.kube.create(ref, body)

    def patch(
        self,
        ref: Ref,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        self.writes += 1
        return self.kube.patch(ref, body, patch_type=patch_type, field_manager=field_manager, dry_run=dry_run)

    def replace(self, ref: Ref, body: Obj) -> Obj:
        self.writes += 1
        return self.kube.replace(ref, body)

    def delete(self, ref: Ref, *, propagation: str = "Background") -> Obj | None:
        self.writes += 1
        return self.kube.delete(ref, propagation=propagation)


def inputs_of(
    release: Obj, scene: Scene, reads: list[tuple[str, Ref]], policies: list[Obj] | None = None
) -> Inputs | None:
    """The :class:`Inputs` of a pass that found nothing to do, when its ``reads`` (besides the release) were
    of its Deployment and canary by name and of the policies only. None when it read anything else (the
    releases a release waiting to start comes after or queues behind, a canary Service's endpoints, the
    objects a refused spec names), when the target was not read by name (found by its labels, a Deployment
    labelled since would not show in these versions) or is absent, or when a version is missing."""
    target, canary = scene.deployments.target, scene.deployments.canary
    if scene.spec.target_ref is None or target is None:
        return None
    name, namespace = target["metadata"]["name"], release["metadata"]["namespace"]
    named = {
        ("GET", deployments_path(namespace, name)),
        ("GET", deployments_path(namespace, canary_name(name))),
        ("LIST", POLICIES_PATH),
    }
    if any(read not in named for read in reads):
        return None
    release_version = (release.get("metadata") or {}).get("resourceVersion")
    target_version = target["metadata"].get("resourceVersion")
    canary_version = canary["metadata"].get("resourceVersion") if canary is not None else None
    if not release_version or not target_version or (canary is not None and not canary_version):
        return None
    deployments = ((name, str(target_version)), (canary_name(name), canary_version))
    return Inputs(str(release_version), deployments, governed_by(policies or [], release))


@dataclass
class Outcome:
    """What a reconcile did: the plan, the Deployments it is about (the target and its canary), and when
    (on the monotonic clock) the plan's ``now`` was taken: its ``requeue_after`` counts from there, not
    from the end of the pass."""

    plan: Plan
    watched: tuple[str, ...] = ()
    decided_at: float = field(default_factory=time.monotonic)
    #: Follow mode: every change of the target may be news (a template held, a revert, an HPA's resize).
    follows: bool = False
    #: The pass wrote nothing (its actions, if any, found what they would write already there) and had nothing
    #: to record, and waits for nothing but a change or its poll's time (``plan.polled``) or a timer
    #: (``plan.timer_after``): what it read.
    resting: Inputs | None = None


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        gates: Gates | None = None,
        governing: Governing | None = None,
        notify: Notify | None = None,
        series: ReleaseSeries | None = None,
        held: HeldSelfTest | None = None,
    ) -> None:
        self.kube = kube
        #: The process's self-test of the hold, shown by follow-mode releases as their Held condition.
        self.held = held
        self.gates = gates if gates is not None else Gates(kube)
        self.governing = governing or Governing()
        self.notify = notify
        #: The per-release series on /metrics, updated from the status each pass records (none: not exported).
        self.series = series
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        #: Per release, the resourceVersion of the object last found to hold, as stored, the status the
        #: model reads from it (see :meth:`_record`).
        self._read_back: dict[tuple[str, str], str] = {}

    def reconcile(self, namespace: str, name: str, *, now: datetime | None = None) -> Outcome | None:
        """Observe, decide, execute, post Events, record. None when the GreyRelease is gone."""
        with self._lock_for((namespace, name)):
            release = self.kube.get(release_path(namespace, name))
            if release is None:
                if self.series is not None:
                    self.series.forget((namespace, name))
                return None
            decided_at, now = time.monotonic(), now or datetime.now(UTC)
            status = GreyReleaseStatus.model_validate(release.get("status") or {})
            try:
                spec = GreyReleaseSpec.model_validate(release.get("spec") or {})
            except ValidationError as err:
                plan = numbered(invalid_spec(status, err, now), status)
                self._notify(release, post_events(self.kube, release, plan, now), plan, status, now)
                write_status(self.kube, release, plan.status)
                self._export(release, None, plan.status)
                return Outcome(plan, decided_at=decided_at)
            log = ReadLog(self.kube)
            scene = observe(log, release, spec, status, self.governing, self.held)
            asked = due(spec, status, now)
            if asked:
                scene.observed = replace(scene.observed, checks=self.gates.checks(release, spec, status))
            calls = webhooks_due(spec, status, now) if not scene.observed.deleting else ()
            if calls:
                answers = self.gates.answers(release, spec, status, calls, now)
                scene.observed = replace(scene.observed, answers=answers)
            plan = numbered(decide(spec, status, scene.observed, now), status)
            execute(log, plan.actions, scene)
            self._notify(release, post_events(self.kube, release, plan, now), plan, status, now)
            if not scene.observed.deleting:  # the deletion's passes end with the object; nothing to record
                self._record((namespace, name), release, status, plan.status)
                self._export(release, spec, plan.status, changed=plan.status is not status)
            names = {n for n in (scene.target_name, plan.status.target_name) if n}
            watched = tuple(sorted(names | {canary_name(n) for n in names}))
            resting = None
            # Actions that wrote nothing leave the release as it was (the canary already at its size while its
            # pods start): the next pass on the same inputs plans them again, and again writes nothing.
            quiet = not (log.writes or plan.events or asked or calls or scene.observed.deleting)
            if quiet and plan.status is status and (plan.requeue_after is None or plan.polled):
                resting = inputs_of(release, scene, log.reads, log.policies)
            return Outcome(plan, watched, decided_at, spec.follows, resting)

    def _notify(
        self, release: Obj, created: list[tuple[str, Event]], plan: Plan, read: GreyReleaseStatus, now: datetime
    ) -> None:
        """Hand the notifications of the Events this pass created to the sender (never those of Events an
        earlier pass created: see :func:`~greyrelease.reconcile.record.post_events`). The pass goes on
        whatever happens here: its Events are posted, and failing it now would post none again."""
        if self.notify is None or not created:
            return
        try:
            found = deliveries(self.kube, release, created, plan.status, read, now, self.governing.slots_namespace)
            if found:
                self.notify(found)
        except Exception as err:  # a notification is never worth a failed pass
            meta = release.get("metadata") or {}
            log.warning(f"[{meta.get('namespace')}/{meta.get('name')}] notifications not handed on: {err!r}")

    def _record(self, key: tuple[str, str], release: Obj, read: GreyReleaseStatus, status: GreyReleaseStatus) -> None:
        """Write ``status`` when the object does not hold it. A status the plan left as it was read (the
        same object) needs no comparison when the object is at the resourceVersion an earlier pass found
        to hold, as stored, the status read from it: the same version holds the same status, which reads
        back the same. An idle release's passes are such (bench/README.md, "What an idle pass repeats")."""
        version = (release.get("metadata") or {}).get("resourceVersion")
        if status is not read or version is None:
            write_status(self.kube, release, status)
        elif self._read_back.get(key) != version and not write_status(self.kube, release, status):
            self._read_back[key] = version

    def _export(
        self, release: Obj, spec: GreyReleaseSpec | None, status: GreyReleaseStatus, *, changed: bool = True
    ) -> None:
        """The release's series as ``status`` (now recorded) has them. Worked out again unless the plan left the
        status as read (``changed`` False) from a version already exported: two passes can read one version
        and plan different statuses (the first found nothing to do, the second was woken by a Deployment),
        and the version read says nothing of what the second wrote."""
        if self.series is not None:
            meta = release.get("metadata") or {}
            key = (meta.get("namespace", ""), meta.get("name", ""))
            self.series.record(key, None if changed else meta.get("resourceVersion"), spec, status)

    def _lock_for(self, key: tuple[str, str]) -> threading.Lock:
        """Passes over one release never overlap: a pass already running (say, one the queue started just
        before the deletion handler's) finishes before the next one starts."""
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        with self._locks_guard:
            self._locks.pop((namespace, name), None)
            self._read_back.pop((namespace, name), None)
        if self.series is not None:
            self.series.forget((namespace, name))
