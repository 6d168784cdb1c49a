import pytest

from kvtier.errors import ConfigError
from kvtier.layout import AttentionKind, KVGroup, KVLayout, dtype_bytes


def test_smollm2_bytes_per_token():
    layout = KVLayout.dense(30, 3, 64, "bfloat16")
    assert layout.bytes_per_token == 23_040
    assert layout.chunk_bytes(32) == 23_040 * 32
    assert layout.load_bytes(1000) == 23_040_000


def test_hybrid_load_bytes_is_an_upper_bound():
    full = KVGroup(AttentionKind.FULL, 4, 2, 64, "fp16")
    swa = KVGroup(AttentionKind.SLIDING, 4, 2, 64, "fp16", window=128)
    mamba = KVGroup(AttentionKind.MAMBA, 2, state_bytes=10_000)
    layout = KVLayout((full, swa, mamba))
    per_tok = 4 * 2 * 64 * 2 * 2
    for tokens in (0, 1, 100, 5000):
        exact_swa = min(tokens, 128) * per_tok
        exact = tokens * per_tok + exact_swa + (20_000 if tokens else 0)
        assert layout.load_bytes(tokens) >= exact
        assert full.load_bytes(tokens) == tokens * per_tok
    assert layout.load_bytes(0) == 0


def test_validation():
    with pytest.raises(ConfigError, match="dtype"):
        dtype_bytes("float128")
    with pytest.raises(ConfigError, match="window"):
        KVGroup(AttentionKind.SLIDING, 1, 1, 1)
    with pytest.raises(ConfigError, match="state_bytes"):
        KVGroup(AttentionKind.MAMBA, 1)


def test_digest_changes_with_geometry():
    assert KVLayout.dense(30, 3, 64).digest() != KVLayout.dense(30, 3, 64, "float16").digest()
    assert (
        KVLayout.dense(30, 3, 64).digest() == KVLayout.dense(30, 3, 64, "torch.bfloat16").digest()
    )
