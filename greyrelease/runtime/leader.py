"""Leader election on a ``coordination.k8s.io/v1`` Lease, so that of several controller replicas exactly
one acts at a time.

Why a Lease and not kopf's peering: peering pauses operators by priority and, with equal priorities,
pauses them all; it also needs its own CRD. A Lease is the mechanism Kubernetes' own controllers use,
needs only RBAC on one object, and gives a failover bounded by the lease duration.

The leader renews every ``renew_every`` seconds. A leader that cannot renew for
``lease_seconds - renew_every`` stops acting and exits (its Deployment restarts it as a candidate), which
is before any candidate may take the lease (``lease_seconds`` after the last renewal), so two leaders
never act at once. With the defaults (15 s, 2 s) a killed leader is replaced within about 17 s.

Why 15 s, as kube-controller-manager and client-go's leader election have it, rather than 10: a Lease is
renewed on the same API server as every other request, and at 10,000 releases over 3 replicas on 2 cores
a replica's start kept a renewal waiting past 8 s (bench/STANDING.md, "3 shards"). The window to renew in
is then 13 s, and a failover takes 2-5 s longer.

A failed attempt (an unreachable API server, a 5xx) is retried by the next renewal, not inside the attempt:
the holder learns that it could not renew only when an attempt returns, so the Lease's client is made with
:data:`greyrelease.kube.retry.ONCE` (by ``greyrelease run``), which sends each call once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from greyrelease.api.release import Obj, parse_time
from greyrelease.kube.protocol import Conflict, Kube, path

log = logging.getLogger("greyrelease.runtime.leader")

LEASE_NAME = "greyrelease-controller"


def identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claim(spec: Obj, me: str, now: datetime, lease_seconds: int) -> Obj | None:
    """The Lease spec that makes ``me`` the holder, or None when someone else holds a live lease. Pure."""
    holder = spec.get("holderIdentity") or ""
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or lease_seconds)
    expired = renewed is None or now >= renewed + timedelta(seconds=duration)
    if holder and holder != me and not expired:
        return None
    new = dict(spec)
    new.update({"holderIdentity": me, "leaseDurationSeconds": lease_seconds, "renewTime": _micro(now)})
    if holder != me:
        new["acquireTime"] = _micro(now)
        new["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
    return new


class Lease:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        name: str = LEASE_NAME,
        me: str | None = None,
        lease_seconds: int = 15,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.labels = labels or {}
        self.namespace = namespace
        self.name = name
        self.me = me or identity()
        self.lease_seconds = lease_seconds
        self.path = path("coordination.k8s.io", "v1", "leases", namespace, name)
        self._written: Obj | None = None  # the Lease as this holder last wrote it

    def try_hold(self, *, take: bool = True) -> bool:
        """One attempt to acquire or renew; True while we hold the lease. With ``take`` False, a renewal
        only: a Lease another holder took, or gave up since, is not taken (back from a pause, a holder that
        lost its Lease stops what it held before it may hold it again)."""
        now = datetime.now(UTC)
        written = self._written
        if written is not None:
            # A renewal of the version this holder wrote last is one PUT, not a read and a write, as client-go
            # renews: half the requests, and half the time on a slow API server. Its resourceVersion makes it a
            # compare-and-swap: a Lease written by anyone since answers 409, and the attempt reads it first.
            spec = claim(written.get("spec") or {}, self.me, now, self.lease_seconds)
            if spec is not None:
                try:
                    self._written = self.kube.replace(self.path, {**written, "spec": spec})
                    return True
                except Conflict:
                    self._written = None
        lease = self.kube.get(self.path)
        try:
            if lease is None:
                if not take:
                    return False
                spec = claim({}, self.me, now, self.lease_seconds)
                assert spec is not None
                meta: Obj = {"name": self.name, "namespace": self.namespace}
                if self.labels:
                    meta["labels"] = self.labels
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
                self._written = self.kube.create(path("coordination.k8s.io", "v1", "leases", self.namespace), body)
                return True
            if not take and (lease.get("spec") or {}).get("holderIdentity") != self.me:
                return False
            spec = claim(lease.get("spec") or {}, self.me, now, self.lease_seconds)
            if spec is None:
                return False
            # The resourceVersion makes this a compare-and-swap: of two candidates only one wins.
            lease["spec"] = spec
            self._written = self.kube.replace(self.path, lease)
            return True
        except Conflict:
            return False

    def holder(self) -> str:
        lease = self.kube.get(self.path) or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def release(self) -> None:
        """Give the lease up on a clean shutdown, so a candidate takes over at once."""
        self._written = None
        lease = self.kube.get(self.path)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.me:
            return
        lease["spec"]["holderIdentity"] = ""
        lease["spec"]["renewTime"] = None
        with contextlib.suppress(Conflict):  # taken over meanwhile: nothing to give up
            self.kube.replace(self.path, lease)


def request_timeout(lease_seconds: int, renew_every: float = 2.0) -> float:
    """The timeout of each call of a Lease's client: an attempt (a read and a write) ends within the
    holder's window of ``lease_seconds - renew_every``, so a call the API server keeps waiting is given up
    while a next attempt can still renew in time."""
    return max(1.0, (lease_seconds - renew_every) / 2)


class Renewing:
    """Renews one Lease every ``every`` seconds on a thread of its own until :meth:`stop`, and after each
    renewal that succeeded calls ``renewed(at)`` with the monotonic time the attempt began (before its
    read: the Lease's ``renewTime`` is later, so a holder counting from ``at`` stops early, never late).
    It only renews (unless ``take``): a Lease that names another holder, or none, is left as it is.

    Why a thread rather than a task of the event loop: a renewal made through the loop waits for the loop
    and for its default executor, and a renewal that comes late stops the holder, as it must to be safe.
    On a replica starting 3,333 releases (10,000 over 3 replicas on 2 cores), renewals made that way missed
    their 8 s window 19 times in 12 minutes (bench/STANDING.md, "3 shards"). This
    thread waits for nothing but the API server and its turn at the interpreter."""

    def __init__(self, lease: Lease, every: float, renewed: Callable[[float], None], *, take: bool = False) -> None:
        self.lease = lease
        self.take = take
        self.every = every
        self.renewed = renewed
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease {lease.name}", daemon=True)

    def start(self) -> Renewing:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No renewal is begun after this returns (one under way may still end)."""
        self._stopping.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the renewal under way, if any (a blocking call: off the event loop)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        due = time.monotonic() + self.every
        while not self._stopping.wait(max(0.0, due - time.monotonic())):
            at = time.monotonic()
            due = at + self.every
            ok = _safe_try(self.lease, take=self.take)
            took = time.monotonic() - at
            if took > self.every:
                log.warning(f"renewing the Lease {self.lease.name} took {took:.1f}s")
            if ok and not self._stopping.is_set():
                self.renewed(at)


async def lead(lease: Lease, *, renew_every: float = 2.0) -> None:
    """Wait until we hold the lease."""
    announced = False
    while not await asyncio.to_thread(_safe_try, lease):
        if not announced:
            holder = await asyncio.to_thread(lease.holder)
            log.info(f"waiting for the lease {lease.namespace}/{lease.name} (held by {holder})")
            announced = True
        await asyncio.sleep(renew_every)
    log.info(f"leading as {lease.me}")


async def keep(lease: Lease, lost: asyncio.Event, *, renew_every: float = 2.0) -> None:
    """Renew (on a :class:`Renewing` thread) until no renewal has succeeded for too long; then set ``lost``."""
    last_ok = [time.monotonic()]

    def renewed(at: float) -> None:
        last_ok[0] = max(last_ok[0], at)

    renewing = Renewing(lease, renew_every, renewed).start()
    try:
        # Woken when the window since the last renewal would end: at once if no renewal came meanwhile.
        while (left := last_ok[0] + lease.lease_seconds - renew_every - time.monotonic()) > 0:
            await asyncio.sleep(left)
        log.error("lost the lease; stopping")
        lost.set()
    finally:
        renewing.stop()


def _safe_try(lease: Lease, *, take: bool = True) -> bool:
    try:
        return lease.try_hold(take=take)
    except Exception as err:  # an unreachable API server is a failed attempt
        log.warning(f"lease attempt failed: {err}")
        return False
