"""The SmolLM2 baseline run (tests/support/vllm_runs.py) as a fixture of every module here."""

from tests.support.vllm_runs import baseline  # noqa: F401  (fixture)
