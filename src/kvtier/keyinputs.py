"""What besides token ids shapes a request's KV, in a form chunk keys can hash.

The vLLM adapter (:mod:`kvtier.vllm.key_inputs`) turns a request into :class:`KeyInputs`;
:class:`kvtier.keys.KeyChain` hashes them. Two kinds:

- per request (into the chain's seed): cache salt; LoRA name, path and int id;
- per chunk (into that chunk's step of the chain, and through the chain into every later
  chunk): each multimodal item overlapping the chunk (its identifier, its offset relative
  to the chunk's first token, its length and a digest of its embed mask), and the digest of
  the prompt embeddings in the chunk's token range.

A request kvtier cannot key (an input kind it does not understand) carries
``unkeyable``, the reason; the scheduler side then neither loads nor stores it.

Encoding: :func:`frame` writes each part as a 4-byte little-endian length and its bytes,
so a sequence of parts has one parse and distinct inputs hash as distinct messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

EmbedsDigest = Callable[[int, int], bytes]
"""``digest(start, end)``: a digest of the prompt embeddings of tokens ``[start, end)``."""


def frame(*parts: bytes | str | int | None) -> bytes:
    """Length-prefixed concatenation: str as UTF-8, int as 8-byte signed little-endian,
    None as a length of 0xFFFFFFFF (distinct from empty)."""
    out = bytearray()
    for p in parts:
        if p is None:
            out += b"\xff\xff\xff\xff"
            continue
        if isinstance(p, str):
            p = p.encode()
        elif isinstance(p, int):
            p = p.to_bytes(8, "little", signed=True)
        out += len(p).to_bytes(4, "little") + p
    return bytes(out)


@dataclass(frozen=True)
class MMInput:
    """One multimodal item of a prompt, by position."""

    identifier: str
    """A hash of the item and every input that shapes its encoding (vLLM's
    ``MultiModalFeatureSpec.identifier``: the mm hash, with the LoRA prefix where the
    tower takes LoRA)."""
    offset: int
    """First placeholder token of the item (tokens from the prompt start)."""
    length: int
    """Placeholder tokens of the item."""
    modality: str = ""
    detail: bytes = b""
    """A digest of whatever else shapes the placeholder (vLLM: the ``is_embed`` mask)."""


@dataclass(frozen=True)
class KeyInputs:
    """A request's inputs besides token ids (see the module docstring)."""

    cache_salt: str | None = None
    lora_name: str | None = None
    lora_path: str | None = None
    lora_id: int | None = None
    mm: tuple[MMInput, ...] = ()
    """Multimodal items, sorted by offset."""
    embeds_tokens: int = 0
    """Prompt positions ``[0, embeds_tokens)`` come with prompt embeddings."""
    embeds_digest: EmbedsDigest | None = None
    """Digest of a range of those embeddings (required when ``embeds_tokens > 0``)."""
    unkeyable: str = ""
    """Why kvtier cannot key this request ("" when it can)."""

    def seed_text(self) -> bytes:
        """The per-request part of the chain seed ("" when there is none)."""
        if not (self.cache_salt or self.lora_name or self.lora_path or self.lora_id):
            return b""
        return frame(
            "salt", self.cache_salt or "", "lora", self.lora_name, self.lora_path, self.lora_id
        )

    @property
    def per_chunk(self) -> bool:
        """Whether some chunk has inputs of its own (multimodal items, embeddings)."""
        return bool(self.mm) or self.embeds_tokens > 0

    def chunk_text(self, start: int, end: int) -> bytes:
        """The inputs of tokens ``[start, end)`` besides their ids; b"" when none."""
        parts: list[bytes | str | int | None] = []
        for item in self.mm:
            if item.offset >= end:
                break
            if item.offset + item.length > start:
                parts += ("mm", item.identifier, item.offset - start, item.length)
                parts += (item.modality, item.detail)
        e_end = min(end, self.embeds_tokens)
        if e_end > start and self.embeds_digest is not None:
            parts += ("embeds", e_end - start, self.embeds_digest(start, e_end))
        return frame(*parts) if parts else b""


NO_INPUTS = KeyInputs()
