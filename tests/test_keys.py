import os
import subprocess
import sys

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier import keyhash
from kvtier.keyinputs import KeyInputs, MMInput, frame
from kvtier.keys import (
    GROUP_CHUNKS,
    HASH_BYTES,
    KEY_BYTES,
    PUBLIC_HASH_KEY,
    TAG_BYTES,
    KeyChain,
    Namespace,
    chunk_keys,
    hash_key_of,
)

NS = Namespace("smollm2", "abc")
SEED = NS.seed()


def test_keys_are_chained_and_prefix_stable():
    a = chunk_keys(list(range(100)), 16, SEED)
    b = chunk_keys(list(range(96)) + [7, 7, 7, 7], 16, SEED)
    assert len(a) == 6 and len(b) == 6
    assert a == b  # the differing tail is in the partial 7th chunk
    c = chunk_keys([0] + list(range(1, 100)), 16, SEED)
    assert c == a
    d = chunk_keys([1] + list(range(1, 100)), 16, SEED)
    assert all(x != y for x, y in zip(a, d, strict=True)), "a change in chunk 0 changes every key"
    assert {len(k) for k in a} == {KEY_BYTES} and KEY_BYTES - TAG_BYTES == HASH_BYTES == 16


def test_namespace_and_request_inputs_separate():
    toks = list(range(64))
    base = chunk_keys(toks, 16, Namespace("m", "g").seed())
    variants = [
        Namespace("m2", "g").seed(),
        Namespace("m", "g2").seed(),
        Namespace("m", "g", "tp2pp1").seed(),
        Namespace("m", "g", extra="tenant-b").seed(),
        Namespace("m", "g").seed(KeyInputs(cache_salt="s")),
        Namespace("m", "g").seed(KeyInputs(lora_name="l", lora_path="/a", lora_id=1)),
        # the same LoRA name re-pointed at another adapter, or another int id
        Namespace("m", "g").seed(KeyInputs(lora_name="l", lora_path="/b", lora_id=1)),
        Namespace("m", "g").seed(KeyInputs(lora_name="l", lora_path="/a", lora_id=2)),
    ]
    got = [chunk_keys(toks, 16, s) for s in variants]
    assert all(all(x != y for x, y in zip(k, base, strict=True)) for k in got)
    assert len({tuple(k) for k in got}) == len(got)
    assert chunk_keys(toks, 16, Namespace("m", "g").seed()) == base
    # the field boundaries are framed: moving text between fields changes the seed
    a = Namespace("m", "g").seed(KeyInputs(lora_name="ab", lora_path="c", lora_id=1))
    b = Namespace("m", "g").seed(KeyInputs(lora_name="a", lora_path="bc", lora_id=1))
    assert a != b


def test_secret_keys_the_hash():
    toks = list(range(64))
    public = chunk_keys(toks, 16, NS.seed())
    ns_a = Namespace("smollm2", "abc", secret=b"a" * 32)
    ns_b = Namespace("smollm2", "abc", secret=b"b" * 32)
    keyed = [ns.key_chain(16) for ns in (ns_a, ns_b)]
    for chain in keyed:
        chain.update(toks)
    assert keyed[0].keys != public and keyed[1].keys != public and keyed[0].keys != keyed[1].keys
    assert ns_a.digest() != NS.digest() and ns_a.chain_digest() != ns_b.chain_digest()
    assert "secret" not in repr(ns_a) and "aaaa" not in repr(ns_a)
    assert hash_key_of(b"") == PUBLIC_HASH_KEY != hash_key_of(b"a" * 32)


def reference_keys(
    tokens: list[int], chunk: int, seed: bytes, key: bytes, extras: dict[int, bytes]
) -> list[bytes]:
    """The definition in kvtier.keys' docstring, chunk by chunk, with the blake3 package."""
    keys: list[bytes] = []
    d = blake3.blake3(b"kvtier-chain-v3" + seed, key=key).digest()
    for i in range(len(tokens) // chunk):
        body = b"".join(t.to_bytes(4, "little") for t in tokens[i * chunk : (i + 1) * chunk])
        x = extras.get(i)
        x = blake3.blake3(b"kvtier-chunk-v3" + x, key=key).digest() if x else bytes(32)
        d = blake3.blake3(d + x + body, key=key).digest()
        head = keys[i - i % GROUP_CHUNKS] if i % GROUP_CHUNKS else d
        keys.append(head[:TAG_BYTES] + d[TAG_BYTES:KEY_BYTES])
    return keys


@given(st.lists(st.integers(0, 2**32 - 1), max_size=400), st.integers(1, 40), st.data())
def test_incremental_equals_definition(tokens, chunk, data):
    """However the tokens arrive, the keys equal the definition; every chunk of a group
    starts with its group's tag."""
    chain = KeyChain(SEED, chunk)
    cut = 0
    while cut < len(tokens):
        cut = data.draw(st.integers(cut + 1, len(tokens)))
        chain.update(tokens[:cut])
    assert chain.keys == chunk_keys(tokens, chunk, SEED)
    assert chain.keys == reference_keys(tokens, chunk, SEED, PUBLIC_HASH_KEY, {})
    assert chain.num_tokens == len(tokens) // chunk * chunk
    for i, k in enumerate(chain.keys):
        assert k[:TAG_BYTES] == chain.keys[i - i % GROUP_CHUNKS][:TAG_BYTES]


@settings(max_examples=40)
@given(st.integers(0, 3000), st.integers(1, 6), st.binary(min_size=32, max_size=32))
def test_native_chain_matches_blake3_package(step, n, key):
    """The C chain equals the blake3 package, message sizes across BLAKE3's chunk (1 KiB)
    and tree boundaries, with and without per-chunk extras."""
    step = max(1, step)
    data = os.urandom(step * n)
    prev = os.urandom(32)
    extras = os.urandom(32 * n)
    for x in (None, extras):
        assert keyhash.chain(key, prev, data, step, x) == keyhash.chain_python(
            key, prev, data, step, x
        )


def test_native_chain_is_built():
    """The native chain is what the scheduler runs here (the fallback is 3-5x slower)."""
    assert keyhash.is_native()


def test_keys_are_the_same_without_the_native_chain():
    code = (
        "from kvtier import keyhash; from kvtier.keys import Namespace, chunk_keys;"
        "assert not keyhash.is_native();"
        "print(chunk_keys(list(range(3000)), 32, Namespace('m','g').seed()).pop().hex())"
    )
    env = dict(os.environ, KVTIER_KEYS_NATIVE="0")
    out = subprocess.check_output([sys.executable, "-c", code], env=env, text=True).strip()
    assert out == chunk_keys(list(range(3000)), 32, Namespace("m", "g").seed())[-1].hex()


def test_deterministic_across_processes():
    code = (
        "from kvtier.keys import Namespace, chunk_keys; from kvtier.keyinputs import KeyInputs;"
        "s = Namespace('m','g', secret=b'k' * 16).seed(KeyInputs(cache_salt='salt'));"
        "print(chunk_keys(list(range(200)), 32, s).pop().hex())"
    )
    outs = set()
    for hashseed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        outs.add(subprocess.check_output([sys.executable, "-c", code], env=env, text=True).strip())
    assert len(outs) == 1
    seed = Namespace("m", "g", secret=b"k" * 16).seed(KeyInputs(cache_salt="salt"))
    assert outs.pop() == chunk_keys(list(range(200)), 32, seed)[-1].hex()


def test_groups_of_a_chain_have_their_own_tags():
    keys = chunk_keys(list(range(64 * GROUP_CHUNKS)), 1, SEED)
    tags = {k[:TAG_BYTES] for k in keys}
    assert len(tags) == 64
    assert len(set(keys)) == len(keys)


def test_out_of_range_token_ids_are_refused():
    with pytest.raises(ValueError, match="token ids"):
        chunk_keys([-1] * 16, 16, SEED)
    with pytest.raises(ValueError, match="token ids"):
        chunk_keys([2**32] * 16, 16, SEED)


# -- per-chunk inputs --------------------------------------------------------------------


def keys_with(inputs: KeyInputs, tokens: list[int], chunk: int = 16) -> list[bytes]:
    chain = NS.key_chain(chunk, inputs)
    chain.update(tokens)
    return chain.keys


def test_image_items_key_their_chunks_and_everything_after():
    """Same token ids (placeholders), different images: keys equal before the first chunk
    the image overlaps, different from there on."""
    toks = [7] * 160  # 10 chunks of 16
    a = keys_with(KeyInputs(mm=(MMInput("img-a", 40, 30, "image"),)), toks)
    b = keys_with(KeyInputs(mm=(MMInput("img-b", 40, 30, "image"),)), toks)
    plain = keys_with(KeyInputs(), toks)
    assert a[:2] == b[:2] == plain[:2]  # chunks 0, 1 end before token 40
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))
    assert all(x != y for x, y in zip(a[2:], plain[2:], strict=True))
    # the same image at another offset, or of another length
    moved = keys_with(KeyInputs(mm=(MMInput("img-a", 41, 30, "image"),)), toks)
    longer = keys_with(KeyInputs(mm=(MMInput("img-a", 40, 31, "image"),)), toks)
    assert moved[2] != a[2] and longer[2] != a[2] and moved[:2] == a[:2]
    assert a == keys_with(KeyInputs(mm=(MMInput("img-a", 40, 30, "image"),)), toks)


@given(
    st.lists(st.tuples(st.integers(0, 150), st.integers(1, 40)), max_size=4),
    st.integers(1, 24),
    st.data(),
)
def test_per_chunk_inputs_match_definition(spans, chunk, data):
    """With multimodal items and prompt embeddings, incremental keys equal the definition
    (x(i) from KeyInputs.chunk_text of the chunk's range)."""
    toks = [3] * 200
    mm = tuple(MMInput(f"id{o}-{n}", o, n, "image") for o, n in sorted(spans))
    embeds = data.draw(st.integers(0, 200))

    def digest(s: int, e: int) -> bytes:
        return blake3.blake3(frame(s, e)).digest()

    inputs = KeyInputs(mm=mm, embeds_tokens=embeds, embeds_digest=digest if embeds else None)
    chain = NS.key_chain(chunk, inputs)
    cut = 0
    while cut < len(toks):
        cut = data.draw(st.integers(cut + 1, len(toks)))
        chain.update(toks[:cut])
    extras = {i: inputs.chunk_text(i * chunk, (i + 1) * chunk) for i in range(len(toks) // chunk)}
    assert chain.keys == reference_keys(toks, chunk, NS.seed(inputs), NS.hash_key, extras)


def test_prompt_embeds_key_their_chunks():
    toks = [0] * 64

    def digest_of(tag: bytes):
        return lambda s, e: blake3.blake3(tag + frame(s, e)).digest()

    a = keys_with(KeyInputs(embeds_tokens=40, embeds_digest=digest_of(b"a")), toks)
    b = keys_with(KeyInputs(embeds_tokens=40, embeds_digest=digest_of(b"b")), toks)
    assert all(x != y for x, y in zip(a, b, strict=True))
    assert a == keys_with(KeyInputs(embeds_tokens=40, embeds_digest=digest_of(b"a")), toks)
    assert a != keys_with(KeyInputs(), toks)


class _Ids:
    """A token sequence that is not a list (as vLLM's ConstantList): slices into lists."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._ids[i]


@settings(max_examples=60)
@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=300),
    st.integers(1, 24),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_native_keys_match_the_python_path(tokens, chunk, as_list, with_image, data):
    """KeyChain.update's one native call (ids -> keys) gives the Python path's keys, however
    the tokens arrive (group tags continued across calls), from a list or another sequence,
    with per-chunk inputs or none."""
    assert keyhash.native_keys() is not None
    inputs = KeyInputs(mm=(MMInput("img", 5, 20),)) if with_image else KeyInputs()
    native, python = NS.key_chain(chunk, inputs), NS.key_chain(chunk, inputs)
    cut = 0
    while cut < len(tokens):
        cut = data.draw(st.integers(cut + 1, len(tokens)))
        seq = tokens[:cut] if as_list else _Ids(tokens[:cut])
        n = native.update(seq)
        base = len(python.keys)
        n_py = (cut - base * chunk) // chunk
        if n_py > 0:
            extras = python._extras(base, n_py) if inputs.per_chunk else None
            python._update_python(tokens[:cut], base, n_py, extras)
        assert n == max(0, n_py)
        assert native.keys == python.keys and native._last == python._last


def test_native_keys_refuse_what_is_not_a_token_id():
    for bad in ([-1], [2**32], [1.5], ["a"]):
        with pytest.raises(ValueError, match="token ids"):
            chunk_keys(bad * 16, 16, SEED)
    # an int-like id (numpy's) is read through __index__, as array("I") reads it
    import numpy as np

    assert chunk_keys([np.int64(7)] * 16, 16, SEED) == chunk_keys([7] * 16, 16, SEED)


def test_the_written_out_public_hash_key_is_the_derived_one():
    # keys.py spells it out so importing kvtier needs no blake3; it must stay the KDF's.
    from kvtier import keyhash
    from kvtier.keys import HASH_KEY_CONTEXT

    assert keyhash.derive_key(HASH_KEY_CONTEXT, b"") == PUBLIC_HASH_KEY
