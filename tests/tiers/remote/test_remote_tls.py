"""The redis tier over TLS against real redis-server processes serving TLS only on loopback,
with a private CA made here by the ``openssl`` CLI and client certificates required
(``tls-auth-clients yes``): standalone and a one-node TLS cluster. What is checked is what
comes back: chunks stored through kvtier's tier, probed and read back byte for byte; with
a wrong CA, no client certificate, a plaintext URL or a certificate that does not name the
host, every chunk is a miss and nothing raises; bad TLS files are one config error line
naming the option."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.tools.redis_server import RedisCluster, RedisServer
from kvtier.tools.tls_certs import TLSCerts, make_certs, openssl_available
from tests.support.redis_fixtures import tier_roundtrip

if not openssl_available():  # Debian's openssl package; scripts/setup.sh installs it
    raise RuntimeError("the openssl CLI is not installed")

ALL = [True, True, True]
MISS = ([False, False, False], 0)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TLSCerts:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(certs: TLSCerts) -> Iterator[RedisServer]:
    with RedisServer(tls=certs) as s:
        yield s


def entry(url: str, certs: TLSCerts, **over: object) -> dict[str, object]:
    e: dict[str, object] = {
        "kind": "redis",
        "url": url,
        "timeout_ms": 3000,
        "ssl_ca": str(certs.ca),
        "ssl_cert": str(certs.client_cert),
        "ssl_key": str(certs.client_key),
    }
    e.update(over)
    return {k: v for k, v in e.items() if v is not None}


def test_tls_with_client_certificate_stores_and_loads(tls_server, certs):
    assert tls_server.url.startswith("rediss://127.0.0.1:")
    assert tier_roundtrip(entry(tls_server.url, certs)) == (ALL, 3)
    # By name too: the certificate names localhost as well as 127.0.0.1.
    by_name = tls_server.url.replace("127.0.0.1", "localhost")
    assert tier_roundtrip(entry(by_name, certs), seed=1) == (ALL, 3)


def test_tls_failures_are_misses_not_crashes(tls_server, certs, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier")
    other = make_certs(tmp_path / "other", cn="another-ca")
    assert tier_roundtrip(entry(tls_server.url, certs, ssl_ca=str(other.ca)), seed=2) == MISS
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    # The server requires a client certificate.
    no_cert = entry(tls_server.url, certs, ssl_cert=None, ssl_key=None)
    assert tier_roundtrip(no_cert, seed=3) == MISS
    # Plaintext to a TLS-only port.
    plain = {"kind": "redis", "url": tls_server.url.replace("rediss", "redis"), "timeout_ms": 3000}
    assert tier_roundtrip(plain, seed=4) == MISS
    # The system's trust store does not know the private CA.
    assert tier_roundtrip(entry(tls_server.url, certs, ssl_ca=None), seed=5) == MISS


def test_the_server_name_is_checked_unless_turned_off(tmp_path):
    named = make_certs(tmp_path / "dns-only", server_names="DNS:localhost")
    with RedisServer(tls=named) as s:
        assert tier_roundtrip(entry(s.url, named)) == MISS  # 127.0.0.1 is not in the cert
        by_name = s.url.replace("127.0.0.1", "localhost")
        assert tier_roundtrip(entry(by_name, named), seed=1) == (ALL, 3)
        unchecked = entry(s.url, named, ssl_check_hostname=False)
        assert tier_roundtrip(unchecked, seed=2) == (ALL, 3)


def test_tls_cluster_stores_and_loads(certs):
    with RedisCluster(1, tls=certs) as c:
        assert c.url.startswith("rediss+cluster://")
        assert tier_roundtrip(entry(c.url, certs)) == (ALL, 3)
        # The node connections get the TLS settings too: a wrong CA fails there.
        other = make_certs(c.nodes[0].dir / "other", cn="another-ca")
        assert tier_roundtrip(entry(c.url, certs, ssl_ca=str(other.ca)), seed=1) == MISS


def _refused(e: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as info:
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, e]})
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_bad_tls_configuration_is_one_line_naming_the_option(certs, tmp_path):
    url = "rediss://cache:6380"
    missing = str(tmp_path / "nope.pem")
    assert _refused(entry(url, certs, ssl_ca=missing)).startswith("tiers[1].ssl_ca: cannot read")
    assert "nope.pem" in _refused(entry(url, certs, ssl_ca=missing))
    assert _refused(entry(url, certs, ssl_key=missing)).startswith("tiers[1].ssl_key:")
    unreadable = tmp_path / "locked.pem"
    unreadable.write_bytes(certs.ca.read_bytes())
    unreadable.chmod(0)
    try:
        readable_anyway = unreadable.open("rb")  # root reads a mode-0 file
        readable_anyway.close()
    except OSError:
        assert _refused(entry(url, certs, ssl_ca=str(unreadable))).startswith("tiers[1].ssl_ca:")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    assert _refused(entry(url, certs, ssl_ca=str(garbage))).startswith("tiers[1].ssl_ca:")
    wrong_key = entry(url, certs, ssl_key=str(certs.server_key))  # not the client cert's key
    assert _refused(wrong_key).startswith("tiers[1].ssl_cert:")
    assert _refused(entry(url, certs, ssl_key=None)).startswith("tiers[1].ssl_key: ssl_cert and")
    # TLS options on a plaintext URL would silently send in the clear: refused.
    msg = _refused(entry("redis://cache:6380", certs))
    assert msg.startswith("tiers[1].ssl_ca: TLS options need a TLS url")
    assert "ssl_check_hostname" in _refused(
        {"kind": "redis", "url": "redis://h", "ssl_check_hostname": False}
    )


def test_tls_files_are_plain_paths_in_the_spec(certs):
    cfg = KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, entry("rediss://h", certs)]})
    spec = cfg.tiers[1].options
    assert (spec.ssl_ca, spec.ssl_check_hostname) == (str(certs.ca), True)
    assert KVTierConfig.from_dict(cfg.to_dict()) == cfg
    assert Path(spec.ssl_key or "").stat().st_mode & 0o077 == 0  # keys made 0600
