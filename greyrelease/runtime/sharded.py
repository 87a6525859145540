"""``greyrelease run --shards N``: one kopf operator per shard this replica holds (see
:mod:`greyrelease.runtime.shards` for how shards are split and held).

Each held shard runs its own kopf operator in this process, watching the GreyReleases of the shard's
namespaces only (the API server filters them), with a :class:`~greyrelease.runtime.controller.Runtime` of its own
(stores, reflectors filtered the same way, pass threads) made by the operator's startup handler. A shard
handed over or lost stops its operator; a new one starts when a shard is taken. Nothing is shared
between the shards but the ``greyrelease_releases`` gauge.
"""

from __future__ import annotations

import asyncio
import logging
import signal

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
    flags: dict[int, asyncio.Event] = {}
    stopping = asyncio.Event()
    asked: set[int] = set()
    failed: list[int] = []

    async def start(k: int, held: Held) -> None:
        asked.discard(k)
        flags[k] = flag = asyncio.Event()
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
        try:
            await kopf.operator(
                clusterwide=not namespaces, namespaces=namespaces, standalone=True, stop_flag=flag, memo=memo
            )
        except Exception:
            log.exception(f"shard {k}: the operator failed")
            failed.append(k)
        if k not in asked:
            stopping.set()  # stopped by a signal (kopf handles SIGTERM and SIGINT) or failed, not handed over

    async def stop(k: int) -> None:
        asked.add(k)
        if k in flags:
            flags.pop(k).set()

    def changed(held: list[int]) -> None:
        state["role"] = "shards " + (",".join(map(str, held)) or "none") + f" of {n}"
        # Each kopf operator takes SIGTERM and SIGINT over while it starts, and one that ends leaves its
        # handler behind: after every change the signals stop every shard again. (An operator started after
        # this call takes them over, and its end by a signal stops the rest.)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)

    shards = Shards(api, namespace=lease_namespace, n=n, me=me, start=start, stop=stop, lease_seconds=lease_seconds)
    shards.changed = changed
    changed([])
    log.info(f"replica {me}: sharing {n} shards")
    await shards.run(stopping)
    return 1 if failed else 0
