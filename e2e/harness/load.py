"""An open-loop HTTP load generator at a fixed rate, recording every request.

    load = Load("http://127.0.0.1:8000", rate=200, host="web.example")
    load.start()                  # a background thread with its own asyncio loop; the caller stays synchronous
    ...
    records = load.stop()         # every request, in the order sent
    s = summarise(records, start, end)   # counts, shares and failures per image, rate kept, send lag

Open loop: request i is sent at start + i/rate whether or not the earlier ones have been answered, so a
slow or failing backend cannot slow the load down and hide itself (a closed loop would send fewer requests
exactly when answers are slow). When the loop falls behind, the overdue requests go out at once and each
record keeps its lag (sent - scheduled), so a test can show the rate was kept.

Built on aiohttp's client (already a dependency through kopf) with a keep-alive connection pool, rather
than vegeta or fortio (Go binaries to build and drive over a pipe): the records come back as Python values
with the answering pod and image parsed from each JSON body, and one Python process keeps 200-300
requests/s with sub-millisecond send lag (e2e/test_load.py measures it).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aiohttp

# Connections the pool may open: enough that requests never queue for a connection at the rates we use
# (a 300 ms canary at 300 requests/s holds ~90 at once), far below the open-file limit.
MAX_CONNECTIONS = 512


@dataclass(frozen=True)
class Record:
    scheduled: float  # wall-clock time (time.time()) the request was due
    sent: float  # wall-clock time it was sent
    latency: float | None  # seconds from sending to the whole answer; None when no answer came
    status: int | None  # HTTP status; None for a connection error or a timeout
    error: str | None  # what went wrong when there is no status
    pod: str | None  # from the JSON answer of a pod
    image: str | None

    @property
    def failed(self) -> bool:
        """Not a 2xx answer: a 5xx (from a pod or the proxy), or no answer at all."""
        return self.status is None or not 200 <= self.status < 300

    @property
    def lag(self) -> float:
        return self.sent - self.scheduled


class Load:
    def __init__(
        self, url: str, rate: float, *, host: str | None = None, path: str = "/", timeout: float = 5.0
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {rate}")
        self.url = url.rstrip("/") + "/" + path.lstrip("/")
        self.rate = rate
        self.host = host
        self.timeout = timeout
        self.started: float | None = None  # wall-clock time of the first request
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def records(self) -> list[Record]:
        """The requests answered (or failed) so far, in the order sent."""
        with self._lock:
            return sorted(self._records, key=lambda r: r.sent)

    def start(self) -> Load:
        if self._thread is not None:
            raise RuntimeError("this Load was already started")
        self._thread = threading.Thread(target=self._main, name="load", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise RuntimeError(f"the load generator did not start: {self._failure}") from self._failure
        return self

    def stop(self) -> list[Record]:
        """Stops sending, waits for the requests in flight (at most `timeout`), returns every record."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 10)
        if self._failure is not None:
            raise RuntimeError(f"the load generator failed: {self._failure}") from self._failure
        return self.records

    def summary(self, start: float | None = None, end: float | None = None) -> Summary:
        return summarise(self.records, start, end, asked_rate=self.rate)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported to the caller by start() or stop()
            self._failure = exc
        finally:
            self._ready.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        headers = {"Host": self.host} if self.host else {}
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            in_flight: set[asyncio.Task[None]] = set()
            mono0, wall0 = loop.time(), time.time()
            self.started = wall0
            self._ready.set()
            i = 0
            while not self._stopping.is_set():
                due = mono0 + i / self.rate
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    continue
                task = asyncio.ensure_future(self._one(session, wall0 + (due - mono0)))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                i += 1
            if in_flight:
                await asyncio.wait(in_flight)

    async def _one(self, session: aiohttp.ClientSession, scheduled: float) -> None:
        sent = time.time()
        t0 = time.monotonic()
        status: int | None = None
        error: str | None = None
        pod: str | None = None
        image: str | None = None
        latency: float | None = None
        try:
            async with session.get(self.url) as response:
                body = await response.read()
                status = response.status
            latency = time.monotonic() - t0
            pod, image = _identity(body)
        except TimeoutError:
            error = f"timeout after {self.timeout}s"
        except aiohttp.ClientError as exc:
            error = f"{type(exc).__name__}: {exc}"
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        record = Record(
            scheduled=scheduled, sent=sent, latency=latency, status=status, error=error, pod=pod, image=image
        )
        with self._lock:
            self._records.append(record)


def _identity(body: bytes) -> tuple[str | None, str | None]:
    try:
        answer = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(answer, dict):
        return None, None
    pod, image = answer.get("pod"), answer.get("image")
    return (pod if isinstance(pod, str) else None), (image if isinstance(image, str) else None)


# --- summaries (pure functions of records) ---


def window(records: Iterable[Record], start: float | None = None, end: float | None = None) -> list[Record]:
    """The records sent in [start, end) (wall-clock times); None leaves that side open."""
    return [r for r in records if (start is None or r.sent >= start) and (end is None or r.sent < end)]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank method; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    start: float
    end: float
    sent: int
    asked_rate: float | None
    rate: float  # requests sent per second over [start, end)
    max_lag: float  # the most a request went out after its due time, seconds
    answered_by_image: dict[str, int] = field(default_factory=dict)  # answers from a pod, by its image
    failed_by_image: dict[str | None, int] = field(default_factory=dict)  # None: no pod answered
    failed: list[Record] = field(default_factory=list)
    latency_p50: float = math.nan
    latency_p99: float = math.nan

    @property
    def answered(self) -> int:
        return sum(self.answered_by_image.values())

    def share(self, image: str) -> float:
        """The image's share of the requests a pod answered (0..1); 0 when no pod answered."""
        return self.answered_by_image.get(image, 0) / self.answered if self.answered else 0.0

    def error_ratio(self, image: str) -> float:
        """The share of the image's answers that were not 2xx (0..1)."""
        n = self.answered_by_image.get(image, 0)
        return self.failed_by_image.get(image, 0) / n if n else 0.0

    def rate_kept(self, tolerance: float) -> bool:
        """Whether the rate sent was within `tolerance` (0.05 = 5%) of the rate asked."""
        return self.asked_rate is not None and abs(self.rate - self.asked_rate) <= tolerance * self.asked_rate

    def line(self) -> str:
        """One line for a person: rate, then share and error ratio per image."""
        versions = "  ".join(
            f"{image.rsplit(':', 1)[-1]} {self.share(image):4.0%} err {self.error_ratio(image):4.0%}"
            for image in sorted(self.answered_by_image)
        )
        no_pod = self.failed_by_image.get(None, 0)
        return f"{self.rate:6.1f} req/s  {versions}" + (f"  no answer/proxy error {no_pod}" if no_pod else "")


def summarise(
    records: Iterable[Record], start: float | None = None, end: float | None = None, *, asked_rate: float | None = None
) -> Summary:
    """Counts over the records sent in [start, end). Without bounds, the span of the records (from the first
    one sent to one interval past the last, so n requests at rate r span n/r seconds)."""
    chosen = window(records, start, end)
    if start is None:
        start = min((r.scheduled for r in chosen), default=0.0)
    if end is None:
        step = 1 / asked_rate if asked_rate else 0.0
        end = max((r.scheduled for r in chosen), default=start) + step
    duration = end - start
    failed = [r for r in chosen if r.failed]
    return Summary(
        start=start,
        end=end,
        sent=len(chosen),
        asked_rate=asked_rate,
        rate=len(chosen) / duration if duration > 0 else 0.0,
        max_lag=max((r.lag for r in chosen), default=0.0),
        answered_by_image=dict(Counter(r.image for r in chosen if r.image is not None)),
        failed_by_image=dict(Counter(r.image for r in failed)),
        failed=failed,
        latency_p50=percentile([r.latency for r in chosen if r.latency is not None], 50),
        latency_p99=percentile([r.latency for r in chosen if r.latency is not None], 99),
    )


def per_second(
    records: Sequence[Record], start: float, end: float, *, asked_rate: float | None = None
) -> list[Summary]:
    """One summary per whole second from `start` (the last one may be shorter than a second)."""
    out: list[Summary] = []
    t = start
    while t < end:
        out.append(summarise(records, t, min(t + 1, end), asked_rate=asked_rate))
        t += 1
    return out


def first(records: Iterable[Record], where: Callable[[Record], bool]) -> Record | None:
    """The first record sent that matches."""
    return min((r for r in records if where(r)), key=lambda r: r.sent, default=None)


def last(records: Iterable[Record], where: Callable[[Record], bool]) -> Record | None:
    """The last record sent that matches."""
    return max((r for r in records if where(r)), key=lambda r: r.sent, default=None)
