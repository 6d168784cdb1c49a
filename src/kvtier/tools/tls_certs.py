"""A private CA with one server and one client certificate, made by the ``openssl`` CLI, for
tests of TLS against a real ``redis-server`` on loopback.

EC P-256 keys, valid one day; the server certificate names ``localhost`` and ``127.0.0.1``
(DNS and IP subjectAltNames) unless told otherwise, so a client connecting to either passes
the hostname check.
Keys are written unencrypted with mode 0600 into the directory given; nothing else is kept.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def openssl_available() -> bool:
    return shutil.which("openssl") is not None


@dataclass(frozen=True)
class TLSCerts:
    """Paths of PEM files: the CA, the server's pair, the client's pair."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _leaf(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject),
        cwd=d,
    )
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-days", "1", "-out", f"{name}.crt", "-extfile", f"{name}.ext"),
        cwd=d,
    )


def make_certs(
    directory: Path,
    cn: str = "kvtier-test-ca",
    server_names: str = "DNS:localhost,IP:127.0.0.1",
) -> TLSCerts:
    """A fresh CA named ``cn`` and its two leaf certificates under ``directory`` (created);
    the server's certificate has the subjectAltNames ``server_names``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"),
        *("-keyout", "ca.key", "-out", "ca.crt", "-days", "1", "-subj", f"/CN={cn}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        cwd=d,
    )
    _leaf(
        d,
        "server",
        "/CN=localhost",
        f"subjectAltName={server_names}\nextendedKeyUsage=serverAuth\n",
    )
    _leaf(d, "client", "/CN=kvtier-client", "extendedKeyUsage=clientAuth\n")
    for key in d.glob("*.key"):
        key.chmod(0o600)
    return TLSCerts(
        d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key"
    )
