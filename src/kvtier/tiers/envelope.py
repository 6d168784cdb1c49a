"""The chunk envelope: the fixed header every chunk carries outside process memory.

Disk slots, shared-store values and remote values hold the same 128-byte envelope, so one
codec checks all three: disk keeps it in a separate header area, a shared-store value in
front of the payload, a remote value after it (``tail=True``: a remote store sends each part
of the payload as soon as it is checksummed, and the checksum is known only at the end).
Little-endian, ``struct`` format ``HEADER_FORMAT``::

    off size field                          off size field
    0    4   magic b"KVTS"                  52  20   parent key (zeros when none)
    4    2   format version (2)             72  16   namespace digest (Namespace.digest())
    6    2   flags: bit 0 has parent,       88  32   reserved (zeros)
             bit 1 parent unknown,          120  8   header checksum: xxh3_64 of [0, 120)
             bit 2 tagged (see below)
    8    8   sequence number (disk: write order; 0 elsewhere)
    16   8   payload length (bytes)
    24   8   payload checksum: xxh3_64(payload, seed = xxh3_64(key || namespace))
    32  20   key (KEY_BYTES)

Version 2 came with 20-byte keys (key format 3, :mod:`kvtier.keys`); a version-1 envelope
(16-byte keys at other offsets) never parses, so old data reads as absent.

The payload checksum is seeded with the key and namespace, so bytes stored under another
key or by another namespace (model, layout, rank) never validate, even when a store hands
back the wrong value for a key. Parsing never trusts a field it has not checked.

A *tagged* envelope (flag bit 2) has no payload checksum (the field is 0): it travels inside
a remote value whose MAC or AES-GCM tag covers the envelope and the payload
(:mod:`kvtier.tiers.remote.auth`), which detects everything the checksum would, so the
checksum's pass over the payload is skipped on both ends. :func:`unwrap` accepts a tagged
envelope only from a caller that checked that tag (``tag_checked``); anywhere else it is
a bad value.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import xxhash

from kvtier.keys import KEY_BYTES, NS_BYTES, Key

MAGIC = b"KVTS"
VERSION = 2
HEADER_BYTES = 128
KEY_AT, PARENT_AT, NAMESPACE_AT = 32, 52, 72
"""Byte offsets of the key, parent key and namespace digest fields."""
RESERVED_BYTES = 120 - NAMESPACE_AT - NS_BYTES
HEADER_FORMAT = f"<4sHHQQQ{KEY_BYTES}s{KEY_BYTES}s{NS_BYTES}s{RESERVED_BYTES}sQ"
_HEADER = struct.Struct(HEADER_FORMAT)
SUMMED_BYTES = HEADER_BYTES - 8
"""The header checksum covers bytes ``[0, SUMMED_BYTES)``."""
FLAG_HAS_PARENT = 1
FLAG_PARENT_UNKNOWN = 2
FLAG_TAGGED = 4
NO_KEY = bytes(KEY_BYTES)

assert _HEADER.size == HEADER_BYTES and PARENT_AT == KEY_AT + KEY_BYTES
assert NAMESPACE_AT == PARENT_AT + KEY_BYTES and RESERVED_BYTES >= 0


class Envelope(NamedTuple):
    """A decoded envelope whose header checksum matched."""

    key: Key
    parent: Key | None
    """None for a chain start, and when ``parent_unknown``."""
    parent_unknown: bool
    namespace: bytes
    seq: int
    length: int
    checksum: int
    tagged: bool
    """No payload checksum: the value's tag covers the payload (see the module docstring)."""


def payload_seed(key: Key, namespace: bytes) -> int:
    """Seed of a payload's checksum: binds the bytes to their key and namespace."""
    return int(xxhash.xxh3_64_intdigest(key + namespace))


def payload_checksum(payload: bytes | bytearray | memoryview, key: Key, namespace: bytes) -> int:
    return int(xxhash.xxh3_64_intdigest(payload, seed=payload_seed(key, namespace)))


def payload_hasher(key: Key, namespace: bytes) -> Any:
    """A streaming form of :func:`payload_checksum`: ``update`` it with the payload's
    parts in order; ``intdigest()`` equals the checksum of their concatenation."""
    return xxhash.xxh3_64(seed=payload_seed(key, namespace))


def pack_envelope(
    key: Key,
    parent: Key | None,
    namespace: bytes,
    seq: int,
    length: int,
    checksum: int,
    *,
    parent_unknown: bool = False,
    tagged: bool = False,
) -> bytes:
    """Encode an envelope, header checksum included; ``tagged``: no payload checksum
    (``checksum`` must be 0), for a value whose tag covers the payload."""
    flags = FLAG_PARENT_UNKNOWN if parent_unknown else (FLAG_HAS_PARENT if parent else 0)
    if tagged:
        if checksum:
            raise ValueError("a tagged envelope carries no payload checksum")
        flags |= FLAG_TAGGED
    head = _HEADER.pack(
        MAGIC,
        VERSION,
        flags,
        seq,
        length,
        checksum,
        key,
        parent or NO_KEY,
        namespace,
        bytes(RESERVED_BYTES),
        0,
    )[:SUMMED_BYTES]
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


def parse_envelope(data: bytes | bytearray | memoryview) -> Envelope | None:
    """The envelope in the first HEADER_BYTES of ``data``; None when it is not one (short,
    wrong magic or version, header checksum mismatch)."""
    if len(data) < HEADER_BYTES:
        return None
    head = bytes(data[:HEADER_BYTES])
    magic, version, flags, seq, length, psum, key, parent, ns, _, hsum = _HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        return None
    if xxhash.xxh3_64_intdigest(head[:SUMMED_BYTES]) != hsum:
        return None
    unknown = bool(flags & FLAG_PARENT_UNKNOWN)
    linked = bool(flags & FLAG_HAS_PARENT) and not unknown
    tagged = bool(flags & FLAG_TAGGED)
    return Envelope(key, parent if linked else None, unknown, ns, seq, length, psum, tagged)


def wrap(
    key: Key, parent: Key | None, namespace: bytes, payload: bytes, *, tail: bool = False
) -> bytes:
    """Envelope + payload as one value (what a key-addressed store keeps under a key);
    payload + envelope with ``tail``."""
    csum = payload_checksum(payload, key, namespace)
    env = pack_envelope(key, parent, namespace, 0, len(payload), csum)
    return payload + env if tail else env + payload


def unwrap(
    value: bytes | bytearray | None,
    key: Key,
    namespace: bytes,
    length: int,
    *,
    tail: bool = False,
    tag_checked: bool = False,
) -> memoryview | None:
    """The payload of a sealed value (envelope in front, or after it with ``tail``), or
    None when the value is missing, truncated, under another key or namespace, of another
    length, or fails its checksum. A tagged envelope (no checksum) is accepted only with
    ``tag_checked``: the caller verified the MAC or AEAD tag over this value."""
    if value is None or len(value) != HEADER_BYTES + length:
        return None
    view = memoryview(value)
    env = parse_envelope(view[length:] if tail else view)
    if env is None or env.key != key or env.namespace != namespace or env.length != length:
        return None
    payload = view[:length] if tail else view[HEADER_BYTES:]
    if env.tagged:
        return payload if tag_checked else None
    if payload_checksum(payload, key, namespace) != env.checksum:
        return None
    return payload
