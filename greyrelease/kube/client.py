"""The real :class:`~greyrelease.kube.protocol.Kube`: a thin Kubernetes REST client over plain dicts.

The objects the controller handles are read and written as the JSON the API server speaks (the same shape
as the YAML users write), with explicit patch types and typed errors. Credentials come from the
``kubernetes`` package's loaders (kubeconfig or in-cluster), so every auth method it supports works here.
Every request is retried as :mod:`greyrelease.kube.retry` says.

**The HTTP stacks of the process, and why three.**

- *urllib3*, here: every call of the controller's own to the API server (the passes' reads and writes,
  the reflectors' lists and watches of Deployments, Services and GreyReleasePolicies, the Leases, the
  webhook's Secret and configuration), ``greyrelease plan`` and ``kubectl gr``. From the ``kubernetes``
  package only its configuration loaders are used, not its ``ApiClient``, although that client sends
  through a urllib3 pool too: the calls here take and give the JSON as it is, and parse it with orjson
  (2.5 times as fast as ``json.loads`` on a Deployment; with the stores holding JSON rather than dicts it
  cut the controller's CPU and peak memory in ``make bench``: bench/README.md, "Responses parsed with
  orjson"), where ``ApiClient`` parses with ``json.loads`` into its generated models or
  hands the raw answer back. The pool keeps a connection per pass thread (a request beyond them would
  open, then drop, a TLS connection of its own). The calls are synchronous because a pass is: it runs on
  one of 128 threads (:mod:`greyrelease.runtime.pool`).
- *aiohttp*: kopf's own client (its watch of GreyReleases and of CRDs, its finalizer and progress
  annotations; its retries are its own, ``settings.networking.error_backoffs``), which kopf does not let
  one replace; and, as it is there and runs on kopf's event loop, the two servers of the process,
  ``/healthz`` and ``/readyz`` (:mod:`greyrelease.runtime.health`) and the admission webhook
  (:mod:`greyrelease.runtime.webhook`). Why the Deployments and Services are not watched through kopf as
  well: measured, see :class:`~greyrelease.kube.cache.Reflector` and bench/README.md, "Reflectors rather
  than kopf's watches".
- *requests*: prometheus-api-client's, for the metric gates' Prometheus queries
  (:mod:`greyrelease.reconcile.prometheus`), another server than the API server, with its retries off and
  a short tenacity retry of its own. The code records no measurement for this choice; it is the client
  the gates were written with. (requests would stay installed without it: the ``kubernetes`` package
  depends on it.)

What one stack would take. The Prometheus queries onto urllib3 is the small step: one GET of
``/api/v1/query`` with a bearer token, the TLS verification switch and a timeout, its JSON read here, its
failures classified by :func:`greyrelease.kube.retry.transient`; it removes prometheus-api-client and what
only it pulls in (dateparser, regex, pytz, tzlocal), not requests. This client onto aiohttp would mean
either passes that are coroutines (the reconciler, the routers, the adapters, the cache and
``MemoryKube`` rewritten as async code) or every call of 128 threads handed to kopf's event loop, the
loop whose extra load the Reflector's measurement above shows in the abort latency. kopf onto urllib3
is not possible without forking kopf. Neither of the last two is worth it; none is done here.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import urlencode

import orjson
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from greyrelease.api.release import Obj
from greyrelease.kube.protocol import JSON_PATCH, MERGE, STRATEGIC, ApiError, Conflict, NotFound, PatchBody, Ref, path
from greyrelease.kube.retry import API, RetryPolicy

__all__ = [
    "JSON_PATCH",
    "MERGE",
    "STRATEGIC",
    "ApiError",
    "Conflict",
    "KubeClient",
    "NotFound",
    "Ref",
    "load_configuration",
    "path",
]


def load_configuration(kubeconfig: str | None = None) -> k8s_client.Configuration:
    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


class KubeClient:
    """GET/LIST/CREATE/PATCH/DELETE on API objects. Thread-safe (one connection pool).

    Every call takes a :class:`~greyrelease.kube.protocol.Ref`; a REST path as a string (``"/api/v1/pods"``)
    is taken too, and sent as it is (the test harness and the benchmarks build some of their own)."""

    #: Sent with every request; the API server's audit log tells the controller's writes by it.
    user_agent = "greyrelease"

    def __init__(
        self,
        cfg: k8s_client.Configuration,
        *,
        timeout: float = 15.0,
        connections: int = 128,
        retry: RetryPolicy = API,
    ) -> None:
        self._cfg = cfg
        self.retry = retry
        self.host = cfg.host.rstrip("/")
        # As many kept connections as threads use the client at once: a request beyond them would open
        # (and then drop) a TLS connection of its own.
        kwargs: dict[str, Any] = {"maxsize": connections, "timeout": urllib3.Timeout(total=timeout)}
        if self.host.startswith("https"):
            if cfg.verify_ssl:
                kwargs["cert_reqs"] = ssl.CERT_REQUIRED
                kwargs["ca_certs"] = cfg.ssl_ca_cert
            else:
                kwargs["cert_reqs"] = ssl.CERT_NONE
            if cfg.cert_file:
                kwargs["cert_file"] = cfg.cert_file
                kwargs["key_file"] = cfg.key_file
        self._pool = urllib3.PoolManager(**kwargs)
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, **kwargs: Any) -> KubeClient:
        return cls(load_configuration(kubeconfig), **kwargs)

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        with self._lock:
            if self._cfg.refresh_api_key_hook is not None:
                self._cfg.refresh_api_key_hook(self._cfg)
            token = self._cfg.get_api_key_with_prefix("authorization") or self._cfg.get_api_key_with_prefix(
                "BearerToken"
            )
        if token:
            headers["Authorization"] = token
        return headers

    def request(
        self,
        method: str,
        ref: Ref | str,
        *,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        """One request, retried by :attr:`retry` (:data:`~greyrelease.kube.retry.API`) when it fails in a
        way that says nothing about the request (a refused connection, 429, 5xx); the answer's JSON, or the
        API server's error as an :class:`ApiError` (:class:`NotFound`, :class:`Conflict`)."""
        target = str(ref)
        url = self.host + target + ("?" + urlencode(query) if query else "")
        # orjson: a status patch serialised in 1.5 us against 17.7 us by json.dumps (a succeeded release's).
        data = None if body is None else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        if data is not None and content_type is None:
            content_type = "application/json"
        return self.retry.call(lambda: self._send(method, url, data, content_type), f"{method} {target}")

    def _send(self, method: str, url: str, data: bytes | None, content_type: str | None) -> dict[str, Any]:
        resp = self._pool.request(method, url, body=data, headers=self._headers(content_type), retries=NO_RETRIES)
        payload = _payload(resp.data)
        if resp.status >= 400:
            raise _error(resp.status, payload, resp.headers.get("Retry-After"))
        return payload

    def watch(
        self,
        ref: Ref | str,
        *,
        resource_version: str | None,
        timeout_seconds: int = 290,
        query: dict[str, str] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The events of a watch of the collection ``ref`` from ``resource_version``, as they come, until
        the server ends the watch (after ``timeout_seconds``); ``query`` adds parameters (selectors)."""
        query = {**(query or {}), "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        if resource_version:
            query["resourceVersion"] = resource_version
        target = str(ref)
        url = self.host + target + "?" + urlencode(query)
        timeout = urllib3.Timeout(connect=10.0, read=timeout_seconds + 30.0)
        # The opening is retried as any request; a stream that breaks is the caller's to open again.
        resp = self.retry.call(lambda: self._open(url, timeout), f"WATCH {target}")
        try:
            pending = b""
            for chunk in resp.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield orjson.loads(line)
        finally:
            # A watch left half-read cannot serve another request: its connection is closed, not reused.
            resp.close()
            resp.release_conn()

    def _open(self, url: str, timeout: urllib3.Timeout) -> Any:
        resp = self._pool.request(
            "GET", url, headers=self._headers(), preload_content=False, timeout=timeout, retries=NO_RETRIES
        )
        if resp.status < 400:
            return resp
        try:
            data = resp.read()
        finally:
            resp.close()
            resp.release_conn()
        raise _error(resp.status, _payload(data), resp.headers.get("Retry-After"))

    def get(self, ref: Ref | str) -> dict[str, Any] | None:
        try:
            return self.request("GET", ref)
        except NotFound:
            return None

    def list(self, ref: Ref | str, *, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        return list(self.request("GET", ref, query=query).get("items") or [])

    def create(self, ref: Ref | str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", ref, body=body)

    def patch(
        self,
        ref: Ref | str,
        body: PatchBody,
        *,
        patch_type: str = MERGE,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        query = {"fieldManager": field_manager} if field_manager else {}
        if dry_run:
            query["dryRun"] = "All"
        return self.request("PATCH", ref, body=body, query=query or None, content_type=patch_type)

    def replace(self, ref: Ref | str, body: Obj) -> dict[str, Any]:
        return self.request("PUT", ref, body=body)

    def delete(self, ref: Ref | str, *, propagation: str = "Background") -> dict[str, Any] | None:
        """Delete; the API server's answer, None when it was already gone."""
        try:
            return self.request(
                "DELETE",
                ref,
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
        except NotFound:
            return None


#: urllib3's own retries are off (it tried a refused connection again three times at once, with no wait):
#: :attr:`KubeClient.retry` decides. Redirects are still followed, as before.
NO_RETRIES = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=3)


def _payload(data: bytes | None) -> dict[str, Any]:
    if not data:
        return {}
    try:
        # orjson: 2.5 times as fast as json.loads on a Deployment, and the keys of the objects it makes share
        # their strings (a dict key seen before is not a string of its own again).
        return cast(dict[str, Any], orjson.loads(data))
    except ValueError:
        return {"message": data.decode(errors="replace")}


def _error(status: int, payload: dict[str, Any], retry_after: str | None) -> ApiError:
    """The API server's error answer as an exception; ``Retry-After`` in seconds when it gave one."""
    error = {404: NotFound, 409: Conflict}.get(status, ApiError)
    wait = float(retry_after) if retry_after and retry_after.strip().isdigit() else None
    return error(status, str(payload.get("reason", "")), str(payload.get("message", "")), retry_after=wait)
