"""Shards: the releases split across controller replicas by namespace, each shard held through a Lease.

Why by namespace. The API server filters lists and watches by a hash of ``object.metadata.namespace`` or
of ``object.metadata.uid`` (server-side sharded list and watch, the ``ShardedListAndWatch`` feature gate,
alpha since Kubernetes 1.36). A release, its Deployments, its Services and their EndpointSlices, its
Events, the releases it waits for (``after:`` names releases of its own namespace) and a per-namespace
concurrency limit all live in one namespace, so one selector serves every watch a shard needs and the
API server sends a replica nothing of the other shards. A hash of the uid would put a release and its
Deployment in different shards. The price: a namespace is never split, so a namespace holding most of
the releases is most of one replica's work (spread releases over namespaces to spread the load).

How a shard is held. Shard ``k`` of ``n`` is the hash range ``[k * 2^64 / n, (k + 1) * 2^64 / n)`` and the
Lease ``greyrelease-shard-<k>-of-<n>``; its holder runs a kopf operator (and the stores, reflectors and
pass threads of a :class:`~greyrelease.runtime.controller.Runtime`) that sees that range only. Each replica also
keeps a member Lease, so every replica knows how many are alive and takes at most its fair share
(``ceil(n / live replicas)``): replicas started together spread the shards, one that dies leaves its
shards to the others once its Leases expire, one that joins gets shards handed over by those holding
more than their share.

Why two replicas never drive one release. A holder that has not renewed a shard's Lease for
``lease_seconds - renew_every`` refuses every write of that shard (:meth:`Held.writable`, checked before
each write on the monotonic clock, so a process stopped and resumed refuses too) and stops its operator; a
candidate takes the Lease only ``lease_seconds`` after its last renewal. A shard given up on purpose is
stopped (its passes finished) before its Lease is released.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from greyrelease.api.release import Obj, parse_time
from greyrelease.kube.protocol import Kube, path
from greyrelease.runtime.leader import LEASE_NAME, Lease, Renewing

log = logging.getLogger("greyrelease.runtime.shards")
T = TypeVar("T")

SPACE = 1 << 64  # the API server's hash space: FNV-1a, 64 bits
FIELD = "object.metadata.namespace"
MEMBER_LABEL = "greyrelease.io/member"
FORGET_MEMBERS_AFTER = 600  # seconds after its last renewal, a member Lease left behind is deleted

# FNV-1a 64 (offset basis and prime of the FNV specification). Written here rather than taken from a
# package: it is six lines, and it must be exactly the function the API server hashes with.
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv1a64(text: str) -> int:
    h = _FNV_OFFSET
    for byte in text.encode():
        h = ((h ^ byte) * _FNV_PRIME) % SPACE
    return h


def bounds(k: int, n: int) -> tuple[int, int]:
    """The hash range ``[start, end)`` of shard ``k`` of ``n``; the ranges of 0..n-1 cover the space."""
    if not 0 <= k < n:
        raise ValueError(f"shard {k} is not one of 0..{n - 1}")
    return k * SPACE // n, (k + 1) * SPACE // n


def shard_of(namespace: str, n: int) -> int:
    """The shard whose range holds the namespace's hash."""
    h = fnv1a64(namespace)
    return next(k for k in range(n) if bounds(k, n)[0] <= h < bounds(k, n)[1])


def _hex(value: int) -> str:
    return f"0x{value:016x}"  # 16 digits, as the API server wants them (2^64 itself has 17)


def selector(shards: Iterable[int], n: int) -> str:
    """The ``shardSelector`` of a list or watch that returns the objects of ``shards`` only."""
    ranges = [bounds(k, n) for k in sorted(set(shards))]
    if not ranges:
        raise ValueError("no shard to select")
    return " || ".join(f"shardRange({FIELD}, '{_hex(a)}', '{_hex(b)}')" for a, b in ranges)


def lease_name(k: int, n: int) -> str:
    return f"greyrelease-shard-{k}-of-{n}"


def member_name(me: str) -> str:
    """A Lease name (DNS-1123) for the replica ``me``."""
    return "greyrelease-member-" + (re.sub(r"[^a-z0-9-]+", "-", me.lower()).strip("-")[:40] or "replica")


# --- what to hold: pure -----------------------------------------------------------------------------------


def live(lease: Obj | None, now: datetime) -> str:
    """The holder of ``lease`` while its last renewal is within its duration, else ""."""
    spec = (lease or {}).get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    if not holder or renewed is None:
        return ""
    return holder if now < renewed + timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0)) else ""


def labels_of(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def older_other_count(members: Iterable[Obj], me: str, n: int, now: datetime) -> list[str]:
    """The live members run with another shard count that joined before ``me``: while one is alive, ``me``
    takes nothing. Their shards are other hash ranges under other Lease names, so the two groups would
    drive the same releases at once; the group started first (the one being replaced, in a rolling update
    that changes ``--shards``) keeps them until its last replica is gone."""
    members = list(members)

    def joined(m: Obj) -> datetime | None:
        return parse_time((m.get("spec") or {}).get("acquireTime"))

    mine = next((joined(m) for m in members if (m.get("spec") or {}).get("holderIdentity") == me), None)
    found = []
    for m in members:
        holder, since, count = live(m, now), joined(m), labels_of(m).get(MEMBER_LABEL)
        older = mine is None or (since is not None and since < mine)
        if holder and holder != me and count != str(n) and older:
            found.append(f"{holder} (--shards {count})")
    return found


def live_members(kube: Kube, namespace: str) -> list[str]:
    """The replicas run with ``--shards`` (any count) alive now: a controller run with ``--shards 1`` waits
    for them to stop before it takes its Lease."""
    now = datetime.now(UTC)
    leases = kube.list(path("coordination.k8s.io", "v1", "leases", namespace), label_selector=MEMBER_LABEL)
    return [h for m in leases if (h := live(m, now))]


@dataclass(frozen=True)
class Moves:
    take: tuple[int, ...] = ()
    give: tuple[int, ...] = ()


def decide(n: int, me: str, holders: dict[int, str], members: Iterable[str]) -> Moves:
    """Which shards ``me`` should try to take and which to give up, from the live holder of each shard
    (``""`` for none) and the live members (``me`` counts whether listed or not).

    Each replica holds at most ``ceil(n / members)``. Free shards are tried in an order that starts at a
    different shard for each member (its rank among them), so replicas started together try different
    shards first. A replica over its share gives up one shard a round, its highest."""
    everyone = sorted(set(members) | {me})
    fair = math.ceil(n / len(everyone))
    mine = sorted(k for k, h in holders.items() if h == me)
    if len(mine) > fair:
        return Moves(give=(mine[-1],))
    start = everyone.index(me) * n // len(everyone)
    order = [(start + i) % n for i in range(n)]
    free = [k for k in order if not holders.get(k)]
    return Moves(take=tuple(free[: fair - len(mine)]))


# --- holding: the Leases ----------------------------------------------------------------------------------


@dataclass
class Held:
    """A shard this replica holds, with when its Lease was last renewed (monotonic). Its Lease is renewed
    on a thread of its own (:class:`~greyrelease.runtime.leader.Renewing`), which calls :meth:`renew`."""

    k: int
    renewed: float
    lease_seconds: int
    renew_every: float
    running: asyncio.Task[None] | None = field(default=None, repr=False)
    renewing: Renewing | None = field(default=None, repr=False)
    dropped: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def writable(self) -> bool:
        """True while writes of this shard are safe: the Lease was renewed less than
        ``lease_seconds - renew_every`` ago, well before anyone else may take it."""
        return time.monotonic() - self.renewed < self.lease_seconds - self.renew_every

    def renew(self, at: float) -> None:
        """A renewal begun at ``at`` succeeded (on the renewing thread). Once dropped, the shard stays
        unwritable whatever a renewal under way at the drop says."""
        with self._lock:
            if not self.dropped:
                self.renewed = max(self.renewed, at)

    def drop(self) -> None:
        with self._lock:
            self.dropped = True
            self.renewed = -math.inf  # no write of this shard from now on
        if self.renewing is not None:
            self.renewing.stop()


class Shards:
    """Holds this replica's share of ``n`` shards and runs each held shard with ``start(k, held)`` (an
    awaitable that runs until cancelled or stopped). ``run`` returns when a shard's run ends by itself (the
    operator was told to stop by a signal) or ``stopping`` is set; the shards are then stopped and their
    Leases released."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        n: int,
        me: str,
        start: Callable[[int, Held], Coroutine[Any, Any, None]],
        stop: Callable[[int], Awaitable[None]],
        lease_seconds: int = 15,
        renew_every: float = 2.0,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.n = n
        self.me = me
        self.start = start
        self.stop = stop
        self.lease_seconds = lease_seconds
        self.renew_every = renew_every
        self.held: dict[int, Held] = {}
        self.changed: Callable[[list[int]], None] = lambda _: None
        self._announced = False
        # The Leases' reads and takes wait for no other blocking call of the process (the loop's default
        # executor also runs the runtimes' waits for their first lists, up to a minute each).
        self._io = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shard leases")

    def _lease(self, name: str, labels: dict[str, str] | None = None) -> Lease:
        return Lease(
            self.kube, namespace=self.namespace, name=name, me=self.me, lease_seconds=self.lease_seconds, labels=labels
        )

    def _look(self) -> tuple[dict[int, str], list[Obj], Obj | None]:
        """The live holder of each shard, the member Leases (of every shard count) and the Lease of a
        controller run with ``--shards 1``, as the API server has them now."""
        now = datetime.now(UTC)
        holders = {k: live(self.kube.get(self._lease(lease_name(k, self.n)).path), now) for k in range(self.n)}
        members = self.kube.list(
            path("coordination.k8s.io", "v1", "leases", self.namespace), label_selector=MEMBER_LABEL
        )
        for m in members:
            # A member that stopped without deleting its Lease (killed) is forgotten after a while.
            renewed = parse_time((m.get("spec") or {}).get("renewTime"))
            if renewed is not None and now - renewed > timedelta(seconds=FORGET_MEMBERS_AFTER):
                with contextlib.suppress(Exception):
                    self.kube.delete(path("coordination.k8s.io", "v1", "leases", self.namespace, m["metadata"]["name"]))
        return holders, members, self.kube.get(self._lease(LEASE_NAME).path)

    # the loop ------------------------------------------------------------------------------------------------

    async def run(self, stopping: asyncio.Event) -> None:
        member = self._lease(member_name(self.me), {MEMBER_LABEL: str(self.n)})
        # A member Lease only says this replica is alive: taken again if it was forgotten meanwhile.
        renewing = Renewing(member, self.renew_every, lambda _: None, take=True)
        try:
            # One round of only being a member first: replicas started together see each other before
            # taking anything, instead of the first one taking every shard and handing them back.
            await self._safely(member.try_hold)
            renewing.start()
            await self._wait(stopping, self.renew_every)
            while not stopping.is_set():
                await self._round()
                if any(h.running is not None and h.running.done() for h in self.held.values()):
                    log.info("a shard's operator stopped by itself; stopping all")
                    return
                await self._wait(stopping, self.renew_every)
        finally:
            for k in sorted(self.held):
                await self._drop(k, release=True)
            renewing.stop()
            with contextlib.suppress(Exception):
                await self._call(renewing.join, self.lease_seconds)
                await self._call(self.kube.delete, member.path)
            self._io.shutdown(wait=False)

    async def _round(self) -> None:
        for k, held in list(self.held.items()):
            if not held.writable():  # its thread did not renew it in time
                log.error(
                    f"shard {k}: the Lease was not renewed for {self.lease_seconds - self.renew_every:g}s; stopping it"
                )
                await self._drop(k, release=False)
        try:
            holders, members, leader = await self._call(self._look)
        except Exception as err:  # an unreachable API server: hold on to what is held, take nothing
            log.warning(f"shard leases not read: {err}")
            return
        now = datetime.now(UTC)
        older = older_other_count(members, self.me, self.n, now)
        if single := live(leader, now):
            older.append(f"{single} (--shards 1)")
        if older:
            for k in sorted(self.held):
                await self._drop(k, release=True)
            if not self._announced:
                log.info(f"waiting for the replicas run with another shard count to stop: {', '.join(older)}")
                self._announced = True
            return
        self._announced = False
        # What this replica holds is what it renewed, whatever a read just before the renewal said.
        holders = {k: (self.me if k in self.held else ("" if h == self.me else h)) for k, h in holders.items()}
        peers = [h for m in members if labels_of(m).get(MEMBER_LABEL) == str(self.n) and (h := live(m, now))]
        moves = decide(self.n, self.me, holders, peers)
        for k in moves.give:
            log.info(
                f"shard {k}: handing over (holding more than a fair share of {self.n} over "
                f"{len(set(peers) | {self.me})} replicas)"
            )
            await self._drop(k, release=True)
        for k in moves.take:
            lease = self._lease(lease_name(k, self.n))
            at = time.monotonic()
            if await self._safely(lease.try_hold):
                held = Held(k, at, self.lease_seconds, self.renew_every)
                held.renewing = Renewing(lease, self.renew_every, held.renew).start()
                self.held[k] = held
                log.info(f"holding shard {k} of {self.n}")
                held.running = asyncio.create_task(self.start(k, held), name=f"shard {k}")
        if moves.give or moves.take:
            self.changed(sorted(self.held))

    async def _drop(self, k: int, *, release: bool) -> None:
        """Stop shard ``k``'s operator (its passes end first), then give its Lease up when ``release``."""
        held = self.held.pop(k, None)
        if held is None:
            return
        held.drop()  # no write of this shard from now on, and no renewal begun
        await self.stop(k)
        if held.running is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(held.running, timeout=30)
        if release:
            if held.renewing is not None:  # a renewal under way would undo the release
                await self._call(held.renewing.join, self.lease_seconds)
            await self._safely(self._lease(lease_name(k, self.n)).release)
        log.info(f"shard {k} stopped" + (" and its Lease released" if release else ""))
        self.changed(sorted(self.held))

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    async def _safely(self, fn: Callable[..., object], *args: object) -> bool:
        try:
            return bool(await self._call(fn, *args))
        except Exception as err:  # an unreachable API server is a failed attempt
            log.warning(f"lease attempt failed: {err}")
            return False

    @staticmethod
    async def _wait(stopping: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=seconds)
