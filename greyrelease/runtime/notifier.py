"""The notification sender: posts the deliveries the passes hand it (:mod:`greyrelease.reconcile.notify`),
never on a pass's path.

How it runs. A bounded queue, filled by the pass threads (:meth:`Notifier.submit` takes a lock for a few
microseconds and never waits), drained by one sender: an asyncio loop on a thread of its own, posting with
aiohttp. Its own thread, not kopf's event loop: kopf's loop carries the watch events that wake a release
for an abort, and the sender's work (TLS handshakes to receivers, JSON, retries) would share it; and the
Secret reads, Events and status writes it makes go through the controller's synchronous client, which a
loop of its own can run in worker threads without holding anything of kopf's.

Order and isolation. Deliveries to one URL (one Secret key) go one after another in the order their
Events were posted: a lane per URL. Lanes run side by side (at most ``lanes`` at once), so a receiver
that hangs holds only its own lane, for its timeout.

Each delivery: the URL is read from its Secret (kept ``secret_ttl`` seconds, dropped after any failure so a
rotated URL is read again), then POSTed with a timeout; a refused connection, a dropped connection, a
connect timeout (half the timeout) and a 5xx answer are tried again (``attempts`` in all, waiting 1 s,
2 s, ... up to 5 s between them). A timeout while waiting for the answer is not: the receiver has the
request and may have acted on it, and trying again would only hold the lane as long again. A 3xx or 4xx
answer is final (redirects are not followed). A delivery that fails, whatever the cause, is counted
(``greyrelease_notifications_failed_total``), posts a Warning Event ``NotificationFailed`` on the release
naming the notification and the cause (the Secret when it is the Secret; never the URL, a credential), and
is recorded in ``status.notifications``. The release is not held for it.

When the queue is full, the oldest delivery is dropped to make room and counted
(``greyrelease_notifications_dropped_total``). Deliveries still queued when the controller stops are lost:
delivery is at most once (the README says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from greyrelease.api.release import GROUP, KIND, VERSION, NotificationStatus
from greyrelease.kube.protocol import MERGE, Conflict, Kube, path
from greyrelease.reconcile import metrics
from greyrelease.reconcile.notify import NOTIFICATION_FAILED, Delivery
from greyrelease.reconcile.outbound import SecretError, describe, secret_text
from greyrelease.reconcile.record import release_path

log = logging.getLogger("greyrelease")

Lane = tuple[str, str, str]


class Undeliverable(Exception):
    """Why a delivery failed, in words fit for an Event (no URL in them)."""


class _ServerError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"the receiver answered {status}")
        self.status = status


def retryable(err: BaseException) -> bool:
    """Tried again: a 5xx answer, a connection refused or dropped, a connect timeout. Not a timeout
    waiting for the answer (the receiver has the request), nor any other answer."""
    if isinstance(err, _ServerError | aiohttp.ConnectionTimeoutError):
        return True
    if isinstance(err, TimeoutError):
        return False
    return isinstance(err, aiohttp.ClientConnectionError)


class Notifier:
    def __init__(
        self,
        kube: Kube,
        *,
        capacity: int = 1000,
        timeout: float = 5.0,
        attempts: int = 3,
        backoff: tuple[float, float] = (1.0, 5.0),
        lanes: int = 16,
        secret_ttl: float = 60.0,
    ) -> None:
        self.kube = kube
        self.capacity = capacity
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.lanes = lanes
        self.secret_ttl = secret_ttl
        self._lock = threading.Lock()
        self._pending: deque[Delivery] = deque()
        self._busy: set[Lane] = set()
        self._urls: dict[Lane, tuple[str, float]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._idle = threading.Condition(self._lock)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        #: Lanes of one release record their results one at a time (a read, then a write of the list).
        self._recording = threading.Lock()

    # --- the passes' side ------------------------------------------------------------------------------

    def submit(self, deliveries: list[Delivery]) -> None:
        """Queue ``deliveries`` (from any thread; never waits). When the queue is full, the oldest queued
        delivery is dropped for each new one."""
        dropped = []
        with self._lock:
            for d in deliveries:
                if len(self._pending) >= self.capacity:
                    dropped.append(self._pending.popleft())
                self._pending.append(d)
        for d in dropped:
            labels = (metrics.notification_label(d.notification), d.format)
            metrics.NOTIFICATIONS_DROPPED.labels(*labels).inc()
            log.warning(
                f"[{d.namespace}/{d.release}] notification {d.notification} of Event {d.reason} dropped: "
                f"the queue is full ({self.capacity})"
            )
        self._poke()

    def queued(self) -> int:
        with self._lock:
            return len(self._pending)

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: the sender stopped
                loop.call_soon_threadsafe(wake.set)

    # --- the sender's thread ---------------------------------------------------------------------------

    def start(self) -> Notifier:
        """Start the sender on a thread of its own; returns once it runs."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="greyrelease-notifier", daemon=True)
            self._thread.start()
            self._started.wait(10)
        return self

    def stop(self, grace: float = 2.0) -> None:
        """Stop the sender: deliveries under way get ``grace`` seconds; the queued ones are dropped."""
        self._stopping = True
        self._poke()
        if self._thread is not None:
            self._thread.join(grace + 5)
            self._thread = None

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is queued or being sent; False when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        # The total timeout bounds the connection, the request and the answer; connecting has half of it,
        # so that a receiver that cannot be reached (tried again) is told from one that hangs (not).
        timeout = aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.timeout / 2)
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=timeout, headers={"User-Agent": "greyrelease"}) as session:
            while not self._stopping:
                for d in self._take():
                    task = asyncio.create_task(self._lane(session, d))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                await self._wake.wait()
                self._wake.clear()
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=2.0)
                for task in late:
                    task.cancel()
        with self._idle:
            self._pending.clear()
            self._idle.notify_all()

    def _take(self) -> list[Delivery]:
        """The oldest queued delivery of each idle lane, as many as lanes are free."""
        out: list[Delivery] = []
        with self._lock:
            if not self._pending or len(self._busy) >= self.lanes:
                return out
            keep: deque[Delivery] = deque()
            for d in self._pending:
                if d.lane not in self._busy and len(self._busy) < self.lanes:
                    self._busy.add(d.lane)
                    out.append(d)
                else:
                    keep.append(d)
            self._pending = keep
        return out

    async def _lane(self, session: aiohttp.ClientSession, d: Delivery) -> None:
        try:
            await self.deliver(session, d)
        except Exception as err:  # a bug here must not stop the lane for good
            log.exception(f"notification {d.notification}: {err!r}")
        finally:
            with self._idle:
                self._busy.discard(d.lane)
                self._idle.notify_all()
            assert self._wake is not None
            self._wake.set()

    # --- one delivery --------------------------------------------------------------------------------

    async def deliver(self, session: aiohttp.ClientSession, d: Delivery) -> bool:
        """Send one delivery and record how it went; True when the receiver took it."""
        labels = (metrics.notification_label(d.notification), d.format)
        try:
            url = await self._url(d)
            started = time.perf_counter()
            try:
                await self._post(session, url, d.body)
            finally:
                metrics.NOTIFICATION_SEND.labels(d.format).observe(time.perf_counter() - started)
        except Exception as err:
            self._urls.pop(d.lane, None)
            why = str(err) if isinstance(err, Undeliverable | _ServerError) else describe(err, self.timeout)
            metrics.NOTIFICATIONS_FAILED.labels(*labels).inc()
            log.warning(f"[{d.namespace}/{d.release}] notification {d.notification} of Event {d.reason}: {why}")
            await asyncio.to_thread(self._failed, d, why)
            return False
        metrics.NOTIFICATIONS_SENT.labels(*labels).inc()
        await asyncio.to_thread(self._record, d, "Sent", "")
        return True

    async def _url(self, d: Delivery) -> str:
        held = self._urls.get(d.lane)
        if held is not None and held[1] > time.monotonic():
            return held[0]
        url = await asyncio.to_thread(self._read_url, d)
        self._urls[d.lane] = (url, time.monotonic() + self.secret_ttl)
        return url

    def _read_url(self, d: Delivery) -> str:
        namespace, name, key = d.secret
        try:
            url = secret_text(self.kube, namespace, name, key)
        except SecretError as err:
            raise Undeliverable(str(err)) from err
        if not url.startswith(("https://", "http://")):
            raise Undeliverable(f"Secret {namespace}/{name}: key {key!r} does not hold an http(s) URL")
        return url

    async def _post(self, session: aiohttp.ClientSession, url: str, body: bytes) -> None:
        low, high = self.backoff
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=low, min=low, max=high),
            retry=retry_if_exception(retryable),
            reraise=True,
        ):
            with attempt:
                headers = {"Content-Type": "application/json"}
                async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
                    if resp.status >= 500:
                        raise _ServerError(resp.status)
                    if resp.status >= 300:
                        raise Undeliverable(f"the receiver answered {resp.status}")

    # --- what is recorded (on worker threads: the controller's client is synchronous) ----------------

    def _failed(self, d: Delivery, why: str) -> None:
        now = datetime.now(UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        message = f"notification {d.notification} ({d.source}) of Event {d.reason} {d.event}: {why}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": d.failure_name, "namespace": d.namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": d.release,
                "namespace": d.namespace,
                "uid": d.uid,
            },
            "type": "Warning",
            "reason": NOTIFICATION_FAILED,
            "message": message[:1024],
            "source": {"component": "greyrelease"},
            "reportingComponent": "greyrelease",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.kube.create(path("", "v1", "events", d.namespace), body)
        except Conflict:
            pass
        except Exception as err:  # refused, or this replica no longer drives the release's shard
            log.warning(f"[{d.namespace}/{d.release}] event {NOTIFICATION_FAILED} not posted: {err}")
        self._record(d, "Failed", why, now)

    def _record(self, d: Delivery, result: str, message: str, now: datetime | None = None) -> None:
        """The notification's entry in ``status.notifications``: written for a failure, and for a success
        only when the entry says otherwise (a success after a failure), so a notification that works
        costs no write."""
        with self._recording:
            self._write_entry(d, result, message, now)

    def _write_entry(self, d: Delivery, result: str, message: str, now: datetime | None) -> None:
        try:
            release = self.kube.get(release_path(d.namespace, d.release))
            if release is None or (release.get("metadata") or {}).get("uid") != d.uid:
                return  # gone, or another object of that name
            entries: list[Any] = list((release.get("status") or {}).get("notifications") or [])
            mine = [i for i, e in enumerate(entries) if (e.get("source"), e.get("name")) == (d.source, d.notification)]
            if result == "Sent" and (not mine or entries[mine[0]].get("result") == "Sent"):
                return
            entry = NotificationStatus(
                name=d.notification,
                source=d.source,
                result="Sent" if result == "Sent" else "Failed",
                message=message,
                event=f"{d.reason} {d.event}",
                at=now or datetime.now(UTC),
            ).model_dump(by_alias=True, mode="json", exclude_none=True)
            if mine:
                entries[mine[0]] = entry
            else:
                entries.append(entry)
            self.kube.patch(
                release_path(d.namespace, d.release, "status"), {"status": {"notifications": entries}}, patch_type=MERGE
            )
        except Exception as err:  # as above: what is recorded is told in the log when it cannot be
            log.warning(f"[{d.namespace}/{d.release}] status.notifications not written: {err}")
