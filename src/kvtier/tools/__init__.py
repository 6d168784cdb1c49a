"""kvtier's tooling: the ``kvtier`` command and what it runs (bench, soak, sim, inspect,
purge) and the helpers they share (a private redis-server, the SmolLM2 weights).

Tooling sits on top of the runtime and may import it; the runtime (everything a vLLM engine
imports: config, keys, index, policies, stack, tiers, transfer, the connector, metrics) never
imports tooling. ``tests/test_code_rules.py`` enforces the direction.
"""
