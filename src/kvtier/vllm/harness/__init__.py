"""Tooling that drives real vLLM engines for ``kvtier bench``, ``kvtier soak`` and the model
tests. It lives under :mod:`kvtier.vllm` because only that package imports vllm; the
connector never imports it."""
