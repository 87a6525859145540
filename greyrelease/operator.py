"""kopf wiring: when to reconcile which release. The decisions live in :mod:`greyrelease.planner`.

Continuation ("RequeueAfter"): every GreyRelease gets a per-object async daemon that reconciles, then
sleeps until the plan's ``requeue_after`` or until it is woken. It is woken by

- an event on the GreyRelease that changes its generation, annotations or deletion mark (so abort,
  pause and promote act within a second), and
- an event on a Deployment it watches (the target or its canary), so readiness is seen as it happens
  instead of by polling.

Why a daemon rather than ``TemporaryError(delay=...)`` handlers: a handler retried by kopf keeps its retry
state in annotations (a write per step) and cannot be cut short by an abort until its delay runs out; a
daemon sleeps in memory for free and wakes on an ``asyncio.Event`` at once. Nothing durable lives in the
daemon: every pass plans from the object's ``status`` as last seen, so a restarted controller resumes
where the last one stopped. Deletion is the exception: kopf stops the daemon when the object is marked
for deletion, and an ``on.delete`` handler (retried with ``TemporaryError``) puts the app back.

Reads come from memory (:mod:`greyrelease.cache`): the GreyReleases as kopf's watch delivers them, the
Deployments from reflectors of our own (which also do the waking above), each with the responses to our
own writes folded in.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import defaultdict
from typing import Any

import kopf

from . import metrics
from .api import ANNOTATION_PREFIX, GROUP, PLURAL, VERSION
from .cache import CachingClient, Reflector, Store, wait_synced
from .kubeclient import path
from .planner import aborting
from .pool import PassPool
from .reconciler import Outcome, Reconciler

log = logging.getLogger("greyrelease")

#: A release with nothing scheduled still looks again this often (reads only, no writes when idle).
IDLE_RESYNC = 300.0
#: Waits after a failed pass. Capped at 10 s: after an API server outage the release resumes within 10 s
#: of the API server being back (a refused connection costs nothing to retry).
ERROR_BACKOFF = (1.0, 2.0, 5.0, 10.0)
#: Changes of a Deployment a release waits on are gathered this long before its pass: a rollout changes
#: a Deployment's status several times in a row, and one pass sees them all. A deletion wakes it at once.
DEPLOYMENT_SETTLE = 0.1
RECONCILE_THREADS = 128
#: While aborts come in, routine passes (capacity being restored, timers, Deployment changes) wait until
#: the last abort pass ended this long ago, and never longer than ABORT_HOLD_MAX: on a busy API server, a
#: burst of aborts gets the releases' traffic cut before the rest of the work shares it again.
ABORT_QUIET = 0.2
ABORT_HOLD_MAX = 3.0

Key = tuple[str, str]


class Registry:
    """In-memory wiring between watch events and the daemons that should wake on them."""

    def __init__(self) -> None:
        self.wake: dict[Key, asyncio.Event] = {}
        self.by_deployment: dict[Key, set[Key]] = defaultdict(set)
        self.watching: dict[Key, tuple[str, ...]] = {}
        self.waiting: dict[Key, bool] = {}
        self.last_seen: dict[Key, Any] = {}
        self.pending: dict[Key, asyncio.TimerHandle] = {}
        #: Releases whose next pass was asked for by a person (spec, annotation, deletion): it goes first.
        self.urgent: set[Key] = set()
        #: Of those, the releases whose next pass cuts traffic for an abort: routine passes wait for it.
        #: Marked from the watch event that brought the annotation, not derived from the stored release
        #: before each pass: that copy can still show the phase from before the abort's own status write,
        #: which would make the pass after it (restoring capacity) hold routine passes back too.
        self.aborting: set[Key] = set()

    def event_for(self, key: Key) -> asyncio.Event:
        return self.wake.setdefault(key, asyncio.Event())

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
        self.wake.pop(key, None)
        self.last_seen.pop(key, None)
        self.urgent.discard(key)
        self.aborting.discard(key)
        handle = self.pending.pop(key, None)
        if handle is not None:
            handle.cancel()

    def poke(self, key: Key) -> None:
        event = self.wake.get(key)
        if event is not None:
            event.set()

    def poke_soon(self, key: Key, delay: float) -> None:
        """Poke after ``delay`` seconds; pokes asked for meanwhile are that same one. On the loop's thread."""
        if key not in self.pending:
            self.pending[key] = asyncio.get_running_loop().call_later(delay, self._poke_pending, key)

    def _poke_pending(self, key: Key) -> None:
        self.pending.pop(key, None)
        self.poke(key)


REGISTRY = Registry()
_state: dict[str, Any] = {}
#: The GreyReleases as last seen (kopf's watch events and our own writes); what each pass reads.
RELEASES = Store()
#: How long the controller waits at startup for its first list of Deployments before it goes on (reads
#: of Deployments go to the API server until that list is in).
SYNC_TIMEOUT = 60.0


def client() -> CachingClient:
    if "client" not in _state:
        # Connections kept for every pass thread, and for the Deployment and Service watches (two per
        # watched namespace) besides; only those opened cost anything.
        kube = CachingClient.from_environment(connections=RECONCILE_THREADS + 64)
        kube.cache(f"/apis/{GROUP}/{VERSION}", PLURAL, RELEASES)
        _state["client"] = kube
    return _state["client"]


def pool() -> PassPool:
    if "pool" not in _state:
        _state["pool"] = PassPool(
            RECONCILE_THREADS,
            hold=ABORT_QUIET,
            hold_max=ABORT_HOLD_MAX,
            waited=lambda urgent, seconds: metrics.PASS_WAIT.labels("urgent" if urgent else "routine").observe(seconds),
        )
    return _state["pool"]


def reconciler() -> Reconciler:
    if "reconciler" not in _state:
        _state["reconciler"] = Reconciler(client())
    return _state["reconciler"]


async def watch_objects(namespaces: list[str]) -> list[Reflector]:
    """Deployments and Services in memory: one reflector of each per watched namespace (one for the
    cluster when none is named). A changed Deployment wakes the releases about it. The routers read a
    Service before each write (Service mode: the user's, to narrow or restore it; the other modes: the
    canary Service); without the right to list Services, those reads go to the API server."""
    loop = asyncio.get_running_loop()
    kube = client()

    def changed(kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        loop.call_soon_threadsafe(deployment_changed, meta.get("namespace", ""), meta.get("name", ""), kind)

    def reflect(group: str, version: str, plural: str, on_change: Any = None) -> list[Reflector]:
        store = Store()
        found = [
            Reflector(kube, path(group, version, plural, ns), store, on_change=on_change).start()
            for ns in (namespaces or [None])
        ]
        api = f"/apis/{group}/{version}" if group else f"/api/{version}"
        kube.cache(api, plural, store, ready=lambda: all(r.synced.is_set() for r in found))
        return found

    deployments = reflect("apps", "v1", "deployments", changed)
    services = reflect("", "v1", "services")
    if not await asyncio.to_thread(wait_synced, deployments, SYNC_TIMEOUT):
        log.warning(f"Deployments not listed within {SYNC_TIMEOUT:g}s; reading them from the API server meanwhile")
    return deployments + services


class NoDiffBase(kopf.DiffBaseStorage):
    """Keeps no last-handled copy of the object. kopf would write one into an annotation on every change
    of the spec or the annotations (a write per change for nothing), and copy the whole object on every
    event to compare with it: the controller's only changing handler is the deletion one, and the daemon
    reads the object as it is, never a diff. Every object is "as handled": no create or update cause."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> Any:
        return {}

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        pass


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Our finalizer and kopf's bookkeeping live under our own prefix.
    settings.persistence.finalizer = "greyrelease.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="greyrelease.io")
    settings.persistence.diffbase_storage = NoDiffBase()
    # Events are posted deliberately, one per transition; kopf's own log lines are not copied into
    # them (only critical ones would be).
    settings.posting.level = logging.CRITICAL
    settings.posting.reporting_component = "greyrelease"
    settings.watching.server_timeout = 300
    # kopf waits this long for more events of an object before handling the last one (0.1 s by
    # default); every abort, pause and promote annotation waits it out.
    settings.batching.batch_window = 0.02
    settings.networking.request_timeout = 30
    # A pass mostly waits on the API server: passes run on many threads of their own (asyncio's default
    # pool, CPU count + 4 threads, would queue hundreds of releases behind a handful of requests), and
    # the passes people ask for (abort, pause, promote, deletion) go ahead of the queue.
    pool()
    reconciler()
    _state["reflectors"] = await watch_objects(list(memo.get("namespaces") or []))


@kopf.on.cleanup()
async def stop_watches(**_: Any) -> None:
    for reflector in _state.pop("reflectors", []):
        reflector.stop()
    if "pool" in _state:
        _state.pop("pool").stop(wait=False)


async def _reconcile_once(namespace: str, name: str, *, urgent: bool = False, abort: bool = False) -> Outcome | None:
    with metrics.RECONCILE.time():
        outcome = await asyncio.wrap_future(
            pool().submit(reconciler().reconcile, namespace, name, urgent=urgent, holds_routine=abort)
        )
    metrics.record((namespace, name), outcome.plan if outcome else None)
    # The plan's Events were posted by the reconciler, before its status write (exactly once).
    return outcome


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def release_daemon(
    name: str, namespace: str, body: kopf.Body, stopped: kopf.DaemonStopped, logger: logging.Logger, **_: Any
) -> None:
    key = (namespace, name)
    wake = REGISTRY.event_for(key)
    errors = 0
    try:
        while not stopped:
            wake.clear()
            urgent, abort = key in REGISTRY.urgent, key in REGISTRY.aborting
            REGISTRY.urgent.discard(key)
            REGISTRY.aborting.discard(key)
            timeout: float | None
            try:
                outcome = await _reconcile_once(namespace, name, urgent=urgent, abort=abort)
                errors = 0
                if outcome is None:
                    return
                REGISTRY.watch(key, outcome.watched, waiting=outcome.waiting)
                timeout = outcome.plan.requeue_after
                if timeout is not None:
                    # Counted from when the plan was made: a pause of 2 s ends 2 s after the batch was
                    # recorded ready, however long the pass's own writes took.
                    timeout = max(0.0, outcome.decided_at + timeout - time.monotonic())
            except Exception as err:  # noqa: BLE001 - a failed pass is retried; the error is logged
                timeout = ERROR_BACKOFF[min(errors, len(ERROR_BACKOFF) - 1)]
                errors += 1
                logger.warning(f"reconcile failed ({err}); retrying in {timeout:g}s")
            if timeout is None:
                timeout = IDLE_RESYNC
            if timeout > 0:
                await _sleep(wake, stopped, timeout)
    finally:
        REGISTRY.unwatch(key)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    """Until ``timeout`` passes, the release is woken, or the daemon is asked to stop."""
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def _fingerprint(body: kopf.Body) -> Any:
    meta = body.get("metadata", {})
    ours = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)}
    # (kopf's diff base, which earlier versions kept on the object and which may still be there.)
    ours = {k: v for k, v in ours.items() if k not in ("greyrelease.io/last-handled-configuration",)}
    return (meta.get("generation"), tuple(sorted(ours.items())), meta.get("deletionTimestamp"))


# The two event handlers below are coroutines on purpose: kopf runs plain functions in a thread pool, and
# an asyncio.Event set from another thread does not wake the loop that waits on it (the daemon would
# sleep on until something else woke its loop, e.g. its own timeout).


@kopf.on.event(GROUP, VERSION, PLURAL)
async def release_changed(
    body: kopf.Body, event: dict[str, Any], name: str, namespace: str, type: str, **_: Any
) -> None:
    """Keep the release's latest body for its passes, and wake its daemon when its spec or annotations
    change (not on our own status writes). The body is in the store before the daemon is woken."""
    key = (namespace, name)
    if type == "DELETED":
        RELEASES.delete(event["object"])
        REGISTRY.forget(key)
        reconciler().forget(namespace, name)
        return
    RELEASES.fold(event["object"])
    fingerprint = _fingerprint(body)
    if REGISTRY.last_seen.get(key) != fingerprint:
        REGISTRY.last_seen[key] = fingerprint
        REGISTRY.urgent.add(key)
        if aborting(body.get("metadata", {}).get("annotations") or {}, (body.get("status") or {}).get("phase")):
            REGISTRY.aborting.add(key)
        REGISTRY.poke(key)


def deployment_changed(namespace: str, name: str, type: str) -> None:
    """Wake the releases waiting on this Deployment (its readiness may have changed), and every release
    about it when it is deleted. Runs on the event loop (the Deployment reflectors hand events over)."""
    for key in list(REGISTRY.by_deployment.get((namespace, name), ())):
        if type == "DELETED":
            REGISTRY.poke(key)
        elif REGISTRY.waiting.get(key):
            REGISTRY.poke_soon(key, DEPLOYMENT_SETTLE)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=1)
async def release_deleted(name: str, namespace: str, body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    """Put the app back as it was before the release began, then let the object go."""
    # The pass must see the deletion mark even if kopf calls this before release_changed has kept it.
    RELEASES.fold(copy.deepcopy(dict(body)))
    try:
        outcome = await _reconcile_once(namespace, name, urgent=True)
    except Exception as err:  # noqa: BLE001 - a failed pass (e.g. a write conflict) is retried at once
        logger.warning(f"cleanup pass failed ({err}); retrying")
        raise kopf.TemporaryError(f"cleanup pass failed: {err}", delay=1) from err
    if outcome is not None and not outcome.plan.done:
        raise kopf.TemporaryError("restoring the stable Deployment and removing the canary", delay=1)
    REGISTRY.forget((namespace, name))
