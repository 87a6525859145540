"""The webhook's server (greyrelease/runtime/webhook.py): certificates, TLS reloads, the HTTPS answer, and
what it keeps in the cluster (the Secret, the caBundle, the registration) against an in-memory API."""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime as dt
import json
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest
from greyrelease.admission import CONFIGURATION_NAME, WEBHOOK_NAME, configuration, service_client_config
from greyrelease.kube.client import Conflict, NotFound
from greyrelease.runtime import webhook as wh

from tests.admission.test_hold import V2, deployment, review

NOW = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
CONFIG_PATH = f"{wh.CONFIGURATIONS}/{CONFIGURATION_NAME}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write(directory: Path, pair: wh.Pair) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "tls.key").write_bytes(pair.key)
    (directory / "tls.crt").write_bytes(pair.cert)


def client_context(ca: bytes) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.decode())
    return ctx


async def post(port: int, ca: bytes, body: bytes, host: str = "127.0.0.1") -> tuple[int, dict[str, Any], bytes]:
    """One HTTPS request on a new connection, verified against ``ca`` for ``host``: (status, the JSON
    answer, the DER certificate served)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca), server_hostname=host)
    served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.write(
        b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    try:
        answer = json.loads(payload)
    except ValueError:
        answer = {}
    return status, answer, served


class FakeKube:
    """The few REST calls of the webhook's Kubernetes side, in memory, with resourceVersions."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.calls: list[tuple[str, str]] = []
        self.conflicts_on: set[tuple[str, str]] = set()

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def request(self, method: str, path: str, *, body: Any = None, query: Any = None, content_type: Any = None) -> Any:
        self.calls.append((method, path))
        if (method, path) in self.conflicts_on:
            self.conflicts_on.discard((method, path))
            raise Conflict(409, "Conflict", "the object has been modified")
        if method == "GET":
            if path not in self.objects:
                raise NotFound(404, "NotFound", path)
            return copy.deepcopy(self.objects[path])
        if method == "POST":
            full = f"{path}/{body['metadata']['name']}"
            if full in self.objects:
                raise Conflict(409, "AlreadyExists", full)
            self.objects[full] = self._stamp(body)
            return copy.deepcopy(self.objects[full])
        if method == "PUT":
            current = self.objects.get(path)
            if current is None:
                raise NotFound(404, "NotFound", path)
            rv = body["metadata"].get("resourceVersion")
            if rv and rv != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", path)
            self.objects[path] = self._stamp(body)
            return copy.deepcopy(self.objects[path])
        raise AssertionError(method)


# --- certificates ----------------------------------------------------------------------------------------


def test_a_serving_certificate_verifies_against_its_ca() -> None:
    from cryptography import x509

    ca = wh.make_ca("test ca", NOW)
    serving = wh.make_serving(ca, ["greyrelease-webhook.greyrelease-system.svc", "127.0.0.1"], NOW)
    cert = x509.load_pem_x509_certificate(serving.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["greyrelease-webhook.greyrelease-system.svc"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert not wh.due_for_renewal(serving.cert, NOW + dt.timedelta(days=200))
    assert wh.due_for_renewal(serving.cert, NOW + dt.timedelta(days=250))
    assert wh.due_for_renewal(b"not a certificate", NOW)


# --- the server over HTTPS ---------------------------------------------------------------------------------


def test_it_answers_over_https_and_reloads_a_changed_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wh, "FILE_CHECK_SECONDS", 0.05)
    ca = wh.make_ca("test ca", dt.datetime.now(dt.UTC))
    first = wh.make_serving(ca, ["127.0.0.1"], dt.datetime.now(dt.UTC))
    second = wh.make_serving(ca, ["127.0.0.1"], dt.datetime.now(dt.UTC))
    certs = tmp_path / "certs"
    write(certs, first)
    port = free_port()
    body = json.dumps(review(deployment(), deployment(V2))).encode()

    async def scenario() -> None:
        hook = await wh.start(port, cert_dir=str(certs))
        try:
            status, answer, served = await post(port, ca.cert, body)
            assert status == 200 and answer["response"]["allowed"] is True
            assert answer["response"]["patchType"] == "JSONPatch"
            assert served == ssl.PEM_cert_to_DER_cert(first.cert.decode())

            # A pair caught half-written (the new key, the old certificate) is not served.
            (certs / "tls.key").write_bytes(second.key)
            await asyncio.sleep(0.3)
            assert (await post(port, ca.cert, body))[2] == ssl.PEM_cert_to_DER_cert(first.cert.decode())
            # Both written: the next connection gets the new certificate, without a restart.
            (certs / "tls.crt").write_bytes(second.cert)
            await asyncio.sleep(0.3)
            assert (await post(port, ca.cert, body))[2] == ssl.PEM_cert_to_DER_cert(second.cert.decode())

            status, answer, _ = await post(port, ca.cert, b"{not json")
            assert status == 400 and "AdmissionReview" in answer["message"]
            status, _, _ = await post(port, ca.cert, json.dumps({"apiVersion": "v1"}).encode())
            assert status == 400
        finally:
            await hook.stop()

    asyncio.run(scenario())


def test_the_cert_dir_must_hold_a_pair(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no usable certificate"):
        asyncio.run(wh.start(free_port(), cert_dir=str(tmp_path)))


def test_one_way_to_a_certificate(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass one"):
        asyncio.run(wh.start(free_port(), cert_dir=str(tmp_path), service="svc", kube=FakeKube()))


def test_no_local_registration_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with pytest.raises(ValueError, match="in a pod"):
        asyncio.run(wh.start(free_port(), kube=FakeKube()))


# --- from a terminal: 127.0.0.1 and a registration ---------------------------------------------------------


def test_from_a_terminal_it_registers_its_url_and_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = FakeKube()
    # A configuration left by an earlier run, at another port: replaced.
    old = configuration({"url": "https://127.0.0.1:1/hold", "caBundle": "eA=="})
    kube.objects[CONFIG_PATH] = kube._stamp(old)
    port = free_port()

    async def scenario() -> None:
        hook = await wh.start(port, kube=kube)
        try:
            [registered] = kube.objects[CONFIG_PATH]["webhooks"]
            assert registered["name"] == WEBHOOK_NAME
            assert registered["clientConfig"]["url"] == f"https://127.0.0.1:{port}/hold"
            ca = base64.b64decode(registered["clientConfig"]["caBundle"])
            body = json.dumps(review(deployment(), deployment(V2))).encode()
            status, answer, _ = await post(port, ca, body)  # verified with the registered caBundle
            assert status == 200 and answer["response"]["auditAnnotations"]["decision"] == "hold"
        finally:
            await hook.stop()
        # Left registered on exit.
        assert CONFIG_PATH in kube.objects

    asyncio.run(scenario())


# --- the install: the Secret and the caBundle --------------------------------------------------------------


def installed(kube: FakeKube) -> None:
    kube.objects[CONFIG_PATH] = kube._stamp(configuration(service_client_config()))


def test_the_first_replica_makes_the_secret_the_others_read_it() -> None:
    kube = FakeKube()
    a = wh.SecretCerts(kube, "greyrelease-webhook", "greyrelease-system", lambda: NOW)
    ca, pair = a.ensure()
    secret = kube.objects["/api/v1/namespaces/greyrelease-system/secrets/greyrelease-webhook-tls"]
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    b = wh.SecretCerts(kube, "greyrelease-webhook", "greyrelease-system", lambda: NOW)
    assert b.ensure() == (ca, pair)


def test_a_replica_that_loses_the_race_to_create_reads_the_winner() -> None:
    elsewhere = FakeKube()
    winner = wh.SecretCerts(elsewhere, "svc", "ns", lambda: NOW).ensure()
    secret_path = "/api/v1/namespaces/ns/secrets/svc-tls"

    class Racing(FakeKube):
        def request(self, method: str, path: str, **kw: Any) -> Any:
            if method == "POST" and secret_path not in self.objects:
                # The other replica's create lands between our GET (404) and our POST.
                self.objects[secret_path] = self._stamp(elsewhere.objects[secret_path])
            return super().request(method, path, **kw)

    kube = Racing()
    assert wh.SecretCerts(kube, "svc", "ns", lambda: NOW).ensure() == winner


def test_a_serving_certificate_is_renewed_with_the_same_ca() -> None:
    kube = FakeKube()
    ca, pair = wh.SecretCerts(kube, "svc", "ns", lambda: NOW).ensure()
    later = NOW + dt.timedelta(days=300)
    ca2, pair2 = wh.SecretCerts(kube, "svc", "ns", lambda: later).ensure()
    assert ca2 == ca and pair2 != pair and not wh.due_for_renewal(pair2.cert, later)


def test_the_ca_bundle_is_kept_in_step() -> None:
    kube = FakeKube()
    assert wh.set_ca_bundle(kube, b"CA") is None  # not installed
    installed(kube)
    assert wh.set_ca_bundle(kube, b"CA") is True
    assert kube.objects[CONFIG_PATH]["webhooks"][0]["clientConfig"]["caBundle"] == base64.b64encode(b"CA").decode()
    writes = len([c for c in kube.calls if c[0] == "PUT"])
    assert wh.set_ca_bundle(kube, b"CA") is False  # no write when it is already so
    assert len([c for c in kube.calls if c[0] == "PUT"]) == writes
    kube.conflicts_on.add(("PUT", CONFIG_PATH))  # another replica wrote in between: read again
    assert wh.set_ca_bundle(kube, b"CA2") is True


def test_the_installed_mode_serves_the_secret_and_sets_the_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    installed(kube)
    port = free_port()

    async def scenario() -> None:
        hook = await wh.start(port, service="greyrelease-webhook", namespace="greyrelease-system", kube=kube)
        try:
            bundle = kube.objects[CONFIG_PATH]["webhooks"][0]["clientConfig"]["caBundle"]
            ca = base64.b64decode(bundle)
            body = json.dumps(review(deployment(), deployment(V2))).encode()
            # Verified as the API server does: the Service's DNS name, against the caBundle.
            status, _, _ = await post(port, ca, body, host="greyrelease-webhook.greyrelease-system.svc")
            assert status == 200
        finally:
            await hook.stop()

    asyncio.run(scenario())
