"""The numpy-only compressed matrices equal the dense matrix of their entries, duplicates summed, in both orders."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx_remat.passes.solve.sparse import Compressed


def dense_of(rows: list[int], cols: list[int], values: list[float], shape: tuple[int, int]) -> np.ndarray:
    dense = np.zeros(shape)
    for r, c, v in zip(rows, cols, values, strict=True):
        dense[r, c] += v
    return dense


def lines(matrix: Compressed) -> np.ndarray:
    """The dense matrix read line by line through indptr and indices, as the backends read it."""
    dense = np.zeros(matrix.shape)
    for k in range(len(matrix.indptr) - 1):
        span = slice(matrix.indptr[k], matrix.indptr[k + 1])
        for minor, value in zip(matrix.indices[span], matrix.data[span], strict=True):
            dense[(k, minor) if matrix.by_rows else (minor, k)] += value
    return dense


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_both_orders_hold_the_summed_entries(rows: int, cols: int, data: st.DataObject):
    count = data.draw(st.integers(0, 20))
    r = data.draw(st.lists(st.integers(0, rows - 1), min_size=count, max_size=count))
    c = data.draw(st.lists(st.integers(0, cols - 1), min_size=count, max_size=count))
    v = data.draw(st.lists(st.integers(-5, 5).map(float), min_size=count, max_size=count))
    expected = dense_of(r, c, v, (rows, cols))
    csr = Compressed.from_entries(np.array(r), np.array(c), np.array(v), (rows, cols))
    csc = csr.tocsc()
    assert csr.by_rows and not csc.by_rows and csc.tocsc() is csc and csr.tocsr() is csr
    assert len(csr.indptr) == rows + 1 and len(csc.indptr) == cols + 1
    for matrix in (csr, csc, csc.tocsr()):
        assert np.array_equal(lines(matrix), expected) and np.array_equal(matrix.toarray(), expected)
        assert matrix.nnz == len({(a, b) for a, b in zip(r, c, strict=True)})
