"""The vector index derived from the vectors in SQLite, sharded by user.

Each ``(tenant, user_id)`` owns a shard; a search only ever touches the shards its scope names (one
user's, or the shards of the users who wrote in a chat), so other users' vectors are never read,
let alone ranked. A shard is searched exactly (a matrix product over its rows) while it is small;
once it holds ``hnsw_threshold`` rows a FAISS HNSW graph is built for it in the background and
searched instead. HNSW cannot remove points, so deletes there are tombstones, filtered inside the
FAISS query; when tombstones pass ``rebuild_ratio`` of a shard its graph is rebuilt in the
background from the live rows, and searches keep using the old graph (with its tombstones) until
the new one is swapped in.

Every write of the shards runs on one dedicated thread, which holds the index's lock while it works;
graph builds run on a second thread from a snapshot. A search that finds the lock free and has
little to score (``INLINE_EXACT_ROWS``) runs where it is asked, holding the lock: handing it to the
thread and back cost more than the search itself. Any other search waits its turn on the thread.
Searches never race writes either way.

On disk the index is a folder: rows in 64 bucket files (a shard's bucket is a hash of its key, so a
``forget`` rewrites one bucket, not the whole index) and one FAISS file per graph. A graph is saved
only while its shard has no tombstones: deleted vectors never stay in a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import logging
import os
import threading
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from narrmem_plugins.storage_sqlite import index_folder, mapped
from narrmem_plugins.storage_sqlite.vector_rows import VectorRows

from narrmem.products import inner_products

log = logging.getLogger("narrmem.storage_sqlite")

BUCKETS = 64
OUTSIDE_GRAPH_LIMIT = 2_000  # rows searched exactly beside a mapped graph before it is copied to memory
MAX_FAILED_BUILDS = 3  # then the shard stays on exact search (it is logged) instead of retrying forever
BUILD_CHUNK = 2_000  # rows added to a graph between checks for a closing index
FORMAT = 2  # 1: vectors inside the rows files (read whole); 2: vectors in files of their own, mapped
READABLE_FORMATS = (1, 2)
ShardKey = tuple[str, str]  # (tenant, user_id)
# A search scores at most this many rows exactly (about 0.8 ms) and reads at most this many shards
# to run without a thread (a graph's search is bounded by its ``ef_search``).
INLINE_EXACT_ROWS = 20_000
INLINE_SHARDS = 16


@dataclass(frozen=True)
class IndexOptions:
    hnsw_threshold: int = 10_000
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 256
    rebuild_ratio: float = 0.2

    @classmethod
    def from_settings(cls, storage: Any) -> IndexOptions:
        """The options a ``[storage]`` table (``StorageSettings``) sets: each is its ``hnsw_`` setting."""
        return cls(**{f.name: getattr(storage, "hnsw_" + f.name.removeprefix("hnsw_")) for f in fields(cls)})


@dataclass(frozen=True)
class Owner:
    """Where a vector belongs: the shard is the user, the chat narrows a search inside it."""

    tenant: str
    user_id: str
    chat_id: str

    @property
    def shard(self) -> ShardKey:
        return (self.tenant, self.user_id)


class Shard:
    """One user's rows: ids, chats (as codes) and vectors in growable arrays, plus a graph."""

    # One per user: a store of 50,000 users holds 50,000 at once.
    __slots__ = (
        "_dead_selector",
        "alive",
        "building",
        "chats",
        "dead",
        "dim",
        "failed_builds",
        "file_offset",
        "graph",
        "graph_mapped_from",
        "graph_saved",
        "ids",
        "key",
        "n",
        "removed_since_snapshot",
        "vectors",
    )

    def __init__(
        self,
        key: ShardKey,
        dim: int,
        capacity: int = 0,
        vectors: VectorRows | None = None,
        rows: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.key = key
        self.dim = dim
        if rows is None:
            self.n = 0
            self.ids = np.empty(capacity, dtype=np.int64)
            self.chats = np.empty(capacity, dtype=np.int32)
            self.alive = np.empty(capacity, dtype=bool)
        else:  # the ids and chats of rows held already (every one alive)
            self.ids, self.chats = rows
            self.n = len(self.ids)
            self.alive = np.ones(self.n, dtype=bool)
        self.vectors = vectors if vectors is not None else VectorRows(dim, capacity=capacity)
        self.dead = 0
        self.graph: Any = None  # an IndexHNSWFlat whose labels are row numbers
        self.graph_saved = False
        # The file a graph was mapped from. FAISS cannot add to a mapped graph (it aborts the
        # process): rows written after the open stay outside it, searched exactly beside it,
        # until a background copy into memory takes them in (see VectorIndex._thaw).
        self.graph_mapped_from: Path | None = None
        self.file_offset: int | None = None  # where its rows start in its bucket's vector file
        self.building = False
        self.failed_builds = 0
        self._dead_selector: Any = None
        # Ids removed since a graph build took its snapshot: written again meanwhile (an import
        # keeps ids), they are new rows, not the snapshot's.
        self.removed_since_snapshot: set[int] | None = None

    @classmethod
    def mapped(cls, key: ShardKey, ids: np.ndarray, chats: np.ndarray, vectors: np.ndarray) -> Shard:
        """A shard whose vectors are read from a mapped file (``vectors``, a read-only view); no
        room for rows written later until one is (its arrays then grow as any shard's do)."""
        # Views of the bucket's columns, read-only: the first row written grows them into arrays
        # of the shard's own (their capacity is exactly its rows), as a compaction copies them.
        dim = vectors.shape[1]
        return cls(key, dim, vectors=VectorRows(dim, base=vectors), rows=(ids, chats))

    @property
    def live(self) -> int:
        return self.n - self.dead

    def append(self, ids: np.ndarray, chats: np.ndarray, vectors: np.ndarray) -> None:
        if not len(ids):
            return
        need = self.n + len(ids)
        if need > len(self.ids):
            capacity = max(need, 2 * len(self.ids))
            self.ids = _grow(self.ids, capacity)
            self.chats = _grow(self.chats, capacity)
            self.alive = _grow(self.alive, capacity)
        self.vectors.reserve(need)
        rows = slice(self.n, need)
        self.ids[rows] = ids
        self.chats[rows] = chats
        self.vectors.put(self.n, vectors)
        self.alive[rows] = True
        if self.graph is not None and self.graph_mapped_from is None:
            self.graph.add(vectors)
            self.graph_saved = False
        self.n = need

    @property
    def outside_graph(self) -> int:
        """Rows after the last one the graph holds (written since a mapped graph was opened)."""
        return self.n - int(self.graph.ntotal) if self.graph is not None else 0

    def remove(self, ids: np.ndarray) -> int:
        rows = np.flatnonzero(self.alive[: self.n] & np.isin(self.ids[: self.n], ids))
        if not len(rows):
            return 0
        tracked = self.removed_since_snapshot  # read once: a failed build may clear it meanwhile
        if tracked is not None:
            tracked.update(self.ids[rows].tolist())
        if self.graph is None:
            keep = np.ones(self.n, dtype=bool)
            keep[rows] = False
            self._compact(keep)
        else:
            self.alive[rows] = False
            self.vectors.zero(rows)  # the graph keeps its own copy until the rebuild drops it
            self.dead += len(rows)
            self.forget_dead_selector()
        return len(rows)

    def chat_codes_of(self, ids: np.ndarray) -> list[int]:
        """The chats (as codes) of the live rows of ``ids``."""
        rows = self.alive[: self.n] & np.isin(self.ids[: self.n], ids)
        return [int(code) for code in np.unique(self.chats[: self.n][rows])]

    def holds_chat(self, code: int) -> bool:
        """Whether a live row belongs to the chat ``code``."""
        return bool(np.any((self.chats[: self.n] == code) & self.alive[: self.n]))

    def forget_dead_selector(self) -> None:
        self._dead_selector = None

    def _compact(self, keep: np.ndarray) -> None:
        self.ids = self.ids[: self.n][keep].copy()
        self.chats = self.chats[: self.n][keep].copy()
        self.vectors = VectorRows.owning(self.vectors.take(np.flatnonzero(keep)))
        self.alive = np.ones(len(self.ids), dtype=bool)
        self.n = len(self.ids)

    def live_ids(self) -> np.ndarray:
        return self.ids[: self.n][self.alive[: self.n]]

    def live_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep = self.alive[: self.n]
        vectors = self.vectors.first(self.n) if not self.dead else self.vectors.take(np.flatnonzero(keep))
        return self.ids[: self.n][keep], self.chats[: self.n][keep], vectors

    def search(
        self, query: np.ndarray, k: int, chat: int | None, allowed: np.ndarray | None, options: IndexOptions
    ) -> list[tuple[int, float]]:
        if self.live == 0:
            return []
        mask: np.ndarray | None = None
        if chat is not None:
            mask = self.chats[: self.n] == chat
        if allowed is not None:
            inside = np.isin(self.ids[: self.n], allowed)
            mask = inside if mask is None else mask & inside
        if self.dead and mask is not None:
            mask &= self.alive[: self.n]
        if self.graph is not None and (mask is None or np.count_nonzero(mask) >= options.hnsw_threshold):
            found = self._search_graph(query, k, mask, options)
            if self.outside_graph:
                keep = mask if mask is not None else (self.alive[: self.n] if self.dead else None)
                found = _best(found, self._search_outside_graph(query, k, keep), k)
            return found
        if mask is None:
            rows = None if not self.dead else np.flatnonzero(self.alive[: self.n])
        else:
            rows = np.flatnonzero(mask)
        return self._search_exact(query, k, rows)

    def _search_outside_graph(
        self, query: np.ndarray, k: int, keep: np.ndarray | None
    ) -> list[tuple[int, float]]:
        """Exact search of the rows after the graph's (those ``keep`` marks, a mask over all rows).
        They are contiguous, so they are scored where they lie: copying them out first cost more
        than the graph's own search (up to ``OUTSIDE_GRAPH_LIMIT`` rows, on every search of a large
        user after a restart)."""
        start = self.n - self.outside_graph
        scores = self.vectors.scores(query, self.n, start)
        if keep is not None:
            scores = np.where(keep[start : self.n], scores, -np.inf).astype(np.float32)
        k = min(k, len(scores) if keep is None else int(np.count_nonzero(keep[start : self.n])))
        if k <= 0:
            return []
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self.ids[start + r]), float(scores[r])) for r in top]

    def _search_exact(self, query: np.ndarray, k: int, rows: np.ndarray | None) -> list[tuple[int, float]]:
        scores = (
            self.vectors.scores(query, self.n)
            if rows is None
            else inner_products(self.vectors.take(rows), query)
        )
        if not len(scores):
            return []
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        picked = top if rows is None else rows[top]
        return [(int(self.ids[r]), float(s)) for r, s in zip(picked, scores[top], strict=True)]

    def _search_graph(
        self, query: np.ndarray, k: int, mask: np.ndarray | None, options: IndexOptions
    ) -> list[tuple[int, float]]:
        params = faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
        params.efSearch = max(options.ef_search, k)
        keep_alive: Any = None
        if mask is not None:
            keep_alive = np.flatnonzero(mask).astype(np.int64)
            params.sel = faiss.IDSelectorBatch(keep_alive)
        elif self.dead:
            if self._dead_selector is None:
                dead = faiss.IDSelectorBatch(np.flatnonzero(~self.alive[: self.n]).astype(np.int64))
                # The wrapper keeps ``dead`` referenced: FAISS holds only a pointer to it.
                self._dead_selector = (faiss.IDSelectorNot(dead), dead)
            params.sel = self._dead_selector[0]
        scores, rows = self.graph.search(query.reshape(1, -1), min(k, self.live), params=params)
        del keep_alive
        return [(int(self.ids[r]), float(s)) for r, s in zip(rows[0], scores[0], strict=True) if r >= 0]


class VectorIndex:
    def __init__(self, path: Path, dim: int, options: IndexOptions | None = None) -> None:
        # Searches are per shard and small; FAISS's own threads would only fight the embedder.
        faiss.omp_set_num_threads(1)
        self.path = path
        self.dim = dim
        self.options = options or IndexOptions()
        self._shards: dict[ShardKey, Shard] = {}
        self._chat_members: dict[tuple[str, str], set[ShardKey]] = {}
        self._chat_tenants: dict[str, int] = {}  # how many tenants have a chat of that id
        self._chat_codes: dict[str, int] = {}
        self._chat_names: dict[int, str] = {}
        # Codes are not given again while the process runs: a tombstone may still hold a dropped one.
        self._next_chat_code = 0
        self._stale_chats = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-vectors")
        self._busy = threading.Lock()  # held while the shards are read or changed
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-hnsw")
        self._builds: set[asyncio.Future[Any]] = set()
        self._dirty_buckets: set[int] = set()
        self._closing = False
        self.dirty = False
        self.rebuilt_reason: str | None = None
        # Rows added and removed to catch the files up with SQLite on open (saved before the
        # last writes: a process that stopped without closing), or None.
        self.caught_up: dict[str, int] | None = None
        self._saved_watermark: dict[str, int] | None = None

    # --- plumbing -------------------------------------------------------------------------

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._holding, fn, *args)

    def _holding(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._busy:
            return fn(*args)

    def _chat_code(self, chat_id: str) -> int:
        code = self._chat_codes.get(chat_id)
        if code is None:
            code = self._chat_codes[chat_id] = self._next_chat_code
            self._chat_names[code] = chat_id
            self._next_chat_code += 1
        return code

    def _set_chat_codes(self, codes: dict[str, int]) -> None:
        self._chat_codes = codes
        self._chat_names = {code: name for name, code in codes.items()}
        self._next_chat_code = max(codes.values(), default=-1) + 1

    def _mark(self, key: ShardKey) -> None:
        self._dirty_buckets.add(_bucket(key))
        self.dirty = True

    @property
    def size(self) -> int:
        return sum(shard.live for shard in self._shards.values())

    def user_size(self, tenant: str, user_id: str) -> int:
        """How many vectors a user holds."""
        shard = self._shards.get((tenant, user_id))
        return 0 if shard is None else shard.live

    def largest_scope(self) -> int:
        """The most vectors one user holds."""
        return max((shard.live for shard in list(self._shards.values())), default=0)

    def ids(self) -> np.ndarray:
        parts = [shard.live_ids() for shard in self._shards.values()]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def describe(self) -> dict[str, int]:
        shards = list(self._shards.values())
        return {
            "vector_shards": len(shards),
            "hnsw_shards": sum(s.graph is not None for s in shards),
            "tombstones": sum(s.dead for s in shards),
            "rows_outside_graphs": sum(s.outside_graph for s in shards),
            "hnsw_builds_running": len(self._builds),
        }

    # --- writing --------------------------------------------------------------------------

    async def add(self, ids: np.ndarray, vectors: np.ndarray, owners: Sequence[Owner]) -> None:
        if len(ids):
            touched = await self._run(
                self._add_sync, np.asarray(ids, dtype=np.int64), _matrix(vectors), list(owners)
            )
            self._schedule_builds(touched)

    def _add_sync(self, ids: np.ndarray, vectors: np.ndarray, owners: list[Owner]) -> list[ShardKey]:
        if not (len(ids) == len(vectors) == len(owners)):
            raise ValueError(f"{len(ids)} ids, {len(vectors)} vectors and {len(owners)} owners")
        groups: dict[ShardKey, list[int]] = {}
        for i, owner in enumerate(owners):
            groups.setdefault(owner.shard, []).append(i)
            self._join_chat(owner.tenant, owner.chat_id, owner.shard)
        for key, rows in groups.items():
            shard = self._shards.get(key)
            if shard is None:
                shard = self._shards[key] = Shard(key, self.dim)
            chats = np.array([self._chat_code(owners[i].chat_id) for i in rows], dtype=np.int32)
            shard.append(ids[rows], chats, vectors[rows])
            self._mark(key)
        return list(groups)

    async def remove(self, ids: np.ndarray, shards: Iterable[ShardKey]) -> int:
        """Remove ``ids`` from the named shards (the store knows whose rows it deleted)."""
        if not len(ids):
            return 0
        keys = set(shards)
        removed = int(await self._run(self._remove_sync, np.asarray(ids, dtype=np.int64), keys))
        self._schedule_builds(keys)
        return removed

    def _remove_sync(self, ids: np.ndarray, keys: set[ShardKey]) -> int:
        removed = 0
        for key in keys:
            shard = self._shards.get(key)
            if shard is None:
                continue
            codes = shard.chat_codes_of(ids)
            removed += shard.remove(ids)
            self._mark(key)
            if shard.live == 0 and not shard.building:
                del self._shards[key]
            for code in codes:
                name = self._chat_names.get(code)
                if name is not None and (key not in self._shards or not shard.holds_chat(code)):
                    self._leave_chat(key, name)
        return removed

    def _join_chat(self, tenant: str, chat_id: str, key: ShardKey) -> None:
        members = self._chat_members.get((tenant, chat_id))
        if members is None:
            members = self._chat_members[(tenant, chat_id)] = set()
            self._chat_tenants[chat_id] = self._chat_tenants.get(chat_id, 0) + 1
        members.add(key)

    def _leave_chat(self, key: ShardKey, chat_id: str) -> None:
        """The shard ``key`` holds nothing of ``chat_id`` any more. A chat no shard holds leaves
        the chat codes too, so the saved index keeps no name of a forgotten chat (a private chat's
        id is often its user's)."""
        members = self._chat_members.get((key[0], chat_id))
        if members is None:
            return
        members.discard(key)
        if members:
            return
        del self._chat_members[(key[0], chat_id)]
        left = self._chat_tenants.pop(chat_id, 1) - 1
        if left:
            self._chat_tenants[chat_id] = left
            return
        code = self._chat_codes.pop(chat_id, None)
        if code is not None:
            self._chat_names.pop(code, None)

    # --- reading --------------------------------------------------------------------------

    async def search(
        self,
        vector: np.ndarray,
        k: int,
        *,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        allowed: np.ndarray | None = None,
    ) -> list[tuple[int, float]]:
        """Top ``k`` inside the scope only: the shards searched are the scope's, nothing else."""
        if k <= 0:
            return []
        query = _matrix(vector.reshape(-1))
        if self._busy.acquire(blocking=False):
            try:
                if self._small(tenant, user_id, chat_id, allowed):
                    return self._search_sync(query, k, tenant, user_id, chat_id, allowed)
            finally:
                self._busy.release()
        return list(await self._run(self._search_sync, query, k, tenant, user_id, chat_id, allowed))

    def _small(
        self, tenant: str, user_id: str | None, chat_id: str | None, allowed: np.ndarray | None
    ) -> bool:
        """Whether a search of the scope is cheap enough to run without the thread: few shards and
        few rows scored exactly (a filter of ids reads every row of its shards)."""
        if user_id is not None:
            keys: Collection[ShardKey] = [(tenant, user_id)]
        elif chat_id is not None:
            keys = self._chat_members.get((tenant, chat_id), set())
        else:
            return False
        if len(keys) > INLINE_SHARDS:
            return False
        exact = 0
        for key in keys:
            shard = self._shards.get(key)
            if shard is not None:
                exact += shard.n if shard.graph is None or allowed is not None else shard.outside_graph
        return exact <= INLINE_EXACT_ROWS

    def _search_sync(
        self,
        query: np.ndarray,
        k: int,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        allowed: np.ndarray | None,
    ) -> list[tuple[int, float]]:
        if user_id is not None:
            keys: Iterable[ShardKey] = [(tenant, user_id)]
        elif chat_id is not None:
            keys = sorted(self._chat_members.get((tenant, chat_id), ()))
        else:
            raise ValueError("a vector search needs a user or a chat")
        chat = None
        if chat_id is not None:
            chat = self._chat_codes.get(chat_id)
            if chat is None:
                return []
        found: list[tuple[int, float]] = []
        for key in keys:
            shard = self._shards.get(key)
            if shard is not None:
                found.extend(shard.search(query, k, chat, allowed, self.options))
        found.sort(key=lambda hit: (-hit[1], hit[0]))
        return found[:k]

    # --- graphs ---------------------------------------------------------------------------

    def _schedule_builds(self, keys: Iterable[ShardKey] | None = None) -> None:
        """Start background builds for the shards that need one (``keys``: only these; a write
        checks the shards it touched, not every user's)."""
        if self._closing:
            return
        shards = list(self._shards.values()) if keys is None else [self._shards.get(k) for k in keys]
        for shard in shards:
            if shard is None or shard.building or shard.failed_builds >= MAX_FAILED_BUILDS:
                continue
            grow = shard.graph is None and shard.live >= self.options.hnsw_threshold
            shrink = shard.graph is not None and shard.dead > self.options.rebuild_ratio * shard.n
            if grow or shrink:
                self._start_build(shard)
            elif shard.graph_mapped_from is not None and shard.outside_graph >= OUTSIDE_GRAPH_LIMIT:
                self._start(shard, self._thaw(shard))

    def _start_build(self, shard: Shard) -> None:
        self._start(shard, self._build(shard))

    def _start(self, shard: Shard, work: Awaitable[None]) -> None:
        shard.building = True
        task = asyncio.ensure_future(work)
        self._builds.add(task)
        task.add_done_callback(self._builds.discard)

    async def _thaw(self, shard: Shard) -> None:
        """Copy a mapped graph into memory (on the builder thread; searches go on reading the
        mapping) and add the rows written since the open, so that it takes writes again."""
        loop = asyncio.get_running_loop()
        try:
            copy = await loop.run_in_executor(self._builder, _copy_graph, shard.graph)
            await self._run(self._install_thawed, shard, copy)
        except Exception:  # the shard stays searchable as it was: mapped graph and exact rows
            shard.failed_builds += 1
            log.exception("copying the HNSW graph of a vector shard into memory failed")
        finally:
            shard.building = False
        self._schedule_builds([shard.key])

    def _install_thawed(self, shard: Shard, graph: Any) -> None:
        if self._shards.get(shard.key) is not shard or shard.graph_mapped_from is None:
            return
        if shard.n > graph.ntotal:
            graph.add(shard.vectors.take(np.arange(int(graph.ntotal), shard.n)))
        shard.graph, shard.graph_mapped_from, shard.graph_saved = graph, None, False
        self.dirty = True

    async def _build(self, shard: Shard) -> None:
        loop = asyncio.get_running_loop()
        try:
            ids, chats, vectors = await self._run(_snapshot, shard)
            graph = await loop.run_in_executor(self._builder, self._new_graph, vectors)
            if graph is not None:
                await self._run(self._swap, shard, ids, chats, vectors, graph)
        except Exception:  # a failed build leaves the shard searchable as it was
            shard.failed_builds += 1
            log.exception("building the HNSW graph of a vector shard failed")
        finally:
            shard.building = False
            shard.removed_since_snapshot = None
        self._schedule_builds([shard.key])

    def _new_graph(self, vectors: np.ndarray) -> Any:
        """The graph over ``vectors`` (labels are their row numbers), or ``None`` if the index closes
        first: it is built in chunks so that closing never waits long for a large shard."""
        graph = faiss.IndexHNSWFlat(self.dim, self.options.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = self.options.ef_construction
        for start in range(0, len(vectors), BUILD_CHUNK):
            if self._closing:
                return None
            graph.add(vectors[start : start + BUILD_CHUNK])
        return graph

    def _swap(
        self, shard: Shard, ids: np.ndarray, chats: np.ndarray, vectors: np.ndarray, graph: Any
    ) -> None:
        """Install the graph built from a snapshot, replaying the adds and deletes made since."""
        if self._shards.get(shard.key) is not shard:
            return  # the shard was forgotten meanwhile
        now_ids, now_chats, now_vectors = shard.live_rows()
        rewritten = np.fromiter(shard.removed_since_snapshot or (), dtype=np.int64)
        shard.removed_since_snapshot = None
        kept = ~np.isin(ids, rewritten)
        added = ~np.isin(now_ids, ids[kept])
        removed = ids[~kept | ~np.isin(ids, now_ids)]
        added_ids, added_chats, added_vectors = now_ids[added], now_chats[added], now_vectors[added]
        shard.ids, shard.chats, shard.vectors = ids, chats, VectorRows.owning(vectors)
        shard.alive = np.ones(len(ids), dtype=bool)
        shard.n, shard.dead = len(ids), 0
        shard.graph, shard.graph_saved, shard.graph_mapped_from = graph, False, None
        shard.forget_dead_selector()
        # The snapshot's rows removed since go first: an id written again is appended after.
        if len(removed):
            shard.remove(removed)
        if len(added_ids):
            shard.append(added_ids, added_chats, added_vectors)
        self._mark(shard.key)

    async def settle(self) -> None:
        """Wait until no graph build is running (tests, benchmarks, a clean shutdown)."""
        while self._builds:
            await asyncio.gather(*list(self._builds), return_exceptions=True)

    # --- files ----------------------------------------------------------------------------

    async def load(self, check: Consistency) -> bool:
        """Load the persisted index; return ``False`` (and stay empty) if it is missing, unreadable,
        of another dimension, holds a different id set than SQLite, or other vectors or owners under
        the sampled ids (an index copied from another store). The id sets are compared only when
        the files' watermark is not SQLite's: an equal one proves them equal without reading
        every id."""
        reason = await self._run(self._read_files)
        if reason is None:
            reason = await self._check(check)
        self.rebuilt_reason = reason
        if reason is not None:
            held = check.watermark.get("changes") if check.watermark is not None else len(self._shards)
            level = logging.WARNING if held else logging.DEBUG
            log.log(level, "vector index %s will be rebuilt from SQLite: %s", self.path, reason)
            self._shards.clear()
            self._chat_members.clear()
            self._chat_tenants.clear()
            self._set_chat_codes({})
            return False
        # An older format, or names of chats no shard holds, are rewritten by the next save.
        self.dirty = bool(self._dirty_buckets) or self._stale_chats > 0
        self._schedule_builds()
        return True

    async def _check(self, check: Consistency) -> str | None:
        ids = self.ids()
        trusted = check.watermark is not None and self._saved_watermark == check.watermark
        self.caught_up = None
        if not trusted:
            expected = await check.ids()
            if not np.array_equal(ids, expected):
                if check.rows is None:
                    return "the index holds other ids than SQLite"
                return await self._catch_up(ids, expected, check)
        picks = ids[np.unique(np.linspace(0, len(ids) - 1, min(SAMPLES, len(ids))).astype(int))]
        samples = await check.samples(picks)
        if trusted and len(samples) != len(picks):
            return "the index holds ids SQLite does not"
        reason: str | None = await self._run(self._compare_samples, samples)
        return reason

    async def _catch_up(self, ids: np.ndarray, expected: np.ndarray, check: Consistency) -> str | None:
        """Files saved before SQLite's last writes (a process that stopped without closing): a
        row's vector and owner never change after the transaction that wrote it, and ids are never
        given twice, so the files are brought up to date by adding the rows SQLite gained and
        removing the ones it lost, once sampled rows of both prove the files are this store's.
        Before, every id read again from SQLite and every vector indexed again: 4.3 s at 100k
        memories after 300 messages, against 0.4 s for an open after a clean close."""
        assert check.rows is not None
        common = np.intersect1d(ids, expected, assume_unique=True)
        picks = common[np.unique(np.linspace(0, len(common) - 1, min(SAMPLES, len(common))).astype(int))]
        samples = await check.samples(picks) if len(picks) else {}
        reason: str | None = await self._run(self._compare_samples, samples)
        if reason is not None or len(samples) != len(picks):
            return f"the index holds other ids than SQLite, and {reason or 'ids SQLite does not'}"
        gone = np.setdiff1d(ids, expected, assume_unique=True)
        new = np.setdiff1d(expected, ids, assume_unique=True)
        if len(gone):
            await self.remove(gone, await self._run(self._holders, gone))
        for start in range(0, len(new), CATCH_UP_ROWS):
            found, vectors, owners = await check.rows(new[start : start + CATCH_UP_ROWS])
            await self.add(found, vectors, owners)
        self.caught_up = {"added": len(new), "removed": len(gone)}
        log.info("vector index %s caught up: %d rows added, %d removed", self.path, len(new), len(gone))
        return None

    def _holders(self, ids: np.ndarray) -> set[ShardKey]:
        """The shards holding any of ``ids`` (a catch-up's rows SQLite lost: their owner is gone)."""
        return {key for key, shard in self._shards.items() if np.isin(shard.ids[: shard.n], ids).any()}

    def _compare_samples(self, samples: dict[int, tuple[np.ndarray, ShardKey]]) -> str | None:
        for memory_id, (vector, key) in samples.items():
            shard = self._shards.get(key)
            rows: Any = np.flatnonzero(shard.ids[: shard.n] == memory_id) if shard is not None else []
            if shard is None or not len(rows):
                return f"the index files id {memory_id} under another user"
            if not np.allclose(shard.vectors.take(rows[:1])[0], vector, atol=1e-6):
                return f"the index holds another vector for id {memory_id}"
        return None

    def _read_files(self) -> str | None:
        manifest_path = self.path / "manifest.json"
        if not manifest_path.exists():
            return "the index file is missing"
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            if manifest.get("format") not in READABLE_FORMATS or manifest.get("dim") != self.dim:
                return "the index file has another format or dimension"
            self._set_chat_codes({str(k): int(v) for k, v in manifest["chats"].items()})
            self._saved_watermark = manifest.get("watermark")
            files = _BucketFiles(self.path, self.dim)
            with _collector_paused():
                for entry in manifest["shards"]:
                    self._load_shard(entry, files)
            # Chats no shard holds (files written before chats were dropped with their last row).
            held = {chat for _, chat in self._chat_members}
            self._stale_chats = len(self._chat_codes) - len(held)
            self._set_chat_codes({name: code for name, code in self._chat_codes.items() if name in held})
        except Exception as exc:  # numpy, json and FAISS all raise their own errors on a bad file
            return f"the index file is unreadable ({type(exc).__name__}: {exc})"
        return None

    def _load_shard(self, entry: dict[str, Any], files: _BucketFiles) -> None:
        key: ShardKey = (str(entry["tenant"]), str(entry["user_id"]))
        if "vectors" in entry:
            offset, count = int(entry["offset"]), int(entry["count"])
            ids, chats = files.ids(entry["ids"], offset, count)
            shard = Shard.mapped(key, ids, chats, files.vectors(entry["vectors"], offset, count))
            shard.file_offset = offset
        else:  # format 1: the vectors sit in the rows file; read whole, written anew by the next save
            ids, chats = files.rows(entry["rows"], entry["prefix"])
            shard = Shard(key, self.dim, capacity=len(ids))
            shard.append(ids, chats, files.rows_vectors(entry["rows"], entry["prefix"], len(ids)))
            self._mark(key)
        graph_file = entry.get("graph")
        if graph_file:
            # Mapped, not read: the graph's vectors are paged in as searches walk it.
            graph = faiss.read_index(str(self.path / graph_file), faiss.IO_FLAG_MMAP_IFC)
            mapped.advise_random(self.path / graph_file)
            if graph.ntotal <= shard.n and graph.d == self.dim:
                shard.graph, shard.graph_saved = graph, True
                shard.graph_mapped_from = self.path / graph_file
        self._shards[key] = shard
        # Most shards hold a few rows: a set of them is quicker than np.unique's sort.
        held = shard.chats[: shard.n]
        codes = set(held.tolist()) if shard.n < 256 else np.unique(held).tolist()
        for code in codes:
            self._join_chat(key[0], self._chat_names[code], key)

    async def save(self, watermark: dict[str, int] | None = None) -> None:
        """Write what changed; ``watermark`` is SQLite's (see :meth:`load`) with the index in step
        with it: the caller holds every vector write back while it reads it and this runs."""
        await self._run(self._save_sync, watermark)
        self.dirty = False

    def claim(self) -> None:
        """Refuse an index path that is not narrmem's own (see index_folder)."""
        index_folder.claim(self.path, FORMAT)

    def _save_sync(self, watermark: dict[str, int] | None) -> None:
        index_folder.claim(self.path, FORMAT)
        by_bucket: dict[int, list[Shard]] = {}
        for key, shard in sorted(self._shards.items()):
            by_bucket.setdefault(_bucket(key), []).append(shard)
        entries: list[dict[str, Any]] = []
        for bucket in range(BUCKETS):
            shards = by_bucket.get(bucket, [])
            ids_name, vectors_name = f"ids-{bucket:02d}.npy", f"vectors-{bucket:02d}.npy"
            stale = not (self.path / ids_name).exists() or not (self.path / vectors_name).exists()
            if bucket in self._dirty_buckets or stale or any(s.file_offset is None for s in shards):
                self._write_bucket(shards, self.path / ids_name, self.path / vectors_name)
            for shard in shards:
                entry = {
                    "tenant": shard.key[0],
                    "user_id": shard.key[1],
                    "ids": ids_name,
                    "vectors": vectors_name,
                    "offset": shard.file_offset,
                    "count": shard.live,
                }
                if shard.graph is not None and not shard.dead:
                    graph_name = f"graph-{_digest(shard.key)}.faiss"
                    if not shard.graph_saved or not (self.path / graph_name).exists():
                        _atomic(self.path / graph_name, lambda tmp, g=shard.graph: faiss.write_index(g, tmp))
                        shard.graph_saved = True
                    entry["graph"] = graph_name
                entries.append(entry)
        manifest = {
            "format": FORMAT,
            "dim": self.dim,
            "watermark": watermark,
            "chats": self._chat_codes,
            "shards": entries,
        }
        _atomic(
            self.path / "manifest.json",
            lambda tmp: Path(tmp).write_text(json.dumps(manifest, ensure_ascii=False), encoding="utf-8"),
        )
        used = {"manifest.json", *(f"{kind}-{b:02d}.{ext}" for b in range(BUCKETS) for kind, ext in _FILES)}
        used |= {e.get("graph", "") for e in entries}
        for stale_file in self.path.iterdir():
            if stale_file.name not in used and index_folder.is_own_file(stale_file.name):
                stale_file.unlink()
        self._dirty_buckets.clear()
        self._saved_watermark = watermark

    def _write_bucket(self, shards: list[Shard], ids_path: Path, vectors_path: Path) -> None:
        """Both files of one bucket (ids with chat codes; vectors), the shards' live rows one
        after another, each file replaced whole; then its shards without tombstones read their
        vectors from the new file (a shard with tombstones keeps its rows: its graph's labels are
        row numbers, and the file holds only the live rows)."""
        total = 0
        for shard in shards:
            shard.file_offset = total
            total += shard.live
        table = np.empty((total, 2), dtype=np.int64)
        for shard in shards:
            assert shard.file_offset is not None
            live = shard.alive[: shard.n]
            table[shard.file_offset : shard.file_offset + shard.live, 0] = shard.ids[: shard.n][live]
            table[shard.file_offset : shard.file_offset + shard.live, 1] = shard.chats[: shard.n][live]

        def write_vectors(tmp: str) -> None:
            if not total:  # nothing to map: a file of no rows
                np.save(tmp, np.empty((0, self.dim), dtype=np.float32))
                return
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(total, self.dim))
            for shard in shards:
                assert shard.file_offset is not None
                out[shard.file_offset : shard.file_offset + shard.live] = shard.live_rows()[2]
            out.flush()
            del out

        _atomic(vectors_path, write_vectors)
        _atomic(ids_path, lambda tmp: np.save(tmp, table))
        files = _BucketFiles(self.path, self.dim)
        for shard in shards:
            if not shard.dead and shard.file_offset is not None:
                shard.vectors = VectorRows(
                    self.dim, base=files.vectors(vectors_path.name, shard.file_offset, shard.n)
                )

    async def stop_builds(self) -> None:
        """Abandon running graph builds (within one chunk); the shards stay searchable exactly."""
        self._closing = True
        await self.settle()

    async def close(self) -> None:
        await self.stop_builds()
        self._builder.shutdown(wait=True)
        self._executor.shutdown(wait=True)


_FILES = (("ids", "npy"), ("vectors", "npy"))
SAMPLES = 64  # stored vectors compared with SQLite's on open
CATCH_UP_ROWS = 5_000  # rows read from SQLite at a time when the files are caught up on open


@dataclass(frozen=True)
class Consistency:
    """What SQLite holds, for checking the index files against it: its watermark (``None``: not
    known), its vector ids (sorted) and, for given ids, their vectors and owners; ``rows`` (the
    ids found, their vectors and owners), when given, lets files saved before the last writes be
    caught up instead of rebuilt."""

    ids: Callable[[], Awaitable[np.ndarray]]
    samples: Callable[[np.ndarray], Awaitable[dict[int, tuple[np.ndarray, ShardKey]]]]
    watermark: dict[str, int] | None = None
    rows: Callable[[np.ndarray], Awaitable[tuple[np.ndarray, np.ndarray, list[Owner]]]] | None = None

    @classmethod
    def known(cls, ids: np.ndarray, samples: dict[int, tuple[np.ndarray, ShardKey]]) -> Consistency:
        """Fixed answers: the ids, and the vectors and owners of some of them."""

        async def all_ids() -> np.ndarray:
            return ids

        async def some(picks: np.ndarray) -> dict[int, tuple[np.ndarray, ShardKey]]:
            return {int(i): samples[int(i)] for i in picks if int(i) in samples}

        return cls(ids=all_ids, samples=some)


class _BucketFiles:
    """The files of an index folder, each opened once: rows read whole, vectors mapped."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.dim = dim
        self._rows: dict[str, Any] = {}
        self._ids: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._vectors: dict[str, np.ndarray] = {}

    def ids(self, name: str, offset: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """A shard's ids and chat codes (format 2), as read-only views: each bucket's file is read
        once, whole, into one column of ids and one of chat codes."""
        columns = self._ids.get(name)
        if columns is None:
            table = np.load(self.path / name, allow_pickle=False)
            if table.dtype != np.int64 or table.ndim != 2 or table.shape[1] != 2:
                raise ValueError(f"{name} holds rows of another shape")
            ids, chats = np.ascontiguousarray(table[:, 0]), table[:, 1].astype(np.int32)
            ids.flags.writeable = chats.flags.writeable = False
            columns = self._ids[name] = (ids, chats)
        ids, chats = columns
        if offset < 0 or offset + count > len(ids):
            raise ValueError(f"{name} is shorter than its manifest says")
        return ids[offset : offset + count], chats[offset : offset + count]

    def rows(self, name: str, prefix: str) -> tuple[np.ndarray, np.ndarray]:
        """A shard's ids and chat codes in a rows file of format 1."""
        arrays = self._rows.get(name)
        if arrays is None:
            with np.load(self.path / name, allow_pickle=False) as npz:
                arrays = self._rows[name] = {key: npz[key] for key in npz.files}
        ids, chats = arrays[f"{prefix}ids"], arrays[f"{prefix}chats"]
        if chats.shape != ids.shape:
            raise ValueError(f"shard {prefix} has rows of another shape")
        return ids, chats

    def rows_vectors(self, name: str, prefix: str, count: int) -> np.ndarray:
        vectors = np.ascontiguousarray(self._rows[name][f"{prefix}vectors"], dtype=np.float32)
        if vectors.shape != (count, self.dim):
            raise ValueError(f"shard {prefix} has rows of another shape")
        return vectors

    def vectors(self, name: str, offset: int, count: int) -> np.ndarray:
        if not count:
            return np.empty((0, self.dim), dtype=np.float32)
        mapped = self._vectors.get(name)
        if mapped is None:
            # A plain array over the mapping: its slices, one per shard, are then plain views
            # (a memmap's carry attributes of their own, copied for each).
            on_disk = np.load(self.path / name, mmap_mode="r", allow_pickle=False)
            mapped = self._vectors[name] = np.asarray(on_disk)
        if mapped.dtype != np.float32 or mapped.ndim != 2 or mapped.shape[1] != self.dim:
            raise ValueError(f"{name} holds vectors of another shape")
        if offset < 0 or offset + count > len(mapped):
            raise ValueError(f"{name} is shorter than its manifest says")
        return mapped[offset : offset + count]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while the shards are made: a store of 50,000 users
    makes a few hundred thousand objects at once, none of them garbage, and the collections their
    allocations set off took a quarter of the load (0.15 of 0.58 s)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _copy_graph(graph: Any) -> Any:
    """An in-memory copy of a (mapped) graph: through its serialized form, since the file it was
    mapped from may be gone (a save drops the graph file of a shard with tombstones)."""
    return faiss.deserialize_index(faiss.serialize_index(graph))


def _best(a: list[tuple[int, float]], b: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    return sorted([*a, *b], key=lambda hit: (-hit[1], hit[0]))[:k]


def _snapshot(shard: Shard) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    shard.removed_since_snapshot = set()
    ids, chats, vectors = shard.live_rows()
    return ids.copy(), chats.copy(), np.array(vectors, dtype=np.float32, order="C")


def _digest(key: ShardKey) -> str:
    return hashlib.sha1(f"{key[0]}\x00{key[1]}".encode()).hexdigest()[:20]


def _bucket(key: ShardKey) -> int:
    return zlib.crc32(f"{key[0]}\x00{key[1]}".encode()) % BUCKETS


def _grow(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def _atomic(target: Path, write: Any) -> None:
    """Write beside and rename: a crash leaves the old file or the new one, never half of one."""
    tmp = target.with_name(target.name + ".tmp" + target.suffix)
    write(str(tmp))
    os.replace(tmp, target)


def _matrix(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32)
