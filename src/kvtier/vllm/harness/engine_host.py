"""One process that runs engine specs as they come, one engine at a time (the test suites).

``python -m kvtier.vllm.harness.engine_host`` reads lines ``SPEC.json OUT.json`` on standard
input and, for each, builds a fresh in-process engine, runs the spec's program, tears the
engine down (:func:`kvtier.vllm.harness.model_matrix.run_one`) and writes the result to
OUT.json; then it prints ``done OUT.json`` on standard output. An engine that refused to
start is a result (``{"error": ..., "error_type": ...}``), not the end of the host. It
exits at the end of its input.

What it saves is the interpreter start and the torch / vLLM import (about 10 s here) of
every engine after the first. Specs whose engine needs a fresh process (``multiprocess``:
the variable that chooses vLLM's engine-core process is read once per process; an engine
restart that a test means literally) belong in :mod:`kvtier.vllm.harness.runner`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> int:
    # Replies get the real standard output; everything else written there (vLLM logs to
    # stdout) goes to stderr, so a log line is never read as a reply.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from kvtier.vllm.harness.model_matrix import run_one

    for line in sys.stdin:
        if not line.strip():
            continue
        spec_path, out_path = line.split()
        with open(spec_path) as f:
            spec = json.load(f)
        if spec.get("multiprocess"):
            result = {"error": "engine_host: multiprocess specs need their own process"}
        else:
            try:
                result = run_one(spec)
            except Exception as e:  # the program failed: report it, the host goes on
                result = {
                    "error": str(e),
                    "error_type": type(e).__name__,
                    "traceback": traceback.format_exc(),
                }
        with open(out_path, "w") as f:
            json.dump(result, f)
        print(f"done {out_path}", file=replies, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
