"""One shard's vectors: a read-only base mapped from the index file, and the rows written since in
memory.

Opening a store maps each bucket's vector file instead of reading it, so opening costs no more
than reading the ids, and right after an open or a save the memory a process holds is what its
searches touch (the page cache shares the rest). Rows appended since live in a growable array
until the next save maps them from its file (about 2 KB a row meanwhile); a write to a mapped row
(zeroing a forgotten vector under a graph) first copies the base into memory, as the file is
never written in place: it is replaced whole by the next save, and then mapped again.
"""

from __future__ import annotations

import numpy as np

from narrmem.products import inner_products


class VectorRows:
    # A bot with 50,000 users holds 50,000 of these: no per-object dict, and no rows in memory
    # until one is written (a shard that was only read holds its mapped file alone).
    __slots__ = ("base", "dim", "tail")

    def __init__(self, dim: int, base: np.ndarray | None = None, capacity: int = 0) -> None:
        self.dim = dim
        self.base = base if base is not None else _no_rows(dim)
        # No rows yet: one empty array shared by all (reserve replaces it before any write).
        self.tail = np.empty((capacity, dim), dtype=np.float32) if capacity else _no_rows(dim)

    @classmethod
    def owning(cls, vectors: np.ndarray) -> VectorRows:
        """Rows held in memory (a snapshot a graph was built from)."""
        rows = cls(vectors.shape[1], capacity=0)
        rows.tail = vectors
        return rows

    @property
    def mapped(self) -> int:
        """How many rows are read from the file rather than held in memory."""
        return len(self.base)

    def capacity(self) -> int:
        return len(self.base) + len(self.tail)

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows in all; the rows in memory at least double when they grow (the
        mapped ones do not count: a large mapped shard does not get a tail as large as itself),
        from the first row written: most users have a few memories."""
        if rows > self.capacity():
            grown = np.empty((max(rows - len(self.base), 2 * len(self.tail)), self.dim), np.float32)
            grown[: len(self.tail)] = self.tail
            self.tail = grown

    def put(self, start: int, vectors: np.ndarray) -> None:
        """Write rows ``start`` onwards (appends: ``start`` is past the mapped rows)."""
        if start < len(self.base):
            self._own()
        offset = start - len(self.base)
        self.tail[offset : offset + len(vectors)] = vectors

    def zero(self, rows: np.ndarray) -> None:
        if len(rows) and int(rows.min()) < len(self.base):
            self._own()
        self.tail[rows - len(self.base)] = 0.0

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of ``rows`` (any order), as one array in memory."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=np.float32)
        in_base = rows < len(self.base)
        if in_base.any():
            out[in_base] = self.base[rows[in_base]]
        if not in_base.all():
            out[~in_base] = self.tail[rows[~in_base] - len(self.base)]
        return out

    def first(self, n: int) -> np.ndarray:
        """Rows ``0..n`` as one array (a copy when they span the file and memory)."""
        if n <= len(self.base):
            return np.asarray(self.base[:n])
        if not len(self.base):
            return self.tail[:n]
        return np.concatenate([self.base, self.tail[: n - len(self.base)]])

    def scores(self, query: np.ndarray, n: int, start: int = 0) -> np.ndarray:
        """Inner products of rows ``start..n`` with ``query``, read in place (neither the mapped
        rows nor the ones in memory are copied)."""
        mapped = len(self.base)
        parts = []
        if start < min(n, mapped):
            parts.append(inner_products(np.asarray(self.base[start : min(n, mapped)]), query))
        if n > max(start, mapped):
            parts.append(inner_products(self.tail[max(start, mapped) - mapped : n - mapped], query))
        if not parts:
            return np.zeros(0, dtype=np.float32)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _own(self) -> None:
        """Hold every row in memory: the mapped file is never written."""
        owned = np.empty((len(self.base) + len(self.tail), self.dim), dtype=np.float32)
        owned[: len(self.base)] = self.base
        owned[len(self.base) :] = self.tail
        self.tail = owned
        self.base = _no_rows(self.dim)


_EMPTY: dict[int, np.ndarray] = {}


def _no_rows(dim: int) -> np.ndarray:
    """A read-only array of no rows, one per dimension."""
    empty = _EMPTY.get(dim)
    if empty is None:
        empty = _EMPTY[dim] = np.empty((0, dim), dtype=np.float32)
        empty.flags.writeable = False
    return empty
