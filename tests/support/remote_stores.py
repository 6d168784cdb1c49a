"""Stores of the redis kind built by hand, as the kind builds them (plain, MAC and AEAD
modes), two tenants' secrets, and the least-privilege ACL grant docs/security.md shows."""

from __future__ import annotations

import hashlib

import pytest
import torch

from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteStore, keyspace, parse_remote_url
from kvtier.tiers.remote.auth import ValueAuth
from tests.support.redis_fixtures import CHUNK_BYTES, NAMESPACE, segs

SECRET_A = hashlib.sha256(b"tenant A").hexdigest().encode()


SECRET_B = hashlib.sha256(b"tenant B").hexdigest().encode()


MODES = ["mac", "aead"]


def make_store(url: str, mode: str, secret: bytes | None, digest: bytes | None = None, rank=0):
    """A store as the redis kind builds one: ``mode`` "off" (no secret), "mac", "aead"."""
    digest = NAMESPACE.for_rank(rank).digest() if digest is None else digest
    encrypt = mode == "aead"
    use = secret if mode != "off" else None
    auth = ValueAuth(use, encrypt, digest, CHUNK_BYTES) if use else None
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    return RemoteStore(
        client, KeySpace(NAMESPACE, use, encrypt), CHUNK_BYTES, digest, rank, auth=auth
    )


def read(store: RemoteStore, keys) -> tuple[list[bool], torch.Tensor]:
    out = torch.zeros(len(keys), CHUNK_BYTES, dtype=torch.uint8)
    return store.read([-1] * len(keys), keys, segs(out)), out


@pytest.fixture
def secrets(tmp_path):
    paths = {}
    for tag, value in (("a", SECRET_A), ("b", SECRET_B)):
        p = tmp_path / f"secret-{tag}"
        p.write_bytes(value + b"\n")
        p.chmod(0o600)
        paths[tag] = str(p)
    return paths


SECRET = "Sw0rdf1sh-c0rrect-h0rse"


ACL_PASSWORD = "acl-" + SECRET


def acl_line(user: str = "kvtier") -> str:
    """The grant docs/security.md shows (minus +client|setinfo, which 7.0 lacks)."""
    prefix = keyspace.PREFIX.decode()
    return (
        f"user {user} on >{ACL_PASSWORD} resetkeys ~{prefix}* resetchannels -@all +getrange +set "
        "+exists +unlink +del +scan +ping +evalsha +eval +script|load +command "
        "+cluster|slots +cluster|shards +readonly"
    )
