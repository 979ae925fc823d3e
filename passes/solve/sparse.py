"""The compressed sparse matrices the MILP backends read, built with numpy alone.

scipy.sparse served before; importing it costs more than most small solves (its array-API layer loads numpy.f2py
and numpy.testing: +1.7 s on 2 loaded cores over numpy and highspy, measured), and the backends only need the rows
or columns compressed. So this is just that: the matrix of (row, column, value) entries, duplicates summed, in
either compressed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True)
class Compressed:
    """A sparse matrix compressed along its major axis: `indices` and `data` of major line k are at
    indptr[k]:indptr[k + 1]. Row-major (CSR) or column-major (CSC) as `by_rows` says; `shape` is (rows, columns)."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]
    by_rows: bool

    @classmethod
    def from_entries(
        cls, rows: ArrayLike, cols: ArrayLike, values: ArrayLike, shape: tuple[int, int], by_rows: bool = True
    ) -> Compressed:
        """The matrix of the (rows[k], cols[k], values[k]) entries, values at the same position summed."""
        row_index, col_index = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        major, minor = (row_index, col_index) if by_rows else (col_index, row_index)
        order = np.lexsort((minor, major))
        major, minor = major[order], minor[order]
        entries = np.asarray(values, dtype=np.float64)[order]
        first = np.ones(len(major), dtype=bool)
        first[1:] = (major[1:] != major[:-1]) | (minor[1:] != minor[:-1])
        starts = np.flatnonzero(first)
        summed = np.add.reduceat(entries, starts) if len(starts) else entries
        lines = shape[0] if by_rows else shape[1]
        indptr = np.searchsorted(major[starts], np.arange(lines + 1)).astype(np.int64)
        return cls(indptr, minor[starts], summed, shape, by_rows)

    @property
    def nnz(self) -> int:
        return len(self.data)

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, columns, values) of the stored entries."""
        major = np.repeat(np.arange(len(self.indptr) - 1), np.diff(self.indptr))
        return (major, self.indices, self.data) if self.by_rows else (self.indices, major, self.data)

    def dot(self, x: np.ndarray) -> np.ndarray:
        """The product of the matrix with the vector `x`."""
        rows, cols, values = self.entries()
        return np.bincount(rows, weights=values * x[cols], minlength=self.shape[0])

    def tocsr(self) -> Compressed:
        return self if self.by_rows else Compressed.from_entries(*self.entries(), self.shape, by_rows=True)

    def tocsc(self) -> Compressed:
        return Compressed.from_entries(*self.entries(), self.shape, by_rows=False) if self.by_rows else self

    def toarray(self) -> np.ndarray:
        """The dense matrix."""
        dense = np.zeros(self.shape)
        rows, cols, values = self.entries()
        np.add.at(dense, (rows, cols), values)
        return dense
