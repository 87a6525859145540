"""The controller's state while it runs, in one object: the API client with its read cache, the stores
the watches feed (kopf's for GreyReleases, reflectors for Deployments and Services), the wake-up wiring
between watch events and the releases' passes, the one queue of those passes
(:class:`~greyrelease.runtime.scheduler.Scheduler`), the reconciler and the pass threads. One :class:`Runtime`
is made at startup and handed to every kopf handler in ``memo`` (kopf gives each object a shallow copy
of the operator's memo, so they all share it); a test makes its own, on an in-memory
:class:`~greyrelease.kube.protocol.Kube`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from greyrelease.admission.probe import would_hold
from greyrelease.api.release import (
    ANNOTATION_PREFIX,
    GROUP,
    PLURAL,
    POLICY_PLURAL,
    RELEASE_LABEL,
    TERMINAL_PHASES,
    TRACK_LABEL,
    VERSION,
    BatchState,
    Obj,
    Phase,
)
from greyrelease.kube.cache import CachedKube, Reflector, Store, Watchable, wait_synced
from greyrelease.kube.protocol import Conflict, Kube, path
from greyrelease.planner.machine import aborting
from greyrelease.planner.observed import HeldCheck
from greyrelease.reconcile import metrics
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.policies import POLICIES_PATH, Governing, governed_by
from greyrelease.reconcile.reconciler import Inputs, Outcome, Reconciler
from greyrelease.reconcile.release_metrics import ReleaseSeries
from greyrelease.runtime import collector
from greyrelease.runtime.notifier import Notifier
from greyrelease.runtime.pool import PassPool
from greyrelease.runtime.scheduler import Scheduler

log = logging.getLogger("greyrelease")

Key = tuple[str, str]

#: The backoff of a failed pass: 1, 2, 4, 8, then every 10 s.
BACKOFF_FIRST, BACKOFF_CAP = 1.0, 10.0


def backoff(failures: int, *, conflict: bool = False) -> float:
    """The wait before a release whose last ``failures`` passes in a row failed is passed again: after 1, 2,
    4, 8, then every 10 s, for as long as its passes fail. Capped at 10 s: after an API server outage a
    release resumes within 10 s of the API server being back (a refused connection costs nothing to retry).

    A pass that failed on a 409 (someone wrote an object between the pass's read and its write, which the
    write's resourceVersion caught) is planned again at once the first time, and then on the backoff as if
    that conflict had not been: reading again is what cures a conflict, and the one-second wait only
    delayed the write. It did: an abort whose route write met a GitOps sync's apply of the same HTTPRoute
    cut the canary 1.04 s late in e2e/test_follow.py, against 0.04-0.5 s for the other nine. Only once at
    once: a conflict on the status write can come from a store a watch event behind, which the next
    immediate pass would read again.

    Not the retry of an API call, which is :data:`greyrelease.kube.retry.API` (a call that failed for a
    transient reason sent again within seconds, then its error raised): a pass fails when a call still
    fails after that, or for a reason no call retry could cure (a 409 on its status write, a Conflict from
    a slot, a bug), and it is then planned again from fresh reads rather than resumed: the release's key
    goes back in the queue, due after this wait (a count per release, as controller-runtime's rate limiter
    keeps one per item; tenacity's loop would hold a task per failing release). (Prometheus queries retry
    briefly on their own, see :mod:`greyrelease.reconcile.prometheus`; kopf retries the deletion handler.)"""
    if conflict:
        if failures <= 1:
            return 0.0
        failures -= 1
    return min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** (max(1, failures) - 1))


def spread(key: Key, seconds: float, share: float = 0.1) -> float:
    """``seconds``, moved by up to ``share`` of it, the same way each time for a key: releases started
    together (a controller's start, a burst) are not all looked at again in the same second."""
    offset = zlib.crc32(f"{key[0]}/{key[1]}".encode()) / 0xFFFFFFFF * 2 - 1  # in [-1, 1]
    return seconds * (1 + share * offset)


@dataclass(frozen=True)
class Tuning:
    #: A release with nothing scheduled still looks again this often, give or take 10 %: a net under lost
    #: wake-ups, not how anything is noticed. 15 minutes, as Argo Rollouts resyncs: at 10,000 standing
    #: releases, 11 a second. A release at rest (or polling its Deployments) is passed again only when
    #: something its last pass read has changed in memory since (:meth:`Runtime.unchanged`), and in any
    #: case every ``full_resync``.
    idle_resync: float = 900.0
    #: A release at rest is passed in full at least this often, give or take 10 %, whatever its reads say.
    full_resync: float = 3600.0
    #: Changes of a Deployment a release waits on are gathered this long before its pass: a rollout
    #: changes a Deployment's status several times in a row, and one pass sees them all. A deletion
    #: wakes it at once.
    deployment_settle: float = 0.1
    #: A pass mostly waits on the API server: passes run on many threads of their own (asyncio's default
    #: pool, CPU count + 4 threads, would queue hundreds of releases behind a handful of requests).
    threads: int = 128
    #: Passes handed to those threads at once (the rest wait in the scheduler as keys): twice the threads,
    #: so that a thread freed finds the next pass queued, urgent ones first.
    in_flight: int = 256
    #: While aborts come in, routine passes (capacity being restored, timers, Deployment changes) wait
    #: until the last abort pass ended this long ago, and never longer than abort_hold_max: on a busy API
    #: server, a burst of aborts gets the releases' traffic cut before the rest of the work shares it.
    abort_quiet: float = 0.2
    abort_hold_max: float = 3.0
    #: How long the controller waits at startup for its first list of Deployments before it goes on
    #: (reads of Deployments go to the API server until that list is in).
    sync_timeout: float = 60.0


@dataclass(frozen=True, slots=True)  # one per release at rest or waiting on its Deployments
class Resting:
    """A release's last pass found nothing to do: what it read (the versions of the release, its Deployments
    and the policies governing it, the self-test result shown) and the count of the policies' changes then;
    when a pass is due whatever they say (its plan's timer, ``due_by``, and the full resync, ``full_by``;
    time.monotonic); and its poll (None: at rest, looked at again at the resync)."""

    inputs: Inputs
    held: HeldCheck | None
    policies: int
    full_by: float
    due_by: float
    poll: float | None


class Registry:
    """In-memory wiring between watch events and the releases they should wake (the waking itself is the
    scheduler's: :attr:`Runtime.scheduler`)."""

    def __init__(self) -> None:
        self.by_deployment: dict[Key, set[Key]] = defaultdict(set)
        self.watching: dict[Key, tuple[str, ...]] = {}
        self.waiting: dict[Key, bool] = {}
        self.last_seen: dict[Key, Any] = {}
        #: Releases whose last pass left them Waiting or Queued: a release that ends (a slot frees, a
        #: predecessor is done) or a policy change wakes them. Small: only releases held back are here.
        self.held_back: dict[Key, Phase] = {}
        #: The phase each release was last seen in (from watch events), to tell when it changed.
        self.phase_seen: dict[Key, Any] = {}
        #: Of those, the releases whose next pass cuts traffic for an abort: routine passes wait for it.
        #: Marked from the watch event that brought the annotation, not derived from the stored release
        #: before each pass: that copy can still show the phase from before the abort's own status write,
        #: which would make the pass after it (restoring capacity) hold routine passes back too.
        self.aborting: set[Key] = set()
        #: The releases in follow mode (as their last pass found them): a change of the hold's self-test
        #: wakes them, so that their Held condition says it.
        self.following: set[Key] = set()
        #: Passes failed in a row, per release failing now (see :func:`backoff`).
        self.failures: dict[Key, int] = {}
        #: The releases whose last pass found nothing to do: what it read (see :meth:`Runtime.unchanged`).
        self.resting: dict[Key, Resting] = {}

    def watch(self, key: Key, deployments: tuple[str, ...], *, waiting: bool) -> None:
        self.waiting[key] = waiting
        if self.watching.get(key) == deployments:
            return
        self.unwatch(key)
        self.watching[key] = deployments
        for name in deployments:
            self.by_deployment[(key[0], name)].add(key)

    def unwatch(self, key: Key) -> None:
        for name in self.watching.pop(key, ()):
            releases = self.by_deployment.get((key[0], name))
            if releases is not None:
                releases.discard(key)
                if not releases:
                    del self.by_deployment[(key[0], name)]

    def forget(self, key: Key) -> None:
        self.unwatch(key)
        self.waiting.pop(key, None)
        self.last_seen.pop(key, None)
        self.held_back.pop(key, None)
        self.phase_seen.pop(key, None)
        self.following.discard(key)
        self.aborting.discard(key)
        self.failures.pop(key, None)
        self.resting.pop(key, None)

    def deleting(self, key: Key) -> bool:
        """Whether the release was last seen marked for deletion (its deletion handler drives it then)."""
        seen = self.last_seen.get(key)
        return seen is not None and seen[2] is not None


def waiting(outcome: Outcome) -> bool:
    """Whether the release waits for its Deployments to converge. Only then does every change of theirs
    wake it: a batch on hold waits for a timer or an annotation, and a finished release for a new spec;
    waking those on every pod becoming ready would cost a pass each for nothing. (A Deployment deleted
    wakes the release in any case.) A release in follow mode waits on its Deployment in every phase: a
    new template held, a revert, an HPA's resize are all changes of it."""
    plan, st = outcome.plan, outcome.plan.status
    return (
        plan.done
        or outcome.follows
        or st.phase in (Phase.INITIALIZING, Phase.PROMOTING, Phase.ROLLING_BACK)
        or (st.phase == Phase.PROGRESSING and st.batch_state == BatchState.UPSCALING)
    )


def fingerprint(body: Obj) -> Any:
    """What a person changes on a release (its generation, our annotations, the deletion mark); our own
    status writes leave it as it was."""
    meta = body.get("metadata", {})
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    # (kopf's diff base, which earlier versions kept on the object and which may still be there.)
    ours = {k: v for k, v in ours.items() if k not in ("greyrelease.io/last-handled-configuration",)}
    return (meta.get("generation"), tuple(sorted(ours.items())), meta.get("deletionTimestamp"))


@dataclass(frozen=True)
class Shard:
    """The slice of the releases one runtime drives (see :mod:`greyrelease.runtime.shards`): the ``shardSelector``
    of its watches, and whether its writes are still safe (the shard's Lease is fresh)."""

    selector: str
    writable: Callable[[], bool]


class Runtime:
    """What the controller keeps in memory while it runs. ``kube`` is the API client; every read of a
    GreyRelease (and, once :meth:`watch` has started, of a Deployment or Service) is served from the
    stores when they hold the object."""

    def __init__(
        self,
        kube: Kube,
        *,
        tuning: Tuning | None = None,
        governing: Governing | None = None,
        phases: metrics.Phases | None = None,
        shard: Shard | None = None,
        notifications: bool = False,
        held: HeldSelfTest | None = None,
    ) -> None:
        self.tuning = tuning or Tuning()
        self.shard = shard
        self.releases = Store()
        self.deployments = Store(packed=True)
        self.services = Store(packed=True)
        self.policies = Store()
        self.kube = CachedKube(kube, writable=shard.writable if shard is not None else None)
        # (Lists of releases are read only by releases waiting to start under a limit or after another.)
        self.kube.cache(path(GROUP, VERSION, PLURAL), self.releases, lists=True)
        self.registry = Registry()
        #: The one queue of the releases' passes: each release's next pass, when it is due.
        self.scheduler: Scheduler[Key] = Scheduler(
            self.run_pass, in_flight=self.tuning.in_flight, promote=self.promote_pass
        )
        #: Each release's pass handed to the threads and not ended (to move it ahead: :meth:`promote_pass`).
        self._submitted: dict[Key, Future[Outcome | None]] = {}
        #: The notification sender (started by :meth:`start_notifier`): the passes queue the notifications
        #: of the Events they create, and it sends them on a thread of its own.
        self.notifier = Notifier(self.kube) if notifications else None
        notify = self.notifier.submit if self.notifier is not None else None
        #: The per-release series of the releases this runtime drives (dropped by :meth:`stop`).
        self.series = ReleaseSeries()
        #: The process's self-test of the hold (shared with its other runtimes), when it runs one.
        self.held = held
        self.reconciler = Reconciler(self.kube, governing=governing, notify=notify, series=self.series, held=held)
        self._held_listener: Callable[[], None] | None = None
        self.phases = phases or metrics.Phases()
        self._pool: PassPool | None = None
        self._reflectors: list[Reflector] = []
        #: Whether the Deployments and the policies are served from memory (listed, and watched since).
        self._synced: Callable[[], bool] = lambda: False
        #: glibc's free memory handed back after a burst of passes (greyrelease.runtime.collector).
        self.trimmer = collector.Trimmer()

    @property
    def pool(self) -> PassPool:
        """The reconcile threads, started on first use; passes people ask for go ahead of the queue."""
        if self._pool is None:
            self._pool = PassPool(
                self.tuning.threads,
                hold=self.tuning.abort_quiet,
                hold_max=self.tuning.abort_hold_max,
                waited=lambda urgent, s: metrics.PASS_WAIT.labels("urgent" if urgent else "routine").observe(s),
            )
        return self._pool

    def start_notifier(self) -> None:
        if self.notifier is not None:
            self.notifier.start()

    async def start_held_selftest(self) -> None:
        """Take part in the process's self-test of the hold, once the Deployments are listed: it looks for
        an enrolled Deployment in this runtime's, and a change of its result wakes this runtime's
        follow-mode releases. Tests once first when the process has not yet: before the releases' first
        passes, which then show the result rather than be woken for it."""
        if self.held is None or self._held_listener is not None:
            return
        loop = asyncio.get_running_loop()

        def changed() -> None:  # on the testing thread
            loop.call_soon_threadsafe(self.wake_following)

        self._held_listener = changed
        self.held.attach(self.enrolled_deployment, changed)
        if self.held.age() is None:
            await asyncio.to_thread(self.held.run)

    def enrolled_deployment(self) -> Obj | None:
        """The first Deployment a new template of which the webhook would hold (the self-test's), from
        memory once the Deployments are watched, else listed."""
        if self._reflectors:
            return self.deployments.first(would_hold, containing=RELEASE_LABEL.encode())
        listed = self.kube.list(path("apps", "v1", "deployments"), label_selector=f"{RELEASE_LABEL},!{TRACK_LABEL}")
        return next((d for d in listed if would_hold(d)), None)

    def wake_following(self) -> None:
        """Wake every follow-mode release (the hold's self-test changed its result), and every release whose
        pass runs: a release is known to follow only once its first pass ended, and a first pass that read
        the old result would otherwise show it until the release's resync (seen at 10,000 releases: 109
        status writes at rest, 4 minutes later, with ``--resync-seconds 240``). On the event loop."""
        for key in {*self.registry.following, *self.scheduler.running_keys()}:
            self.scheduler.add(key)

    async def drain(self, timeout: float = 10.0) -> None:
        """Start no more passes, and let those running end (at most ``timeout``): before :meth:`stop`, when
        the releases are handed over (a shard given up is stopped, its passes finished, before its Lease
        is released)."""
        await self.scheduler.stop(timeout)

    def stop(self) -> None:
        # The releases are no longer this runtime's (a shard handed over or lost, the lease lost, the end):
        # another replica exports them now.
        self.scheduler.halt()
        self.series.close()
        if self.held is not None and self._held_listener is not None:
            self.held.detach(self.enrolled_deployment, self._held_listener)
            self._held_listener = None
        if self.notifier is not None:
            self.notifier.stop()
        for reflector in self._reflectors:
            reflector.stop()
        self._reflectors = []
        if self._pool is not None:
            self._pool.stop(wait=False)
            self._pool = None

    # --- passes --------------------------------------------------------------------------------------

    async def reconcile(
        self, namespace: str, name: str, *, urgent: bool = False, abort: bool = False
    ) -> Outcome | None:
        """One pass on a pool thread. The plan's Events were posted by the reconciler, before its status
        write (exactly once)."""
        key = (namespace, name)
        with metrics.RECONCILE.time():
            future = self.pool.submit(self.reconciler.reconcile, namespace, name, urgent=urgent, holds_routine=abort)
            self._submitted[key] = future
            try:
                outcome = await asyncio.wrap_future(future)
            finally:
                if self._submitted.get(key) is future:
                    del self._submitted[key]
        self.phases.record(key, outcome.plan if outcome else None)
        return outcome

    def promote_pass(self, key: Key) -> None:
        """Someone asked for ``key`` while its routine pass waits for a thread: that pass goes ahead (it reads
        the release when it starts, so it does what was asked; an abort's holds routine passes back)."""
        future = self._submitted.get(key)
        if future is not None and self._pool is not None:
            self._pool.promote(future, holds_routine=key in self.registry.aborting)

    async def run_pass(self, key: Key, urgent: bool) -> float | None:
        """One pass of a release, for the scheduler: the seconds until its next one (the plan's
        ``requeue_after``, counted from when the plan was made; the backoff after a failure), or None when
        it is not due again until woken (the release is gone, or its deletion handler drives it)."""
        registry = self.registry
        if registry.deleting(key):
            return None  # kopf's deletion handler passes it from now on (release_deleted)
        abort = key in registry.aborting
        registry.aborting.discard(key)
        if not (urgent or abort) and (rest := self.unchanged(key)) is not None:
            metrics.PASSES_SKIPPED.inc()
            if rest.poll is None:
                return spread(key, self.tuning.idle_resync)
            return max(0.0, min(rest.poll, rest.due_by - time.monotonic()))
        # What the pass reads besides its objects, taken before it reads: a change while it runs wakes it
        # again, and that pass must not find these equal.
        held, policies = self.held.result if self.held is not None else None, self.policies.changes
        registry.resting.pop(key, None)
        try:
            outcome = await self.reconcile(*key, urgent=urgent, abort=abort)
        except Exception as err:
            self._passed()
            failures = registry.failures[key] = registry.failures.get(key, 0) + 1
            wait = backoff(failures, conflict=isinstance(err, Conflict))
            log.warning(f"[{key[0]}/{key[1]}] reconcile failed ({err}); retrying in {wait:g}s")
            return wait
        registry.failures.pop(key, None)
        self._passed()
        if outcome is None:  # the release is gone
            registry.unwatch(key)
            registry.following.discard(key)
            return None
        registry.watch(key, outcome.watched, waiting=waiting(outcome))
        if outcome.follows:
            registry.following.add(key)
        else:
            registry.following.discard(key)
        phase = outcome.plan.status.phase
        if phase in (Phase.WAITING, Phase.QUEUED):
            registry.held_back[key] = phase
        else:
            registry.held_back.pop(key, None)
        plan = outcome.plan
        timeout = plan.requeue_after
        if outcome.resting is not None:
            full_by = time.monotonic() + spread(key, self.tuning.full_resync)
            due_by = outcome.decided_at + plan.timer_after if plan.timer_after is not None else float("inf")
            poll = timeout if plan.polled else None
            registry.resting[key] = Resting(outcome.resting, held, policies, full_by, due_by, poll)
        if timeout is None:
            return spread(key, self.tuning.idle_resync)
        # Counted from when the plan was made: a pause of 2 s ends 2 s after the batch was recorded ready,
        # however long the pass's own writes took.
        return max(0.0, outcome.decided_at + timeout - time.monotonic())

    def unchanged(self, key: Key) -> Resting | None:
        """What the release's last pass found, when it found nothing to do, nothing it read has changed
        since, and neither its plan's timer nor its full resync is due: another pass would read the same
        objects at the same versions, the same self-test result and the same policies, before any time its
        plan depends on, and plan the same nothing. A resync of a release at rest, or the poll of one
        waiting on its Deployments, then only looks at these, from memory, on the event loop: at 10,000
        releases a resync pass cost 1.9-2.1 ms of the process's CPU on the local cluster, and at N = 3,000
        in ``make compare`` the polls of releases waiting on their pods were most of 82 passes a release
        (bench/README.md, "Looks without a pass"). A change that woke the release (an event of its own, a Deployment's)
        shows here as a new version, so the net under lost wake-ups holds; what no store keeps is looked at
        by the full pass. When the policies changed but not those governing this release, the count of
        their changes it holds is brought up to date, so that the next look compares a number again."""
        rest = self.registry.resting.get(key)
        now = time.monotonic()
        if rest is None or now >= rest.full_by or now >= rest.due_by or not self._synced():
            return None
        if self.releases.version(*key) != rest.inputs.release:
            return None
        if self.policies.changes != rest.policies:
            # A policy changed somewhere (or came, or went): those that govern this release, as they are now.
            changes, release = self.policies.changes, self.releases.get(*key)
            if release is None or governed_by(self.kube.list(POLICIES_PATH), release) != rest.inputs.policies:
                return None
            rest = self.registry.resting[key] = replace(rest, policies=changes)
        if (self.held.result if self.held is not None else None) != rest.held:
            return None
        deployments = rest.inputs.deployments
        return rest if all(self.deployments.version(key[0], n) == v for n, v in deployments) else None

    def _passed(self) -> None:
        """A pass ended: once a burst is over, glibc's free memory is handed back, on a thread of the loop's."""
        if self.trimmer.passed(alone=self.scheduler.running <= 1):
            asyncio.get_running_loop().run_in_executor(None, self.trimmer.trim)

    # --- watch events --------------------------------------------------------------------------------

    def release_changed(self, obj: Obj, type: str | None) -> None:
        """Keep the release's latest body for its passes, and queue its pass when it is new or its spec,
        annotations or deletion mark changed (not on our own status writes), urgently unless it is only
        listed at startup (``type`` None). The body is in the store before the pass is queued."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if type == "DELETED":
            self.releases.delete(obj)
            self.registry.forget(key)
            self.scheduler.forget(key)
            self.reconciler.forget(*key)
            self.wake_held_back(ended=True)
            return
        self.releases.fold(obj)
        phase = (obj.get("status") or {}).get("phase")
        before = self.registry.phase_seen.get(key, phase)
        if before != phase and self.registry.held_back:
            # A release that ends frees its slot, one that succeeds (or fails) is what another waits for, and
            # one that leaves the queue moves those behind it up.
            queue = (None, "", Phase.QUEUED)
            self.wake_held_back(ended=phase in TERMINAL_PHASES or (before in queue and phase not in queue))
        self.registry.phase_seen[key] = phase
        seen = fingerprint(obj)
        before_seen = self.registry.last_seen.get(key)
        if before_seen != seen:
            self.registry.last_seen[key] = seen
            status = obj.get("status") or {}
            if aborting(meta.get("annotations") or {}, status.get("phase"), _requests_seen(status)):
                self.registry.aborting.add(key)
            self.scheduler.add(key, urgent=before_seen is not None or type is not None)

    def wake_held_back(self, *, ended: bool = True) -> None:
        """Wake the releases waiting to start: all of them when a release ended or left the queue, or a
        policy changed (a slot may be free, a place in the queue changed, a window may have moved), else
        those waiting for a predecessor or a window. And the releases not yet started whose pass runs now:
        one is known to wait only once its pass ended, and a pass that read the queue before this change
        would show the old place until something else woke it (seen in e2e/test_governance.py: a release
        queued behind three showed place 4, then 2, never 3, its first pass having run while the second
        release took its slot)."""
        for key, phase in list(self.registry.held_back.items()):
            if ended or phase == Phase.WAITING:
                self.scheduler.add(key)
        for key in self.scheduler.running_keys():
            if self.registry.phase_seen.get(key) in (None, "", Phase.QUEUED, Phase.WAITING):
                self.scheduler.add(key)

    def policy_changed(self, kind: str, obj: Obj) -> None:
        """A policy changed: the releases held back look again (on the event loop)."""
        self.wake_held_back(ended=True)

    def deployment_changed(self, namespace: str, name: str, type: str) -> None:
        """Wake the releases waiting on this Deployment (its readiness may have changed), and every release
        about it when it is deleted. On the event loop (the Deployment reflectors hand events over)."""
        for key in list(self.registry.by_deployment.get((namespace, name), ())):
            if type == "DELETED":
                self.scheduler.add(key)
            elif self.registry.waiting.get(key):
                self.scheduler.add(key, self.tuning.deployment_settle)

    def deployments_relisted(self, namespace: str | None) -> None:
        """The Deployments of ``namespace`` (None: of the cluster) were listed again (their watch too old to
        resume, after an outage): what changed meanwhile, a canary become ready, a Deployment deleted, came
        with no event, so every release there about a Deployment looks again. On the event loop."""
        for key in list(self.registry.watching):
            if namespace is None or key[0] == namespace:
                self.scheduler.add(key, self.tuning.deployment_settle)

    async def watch(self, api: Watchable, namespaces: list[str]) -> None:
        """Deployments and Services in memory: one reflector of each per watched namespace (one for the
        cluster when none is named), until :meth:`stop`. A changed Deployment wakes the releases about it.
        The routers read a Service before each write (Service mode: the user's, to narrow or restore it;
        the other modes: the canary Service); without the right to list Services, those reads go to the
        API server. Waits (at most ``sync_timeout``) for the first lists: until then, reads of Deployments
        go to the API server."""
        loop = asyncio.get_running_loop()

        def changed(kind: str, obj: Obj) -> None:
            meta = obj.get("metadata") or {}
            loop.call_soon_threadsafe(self.deployment_changed, meta.get("namespace", ""), meta.get("name", ""), kind)

        query = {"shardSelector": self.shard.selector} if self.shard is not None else None

        def relisted(namespace: str | None) -> Callable[[], None]:
            def wake() -> None:
                loop.call_soon_threadsafe(self.deployments_relisted, namespace)

            return wake

        def reflect(
            group: str, version: str, plural: str, store: Store, on_change: Any = None, relists: bool = False
        ) -> list[Reflector]:
            found = [
                Reflector(
                    api,
                    path(group, version, plural, ns),
                    store,
                    on_change=on_change,
                    query=query,
                    on_relist=relisted(ns) if relists else None,
                ).start()
                for ns in ([*namespaces] if namespaces else [None])
            ]
            self.kube.cache(path(group, version, plural), store, ready=lambda: all(r.synced.is_set() for r in found))
            return found

        def policy(kind: str, obj: Obj) -> None:
            loop.call_soon_threadsafe(self.policy_changed, kind, obj)

        deployments = reflect("apps", "v1", "deployments", self.deployments, changed, relists=True)
        # The policies are cluster-scoped: one reflector whatever the namespaces watched. Lists of them are
        # served from memory once the first list is in; until then they go to the API server, so a release
        # never starts a batch without the freezes and limits that apply to it.
        policies = [Reflector(api, path(GROUP, VERSION, POLICY_PLURAL), self.policies, on_change=policy).start()]
        self.kube.cache(
            path(GROUP, VERSION, POLICY_PLURAL), self.policies, ready=lambda: policies[0].synced.is_set(), lists=True
        )
        self._reflectors = deployments + policies + reflect("", "v1", "services", self.services)
        self._synced = lambda: policies[0].synced.is_set() and all(r.synced.is_set() for r in deployments)
        timeout = self.tuning.sync_timeout
        if not await asyncio.to_thread(wait_synced, deployments + policies, timeout):
            log.warning(
                f"Deployments or GreyReleasePolicies not listed within {timeout:g}s; reading them from the API "
                "server meanwhile"
            )


def _requests_seen(status: Obj) -> dict[str, str]:
    """Follow mode: the value of each request annotation the status records as seen (``status.requests``);
    empty in pinned mode, which records none."""
    seen: dict[str, str] = {}
    for rec in status.get("requests") or []:
        if isinstance(rec, dict) and isinstance(rec.get("annotation"), str) and isinstance(rec.get("value"), str):
            seen[rec["annotation"]] = rec["value"]
    return seen
