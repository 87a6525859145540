"""``greyrelease run --shards N``: one kopf operator per shard this replica holds (see
:mod:`greyrelease.runtime.shards` for how shards are split and held).

Each held shard runs its own kopf operator in this process, watching the GreyReleases of the shard's
namespaces only (the API server filters them), with a :class:`~greyrelease.runtime.controller.Runtime` of its own
(stores, reflectors filtered the same way, pass threads) made by the operator's startup handler. A shard
handed over or lost stops its operator; a new one starts when a shard is taken. Nothing is shared
between the shards but the ``greyrelease_releases`` gauge and the process's self-test of the hold.

Why each operator has an event loop (and a thread) of its own. An operator that stops cancels every task
of its loop made after it started, whoever made it (kopf's ``run_tasks`` cannot tell its tasks from
others'). Sharing one loop, a shard handed over 5 s after it was taken cancelled the other shard's passes
and kopf's workers of its releases made in those 5 s: at 10,000 releases over 3 replicas, 24 releases were
never passed again, whatever changed in them (bench/STANDING.md, "3 shards").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
from collections.abc import Callable

import kopf

from greyrelease.kube.client import KubeClient
from greyrelease.kube.protocol import ApiError, path
from greyrelease.kube.retry import ONCE
from greyrelease.reconcile import metrics
from greyrelease.reconcile.held import HeldSelfTest
from greyrelease.reconcile.policies import Governing
from greyrelease.runtime.controller import Shard, Tuning
from greyrelease.runtime.leader import identity, request_timeout
from greyrelease.runtime.shards import Held, Shards, selector

log = logging.getLogger("greyrelease.runtime.shards")


class _SignalsHereAreOurs(logging.Filter):
    """kopf warns that an operator run off the main thread ignores OS signals: here that is the design (the
    main loop takes SIGTERM and SIGINT and stops every shard), so the warning would only mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "OS signals are ignored" not in record.getMessage()


async def on_own_thread(fn: Callable[[], None], name: str) -> None:
    """Run ``fn`` on a thread of its own and wait for it (its exception raised here). Not the loop's default
    executor: ``fn`` runs as long as a shard is held, and would keep one of its few threads all that time."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def report(err: BaseException | None) -> None:
        if not done.done():
            done.set_result(None) if err is None else done.set_exception(err)

    def target() -> None:
        err: BaseException | None = None
        try:
            fn()
        except BaseException as caught:  # handed to the waiting coroutine
            err = caught
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(report, err)

    threading.Thread(target=target, name=name, daemon=True).start()
    await done


class NotSharded(RuntimeError):
    """The API server does not filter lists by shard: every replica would drive every release."""


def check_server_filters(api: KubeClient, n: int, namespace: str | None) -> None:
    """Refuse to shard when the API server ignores ``shardSelector``: a server before Kubernetes 1.36, or
    without the ShardedListAndWatch feature gate, answers every list in full and says nothing. A filtered
    list of a built-in kind says so in ``metadata.shardInfo`` (lists of custom resources are filtered by the
    same gate but, in Kubernetes 1.37, do not say so), so the question is asked of Deployments."""
    query = {"limit": "1", "shardSelector": selector([0], n)}
    try:
        listed = api.request("GET", path("apps", "v1", "deployments", namespace), query=query)
    except ApiError as err:
        raise NotSharded(f"the API server refused a sharded list ({err})") from err
    if not (listed.get("metadata") or {}).get("shardInfo"):
        raise NotSharded(
            "the API server does not filter lists by shard (it needs Kubernetes 1.36 or later with the feature "
            "gate ShardedListAndWatch=true); run with --shards 1"
        )


async def run_sharded(
    *,
    n: int,
    namespaces: list[str],
    governing: Governing,
    lease_namespace: str,
    lease_seconds: int,
    state: dict[str, str],
    selftest: HeldSelfTest | None = None,
    tuning: Tuning | None = None,
) -> int:
    """Hold a share of ``n`` shards until SIGTERM or SIGINT; 0 on a clean stop, 2 when the API server cannot
    shard, 1 when a shard's operator failed. ``selftest``, the process's self-test of the hold, is every
    shard's runtime's."""
    # The Leases' calls are not retried inside an attempt: the next renewal is the retry (retry.ONCE).
    api = KubeClient.from_environment(retry=ONCE, timeout=request_timeout(lease_seconds))
    me = identity()
    api.user_agent = f"greyrelease/{me}"  # the audit log tells the replicas apart
    try:
        await asyncio.to_thread(check_server_filters, api, n, namespaces[0] if namespaces else None)
    except NotSharded as err:
        log.error(str(err))
        return 2
    phases = metrics.Phases()
    flags: dict[int, concurrent.futures.Future[None]] = {}
    stopping = asyncio.Event()
    asked: set[int] = set()
    failed: list[int] = []

    async def start(k: int, held: Held) -> None:
        asked.discard(k)
        flag: concurrent.futures.Future[None] = concurrent.futures.Future()
        flags[k] = flag
        memo = kopf.Memo(
            namespaces=namespaces,
            governing=governing,
            phases=phases,
            user_agent=api.user_agent,
            shard=Shard(selector([k], n), held.writable),
            state=state,
            held=selftest,
            tuning=tuning,
        )

        def operate() -> None:  # on the shard's thread, in an event loop of its own (see the module's doc)
            asyncio.run(
                kopf.operator(
                    clusterwide=not namespaces, namespaces=namespaces, standalone=True, stop_flag=flag, memo=memo
                )
            )

        try:
            await on_own_thread(operate, f"shard {k}")
        except Exception:
            log.exception(f"shard {k}: the operator failed")
            failed.append(k)
        if k not in asked:
            stopping.set()  # ended by itself (failed), not handed over

    async def stop(k: int) -> None:
        asked.add(k)
        flag = flags.pop(k, None)
        if flag is not None and not flag.done():
            flag.set_result(None)

    def changed(held: list[int]) -> None:
        state["role"] = "shards " + (",".join(map(str, held)) or "none") + f" of {n}"

    # The operators run off the main thread and leave the signals alone: SIGTERM and SIGINT stop every shard.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    logging.getLogger("kopf._core.reactor.running").addFilter(_SignalsHereAreOurs())
    shards = Shards(api, namespace=lease_namespace, n=n, me=me, start=start, stop=stop, lease_seconds=lease_seconds)
    shards.changed = changed
    changed([])
    log.info(f"replica {me}: sharing {n} shards")
    await shards.run(stopping)
    return 1 if failed else 0
