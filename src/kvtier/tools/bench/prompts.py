"""Token-id prompts of exact lengths from deterministic text (needs the model's tokenizer)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kvtier.tools.bench.text import SYSTEM, document, question


@lru_cache(maxsize=4)
def tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def encode(model_dir: str, text: str) -> list[int]:
    return list(tokenizer(model_dir).encode(text, add_special_tokens=False))


def exact_document(model_dir: str, seed: int, tokens: int) -> list[int]:
    """A document of exactly ``tokens`` tokens; different seeds differ from the first token."""
    ids: list[int] = []
    part = 0
    while len(ids) < tokens:
        ids += encode(model_dir, document(seed * 1000 + part, 40) + " ")
        part += 1
    return ids[:tokens]


def document_text(model_dir: str, seed: int, tokens: int) -> str:
    """The text of :func:`exact_document` (about ``tokens`` tokens once re-encoded)."""
    return str(tokenizer(model_dir).decode(exact_document(model_dir, seed, tokens)))


def chat_turn(model_dir: str, user: str, system: bool = True) -> list[int]:
    """A user turn in the model's chat format, ready for the assistant's answer."""
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" if system else ""
    text += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return encode(model_dir, text)


def followup(model_dir: str, user: str) -> list[int]:
    """What a client appends after the assistant's answer to ask the next question."""
    return encode(
        model_dir, f"<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )


__all__ = ["chat_turn", "document_text", "encode", "exact_document", "followup", "question"]
