"""Tiny random-weight checkpoints of each attention layout, for engine tests.

``build(arch, directory)`` writes a Hugging Face checkpoint (config, safetensors weights,
SmolLM2's tokenizer files) of a 2-4 layer model of hidden size 64 and a 512-token
vocabulary, built from the transformers config class of that architecture with the
class's own random initialisation, scaled up (:data:`INIT_STD`) so that outputs depend on
the whole prompt. vLLM then loads it like any model.

Why not ``load_format="dummy"``: vLLM's dummy weights are tiny uniform values, with which
the output depends on the last token only, so a test would pass with wrong KV. A test
must still check that sensitivity itself (the baseline's outputs differ between prompts
that end alike): see ``tests/vllm/test_models.py``.

``python -m kvtier.tools.tiny_models ARCH DIR`` writes one.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

VOCAB = 512
HIDDEN = 64
WINDOW = 64
"""Sliding window of the sliding-window layouts (two 32-token engine blocks)."""
INIT_STD = 0.25
"""Std of the weights' normal init (transformers' default 0.02 gives near-uniform
attention and outputs that hardly depend on the prompt)."""

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "initializer_range": INIT_STD,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def configs() -> dict[str, Any]:
    """Architecture name -> a transformers config (built lazily: imports transformers)."""
    import transformers as tf

    c = _COMMON
    mamba2 = {k: v for k, v in c.items() if k != "head_dim"} | {
        # head size = hidden / heads: 2 heads give 32 (vLLM-CPU has no 16-wide kernel)
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "mamba_d_state": 16,
        "mamba_n_heads": 4,
        "mamba_d_head": 32,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
    }
    """The Mamba2 hybrids' shared fields (Granite 4.0-H, Falcon-H1)."""
    return {
        "llama": tf.LlamaConfig(**c, num_hidden_layers=2),
        "qwen3": tf.Qwen3Config(**c, num_hidden_layers=2),
        "mqa": tf.LlamaConfig(**{**c, "num_key_value_heads": 1}, num_hidden_layers=2),
        "mistral_swa": tf.MistralConfig(**c, num_hidden_layers=2, sliding_window=WINDOW),
        "gemma3": tf.Gemma3TextConfig(
            **c,
            num_hidden_layers=4,
            sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            query_pre_attn_scalar=32,
        ),
        "gpt_oss": tf.GptOssConfig(
            **{**c, "intermediate_size": 64},
            num_hidden_layers=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "deepseek_v2_mla": tf.DeepseekV2Config(
            **{k: v for k, v in c.items() if k != "head_dim"},
            num_hidden_layers=2,
            kv_lora_rank=512,  # + rope 64: vLLM's MLA takes latents of 320, 512 or 576
            q_lora_rank=None,
            qk_rope_head_dim=64,
            qk_nope_head_dim=32,
            v_head_dim=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=64,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
        ),
        "granite_hybrid": tf.GraniteMoeHybridConfig(
            **mamba2,
            layer_types=["mamba", "attention"],
            mamba_expand=2,
            num_local_experts=0,
            shared_intermediate_size=128,
        ),
        "falcon_h1": tf.FalconH1Config(**mamba2, mamba_d_ssm=128, mamba_chunk_size=32),
        "qwen3_next": tf.Qwen3NextConfig(
            # Wider attention pages and one linear head: vLLM sizes the attention block to
            # hold a gated-delta-net state (64 KiB here), so a 160-token prompt spans
            # several blocks and its own prefix cache can hit.
            **c | {"num_key_value_heads": 4, "head_dim": 64},
            num_hidden_layers=2,
            # Full attention first: behind a linear layer the output hardly depended on
            # more than the prompt's tail at this size.
            layer_types=["full_attention", "linear_attention"],
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,  # vLLM-CPU GDN kernels: 128 only
            linear_value_head_dim=128,
            linear_num_key_heads=1,
            linear_num_value_heads=1,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        ),
    }


ARCHS = (
    "llama",
    "qwen3",
    "mqa",
    "mistral_swa",
    "gemma3",
    "gpt_oss",
    "deepseek_v2_mla",
    "granite_hybrid",
    "falcon_h1",
    "qwen3_next",
)
"""Every architecture :func:`configs` builds."""


def build(arch: str, directory: str | Path, seed: int = 0) -> Path:
    """Write the checkpoint of ``arch`` into ``directory`` (created); returns it."""
    import torch
    import transformers as tf

    from kvtier.tools.models import smollm2_path

    cfgs = configs()
    if arch not in cfgs:
        raise ValueError(f"tiny_models: unknown arch {arch!r}; known: {', '.join(cfgs)}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    auto: Any = tf.AutoModelForCausalLM
    model = auto.from_config(cfgs[arch], dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    src = Path(smollm2_path())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


VISION_IMAGE = 64
"""Side of the tiny vision model's square input images (pixels)."""
VISION_TOKENS = 16
"""Image tokens per image: (64 / 8-pixel patches)^2 / pixel-shuffle scale 2^2."""
_VISION_SPECIAL = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
]
"""Idefics3's special tokens (SmolVLM adds them to SmolLM2's tokenizer the same way)."""


def build_vision(directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny Idefics3 (SmolVLM's architecture: SigLIP-style vision encoder,
    pixel-shuffle connector, Llama text model) with its processor into ``directory``;
    returns it. Nothing is downloaded: the tokenizer is SmolLM2's plus Idefics3's special
    tokens, the image processor is built from its class with no image splitting, so every
    image becomes one ``<fake_token_around_image><global-img>`` + ``VISION_TOKENS`` x
    ``<image>`` + ``<fake_token_around_image>`` run wherever the prompt has one ``<image>``.

    The weights use :data:`INIT_STD` like :func:`build`. The processor's image processor
    is the torchvision backend where torchvision imports and the PIL one elsewhere
    (transformers picks it), so the model needs no torchvision itself.
    """
    import torch
    import transformers as tf

    from kvtier.tools.models import smollm2_path

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = tf.AutoTokenizer.from_pretrained(smollm2_path())
    tokenizer.add_special_tokens({"additional_special_tokens": _VISION_SPECIAL})
    images = tf.Idefics3ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": VISION_IMAGE},
        max_image_size={"longest_edge": VISION_IMAGE},
    )
    processor = tf.Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=VISION_TOKENS
    )
    text = tf.LlamaConfig(**_COMMON | {"vocab_size": len(tokenizer)}, num_hidden_layers=2)
    vision = tf.Idefics3VisionConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=VISION_IMAGE,
        patch_size=8,
        initializer_range=INIT_STD,
    )
    # Not a declared Idefics3Config field, but configs keep extra keyword fields and the
    # model's weight init reads the top-level initializer_range (hence Any for mypy).
    idefics3: Any = tf
    config = idefics3.Idefics3Config(
        text_config=text,
        vision_config=vision,
        scale_factor=2,
        image_token_id=processor.image_token_id,
        initializer_range=INIT_STD,
        tie_word_embeddings=False,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    idefics3.Idefics3ForConditionalGeneration(config).save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kvtier.tools.tiny_models ARCH DIR", file=sys.stderr)
        return 2
    print(build(args[0], args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
