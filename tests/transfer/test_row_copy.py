"""Streaming row copies (kvtier.transfer._rowcopy via kvtier.transfer.copy) against NumPy's
fancy indexing, over row sizes, strides and alignments that real engines and odd ones give."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvtier.transfer import copy as rowcopy
from kvtier.transfer.native import row_copier


@pytest.fixture(autouse=True)
def stream_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every copy takes the streaming path, however small (the size floor is a speed
    choice, not a correctness one)."""
    monkeypatch.setattr(rowcopy, "STREAM_MIN_BYTES", 0)


def test_the_streaming_copier_is_built_here() -> None:
    # setup.sh builds the extension; without it these tests would only test NumPy.
    assert row_copier() is not None


def _strided(buf: np.ndarray, offset: int, rows: int, row_bytes: int, gap: int) -> np.ndarray:
    return np.lib.stride_tricks.as_strided(
        buf[offset:], shape=(rows, row_bytes), strides=(row_bytes + gap, 1)
    )


def _case(data: st.DataObject) -> tuple[np.ndarray, tuple[int, int, int, int], np.ndarray]:
    """A buffer holding rows at a stride (``gap`` bytes between them) from an odd offset,
    the geometry, and distinct row ids."""
    rows = data.draw(st.integers(1, 40), label="rows")
    row_bytes = data.draw(st.integers(1, 700), label="row_bytes")
    gap = data.draw(st.integers(0, 70), label="stride gap")
    offset = data.draw(st.integers(0, 63), label="misalignment")
    buf = np.arange(offset + rows * (row_bytes + gap), dtype=np.int64).astype(np.uint8)
    n = data.draw(st.integers(0, rows), label="n")
    ids = np.array(data.draw(st.permutations(range(rows)), label="ids")[:n], dtype=np.int64)
    return buf, (offset, rows, row_bytes, gap), ids


@given(st.data())
def test_gather_equals_fancy_indexing(data: st.DataObject) -> None:
    buf, geometry, ids = _case(data)
    indexed = _strided(buf, *geometry)
    before = buf.copy()
    out = torch.full((len(ids), indexed.shape[1]), 7, dtype=torch.uint8)
    rowcopy.gather_rows(out, torch.from_numpy(indexed), torch.from_numpy(ids))
    assert np.array_equal(out.numpy(), indexed[ids])
    assert np.array_equal(buf, before)  # the source is only read


@given(st.data())
def test_scatter_equals_fancy_assignment(data: st.DataObject) -> None:
    buf, geometry, ids = _case(data)
    dense = np.random.default_rng(len(ids)).integers(
        0, 256, (len(ids), geometry[2]), dtype=np.uint8
    )
    want = buf.copy()
    _strided(want, *geometry)[ids] = dense
    rowcopy.scatter_rows(_strided(buf, *geometry), ids, dense)
    assert np.array_equal(buf, want)  # the rows, and nothing between or around them


def test_an_index_out_of_range_raises_and_writes_nothing() -> None:
    indexed = np.zeros((8, 64), dtype=np.uint8)
    dense = np.ones((2, 64), dtype=np.uint8)
    for bad in ([0, 8], [-1, 0]):
        with pytest.raises(IndexError, match="out of range"):
            rowcopy.scatter_rows(indexed, np.array(bad, dtype=np.int64), dense)
        assert not indexed.any()
        out = torch.zeros(2, 64, dtype=torch.uint8)
        with pytest.raises(IndexError, match="out of range"):
            rowcopy.gather_rows(
                out, torch.from_numpy(indexed), torch.tensor(bad, dtype=torch.int64)
            )
