"""Digests of multimodal items' processed content: what names an item in the chunk keys
when ``mm_keys`` is "content" (the default).

vLLM names an item by its identifier: its own hash of the raw item, or, when the client
sent ``multi_modal_uuids``, the client's string unchanged. A client can therefore send
image X under the name of image Y, and a key made of the name would serve X's KV to every
later request that sends Y, on every engine sharing a tier (docs/security.md, "Keys").
The processed tensors (``MultiModalFeatureSpec.data``, e.g. ``pixel_values``) are what the
engine's encoder runs on, so a key made of them matches KV only where the engine would
compute the same KV. They are hashed on the scheduler's thread, once per item object:
vLLM's engine-side processor cache hands the same object to every request that reuses
an item, and :class:`ContentDigests` remembers the digest of a live object.

Unkeyable (``""`` returned, the caller marks the request): an item whose data is absent
(the engine has not filled it in) or holds a value of a type this module does not know.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import blake3
import torch

from kvtier.keyinputs import frame

PREFIX = "content:"
"""Starts every content name, so it never equals an identifier vLLM computes (a hex
digest) nor, by accident, a client's uuid of the same hex."""

_LEAVES = (int, float, bool, str, type(None))


class _Unknown(Exception):
    """A value inside an item whose bytes this module cannot name."""


class ContentDigests:
    """``name(data)``: the content name of one item's processed data (``""`` when it
    cannot be named), memoised for at most ``capacity`` live data objects.

    A memo entry holds a weak reference to its object and is used only while that very
    object is alive (a new object at a recycled address is hashed afresh). Items are
    read, never changed. Single-threaded (the scheduler's thread)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._memo: OrderedDict[int, tuple[weakref.ref[Any], str]] = OrderedDict()

    def name(self, data: Any) -> str:
        if data is None:
            return ""
        memo = self._memo.get(id(data))
        if memo is not None and memo[0]() is data:
            self._memo.move_to_end(id(data))
            return memo[1]
        try:
            h = blake3.blake3(max_threads=1)
            _feed(h, data)
        except _Unknown:
            return ""
        name = PREFIX + h.hexdigest()
        try:
            ref = weakref.ref(data)
        except TypeError:  # not weak-referenceable: hash it again next time
            return name
        self._memo[id(data)] = (ref, name)
        if len(self._memo) > self.capacity:
            self._memo.popitem(last=False)
        return name


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` (an item: a mapping of field name to an element with ``data`` and
    ``field``, nested tensors inside) as one unambiguous message."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu" or t.is_sparse:
            raise _Unknown
        t = t.contiguous()
        h.update(frame(b"T", str(t.dtype), repr(tuple(t.shape))))
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, Mapping):
        h.update(frame(b"M", str(len(value))))
        for k in sorted(value, key=str):
            h.update(frame(str(k)))
            _feed(h, value[k])
    elif isinstance(value, list | tuple):
        h.update(frame(b"L" if isinstance(value, list) else b"U", str(len(value))))
        for v in value:
            _feed(h, v)
    elif isinstance(value, _LEAVES):
        h.update(frame(b"V", type(value).__name__, repr(value)))
    elif hasattr(value, "data") and hasattr(value, "field"):
        # vLLM's MultiModalFieldElem: the tensors, and how they batch (the field's kind
        # and its slices decide which rows belong to this item).
        h.update(frame(b"E", type(value.field).__name__, repr(value.field)))
        _feed(h, value.data)
    else:
        raise _Unknown
