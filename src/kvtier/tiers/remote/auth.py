"""Authenticated (and optionally encrypted) remote values: the secret, its subkeys, formats.

A redis tier with a secret (``secret_env`` or ``secret_file``) seals every value so that an
engine never loads bytes that someone without the secret wrote or changed, and keys the
chunk names (:mod:`kvtier.tiers.remote.keyspace`) so that a SCAN user cannot test guessed
prompts against them. ``P`` is what an unauthenticated value holds (payload ‖ 128-byte
envelope, :mod:`kvtier.tiers.envelope`), ``name`` the value's full Redis name::

    no secret        P
    MAC              P ‖ tag                tag: 32 bytes, BLAKE3 keyed with k_mac over AAD ‖ P
    AEAD (encrypt)   salt ‖ nonce ‖ C ‖ tag  salt 16 B, nonce 12 B (both random per value);
                                            C ‖ tag = AES-256-GCM(k_v, nonce, P, AAD), 16 B tag,
                                            k_v = BLAKE3 keyed with k_aead over salt

    AAD = b"kvtier-remote" ‖ version (1 B) ‖ mode (1 B: 1 MAC, 2 AEAD) ‖ len(name) (2 B, LE)
          ‖ name ‖ namespace digest (Namespace.digest(): model, layout, TP rank, namespace
          text) ‖ payload length (8 B, LE)

The envelope inside ``P`` carries the chunk key and parent key, so the tag covers chunk key ‖
namespace ‖ layout ‖ payload; the name in the AAD stops a value copied to another name, the
length a value cut short. Every value under AEAD has its own key ``k_v`` (a fresh 128-bit
salt), so a (key, nonce) pair repeats only if two values draw the same salt and nonce
(about q²/2^225 after q values): no per-key count to keep, across any number of writers.

Subkeys come from the one secret through BLAKE3's key derivation (:func:`subkey`, one
context string per purpose), so MAC, AEAD and name keys never coincide. Secrets are bytes
that never reach a repr, log line or error message: errors name the option, not the value.

Not covered (see docs): replay of an older honest value for the same name (it is the same
chunk's bytes), value lengths and timing, and, in MAC mode, confidentiality (anyone who may
GET a value reads its KV and the chunk keys in its envelope).
"""

from __future__ import annotations

import hmac
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kvtier.errors import ConfigError
from kvtier.keysecret import env_unset, read_private_file
from kvtier.tiers.envelope import HEADER_BYTES
from kvtier.tiers.remote.streams import PART_BYTES

MIN_SECRET_BYTES = 32
"""Shortest secret accepted (after surrounding whitespace is dropped): 256 bits when it is
random bytes, e.g. ``openssl rand -hex 32`` (64 characters)."""

VERSION = 1
MODE_MAC, MODE_AEAD = 1, 2
MAC_BYTES = 32
SALT_BYTES, NONCE_BYTES, GCM_TAG_BYTES = 16, 12, 16
_AAD_HEAD = b"kvtier-remote"

CONTEXTS = {
    "names": "kvtier 2026-12 remote names v4",
    "chunks-mac": "kvtier 2026-12 remote chunk names mac v4",
    "chunks-aead": "kvtier 2026-12 remote chunk names aead v4",
    "mac": "kvtier 2026-12 remote value mac v4",
    "aead": "kvtier 2026-12 remote value aead v4",
}
"""BLAKE3 key-derivation contexts, one per subkey. Chunk names differ between MAC and
AEAD tiers on one secret (their values could not be read by each other); tenant and model
labels (``names``) do not, so one purge pattern covers both."""


def subkey(secret: bytes, purpose: str) -> bytes:
    """The 32-byte subkey of ``secret`` for ``purpose`` (a key of :data:`CONTEXTS`)."""
    return blake3.blake3(secret, derive_key_context=CONTEXTS[purpose]).digest(32)


# -- the secret ------------------------------------------------------------------------------


def load_secret(
    secret_env: str | None,
    secret_file: str | None,
    encrypt: bool,
    where: str,
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The tier's secret, or None when it has none. Raises ConfigError, one line naming
    ``where.<option>`` and never the secret, when both options are given, the variable is
    unset, the file unreadable or not private (:func:`kvtier.keysecret.read_private_file`:
    mode 0600, owned by this user), the secret shorter than MIN_SECRET_BYTES, or ``encrypt`` is
    asked without a secret. Surrounding whitespace (a file's newline) is dropped."""
    env = os.environ if environ is None else environ
    if secret_env and secret_file:
        raise ConfigError(f"{where}.secret_file: give secret_env or secret_file, not both")
    if secret_env:
        option = "secret_env"
        text = env.get(secret_env)
        if text is None:
            raise ConfigError(env_unset(f"{where}.secret_env"))
        raw = text.encode()
    elif secret_file:
        option = "secret_file"
        raw = read_private_file(secret_file, f"{where}.secret_file", 1 << 16)
    else:
        if encrypt:
            raise ConfigError(
                f"{where}.encrypt: encryption needs a secret (secret_env or secret_file)"
            )
        return None
    secret = raw.strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{where}.{option}: the secret is {len(secret)} bytes; at least "
            f"{MIN_SECRET_BYTES} are needed (e.g. the output of `openssl rand -hex 32`)"
        )
    return secret


# -- sealing and opening values ---------------------------------------------------------------


class ValueAuth:
    """Seals and opens one rank's values under a secret (MAC, or AEAD with ``encrypt``).

    ``namespace``: the rank's ``Namespace.digest()``; ``payload_bytes``: a chunk's payload
    (``P`` is that and the envelope). Thread-safe: per-thread buffers; keys are read-only.
    The secret is not kept, only its subkeys, and none shows in ``repr``.
    """

    def __init__(self, secret: bytes, encrypt: bool, namespace: bytes, payload_bytes: int) -> None:
        self.mode = MODE_AEAD if encrypt else MODE_MAC
        self.namespace = namespace
        self.payload_bytes = payload_bytes
        self.plain_bytes = payload_bytes + HEADER_BYTES
        self._key = subkey(secret, "aead" if encrypt else "mac")
        self._local = threading.local()
        # The AAD's parts that are the same for every value (see the module docstring).
        self._aad_head = _AAD_HEAD + struct.pack("<BB", VERSION, self.mode)
        self._aad_tail = namespace + struct.pack("<Q", payload_bytes)

    def __repr__(self) -> str:
        return f"ValueAuth({'aead' if self.mode == MODE_AEAD else 'mac'})"

    @property
    def overhead(self) -> int:
        """Bytes a sealed value has beyond ``P``."""
        if self.mode == MODE_AEAD:
            return SALT_BYTES + NONCE_BYTES + GCM_TAG_BYTES
        return MAC_BYTES

    def aad(self, name: bytes) -> bytes:
        return b"".join((self._aad_head, struct.pack("<H", len(name)), name, self._aad_tail))

    def _value_key(self, salt: bytes | memoryview) -> bytes:
        return blake3.blake3(salt, key=self._key).digest(32)

    def seal(self, name: bytes, pieces: Iterable[Any]) -> Iterator[Any]:
        """The sealed value of ``name`` as pieces, from ``P``'s ``pieces`` in order (each
        at most PART_BYTES): in MAC mode the pieces themselves, each added to the tag just
        before it is handed on, then the tag; with AEAD the salt and nonce, then each piece
        encrypted into this thread's two buffers in turn, then the tag: a piece must be sent
        before the next but one is asked for."""
        aad = self.aad(name)
        if self.mode == MODE_MAC:
            mac = blake3.blake3(aad, key=self._key)
            for piece in pieces:
                mac.update(piece)
                yield piece
            yield mac.digest(MAC_BYTES)
            return
        head = os.urandom(SALT_BYTES + NONCE_BYTES)
        enc = Cipher(
            algorithms.AES(self._value_key(head[:SALT_BYTES])), modes.GCM(head[SALT_BYTES:])
        ).encryptor()
        enc.authenticate_additional_data(aad)
        yield head
        views = self._out_views()
        for k, piece in enumerate(pieces):
            view = views[k & 1]
            yield view[: enc.update_into(piece, view)]
        enc.finalize()
        yield enc.tag

    def mac_pieces(self, name: bytes, pieces: Iterable[Any]) -> list[Any]:
        """MAC mode: ``pieces`` (kept as they are, so they must stay valid until sent) and
        their tag last: what :meth:`seal` yields, made at once (ahead of the send)."""
        assert self.mode == MODE_MAC
        mac = blake3.blake3(self.aad(name), key=self._key)
        out = []
        for piece in pieces:
            mac.update(piece)
            out.append(piece)
        out.append(mac.digest(MAC_BYTES))
        return out

    def seal_into(self, name: bytes, pieces: Iterable[Any], out: memoryview) -> memoryview:
        """The sealed value of ``name`` (as :meth:`seal` would yield it, in one piece),
        made from ``P``'s ``pieces`` straight into ``out`` (at least ``plain_bytes +
        overhead`` bytes): each piece copied and MACed, or encrypted into place, one pass
        over it. Returns the view of ``out`` holding the value."""
        pos = 0
        if self.mode == MODE_MAC:
            mac = blake3.blake3(self.aad(name), key=self._key)
            for piece in pieces:
                end = pos + len(piece)
                out[pos:end] = piece
                mac.update(out[pos:end])  # the copy just made, in cache
                pos = end
            out[pos : pos + MAC_BYTES] = mac.digest(MAC_BYTES)
            return out[: pos + MAC_BYTES]
        head = os.urandom(SALT_BYTES + NONCE_BYTES)
        out[: len(head)] = head
        enc = Cipher(
            algorithms.AES(self._value_key(head[:SALT_BYTES])), modes.GCM(head[SALT_BYTES:])
        ).encryptor()
        enc.authenticate_additional_data(self.aad(name))
        pos = len(head)
        for piece in pieces:
            # The encryptor wants 15 bytes of room past a piece; the tag's 16 follow it.
            pos += enc.update_into(piece, out[pos : pos + len(piece) + 15])
        enc.finalize()
        out[pos : pos + GCM_TAG_BYTES] = enc.tag
        return out[: pos + GCM_TAG_BYTES]

    def open(self, name: bytes, value: bytes) -> memoryview | None:
        """``P`` of a sealed value whose tag matches, None otherwise (wrong length, forged,
        changed, moved from another name or namespace). With AEAD the plaintext is in this
        thread's buffer, valid until this thread's next call."""
        view = memoryview(value)
        aad = self.aad(name)
        if self.mode == MODE_MAC:
            if len(view) != self.plain_bytes + MAC_BYTES:
                return None
            body = view[: self.plain_bytes]
            want = blake3.blake3(aad, key=self._key)
            want.update(body)
            ok = hmac.compare_digest(want.digest(MAC_BYTES), view[self.plain_bytes :])
            return body if ok else None
        if len(view) != self.plain_bytes + self.overhead:
            return None
        salt, nonce = view[:SALT_BYTES], view[SALT_BYTES : SALT_BYTES + NONCE_BYTES]
        plain = self._buffer("plain", self.plain_bytes)
        try:
            AESGCM(self._value_key(salt)).decrypt_into(
                bytes(nonce), view[SALT_BYTES + NONCE_BYTES :], aad, plain
            )
        except InvalidTag:
            return None
        return memoryview(plain)

    def _out_views(self) -> tuple[memoryview, memoryview]:
        """This thread's two buffers for :meth:`seal`'s parts (PART_BYTES and the 15 bytes
        of room the encryptor wants past a piece)."""
        views: tuple[memoryview, memoryview] | None = getattr(self._local, "out", None)
        if views is None:
            views = self._local.out = (
                memoryview(bytearray(PART_BYTES + 15)),
                memoryview(bytearray(PART_BYTES + 15)),
            )
        return views

    def _buffer(self, which: str, size: int) -> bytearray:
        buf: bytearray | None = getattr(self._local, which, None)
        if buf is None:
            buf = bytearray(size)
            setattr(self._local, which, buf)
        return buf
