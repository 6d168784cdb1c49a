"""vLLM general plugin: registers ``KVTierConnector`` by name in every vLLM process."""

from __future__ import annotations


def register() -> None:
    """Entry point ``vllm.general_plugins: kvtier``; safe to call more than once."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    if "KVTierConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(
            "KVTierConnector", "kvtier.vllm.connector", "KVTierConnector"
        )
