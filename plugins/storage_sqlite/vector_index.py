"""The FAISS index derived from the vectors in SQLite.

An ``IndexIDMap2`` over a flat inner-product index: exact search, ids are the SQLite row ids,
and ids can be removed (which HNSW cannot). Every FAISS call runs on one dedicated thread, so
the event loop never waits on a search and adds never race searches.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import faiss
import numpy as np

log = logging.getLogger("narrmem.storage_sqlite")


class VectorIndex:
    def __init__(self, path: Path, dim: int) -> None:
        # Searches are per scope and small; FAISS's own threads would only fight the embedder.
        faiss.omp_set_num_threads(1)
        self.path = path
        self.dim = dim
        self._index: Any = self._empty()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-faiss")
        self.dirty = False
        self.rebuilt_reason: str | None = None

    def _empty(self) -> Any:
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    @property
    def size(self) -> int:
        return int(self._index.ntotal)

    def ids(self) -> np.ndarray:
        return np.sort(faiss.vector_to_array(self._index.id_map).astype(np.int64))

    async def load(self, expected_ids: np.ndarray, samples: dict[int, np.ndarray]) -> bool:
        """Load the persisted index; return ``False`` (and stay empty) if it is missing, unreadable,
        of another dimension, holds a different id set than SQLite, or other vectors under the
        sampled ids (an index copied from another store)."""
        reason = await self._run(self._load_sync, expected_ids, samples)
        self.rebuilt_reason = reason
        if reason is not None:
            level = logging.WARNING if len(expected_ids) else logging.DEBUG
            log.log(
                level,
                "vector index %s will be rebuilt from SQLite: %s",
                self.path,
                reason,
            )
            self._index = self._empty()
            return False
        return True

    def _load_sync(self, expected_ids: np.ndarray, samples: dict[int, np.ndarray]) -> str | None:
        if not self.path.exists():
            return "the index file is missing"
        try:
            index = faiss.read_index(str(self.path))
        except Exception as exc:  # FAISS raises RuntimeError subclasses with C++ messages
            return f"the index file is unreadable ({exc})"
        if not isinstance(index, faiss.IndexIDMap2) or index.d != self.dim:
            return "the index file has another type or dimension"
        self._index = index
        if not np.array_equal(self.ids(), expected_ids):
            return "the index holds other ids than SQLite"
        for memory_id, vector in samples.items():
            if not np.allclose(index.reconstruct(memory_id), vector, atol=1e-6):
                return f"the index holds another vector for id {memory_id}"
        return None

    async def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids):
            await self._run(self._index.add_with_ids, _matrix(vectors), np.asarray(ids, dtype=np.int64))
            self.dirty = True

    async def remove(self, ids: np.ndarray) -> int:
        if not len(ids):
            return 0
        selector = faiss.IDSelectorBatch(np.asarray(ids, dtype=np.int64))
        removed = int(await self._run(self._index.remove_ids, selector))
        self.dirty = True
        return removed

    async def search(self, vector: np.ndarray, k: int, allowed: np.ndarray) -> list[tuple[int, float]]:
        """Top ``k`` among ``allowed`` ids only: the scope filter is part of the FAISS query."""
        if not len(allowed) or self.size == 0:
            return []
        return list(await self._run(self._search_sync, vector, min(k, len(allowed)), allowed))

    def _search_sync(self, vector: np.ndarray, k: int, allowed: np.ndarray) -> list[tuple[int, float]]:
        params = faiss.SearchParameters(sel=faiss.IDSelectorBatch(allowed))
        scores, ids = self._index.search(_matrix(vector.reshape(1, -1)), k, params=params)
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    async def save(self) -> None:
        await self._run(self._save_sync)
        self.dirty = False

    def _save_sync(self) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        faiss.write_index(self._index, str(tmp))
        os.replace(tmp, self.path)  # atomic: a crash leaves the old file or the new one

    async def close(self) -> None:
        self._executor.shutdown(wait=True)


def _matrix(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32)
