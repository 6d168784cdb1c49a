"""vLLM's KV events as a router sees them: a ZMQ subscriber the engines publish to, vLLM's own
block hashes of known token sequences, and the replay of event batches into the blocks each
medium holds. Independent of kvtier's event code, so it serves as the oracle."""

from __future__ import annotations

import threading
from typing import Any

BLOCK = 32  # the runner's engine block size


class Subscriber:
    """A SUB socket bound where the engines connect, collecting every message."""

    def __init__(self) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.messages: list[tuple[bytes, int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        while not self._stop.is_set():
            try:
                topic, seq, payload = self.sock.recv_multipart()
            except zmq.Again:
                continue
            self.messages.append((topic, int.from_bytes(seq, "big"), payload))

    def batches(self, topic: bytes) -> list[Any]:
        """The decoded batches of one topic, checked gap-free from sequence 0."""
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        mine = [(seq, payload) for t, seq, payload in self.messages if t == topic]
        assert [seq for seq, _ in mine] == list(range(len(mine))), "a batch was lost"
        return [decoder.decode(payload) for _, payload in mine]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close(linger=0)
        self.ctx.term()


def block_hashes(tokens: list[int], block: int = BLOCK) -> list[int]:
    """vLLM's hashes (as its events carry them) of every full ``block``-token block of
    ``tokens``."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    fn = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
    kcu.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block):
        parent = kcu.hash_block_tokens(fn, parent, tokens[i * block : (i + 1) * block])
        out.append(kcu.maybe_convert_block_hash(parent))
    return out


def replay(batches: list[Any], strict: bool = True) -> dict[str, set[int]]:
    """Per medium, the block hashes the events say are held (AllBlocksCleared: the engine's
    own cache). ``strict``: a kvtier medium never announces a held block again, nor
    removes one it did not announce."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    state: dict[str, set[int]] = {"GPU": set(), "CPU": set(), "STORAGE": set()}
    for batch in batches:
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                state["GPU"].clear()
                continue
            medium = ev.medium or "GPU"
            assert medium in state, medium
            held = state[medium]
            for h in ev.block_hashes:
                if isinstance(ev, BlockStored):
                    assert not (strict and medium != "GPU" and h in held), (medium, h)
                    held.add(h)
                else:
                    assert isinstance(ev, BlockRemoved)
                    assert not (strict and medium != "GPU" and h not in held), (medium, h)
                    held.discard(h)
    return state
