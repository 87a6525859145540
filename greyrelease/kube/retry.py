"""The one retry policy of calls to the Kubernetes API: which failures are tried again, how long to wait,
and when to give up.

:class:`RetryPolicy` decides for every request :class:`~greyrelease.kube.client.KubeClient` sends, and
:data:`API` is the policy of every client (the passes' reads and writes, the reflectors' lists and the
opening of their watches, ``greyrelease plan``, the ``kubectl gr`` plugin) but the Leases' (:data:`ONCE`,
the same policy bounded to one attempt, see there):

- **Retried**: failures that say nothing about the request itself. A connection refused, reset or timed
  out (urllib3's transport errors, Python's ``ConnectionError`` and ``TimeoutError``); 429 Too Many
  Requests (API Priority and Fairness turning the request away); any 5xx (an API server starting or
  stopping, etcd slow, a webhook not answering).
- **Not retried**: every other answer, raised at once for the caller to handle. 404 (the callers make it
  None, or "gone"); 409, a name taken or a ``resourceVersion`` no longer current: the caller reads again and
  decides (a pass re-planned, the slots' and the Leases' compare-and-swap); 403, 422 and the rest of the 4xx,
  which would fail the same way again; a TLS error (a certificate does not heal); and
  :class:`~greyrelease.kube.cache.NotHeld`, a write a replica may no longer make.
- **Waits**: exponential with jitter, ``first_wait * 2^(n-1)`` plus up to ``jitter`` (0.1-0.2, 0.2-0.3,
  0.4-0.5 s), at most ``max_wait`` (2 s); when the API server asked for longer in ``Retry-After`` (a 429's or
  a 503's), that long, within the same cap.
- **Bound**: ``attempts`` in all (4: three retries, as many as urllib3 made of a refused connection on its
  own before, at once and without waits; it never retried a 429 or a 5xx), and no retry once ``deadline``
  (5 s) has passed since the first failure. Then the last error is raised as it came (a 503, a refused
  connection; never a tenacity ``RetryError``): the pass fails and is retried as a pass, the reflector
  lists again.

A write whose answer was lost (a connection reset, a 504) may have been applied before it is sent again.
That is safe for the writes the controller makes: a create sent again meets 409 AlreadyExists, which the
Events' and the slots' callers take as made, and which elsewhere fails the pass, whose next run, planned
from fresh reads, finds the object made; a write with a ``resourceVersion`` meets 409 Conflict, handled as
a lost race; the merge patches the controller sends set fields to values, and applied twice give the same
object.

The first attempt is made outside tenacity: its bookkeeping costs about 40 us a call, and nearly every
call succeeds at once. Only a call that failed in a way that is retried goes on into the policy's
:class:`tenacity.Retrying`, with that failure as its first attempt.

Before each attempt the checks registered with :func:`checked` run (a shard's writes: the replica must
still hold the shard when a write is sent again, not only when it was first tried).

Not this policy, each a concern of its own:

- a failed pass (:func:`greyrelease.runtime.controller.backoff`): re-planned from fresh reads after 1,
  2, 4, 8, then every 10 s for as long as its passes fail (after a 409, at once the first time); the
  pass's calls were each retried here first;
- a reflector's list and watch (:class:`greyrelease.kube.cache.Reflector`): a stream reopened for the life
  of the process, after any failure (also 404 while a CRD is not installed, 410 when the watch is too old);
  each list and each watch's opening is a call retried here first;
- the Leases (:mod:`greyrelease.runtime.leader`, :mod:`greyrelease.runtime.shards`): renewed at a fixed
  cadence, the next renewal being the retry of a failed one; their client's calls are bounded to one
  attempt (:data:`ONCE`);
- the slots' compare-and-swap (:mod:`greyrelease.reconcile.slots`): a 409 read again and written again;
- kopf's own calls (its watch of GreyReleases, its finalizer, the Events it posts): its aiohttp client with
  its own backoffs (``settings.networking.error_backoffs``, 1 s to 21 s);
- Prometheus queries (:mod:`greyrelease.reconcile.prometheus`): another server, another client, a retry of
  its own.
"""

from __future__ import annotations

import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

import urllib3.exceptions
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay
from tenacity.wait import wait_base

from greyrelease.kube.protocol import ApiError

log = logging.getLogger("greyrelease.kube")

T = TypeVar("T")


def transient(err: BaseException) -> bool:
    """Whether a failed call is tried again: a transport failure, 429 or a 5xx."""
    if isinstance(err, ApiError):
        return err.status == 429 or err.status >= 500
    if isinstance(err, urllib3.exceptions.MaxRetryError):
        return err.reason is not None and transient(err.reason)
    if isinstance(err, urllib3.exceptions.SSLError | ssl.SSLError):
        return False
    return isinstance(
        err,
        ConnectionError
        | TimeoutError
        | urllib3.exceptions.TimeoutError  # a connect or read timeout; a refused connection (NewConnectionError)
        | urllib3.exceptions.ProtocolError,  # the connection reset or closed mid-answer
    )


class Backoff(wait_base):
    """Exponential backoff with jitter, or the failure's ``retry_after`` when longer; at most ``cap``."""

    def __init__(self, first: float, jitter: float, cap: float) -> None:
        self.first, self.jitter, self.cap = first, jitter, cap

    def __call__(self, retry_state: RetryCallState) -> float:
        seconds = self.first * 2 ** (retry_state.attempt_number - 1) + random.uniform(0, self.jitter)
        err = retry_state.outcome.exception() if retry_state.outcome is not None else None
        asked = getattr(err, "retry_after", None)
        if isinstance(asked, int | float) and asked > seconds:
            seconds = asked
        return float(min(seconds, self.cap))


#: The checks run before each attempt of the calls made inside :func:`checked` (in this thread or task).
_checks: ContextVar[tuple[Callable[[], None], ...]] = ContextVar("greyrelease_kube_checks", default=())


@contextlib.contextmanager
def checked(check: Callable[[], None]) -> Iterator[None]:
    """Run ``check`` before every attempt of the API calls made inside; it raises to refuse one (a write of
    a shard this replica no longer holds, see :class:`~greyrelease.kube.cache.CachedKube`)."""
    token = _checks.set((*_checks.get(), check))
    try:
        yield
    finally:
        _checks.reset(token)


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of an API call (see the module's docstring for what, how long and why)."""

    attempts: int = 4
    deadline: float = 5.0
    first_wait: float = 0.1
    jitter: float = 0.1
    max_wait: float = 2.0
    #: How a wait is waited (a test records the waits instead).
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False, repr=False)

    @cached_property
    def retrying(self) -> Retrying:
        """The tenacity policy; one object for every call (tenacity keeps each call's state per thread)."""
        return Retrying(
            retry=retry_if_exception(transient),
            wait=Backoff(self.first_wait, self.jitter, self.max_wait),
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.deadline),
            sleep=self.sleep,
            before_sleep=_log_retry,
            reraise=True,
        )

    def call(self, fn: Callable[[], T], what: str = "") -> T:
        """``fn()`` under this policy; ``what`` names the call in the log (``GET /api/v1/...``)."""
        try:
            _check()
            return fn()
        except Exception as err:
            if not transient(err) or self.attempts <= 1:
                raise
            pending = [err]

        def attempt(what: str) -> T:  # (``what`` is read by the log line, from the call's arguments)
            if pending:
                raise pending.pop()  # the failure of the first attempt, made above
            _check()
            return fn()

        return self.retrying(attempt, what=what)


def _check() -> None:
    for check in _checks.get():
        check()


def _log_retry(state: RetryCallState) -> None:
    err = state.outcome.exception() if state.outcome is not None else None
    what = state.kwargs.get("what") or "an API call"
    seconds = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning(f"{what} failed ({err}); attempt {state.attempt_number + 1} in {seconds:.2f}s")


#: The policy of every call to the API server.
API = RetryPolicy()

#: The same policy bounded to one attempt: for the Leases' calls (:mod:`greyrelease.runtime.leader`,
#: :mod:`greyrelease.runtime.shards`), whose holder renews every 2 s and must stop acting within 8 s of its
#: last renewal. It notices that only when an attempt returns, so an attempt must fail at once: the next
#: renewal is its retry (four of them before the lease is given up for lost).
ONCE = RetryPolicy(attempts=1)
