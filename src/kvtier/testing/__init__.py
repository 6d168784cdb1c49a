"""Test helpers shipped with kvtier (redis-server processes, TLS certificates, tiny models).
The tier conformance suite is :mod:`kvtier.conformance`."""
