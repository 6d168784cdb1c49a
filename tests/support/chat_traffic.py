"""Chat sessions and one-off documents behind one system prompt, in chunks of 8 tokens."""

from __future__ import annotations

SYSTEM = list(range(32))  # 4 chunks of 8 tokens, shared by everything below


def traffic(n_docs: int, n_turns: int) -> list[list[int]]:
    """Two chat sessions whose turns extend their previous prompt by one chunk, interleaved
    with one-off documents of 12 chunks behind the same system prompt."""
    out: list[list[int]] = []
    sessions = [SYSTEM + [1000 + s] * 8 for s in range(2)]
    for t in range(max(n_docs, n_turns)):
        if t < n_docs:
            out.append(SYSTEM + [5000 + t * 100 + i for i in range(96)])
        if t < n_turns:
            for s, prompt in enumerate(sessions):
                prompt += [2000 + 50 * s + t] * 8
                out.append(list(prompt))
    return out
