"""What the controller's own HTTP calls share (the notifications' POSTs, the webhook checks): reading a
value from a Secret, and telling why a call failed without the URL, which may be a credential."""

from __future__ import annotations

import base64
import binascii
import os

import aiohttp

from greyrelease.kube.protocol import ApiError, Kube, path


class SecretError(Exception):
    """A Secret's value that cannot be had, in words fit for an Event (the Secret by name, never a value)."""


def _raw(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    where = f"Secret {namespace}/{name}"
    try:
        secret = kube.get(path("", "v1", "secrets", namespace, name))
    except ApiError as err:
        raise SecretError(f"{where} could not be read: {err.status} {err.reason}") from err
    if secret is None:
        raise SecretError(f"{where} not found")
    return dict(secret.get("data") or {})


def _decoded(namespace: str, name: str, key: str, raw: str) -> str:
    try:
        return base64.b64decode(raw, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError, TypeError) as err:
        raise SecretError(f"Secret {namespace}/{name}: key {key!r} is not base64 text") from err


def secret_data(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    """Every key of a Secret, decoded as text."""
    return {key: _decoded(namespace, name, key, raw) for key, raw in _raw(kube, namespace, name).items()}


def secret_text(kube: Kube, namespace: str, name: str, key: str) -> str:
    """One key of a Secret, decoded as text."""
    raw = _raw(kube, namespace, name).get(key)
    if raw is None:
        raise SecretError(f"Secret {namespace}/{name} has no key {key!r}")
    return _decoded(namespace, name, key, raw)


def describe(err: BaseException, timeout: float, doing: str = "posting") -> str:
    """Why an aiohttp call failed, without the URL: its errors' own texts name the host, the port and
    sometimes the whole URL."""
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        return f"could not connect within {timeout:g}s"
    if isinstance(err, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(err, aiohttp.ClientConnectorError):
        # The error number's text only: the error's own text names the host and port.
        code = err.os_error.errno
        return "could not connect" + (f": {os.strerror(code)}" if code else "")
    # Only the kind of the others: their text may quote the URL, a credential.
    return f"{type(err).__name__} while {doing}"
