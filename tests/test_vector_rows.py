"""A shard's vectors split between a read-only mapped base and rows in memory: reads see one
sequence of rows, a write never touches the mapped file, and growing does not copy the base."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from narrmem_plugins.storage_sqlite.vector_rows import VectorRows

DIM = 4


def mapped_rows(tmp_path: Path, n: int) -> tuple[VectorRows, np.ndarray, Path]:
    base = np.arange(n * DIM, dtype=np.float32).reshape(n, DIM)
    path = tmp_path / "vectors.npy"
    np.save(path, base)
    return VectorRows(DIM, base=np.load(path, mmap_mode="r")), base, path


def test_reads_span_the_mapped_rows_and_the_rows_in_memory(tmp_path: Path) -> None:
    rows, base, _ = mapped_rows(tmp_path, 5)
    extra = np.full((3, DIM), 7.0, dtype=np.float32)
    rows.reserve(8)
    rows.put(5, extra)
    everything = np.vstack([base, extra])
    assert rows.mapped == 5
    assert np.array_equal(rows.first(8), everything)
    assert np.array_equal(rows.first(3), base[:3])
    assert np.array_equal(rows.take(np.array([6, 0, 4, 7])), everything[[6, 0, 4, 7]])
    query = np.array([1.0, 0.0, -1.0, 0.5], dtype=np.float32)
    assert np.allclose(rows.scores(query, 8), everything @ query)
    assert np.allclose(rows.scores(query, 4), base[:4] @ query)
    # A range read where it lies: inside the mapped rows, across both, inside the ones in memory.
    for start, stop in ((1, 4), (3, 7), (5, 8), (6, 6)):
        assert np.allclose(rows.scores(query, stop, start), everything[start:stop] @ query)


def test_growing_keeps_the_base_mapped_and_the_tail_small(tmp_path: Path) -> None:
    rows, base, _ = mapped_rows(tmp_path, 1000)
    for n in range(1000, 1040):
        rows.reserve(n + 1)
        rows.put(n, np.ones((1, DIM), dtype=np.float32))
    assert rows.mapped == 1000 and len(rows.tail) < 100  # not a second copy of the base
    assert np.array_equal(rows.first(1040)[:1000], base)


def test_a_write_to_a_mapped_row_moves_the_rows_into_memory(tmp_path: Path) -> None:
    rows, base, path = mapped_rows(tmp_path, 5)
    rows.zero(np.array([1, 3]))
    assert rows.mapped == 0
    expected = base.copy()
    expected[[1, 3]] = 0.0
    assert np.array_equal(rows.first(5), expected)
    assert np.array_equal(np.load(path), base)  # the file is never written in place
    assert np.array_equal(VectorRows.owning(expected).take(np.array([4])), expected[[4]])
