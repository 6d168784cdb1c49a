"""Sealing ahead (kvtier.tiers.remote.ahead): a helper thread seals a batch's values while
the sender sends. Every value is sealed once, by one thread, and its bytes reach the sender
whole, in order, from a buffer nobody writes meanwhile, whatever the two threads' speeds;
a failure on the helper surfaces on the sender; nothing of a batch runs after it ends. Then
real stores on a real redis-server: values sealed ahead read back through a store sealing
inline and the other way round (one format), MAC and AEAD, segments with gaps."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteStore, parse_remote_url
from kvtier.tiers.remote.ahead import SealAhead
from kvtier.tiers.remote.auth import ValueAuth
from tests.support.redis_fixtures import CHUNK_BYTES, NAMESPACE, chain, payload, server  # noqa: F401

VALUE = 4096
PIECE = 1024


def value_of(j: int) -> bytes:
    return bytes((j * 7 + i) % 251 for i in range(VALUE))


class Recorder:
    """``work`` and ``inline`` for a SealAhead batch of synthetic values, recording who
    sealed what (and sleeping as told, to vary the split)."""

    def __init__(self, helper_sleep: float, fail_at: int | None = None) -> None:
        self.helper_sleep = helper_sleep
        self.fail_at = fail_at
        self.sealed: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.live = 0  # seals running now
        self.sender = threading.get_ident()

    def work(self, j: int, buffer):
        who = "sender" if threading.get_ident() == self.sender else "helper"
        with self.lock:
            self.sealed.append((j, who))
            self.live += 1
        try:
            if who == "helper":
                time.sleep(self.helper_sleep * random.random())
            if j == self.fail_at:
                raise RuntimeError(f"sealing {j} failed")
            buf = buffer()
            buf[:VALUE] = value_of(j)
            return [buf[a : a + PIECE] for a in range(0, VALUE, PIECE)]
        finally:
            with self.lock:
                self.live -= 1

    def inline(self, j: int):
        with self.lock:
            self.sealed.append((j, "inline"))
        data = value_of(j)
        for a in range(0, VALUE, PIECE):
            yield data[a : a + PIECE]


def send_all(ahead: SealAhead, rec: Recorder, n: int, sender_sleep: float) -> list[bytes]:
    """Consume a batch as set_streamed does; each piece is checked again after a pause, so
    a buffer reused too early (overwritten while being sent) is caught."""
    out = []
    with ahead.batch(n, rec.work, rec.inline) as parts:
        assert parts is not None
        for j in range(n):
            got = []
            for piece in parts(j):
                kept = bytes(piece)
                time.sleep(sender_sleep * random.random())
                assert bytes(piece) == kept, f"value {j}'s buffer changed while it was sent"
                got.append(kept)
            out.append(b"".join(got))
    return out


@pytest.mark.parametrize(
    ("helper_sleep", "sender_sleep", "who"),
    [
        (0.0, 0.001, "helper"),  # a fast helper: most values come from its buffers
        (0.01, 0.0, "sender"),  # a slow helper: the sender seals most values itself
        (0.002, 0.0005, None),
    ],
)
def test_every_value_is_sealed_once_and_sent_whole_in_order(helper_sleep, sender_sleep, who):
    random.seed(7)
    with ThreadPoolExecutor(1) as pool:
        ahead = SealAhead(pool, VALUE)
        assert ahead.slots == max(2, (4 << 20) // VALUE)
        for n in (1, 2, 3, 40):
            rec = Recorder(helper_sleep)
            assert send_all(ahead, rec, n, sender_sleep) == [value_of(j) for j in range(n)]
            assert sorted(j for j, _ in rec.sealed) == list(range(n))  # each exactly once
            # The sender starts at once, sealing what nobody has claimed into a free
            # buffer (never inline while one is free: each value goes out whole).
            assert rec.sealed[0] == (0, "sender")
            assert all(x != "inline" for _, x in rec.sealed), rec.sealed
            if who and n == 40:  # the sender's own: unclaimed, or ahead while it waits
                helper = sum(1 for _, x in rec.sealed if x == "helper")
                mine = helper if who == "helper" else n - helper
                assert mine > n // 2, rec.sealed


def test_few_buffers_are_reused_without_overwriting_a_value_being_sent():
    random.seed(3)
    with ThreadPoolExecutor(1) as pool:
        ahead = SealAhead(pool, 3 << 20)  # two slots
        assert ahead.slots == 2
        rec = Recorder(0.0)
        n = 30
        sent = []
        with ahead.batch(n, rec.work, rec.inline) as parts:
            for j in range(n):
                pieces = list(parts(j))  # the generator ends: its buffer is free again
                sent.append(b"".join(bytes(p) for p in pieces[:VALUE]))
                time.sleep(0.001)
        assert [s[:VALUE] for s in sent] == [value_of(j) for j in range(n)]


def test_a_failure_while_sealing_ahead_raises_on_the_sender():
    with ThreadPoolExecutor(1) as pool:
        ahead = SealAhead(pool, VALUE)
        rec = Recorder(0.0, fail_at=5)
        seen = []
        failed = pytest.raises(RuntimeError, match="sealing 5 failed")
        with failed, ahead.batch(10, rec.work, rec.inline) as parts:
            seen.append(b"".join(bytes(p) for p in parts(0)))
            deadline = time.monotonic() + 30  # the helper gets to value 5 first
            while (5, "helper") not in rec.sealed and time.monotonic() < deadline:
                time.sleep(0.001)
            for j in range(1, 10):
                seen.append(b"".join(bytes(p) for p in parts(j)))
        assert seen == [value_of(j) for j in range(5)]
        assert (5, "helper") in rec.sealed
        assert rec.live == 0


def test_a_batch_stopped_early_leaves_nothing_running_and_frees_the_helper():
    with ThreadPoolExecutor(1) as pool:
        ahead = SealAhead(pool, VALUE)
        rec = Recorder(0.02)
        with pytest.raises(KeyboardInterrupt), ahead.batch(100, rec.work, rec.inline) as parts:
            next(iter(parts(0)))
            time.sleep(0.01)  # the helper is in the middle of sealing value 1
            raise KeyboardInterrupt
        assert rec.live == 0  # the helper's seal finished before the batch returned
        count = len(rec.sealed)
        time.sleep(0.05)
        assert len(rec.sealed) == count  # and it claimed nothing after
        assert count < 100
        rec2 = Recorder(0.0)  # the helper is free for the next batch
        assert send_all(ahead, rec2, 5, 0.0) == [value_of(j) for j in range(5)]


def test_a_second_concurrent_batch_seals_inline():
    with ThreadPoolExecutor(1) as pool:
        ahead = SealAhead(pool, VALUE)
        rec = Recorder(0.0)
        with ahead.batch(3, rec.work, rec.inline) as first:
            with ahead.batch(3, rec.work, rec.inline) as second:
                assert first is not None and second is None
            for j in range(3):
                list(first(j))


# -- real stores ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["mac", "aead"])
def test_a_value_sealed_at_once_is_the_value_sealed_part_by_part(mode):
    """What the helper makes (seal_into, or mac_pieces for host memory) opens like what the
    inline sealer streams: the same bytes under a MAC, the same plaintext under AES-GCM
    (fresh salt and nonce each time), and neither opens under another name."""
    auth = ValueAuth(b"s" * 40, mode == "aead", NAMESPACE.digest(), 5000)
    plain = [bytes(range(256)) * 8, b"\x07" * 2952, b"tail" * 32]  # 5000, and 128 (envelope)
    whole = b"".join(plain)
    streamed = b"".join(bytes(p) for p in auth.seal(b"name", iter(plain)))
    out = memoryview(bytearray(len(streamed) + 64))
    at_once = bytes(auth.seal_into(b"name", iter(plain), out))
    assert len(at_once) == len(streamed) == auth.plain_bytes + auth.overhead
    for value in (streamed, at_once):
        assert bytes(auth.open(b"name", value)) == whole
        assert auth.open(b"other", value) is None
    if mode == "mac":
        assert at_once == streamed
        pieces = auth.mac_pieces(b"name", iter(plain))
        assert b"".join(bytes(p) for p in pieces) == streamed and pieces[0] is plain[0]
    else:
        assert at_once[:28] != streamed[:28] and at_once[28:-16] != streamed[28:-16]


def _store(url: str, mode: str, ahead: bool) -> RemoteStore:
    digest = NAMESPACE.digest()
    auth = ValueAuth(b"s" * 40, mode == "aead", digest, CHUNK_BYTES)
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    space = KeySpace(NAMESPACE, b"s" * 40, mode == "aead")
    least = 0 if ahead else None  # these values are small: sealed ahead only when told
    return RemoteStore(client, space, CHUNK_BYTES, digest, auth=auth, seal_ahead_bytes=least)


def _gappy(data: torch.Tensor):
    """Each chunk as two segments with a gap between them (zeros in the value)."""
    q = CHUNK_BYTES // 4
    return [[(0, row[:q]), (2 * q, row[2 * q : 3 * q])] for row in data]


@pytest.mark.parametrize("mode", ["mac", "aead"])
def test_values_sealed_ahead_and_inline_are_one_format(server, mode):  # noqa: F811
    n = 37
    keys = chain(n, salt=11)
    data = payload(n, seed=5)
    ahead, inline = _store(server.url, mode, True), _store(server.url, mode, False)
    small = _store(server.url, mode, True)
    small.batch = 4  # several batches of a job, each with its own helper run
    try:
        for writer, reader, ks in ((ahead, inline, keys[:20]), (inline, ahead, keys[20:])):
            assert all(writer.write([0] * len(ks), ks, _gappy(data[: len(ks)])))
            out = torch.zeros(len(ks), CHUNK_BYTES, dtype=torch.uint8)
            assert all(reader.read([0] * len(ks), ks, [[(0, row)] for row in out]))
            q = CHUNK_BYTES // 4
            want = torch.zeros_like(out)
            want[:, :q] = data[: len(ks), :q]
            want[:, 2 * q : 3 * q] = data[: len(ks), 2 * q : 3 * q]
            assert torch.equal(out, want)
        fresh = chain(n, salt=12)
        assert all(small.write([0] * n, fresh, _gappy(data)))
        back = torch.zeros(n, CHUNK_BYTES, dtype=torch.uint8)
        assert all(inline.read([0] * n, fresh, [[(0, row)] for row in back]))
        assert torch.equal(back[:, : CHUNK_BYTES // 4], data[:, : CHUNK_BYTES // 4])
        assert inline.auth_failures == ahead.auth_failures == small.auth_failures == 0
        assert not inline.threads.sealing_ahead and ahead.threads.sealing_ahead  # each its path
    finally:
        for s in (ahead, inline, small):
            s.close()
