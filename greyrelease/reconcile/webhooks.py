"""The webhook checks' calls: the webhooks a pass finds due (:func:`greyrelease.analysis.webhooks.due`)
called, each once, side by side, and their answers handed to the planner, which judges them.

Where and how long. The calls are made by the pass, where the metric queries are made, before the plan
(:mod:`.reconciler`). They run at once, on an event loop of the pass's own, each bounded by its
``timeout`` (at most 30 s) for all of it: connecting, sending, and reading the answer (of which the first
64 KiB are read). So a pass waits for its calls at most the longest timeout among them, and only the pass
of that release waits: the passes of other releases run on other threads, and an abort of another release
is not held by it. An abort of the same release waits for the pass under way, so for at most that
timeout (keep timeouts short: 5 s by default).

What is sent. ``POST`` (the default) sends the release's state as JSON (:func:`body`); ``GET`` sends no
body. The URL's placeholders are filled as a query's are, each value percent-encoded. A Bearer token from
``bearerTokenSecret`` and the headers of ``headersSecret`` (every key a header) are read from Secrets of the
release's namespace at every call, so a rotated credential counts from the next call; a Secret that cannot
be read is an error answer naming the Secret.

Redirects are never followed: a 3xx answer is an error (a redirect to another host could carry the token
there). Nothing is retried within a call: a check is called again at the next interval anyway, and an
error counts towards ``consecutiveErrorLimit``. A call may be repeated: a controller that dies after a
call and before its answer is recorded calls it again, so an endpoint must take a repeated call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
from yarl import URL

from greyrelease.analysis.verdicts import render_query
from greyrelease.analysis.webhooks import Answer
from greyrelease.api.release import (
    GROUP,
    VERSION,
    GreyReleaseSpec,
    GreyReleaseStatus,
    Obj,
    Webhook,
    fmt_time,
    parse_duration,
)
from greyrelease.kube.protocol import Kube
from greyrelease.reconcile.outbound import SecretError, describe, secret_data, secret_text

#: How much of an answer is read: a verdict needs a field, not a document.
MAX_ANSWER = 64 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True)
class Call:
    """One webhook's request, ready to send."""

    webhook: str
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    timeout: float


def _placeholders(release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus) -> dict[str, str | int]:
    meta = release.get("metadata") or {}
    held = status.held.digest if status.held else ""
    return {
        "namespace": meta.get("namespace", ""),
        "name": meta.get("name", ""),
        "app": spec.app_name or status.target_name,
        "track": "canary",
        # Follow mode: the template's digest (the canary's greyrelease.io/version label), as the queries'.
        "version": spec.target_version or status.restore.template or held,
        "batch": status.current_batch,
    }


def body(
    release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus, webhook: Webhook, now: datetime
) -> dict[str, Any]:
    """The JSON a webhook is sent: the webhook, the release, and its state when the call was due."""
    meta = release.get("metadata") or {}
    values = _placeholders(release, spec, status)
    doc: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GreyReleaseWebhookCall",
        "webhook": {"name": webhook.name, "at": webhook.at, "kind": webhook.kind},
        "time": fmt_time(now),
        "release": {
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "generation": meta.get("generation", 0),
        },
        "phase": status.phase.value if status.phase else "",
        "batch": {"current": status.current_batch, "total": status.total_batches},
        "weight": status.canary_weight,
        "versions": {"stable": status.stable_version, "target": status.target_version or str(values["version"])},
    }
    if spec.follows:
        doc["template"] = str(values["version"])
    return doc


class Webhooks:
    """Calls the webhooks of releases (one instance serves every release; it keeps nothing between calls)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def request(
        self, release: Obj, spec: GreyReleaseSpec, status: GreyReleaseStatus, webhook: Webhook, now: datetime
    ) -> Call:
        """The request for ``webhook``; SecretError when a credential it names cannot be read."""
        namespace = (release.get("metadata") or {}).get("namespace", "")
        values = {k: quote(str(v), safe="") for k, v in _placeholders(release, spec, status).items()}
        headers = {"User-Agent": "greyrelease", "Accept": "application/json"}
        if webhook.headers_secret is not None:
            headers.update(secret_data(self.kube, namespace, webhook.headers_secret.name))
        if webhook.bearer_token_secret is not None:
            ref = webhook.bearer_token_secret
            headers["Authorization"] = f"Bearer {secret_text(self.kube, namespace, ref.name, ref.key)}"
        data = None
        if webhook.method == "POST":
            headers["Content-Type"] = "application/json"
            data = json.dumps(body(release, spec, status, webhook, now)).encode()
        return Call(
            webhook=webhook.name,
            method=webhook.method,
            url=render_query(webhook.url, **values),
            headers=headers,
            body=data,
            timeout=parse_duration(webhook.timeout),
        )

    def answers(
        self,
        release: Obj,
        spec: GreyReleaseSpec,
        status: GreyReleaseStatus,
        webhooks: tuple[Webhook, ...],
        now: datetime,
    ) -> tuple[Answer, ...]:
        """Call ``webhooks`` side by side; one answer each, in their order (an error is an answer too)."""
        ready: dict[str, Answer] = {}
        calls: list[Call] = []
        for webhook in webhooks:
            try:
                calls.append(self.request(release, spec, status, webhook, now))
            except SecretError as err:
                ready[webhook.name] = Answer(webhook.name, error=str(err))
        if calls:
            for answer in run(call_all(calls)):
                ready[answer.webhook] = answer
        return tuple(ready[w.name] for w in webhooks)


async def call_all(calls: list[Call]) -> list[Answer]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(call(session, c) for c in calls)))


async def call(session: aiohttp.ClientSession, c: Call) -> Answer:
    """One call, bounded by its timeout from start to end; whatever goes wrong is an error answer."""
    try:
        async with asyncio.timeout(c.timeout):
            async with session.request(
                c.method,
                URL(c.url, encoded=True),  # as rendered: its values were percent-encoded, and stay so
                data=c.body,
                headers=c.headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=c.timeout),
            ) as resp:
                raw = b""
                while len(raw) < MAX_ANSWER:  # a read gives what has come so far: read on to the end or the limit
                    chunk = await resp.content.read(MAX_ANSWER - len(raw))
                    if not chunk:
                        break
                    raw += chunk
                return Answer(c.webhook, code=resp.status, body=raw.decode("utf-8", errors="replace"))
    except Exception as err:  # aiohttp's and the socket's errors, and the timeout: all an error answer
        return Answer(c.webhook, error=describe(err, c.timeout, "calling"))


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to its end on a loop of its own (on a thread of its own when this thread runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
