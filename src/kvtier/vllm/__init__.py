"""The vLLM adapter: the only kvtier package that imports vllm.

Use ``kv_connector="KVTierConnector"`` with ``kv_connector_module_path="kvtier.vllm"``, or
just the name once kvtier is installed (its vLLM plugin registers it).
"""

from kvtier.vllm.connector import KVTierConnector

__all__ = ["KVTierConnector"]
