"""KV layouts of vLLM's CPU backend as plain tensors, and one block's bytes across layers."""

from __future__ import annotations

import torch


def cpu_layout(num_blocks=20, heads=3, bt=4, hd2=8, layers=3, dtype=torch.bfloat16):
    """vLLM CPU backend layout: per layer [blocks, kv_heads, block_size, 2*head_dim]."""
    return [torch.randn(num_blocks, heads, bt, hd2).to(dtype) for _ in range(layers)]


def block_bytes(kv, b):
    return torch.cat([t[b].reshape(-1).view(torch.uint8) for t in kv])
