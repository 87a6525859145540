"""The admission webhook's HTTPS server, run by every replica (``greyrelease run --webhook-port``).

Every replica answers, the leader, a shard owner and a standby alike: the API server sends each review to
any pod behind the Service, and the answer (:func:`greyrelease.admission.admit`) needs nothing but the
review. The server starts before the replica waits for its Lease.

Plain aiohttp (already a dependency) rather than ``kopf.WebhookServer``: that server routes to kopf's
registered handlers and their request types, restarts itself (dropping connections) when its certificate
files change, and makes its self-signed certificates with ``certbuilder``/``oscrypto`` (kopf's ``dev``
extra), which does not install on current OpenSSL. Here the live TLS context loads a renewed pair in
place, after checking it in a context of its own, so open connections go on and a half-written pair is
never served.

Where the certificate comes from, one of three:

- ``--webhook-cert-dir DIR``: ``DIR/tls.crt`` and ``DIR/tls.key``, read again when they change (a
  mounted Secret, cert-manager). The caBundle is someone else's (cert-manager's CA injector).
- ``--webhook-service NAME`` (the install: config/webhook): the Secret ``NAME-tls`` in the controller's
  namespace holds a CA and a serving certificate for ``NAME.<namespace>.svc``. The first replica to start
  makes it (create; a 409 means another replica was first, and its Secret is read), every replica
  serves it, renews the serving certificate with the same CA when a third of its year is left, and puts
  the CA into the caBundle of the MutatingWebhookConfiguration ``greyrelease-hold`` when it differs.
  Read again every minute, so a Secret deleted to rotate the CA is made anew and served by all.
- neither (``greyrelease run`` from a terminal, against a cluster whose API server runs on this host,
  such as the local one of e2e/): a CA and a certificate for 127.0.0.1 made in memory, served on
  127.0.0.1, and the configuration registered (created or replaced) with ``url:
  https://127.0.0.1:PORT/hold`` and that CA. It is **left registered on exit**: a controller that is
  killed cannot remove it either, and with ``failurePolicy: Fail`` a stopped controller then refuses
  the template changes of enrolled Deployments (naming the webhook) rather than letting them roll
  unheld; scaling, labels and pods are not affected. The next start registers its own port and CA.
  ``kubectl delete mutatingwebhookconfiguration greyrelease-hold`` removes it. Refused in a pod.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import logging
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import Counter, Histogram

from greyrelease.admission import (
    CONFIGURATION_NAME,
    PATH,
    WEBHOOK_NAME,
    admit,
    configuration,
    url_client_config,
)

log = logging.getLogger("greyrelease.webhook")

REVIEWS = Counter(
    "greyrelease_admission_reviews_total",
    "Admission reviews answered, by decision (hold, rehold, release, allow) and whether a dry run.",
    ["decision", "dry_run"],
)
REVIEW_SECONDS = Histogram(
    "greyrelease_admission_review_duration_seconds",
    "Time to answer one admission review (read, decide, write), in the server.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)

CERT_FILE, KEY_FILE = "tls.crt", "tls.key"
#: How often the certificate files are looked at (their mtime, size and inode).
FILE_CHECK_SECONDS = 5.0
#: How often the Secret (``--webhook-service``) is read again and the caBundle checked.
SECRET_CHECK_SECONDS = 60.0
CA_DAYS, SERVING_DAYS = 3650, 365
#: A review carries the old and the new object (up to about 1.5 MB each).
MAX_BODY = 8 * 1024 * 1024
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


# --- certificates --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    cert: bytes  # PEM
    key: bytes  # PEM (PKCS#8)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def make_ca(common_name: str, now: dt.datetime, days: int = CA_DAYS) -> Pair:
    """A self-signed CA (ECDSA P-256)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def make_serving(ca: Pair, hosts: list[str], now: dt.datetime, days: int = SERVING_DAYS) -> Pair:
    """A serving certificate signed by ``ca`` for ``hosts`` (DNS names or IP addresses)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = _new_key()
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def due_for_renewal(cert_pem: bytes, now: dt.datetime) -> bool:
    """Whether less than a third of the certificate's lifetime is left (or it is unreadable)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) / 3


def service_hosts(service: str, namespace: str) -> list[str]:
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local", f"{service}.{namespace}", service]


# --- the live TLS context and the certificate files ------------------------------------------------------


class TLS:
    """The server's TLS context. A new pair is first loaded into a context of its own: only a pair that
    loads there replaces the live one, so a pair caught half-written is never served. Connections
    already open keep the certificate they started with."""

    def __init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loads = 0

    def load_files(self, cert: Path, key: Path) -> None:
        """Raises OSError or ssl.SSLError, the live context untouched, when the pair does not load."""
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        self.context.load_cert_chain(cert, key)
        self.loads += 1

    def load_pair(self, pair: Pair) -> None:
        """Load a pair held in memory. The ssl module reads certificates from files only: they are written
        to a private directory and removed at once, so no key stays on disk."""
        tmp = Path(tempfile.mkdtemp(prefix="greyrelease-webhook-"))
        try:
            for name, data in ((KEY_FILE, pair.key), (CERT_FILE, pair.cert)):
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            self.load_files(tmp / CERT_FILE, tmp / KEY_FILE)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class WatchedFiles:
    """``tls.crt`` and ``tls.key`` in a directory (``--webhook-cert-dir``), loaded into ``tls`` again
    whenever their mtime, size or inode change (a Secret volume swaps both at once)."""

    def __init__(self, directory: Path, tls: TLS) -> None:
        self.cert, self.key, self.tls = directory / CERT_FILE, directory / KEY_FILE, tls
        self._loaded: tuple[int, ...] | None = None
        self._refused: tuple[int, ...] | None = None
        if not self.reload():
            raise ValueError(f"no usable certificate in {directory} ({CERT_FILE} and {KEY_FILE})")

    def _stamp(self) -> tuple[int, ...]:
        a, b = os.stat(self.cert), os.stat(self.key)
        return (a.st_mtime_ns, a.st_size, a.st_ino, b.st_mtime_ns, b.st_size, b.st_ino)

    def reload(self) -> bool:
        """Load the pair when it changed and loads; whether it did."""
        try:
            stamp = self._stamp()
        except OSError as err:
            if self._refused != ():
                log.warning(f"webhook certificate: {err}")
                self._refused = ()
            return False
        if stamp in (self._loaded, self._refused):
            return False
        try:
            self.tls.load_files(self.cert, self.key)
        except (OSError, ssl.SSLError) as err:
            log.warning(f"webhook certificate {self.cert} not loaded (the one served is kept): {err}")
            self._refused = stamp
            return False
        if self._loaded is not None:
            log.info(f"webhook certificate reloaded from {self.cert}")
        self._loaded, self._refused = stamp, None
        return True


# --- the server ----------------------------------------------------------------------------------------


async def _hold(request: web.Request) -> web.Response:
    started = time.perf_counter()
    try:
        review = orjson.loads(await request.read())
        answer = admit(review)
    except ValueError as err:  # not JSON, or not an AdmissionReview
        return web.json_response({"message": f"not an admission.k8s.io/v1 AdmissionReview: {err}"}, status=400)
    req = review["request"]
    response = answer["response"]
    decision = response.get("auditAnnotations", {}).get("decision", "allow")
    dry_run = bool(req.get("dryRun"))
    REVIEWS.labels(decision, str(dry_run).lower()).inc()
    body = orjson.dumps(answer)
    elapsed = time.perf_counter() - started
    REVIEW_SECONDS.observe(elapsed)
    who = f"{req.get('namespace')}/{req.get('name')}"
    if decision != "allow":
        user = (req.get("userInfo") or {}).get("username")
        manager = (req.get("options") or {}).get("fieldManager")
        log.info(
            f"admission {decision}: Deployment {who} by {user} (field manager {manager})"
            f"{' (dry run)' if dry_run else ''} in {elapsed * 1000:.1f} ms"
        )
    else:
        log.debug(f"admission allow: Deployment {who} in {elapsed * 1000:.1f} ms")
    return web.Response(body=body, content_type="application/json")


def application() -> web.Application:
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(PATH, _hold)
    return app


# --- the Kubernetes side: the Secret, the caBundle, the registration --------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text or "")


class SecretCerts:
    """The CA and the serving certificate kept in the Secret ``<service>-tls`` (``--webhook-service``)."""

    def __init__(self, kube: Any, service: str, namespace: str, clock: Callable[[], dt.datetime]) -> None:
        self.kube, self.service, self.namespace, self.clock = kube, service, namespace, clock
        self.name = f"{service}-tls"
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{self.name}"

    def _body(self, ca: Pair, serving: Pair, resource_version: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/name": "greyrelease", "app.kubernetes.io/component": "webhook"},
        }
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta,
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": _b64(serving.cert),
                "tls.key": _b64(serving.key),
                "ca.crt": _b64(ca.cert),
                "ca.key": _b64(ca.key),
            },
        }

    def ensure(self) -> tuple[bytes, Pair]:
        """(the CA's PEM, the serving pair): read, made when absent, renewed when due. Idempotent across
        replicas: a create or an update that loses the race (409) is followed by a read."""
        from greyrelease.kube.client import Conflict, NotFound

        for _ in range(5):
            try:
                secret = self.kube.request("GET", self.path)
            except NotFound:
                now = self.clock()
                ca = make_ca(f"greyrelease-webhook-ca ({self.namespace})", now)
                serving = make_serving(ca, service_hosts(self.service, self.namespace), now)
                try:
                    self.kube.request(
                        "POST", f"/api/v1/namespaces/{self.namespace}/secrets", body=self._body(ca, serving)
                    )
                    log.info(
                        f"webhook certificate: made the CA and the certificate in Secret {self.namespace}/{self.name}"
                    )
                    return ca.cert, serving
                except Conflict:
                    continue  # another replica made it first
            data = secret.get("data") or {}
            ca = Pair(_unb64(data.get("ca.crt")), _unb64(data.get("ca.key")))
            serving = Pair(_unb64(data.get("tls.crt")), _unb64(data.get("tls.key")))
            if not due_for_renewal(serving.cert, self.clock()):
                return ca.cert, serving
            serving = make_serving(ca, service_hosts(self.service, self.namespace), self.clock())
            try:
                self.kube.request("PUT", self.path, body=self._body(ca, serving, secret["metadata"]["resourceVersion"]))
                log.info(f"webhook certificate: renewed in Secret {self.namespace}/{self.name}")
                return ca.cert, serving
            except Conflict:
                continue
        raise RuntimeError(f"Secret {self.namespace}/{self.name} kept changing under us")


def set_ca_bundle(kube: Any, ca_pem: bytes, name: str = CONFIGURATION_NAME) -> bool | None:
    """Put ``ca_pem`` into the caBundle of our webhook in the configuration ``name``; whether it changed
    it, None when the configuration is not there."""
    from greyrelease.kube.client import Conflict, NotFound

    for _ in range(5):
        try:
            current = kube.request("GET", f"{CONFIGURATIONS}/{name}")
        except NotFound:
            return None
        changed = False
        for hook in current.get("webhooks") or []:
            if hook.get("name") == WEBHOOK_NAME and hook.get("clientConfig", {}).get("caBundle") != _b64(ca_pem):
                hook.setdefault("clientConfig", {})["caBundle"] = _b64(ca_pem)
                changed = True
        if not changed:
            return False
        try:
            kube.request("PUT", f"{CONFIGURATIONS}/{name}", body=current)
            return True
        except Conflict:
            continue
    raise RuntimeError(f"MutatingWebhookConfiguration {name} kept changing under us")


def register_url(kube: Any, url: str, ca_pem: bytes) -> None:
    """Create the configuration pointing at ``url``, or replace the one there."""
    from greyrelease.kube.client import Conflict

    body = configuration(url_client_config(url, ca_pem))
    for _ in range(5):
        try:
            kube.request("POST", CONFIGURATIONS, body=body)
            return
        except Conflict:
            pass
        try:
            current = kube.request("GET", f"{CONFIGURATIONS}/{CONFIGURATION_NAME}")
        except Exception:
            continue
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        try:
            kube.request("PUT", f"{CONFIGURATIONS}/{CONFIGURATION_NAME}", body=body)
            return
        except Conflict:
            body["metadata"].pop("resourceVersion", None)
    raise RuntimeError(f"MutatingWebhookConfiguration {CONFIGURATION_NAME} kept changing under us")


# --- the whole ---------------------------------------------------------------------------------------------


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Webhook:
    """The running server and its background work; :meth:`stop` ends both."""

    def __init__(self, runner: web.AppRunner, tls: TLS, tasks: list[asyncio.Task[None]]) -> None:
        self.runner, self.tls, self.tasks = runner, tls, tasks

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runner.cleanup()


async def _every(seconds: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await work()
        except Exception as err:  # the API server away, a Secret being replaced: next time
            log.warning(f"{what}: {err}")


async def start(
    port: int,
    *,
    cert_dir: str | None = None,
    service: str | None = None,
    namespace: str = "greyrelease-system",
    kube: Any = None,
    clock: Callable[[], dt.datetime] = _utcnow,
) -> Webhook:
    """Serve the webhook on ``port`` until :meth:`Webhook.stop` (see the module docstring for the modes).
    ``kube`` (a KubeClient) is made from the environment when needed and not given."""
    if cert_dir and service:
        raise ValueError("--webhook-cert-dir and --webhook-service are two ways to one certificate: pass one")
    if not cert_dir and not service and os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ValueError("in a pod, pass --webhook-service (the install's Service) or --webhook-cert-dir")
    if (service or not cert_dir) and kube is None:
        from greyrelease.kube.client import KubeClient

        kube = KubeClient.from_environment()
    tls = TLS()
    tasks: list[asyncio.Task[None]] = []
    host = "0.0.0.0"
    local_ca: bytes | None = None
    if cert_dir:
        files = WatchedFiles(Path(cert_dir), tls)

        async def check_files() -> None:
            files.reload()

        tasks.append(asyncio.create_task(_every(FILE_CHECK_SECONDS, check_files, "webhook certificate")))
    elif service:
        secrets = SecretCerts(kube, service, namespace, clock)
        while True:
            try:
                ca_pem, pair = await asyncio.to_thread(secrets.ensure)
                break
            except Exception as err:
                log.warning(f"webhook certificate: Secret {namespace}/{secrets.name}: {err}; again in 5 s")
                await asyncio.sleep(5.0)
        tls.load_pair(pair)
        served = {"ca": ca_pem, "cert": pair.cert}

        async def keep_bundle() -> None:
            changed = await asyncio.to_thread(set_ca_bundle, kube, served["ca"])
            if changed is None:
                log.warning(
                    f"MutatingWebhookConfiguration {CONFIGURATION_NAME} not found: install config/webhook "
                    "(kubectl apply -k config/default); until then no Deployment is held"
                )
            elif changed:
                log.info(f"MutatingWebhookConfiguration {CONFIGURATION_NAME}: caBundle set to the CA of the Secret")

        async def keep_secret() -> None:
            ca_now, pair_now = await asyncio.to_thread(secrets.ensure)
            if pair_now.cert != served["cert"]:
                tls.load_pair(pair_now)
                served["cert"] = pair_now.cert
                log.info(f"webhook certificate: the one in Secret {namespace}/{secrets.name} served now")
            served["ca"] = ca_now
            await keep_bundle()

        try:
            await keep_bundle()
        except Exception as err:
            log.warning(f"MutatingWebhookConfiguration {CONFIGURATION_NAME}: {err}")
        tasks.append(asyncio.create_task(_every(SECRET_CHECK_SECONDS, keep_secret, "webhook certificate")))
    else:
        host = "127.0.0.1"
        now = clock()
        ca = make_ca("greyrelease-webhook-ca (local)", now)
        tls.load_pair(make_serving(ca, ["127.0.0.1", "localhost"], now))
        local_ca = ca.cert
    runner = web.AppRunner(application(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=tls.context, backlog=128).start()
        log.info(f"admission webhook serving https://{host}:{port}{PATH}")
        if local_ca is not None:
            url = f"https://127.0.0.1:{port}"
            await asyncio.to_thread(register_url, kube, url, local_ca)
            log.info(
                f"MutatingWebhookConfiguration {CONFIGURATION_NAME} registered with url {url}{PATH}; it stays "
                "registered when this process stops"
            )
    except BaseException:
        for task in tasks:
            task.cancel()
        await runner.cleanup()
        raise
    return Webhook(runner, tls, tasks)
