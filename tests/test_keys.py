import os
import subprocess
import sys

import numpy as np
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvtier.keys import GROUP_CHUNKS, TAG_BYTES, KeyChain, Namespace, chunk_keys

SEED = Namespace("smollm2", "abc").seed()


def test_keys_are_chained_and_prefix_stable():
    a = chunk_keys(list(range(100)), 16, SEED)
    b = chunk_keys(list(range(96)) + [7, 7, 7, 7], 16, SEED)
    assert len(a) == 6 and len(b) == 6
    assert a == b  # the differing tail is in the partial 7th chunk
    c = chunk_keys([0] + list(range(1, 100)), 16, SEED)
    assert c == a
    d = chunk_keys([1] + list(range(1, 100)), 16, SEED)
    assert all(x != y for x, y in zip(a, d, strict=True)), "a change in chunk 0 changes every key"


def test_namespace_separates():
    toks = list(range(64))
    base = chunk_keys(toks, 16, Namespace("m", "g").seed())
    assert chunk_keys(toks, 16, Namespace("m2", "g").seed()) != base
    assert chunk_keys(toks, 16, Namespace("m", "g2").seed()) != base
    assert chunk_keys(toks, 16, Namespace("m", "g", "tp2r0").seed()) != base
    assert chunk_keys(toks, 16, Namespace("m", "g").seed(cache_salt="s")) != base
    assert chunk_keys(toks, 16, Namespace("m", "g").seed(lora="l")) != base
    assert chunk_keys(toks, 16, Namespace("m", "g").seed()) == base


@given(st.lists(st.integers(0, 2**31 - 1), max_size=300), st.integers(1, 40), st.data())
def test_incremental_equals_one_shot(tokens, chunk, data):
    chain = KeyChain(SEED, chunk)
    cut = 0
    while cut < len(tokens):
        cut = data.draw(st.integers(cut + 1, len(tokens)))
        chain.update(tokens[:cut])
    assert chain.keys == chunk_keys(tokens, chunk, SEED)
    assert chain.num_tokens == len(tokens) // chunk * chunk


def test_deterministic_across_processes():
    code = (
        "from kvtier.keys import Namespace, chunk_keys;"
        "print(chunk_keys(list(range(200)), 32, Namespace('m','g').seed('salt')).pop().hex())"
    )
    outs = set()
    for hashseed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        outs.add(subprocess.check_output([sys.executable, "-c", code], env=env, text=True).strip())
    assert len(outs) == 1
    assert (
        outs.pop() == chunk_keys(list(range(200)), 32, Namespace("m", "g").seed("salt"))[-1].hex()
    )


def reference_keys(tokens: list[int], chunk: int, seed: bytes) -> list[bytes]:
    """The definition, chunk by chunk: the chained xxh3-128, its first TAG_BYTES replaced
    by those of the group's first chunk."""
    keys: list[bytes] = []
    prev = seed
    for i in range(len(tokens) // chunk):
        body = np.asarray(tokens[i * chunk : (i + 1) * chunk], dtype="<i8").tobytes()
        h = xxhash.xxh3_128_digest(prev + body)
        head = keys[i - i % GROUP_CHUNKS] if i % GROUP_CHUNKS else h
        keys.append(head[:TAG_BYTES] + h[TAG_BYTES:])
        prev = keys[-1]
    return keys


@given(st.lists(st.integers(0, 2**31 - 1), max_size=400), st.integers(1, 8), st.data())
def test_keys_carry_their_group_tag(tokens, chunk, data):
    """Every chunk of a group of GROUP_CHUNKS starts with its group's tag; the keys equal
    the definition computed chunk by chunk, however the tokens arrive."""
    chain = KeyChain(SEED, chunk)
    cut = 0
    while cut < len(tokens):
        cut = data.draw(st.integers(cut + 1, len(tokens)))
        chain.update(tokens[:cut])
    keys = chain.keys
    assert keys == reference_keys(tokens, chunk, SEED)
    for i, k in enumerate(keys):
        assert k[:TAG_BYTES] == keys[i - i % GROUP_CHUNKS][:TAG_BYTES]


def test_groups_of_a_chain_have_their_own_tags():
    keys = chunk_keys(list(range(64 * GROUP_CHUNKS)), 1, SEED)
    tags = {k[:TAG_BYTES] for k in keys}
    assert len(tags) == 64
    assert len(set(keys)) == len(keys)
