"""The connector's ``on_new_request``: request hints and the prefetch on arrival.

vLLM calls ``KVConnectorBase_V1.on_new_request(request)`` when a request is added, before
it is scheduled. :class:`ArrivalHooks` (a base of
:class:`~kvtier.vllm.connector.KVTierConnector`) reads kvtier's hints from the request's
``kv_transfer_params`` (:mod:`kvtier.hints`) and hands the request to the manager
(:func:`kvtier.manager.on_new_request`), which starts the prefetch of its slow-tier prefix.
Without hints and with prefetch off it returns at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtier.hints import NO_HINTS, parse_hints
from kvtier.manager import CacheManager, on_new_request

if TYPE_CHECKING:
    from vllm.v1.request import Request


class ArrivalHooks:
    """``on_new_request`` for a connector with ``manager`` (None on a worker) and ``setup``
    (its key inputs)."""

    manager: CacheManager | None
    setup: Any

    def on_new_request(self, request: Request) -> None:
        m = self.manager
        if m is None:
            return
        hints = parse_hints(request.kv_transfer_params, m.metrics)
        if hints is NO_HINTS and not m.arrivals.prefetching():
            return
        inputs = self.setup.key_inputs(request)
        on_new_request(m, request.request_id, request.all_token_ids, inputs=inputs, hints=hints)
