"""A vLLM request's inputs besides token ids, as :class:`kvtier.keyinputs.KeyInputs`.

What is read (vLLM 0.32 ``vllm.v1.request.Request``): ``cache_salt``; ``lora_request``
(name, path, int id); ``mm_features`` (each ``MultiModalFeatureSpec``'s identifier,
modality and ``mm_position`` offset, length and ``is_embed`` mask); ``prompt_embeds`` (the
raw bytes of each chunk's rows, hashed lazily, with the dtype, the row shape and the
``prompt_is_token_ids`` mask of the rows).

A multimodal item is named by its processed content (:mod:`kvtier.vllm.mm_content`, the
default ``mm_keys: content``) or by vLLM's identifier (``mm_keys: identifier``).

Unkeyable (the request is neither loaded nor stored): a multimodal item without an
identifier, without processed data or with data of an unknown type where its content
names it (``mm-data``), of a modality not in :data:`MODALITIES`, or whose spec or
placeholder carries a field this module does not know (a newer vLLM adding an input that
may shape the KV), and prompt embeddings that are not a tensor. The reason is the ``input`` label of
``kvtier_unkeyable_requests_total``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

import torch

from kvtier.keyinputs import NO_INPUTS, KeyInputs, MMInput, frame
from kvtier.vllm.mm_content import ContentDigests

if TYPE_CHECKING:
    from vllm.v1.request import Request

MODALITIES = frozenset(
    ("image", "audio", "video", "vision_chunk", "image_embeds", "audio_embeds", "video_embeds")
)
"""Modalities whose ``identifier`` covers everything that shapes the item's KV (vLLM hashes
the item with the model id and processor arguments)."""

_FEATURE_FIELDS = frozenset(("data", "modality", "identifier", "mm_position", "mm_hash"))
_PLACEHOLDER_FIELDS = frozenset(("offset", "length", "is_embed"))


def key_inputs(request: Request, content: ContentDigests | None = None) -> KeyInputs:
    """The request's :class:`KeyInputs` (``unkeyable`` set when it has an input kind this
    module cannot key). With ``content``, multimodal items are named by their processed
    data's digest; without, by vLLM's identifier."""
    lora = request.lora_request
    salt = request.cache_salt or None
    embeds = getattr(request, "prompt_embeds", None)
    features = getattr(request, "mm_features", None) or ()
    if not (salt or lora or features or embeds is not None):
        return NO_INPUTS
    base = KeyInputs(
        cache_salt=salt,
        lora_name=lora.lora_name if lora else None,
        lora_path=lora.lora_path if lora else None,
        lora_id=lora.lora_int_id if lora else None,
    )
    mm = []
    for f in features:
        reason = _unkeyable_feature(f)
        if reason:
            return dataclasses.replace(base, unkeyable=reason)
        name = f.identifier if content is None else content.name(f.data)
        if not name:
            return dataclasses.replace(base, unkeyable="mm-data")
        pos = f.mm_position
        mask = b"" if pos.is_embed is None else _tensor_digest(pos.is_embed)
        mm.append(MMInput(name, int(pos.offset), int(pos.length), f.modality, mask))
    mm.sort(key=lambda m: m.offset)
    if embeds is None:
        return dataclasses.replace(base, mm=tuple(mm))
    if not isinstance(embeds, torch.Tensor) or embeds.dim() < 1:
        return dataclasses.replace(base, unkeyable="prompt-embeds")
    return dataclasses.replace(
        base,
        mm=tuple(mm),
        embeds_tokens=int(embeds.shape[0]),
        embeds_digest=_EmbedsDigest(embeds, getattr(request, "prompt_is_token_ids", None)),
    )


def _unkeyable_feature(f: Any) -> str:
    if not isinstance(getattr(f, "identifier", None), str) or not f.identifier:
        return "mm-identifier"
    if f.modality not in MODALITIES:
        return "mm-modality"
    if _unknown_fields(f, _FEATURE_FIELDS) or _unknown_fields(f.mm_position, _PLACEHOLDER_FIELDS):
        return "mm-field"
    return ""


def _unknown_fields(obj: Any, known: frozenset[str]) -> bool:
    """Whether a dataclass has a field outside ``known`` set to other than its default."""
    if not dataclasses.is_dataclass(obj):
        return True
    for fld in dataclasses.fields(obj):
        if fld.name in known:
            continue
        value = getattr(obj, fld.name)
        if fld.default is dataclasses.MISSING or value != fld.default:
            return True
    return False


def _tensor_digest(t: torch.Tensor) -> bytes:
    raw = t.detach().flatten().cpu().contiguous().view(torch.uint8).numpy()
    return hashlib.sha256(frame(str(t.dtype), repr(tuple(t.shape)), raw.tobytes())).digest()


class _EmbedsDigest:
    """``digest(start, end)`` of prompt embeddings rows ``[start, end)`` (with dtype, row
    shape and the rows' token-id mask): SHA-256, as vLLM hashes them per block."""

    __slots__ = ("embeds", "mask")

    def __init__(self, embeds: torch.Tensor, mask: list[bool] | None) -> None:
        self.embeds = embeds
        self.mask = mask

    def __call__(self, start: int, end: int) -> bytes:
        rows = self.embeds[start:end]
        mask = b"" if self.mask is None else bytes(map(bool, self.mask[start:end]))
        return hashlib.sha256(frame(_tensor_digest(rows), mask)).digest()
