"""The throw-away PKI of a local cluster, made with the `openssl` command line tool.

ECDSA P-256 keys throughout: generating them takes milliseconds, which keeps a cold start fast.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

VALID_DAYS = 30


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: KeyPair
    apiserver: KeyPair  # serving certificate of kube-apiserver
    sa_key: Path  # service-account token signing key (private)
    sa_pub: Path  # ... and its public half, for token verification
    clients: dict[str, KeyPair]  # client certificates by component name


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise RuntimeError("the `openssl` command is needed to create the local cluster's certificates")
    subprocess.run([exe, *args], check=True, capture_output=True, text=True)


def _ec_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def _signed(ca: KeyPair, dest: Path, name: str, subject: str, extensions: list[str]) -> KeyPair:
    key, cert = dest / f"{name}.key", dest / f"{name}.crt"
    _ec_key(key)
    ext_args = [arg for ext in extensions for arg in ("-addext", ext)]
    _openssl(
        "req",
        "-new",
        "-x509",
        "-key",
        str(key),
        "-out",
        str(cert),
        "-days",
        str(VALID_DAYS),
        "-subj",
        subject,
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        *ext_args,
    )
    return KeyPair(cert=cert, key=key)


def create_pki(dest: Path, clients: dict[str, tuple[str, str | None]], service_ip: str) -> Pki:
    """Creates a CA, the API server's serving certificate, a service-account key pair and one client
    certificate per entry of `clients` (name -> (common name = user, organisation = group or None))."""
    dest.mkdir(parents=True, exist_ok=True)
    ca = KeyPair(cert=dest / "ca.crt", key=dest / "ca.key")
    _ec_key(ca.key)
    _openssl(
        "req",
        "-new",
        "-x509",
        "-key",
        str(ca.key),
        "-out",
        str(ca.cert),
        "-days",
        str(VALID_DAYS),
        "-subj",
        "/CN=greyrelease-e2e-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    sans = ",".join(
        [
            "IP:127.0.0.1",
            f"IP:{service_ip}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    apiserver = _signed(
        ca,
        dest,
        "apiserver",
        "/CN=kube-apiserver",
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature",
            "extendedKeyUsage=serverAuth",
            f"subjectAltName={sans}",
        ],
    )
    issued: dict[str, KeyPair] = {}
    for name, (user, group) in clients.items():
        subject = f"/CN={user}" + (f"/O={group}" if group else "")
        issued[name] = _signed(
            ca,
            dest,
            f"client-{name}",
            subject,
            ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature", "extendedKeyUsage=clientAuth"],
        )
    sa_key, sa_pub = dest / "sa.key", dest / "sa.pub"
    _ec_key(sa_key)
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Pki(ca=ca, apiserver=apiserver, sa_key=sa_key, sa_pub=sa_pub, clients=issued)


def create_ca(dest: Path, common_name: str) -> KeyPair:
    """A CA of its own (an admission webhook's, say), apart from the cluster's."""
    dest.mkdir(parents=True, exist_ok=True)
    ca = KeyPair(cert=dest / "ca.crt", key=dest / "ca.key")
    _ec_key(ca.key)
    _openssl(
        "req",
        "-new",
        "-x509",
        "-key",
        str(ca.key),
        "-out",
        str(ca.cert),
        "-days",
        str(VALID_DAYS),
        "-subj",
        f"/CN={common_name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )
    return ca


def serving_pair(ca: KeyPair, dest: Path, name: str, hosts: list[str]) -> KeyPair:
    """A serving certificate signed by `ca` for `hosts` (IP addresses and DNS names), as `dest/name.crt`
    and `dest/name.key`: e.g. an admission webhook's on 127.0.0.1, whose caBundle is `ca`."""
    dest.mkdir(parents=True, exist_ok=True)
    sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    return _signed(
        ca,
        dest,
        name,
        f"/CN={hosts[0]}",
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature",
            "extendedKeyUsage=serverAuth",
            f"subjectAltName={sans}",
        ],
    )
