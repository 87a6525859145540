"""kopf wiring: when to reconcile which release. The decisions live in :mod:`greyrelease.planner.machine`, the
state kept while running in one :class:`~greyrelease.runtime.controller.Runtime`, made at startup and found by every
handler in kopf's ``memo``.

Continuation ("RequeueAfter"): one queue of passes for all the releases
(:class:`~greyrelease.runtime.scheduler.Scheduler`): a release's key is due after its plan's
``requeue_after``, or sooner when it is woken by

- an event on the GreyRelease that changes its generation, annotations or deletion mark (so abort,
  pause and promote act within a second), and
- an event on a Deployment it watches (the target or its canary), so readiness is seen as it happens
  instead of by polling.

Why neither kopf's daemons (one per release) nor ``TemporaryError(delay=...)`` handlers: a handler
retried by kopf keeps its retry state in annotations (a write per step) and cannot be cut short by an
abort until its delay runs out; a daemon is a task per release for the release's whole life, sleeping
on two waiter tasks per sleep, with kopf's handler state besides: paid by every standing release, all
the time. The queue holds a release at rest as a key and a due time. kopf does what it is good at: the
GreyReleases' watch, the finalizer and the deletion handler. Nothing durable lives in the queue: every
pass plans from the object's ``status`` as last seen, so a restarted controller resumes where the last
one stopped (kopf lists every release at its start, and each is queued). Deletion is the exception: from
the deletion mark on, an ``on.delete`` handler (retried with ``TemporaryError``) puts the app back, and the
queue leaves the release to it.

Reads come from memory (:mod:`greyrelease.kube.cache`): the GreyReleases as kopf's watch delivers them, the
Deployments and Services from reflectors of our own (which also do the waking above; why not kopf's
watches: see :class:`~greyrelease.kube.cache.Reflector`), each with the responses to our own writes folded in.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, cast

import kopf
import orjson

from greyrelease.api.release import GROUP, PLURAL, VERSION, Obj
from greyrelease.kube.cache import LIST_PAGE
from greyrelease.kube.client import KubeClient
from greyrelease.reconcile import metrics
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.policies import Governing
from greyrelease.runtime import collector
from greyrelease.runtime.controller import Runtime, Shard, Tuning

log = logging.getLogger("greyrelease")


def runtime(memo: Any) -> Runtime:
    found = memo.get("runtime")
    if not isinstance(found, Runtime):
        raise RuntimeError("the controller's runtime is not set up (the startup handler makes it)")
    return found


class NoDiffBase(kopf.DiffBaseStorage):
    """Keeps no last-handled copy of the object. kopf would write one into an annotation on every change
    of the spec or the annotations (a write per change for nothing), and copy the whole object on every
    event to compare with it: the controller's only changing handler is the deletion one, and a pass
    reads the object as it is, never a diff. Every object is "as handled": no create or update cause."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> Any:
        return {}

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        pass


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # Our finalizer and kopf's bookkeeping live under our own prefix.
    settings.persistence.finalizer = "greyrelease.io/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="greyrelease.io")
    settings.persistence.diffbase_storage = NoDiffBase()
    # Events are posted deliberately, one per transition; kopf's own log lines are not copied into
    # them (only critical ones would be).
    settings.posting.level = logging.CRITICAL
    settings.posting.reporting_component = "greyrelease"
    settings.watching.server_timeout = 300
    # kopf lists the releases at its start in pages, as the Deployments and Services are listed
    # (greyrelease.kube.cache.LIST_PAGE): one list of 10,000 was held parsed all at once.
    settings.watching.chunk_size = LIST_PAGE
    # kopf waits this long for more events of an object before handling the last one (0.1 s by
    # default); every abort, pause and promote annotation waits it out.
    settings.batching.batch_window = 0.02
    settings.networking.request_timeout = 30
    shard = memo.get("shard")
    if isinstance(shard, Shard):
        # One shard of several (greyrelease.runtime.shards): the API server sends this operator the releases of
        # the shard's namespaces only.
        settings.watching.shard_selectors[GROUP, PLURAL] = shard.selector
    if not isinstance(memo.get("runtime"), Runtime):
        tuning = memo.get("tuning")
        if not isinstance(tuning, Tuning):
            tuning = Tuning()
        # Connections kept for every pass thread, and for the Deployment and Service watches (two per
        # watched namespace) besides; only those opened cost anything.
        api = KubeClient.from_environment(connections=tuning.threads + 64)
        if isinstance(memo.get("user_agent"), str):
            api.user_agent = memo["user_agent"]
        governing, phases, held = memo.get("governing"), memo.get("phases"), memo.get("held")
        memo["runtime"] = rt = Runtime(
            api,
            tuning=tuning,
            governing=governing if isinstance(governing, Governing) else None,
            phases=phases if isinstance(phases, metrics.Phases) else None,
            shard=shard if isinstance(shard, Shard) else None,
            notifications=True,
            held=held if isinstance(held, HeldSelfTest) else None,
        )
        rt.pool  # noqa: B018 - the threads start now, not on the first pass
        rt.start_notifier()
        await rt.watch(api, list(memo.get("namespaces") or []))
        await rt.start_held_selftest()  # the process's self-test of the hold, tested once before the first passes
        collector.settle()  # what the process holds once started is not walked by collections again
    state = memo.get("state")
    if isinstance(state, dict):
        state["ready"] = "yes"  # /readyz (greyrelease.runtime.health): the watches have listed, passes may run


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    if isinstance(memo.get("runtime"), Runtime):
        rt = runtime(memo)
        await rt.drain()  # the passes running end before the operator does (and a shard's Lease is let go)
        rt.stop()


# The event handler below is a coroutine on purpose: it queues passes on the event loop's scheduler, which
# a plain function (run by kopf in a thread pool) could not touch safely.


@kopf.on.event(GROUP, VERSION, PLURAL)
async def release_changed(event: kopf.RawEvent, type: str, memo: Any, **_: Any) -> None:
    obj = cast(Obj, event["object"])
    compact(obj)
    runtime(memo).release_changed(obj, type)


def compact(obj: Obj) -> None:
    """Make the body of a release event, in place, as small as it can be held.

    kopf keeps this very dict as the release's latest body until the next event, and the store keeps the
    same dict (one body per release, for as long as the release exists). Neither kopf nor a pass reads
    managedFields, the largest part of a release's metadata: dropped (bench/README, "Memory at rest").
    kopf parses with the standard library, which gives every body its own key strings; parsed again by
    orjson, whose dicts share the keys it has seen, a succeeded release is held in about 3 KiB less
    (bench/README, "Both sides at rest, counted"; tests/runtime/test_event_body.py), for about 10 us an
    event. The dict itself stays the one kopf holds.
    """
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    parsed = orjson.loads(orjson.dumps(obj))
    obj.clear()
    obj.update(parsed)


@kopf.on.delete(GROUP, VERSION, PLURAL, backoff=1)
async def release_deleted(
    name: str,
    namespace: str | None,
    body: kopf.Body,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    memo: Any,
    **_: Any,
) -> None:
    """Put the app back as it was before the release began, then let the object go."""
    rt = runtime(memo)
    key = (namespace or "", name)
    # The pass must see the deletion mark even if kopf calls this before release_changed has kept it.
    rt.releases.fold(copy.deepcopy(dict(body)))
    # No pass of the queue's runs beside this one: one that had started before the mark ends first.
    release = await rt.scheduler.exclusive(key)
    try:
        outcome = await rt.reconcile(*key, urgent=True)
    except Exception as err:  # a failed pass (e.g. a write conflict) is retried at once
        logger.warning(f"cleanup pass failed ({err}); retrying")
        raise kopf.TemporaryError(f"cleanup pass failed: {err}", delay=1) from err
    finally:
        release()
    if outcome is not None and not outcome.plan.done:
        raise kopf.TemporaryError("restoring the stable Deployment and removing the canary", delay=1)
    rt.registry.forget(key)
