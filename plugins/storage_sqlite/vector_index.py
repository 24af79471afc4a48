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
only while its shard has no tombstones: deleted vectors never stay in a file. A save writes its files
under names of its own generation and the manifest, replaced last, names the files it uses: a process
killed in a save leaves the previous manifest and its files whole (see index_manifest).
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
from narrmem_plugins.storage_sqlite import durable, index_folder, index_manifest, mapped
from narrmem_plugins.storage_sqlite.index_manifest import FORMAT, READABLE_FORMATS
from narrmem_plugins.storage_sqlite.lazy_shards import BucketRows, ChatsAtOpen, ShardTable, Waiting
from narrmem_plugins.storage_sqlite.vector_rows import VectorRows

from narrmem import logs
from narrmem.products import inner_products

log = logs.logger("narrmem.storage_sqlite")

BUCKETS = 64
OUTSIDE_GRAPH_LIMIT = 2_000  # rows searched exactly beside a mapped graph before it is copied to memory
MAX_FAILED_BUILDS = 3  # then the shard stays on exact search (it is logged) instead of retrying forever
BUILD_CHUNK = 2_000  # rows added to a graph between checks for a closing index
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
        "graph_file",
        "graph_mapped_from",
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
        self.graph_file: str | None = None  # the index file holding the graph as it is, if one does
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
            self.graph_file = None
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
        self._shards: ShardTable[Shard] = ShardTable(self._make_waiting)
        self._chat_members: dict[tuple[str, str], set[ShardKey]] = {}
        self._chat_tenants: dict[str, int] = {}  # how many tenants have a chat of that id
        # The chats' members as the files held them, taken per chat on first need (see
        # lazy_shards), and the codes of the chats the files held whose members are not taken
        # yet. (A set of every chat id taken since the open grew with each chat a bot met, and
        # kept the names of chats forgotten since.) Once all are taken, the table goes too.
        self._chats_at_open: ChatsAtOpen | None = None
        self._codes_not_taken: set[int] = set()
        self._chat_codes: dict[str, int] = {}
        self._chat_names: dict[int, str] = {}
        # Codes are not given again while the process runs: a tombstone may still hold a dropped one.
        self._next_chat_code = 0
        self._stale_chats = 0
        self._older_format = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-vectors")
        self._busy = threading.Lock()  # held while the shards are read or changed
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-hnsw")
        self._builds: set[asyncio.Future[Any]] = set()
        self._dirty_buckets: set[int] = set()
        # The generation of the last save (of this process or the one that wrote the manifest
        # read): the next save writes its files under the next one. The files each bucket's rows
        # are in, and every file the manifest on disk names.
        self._generation = 0
        self._bucket_files: dict[int, tuple[str, str]] = {}
        self._named_files: set[str] = set()
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
        return sum(self._shards.lives())

    def user_size(self, tenant: str, user_id: str) -> int:
        """How many vectors a user holds."""
        return self._shards.live((tenant, user_id))

    def largest_scope(self) -> int:
        """The most vectors one user holds."""
        return max(self._shards.lives(), default=0)

    def ids(self) -> np.ndarray:
        parts = [self._shards.live_ids(key) for key in self._shards.keys()]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def describe(self) -> dict[str, int]:
        shards = self._shards.made()  # one waiting in the files has no graph and no tombstones
        return {
            "vector_shards": len(self._shards),
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

    def _take_chat(self, chat_id: str) -> None:
        """Take the chat's members as the files held them, once, before it is searched or changed."""
        at_open = self._chats_at_open
        code = self._chat_codes.get(chat_id)
        # Codes only grow after the open: a chat first met since has none of the files'.
        if at_open is None or code not in self._codes_not_taken:
            return
        self._codes_not_taken.discard(code)
        for key in at_open.keys_of(code):
            self._add_member(key[0], chat_id, key)
        if not self._codes_not_taken:
            self._chats_at_open = None

    def _members(self, tenant: str, chat_id: str) -> set[ShardKey]:
        self._take_chat(chat_id)
        return self._chat_members.get((tenant, chat_id), set())

    def _join_chat(self, tenant: str, chat_id: str, key: ShardKey) -> None:
        self._take_chat(chat_id)
        self._add_member(tenant, chat_id, key)

    def _add_member(self, tenant: str, chat_id: str, key: ShardKey) -> None:
        members = self._chat_members.get((tenant, chat_id))
        if members is None:
            members = self._chat_members[(tenant, chat_id)] = set()
            self._chat_tenants[chat_id] = self._chat_tenants.get(chat_id, 0) + 1
        members.add(key)

    def _leave_chat(self, key: ShardKey, chat_id: str) -> None:
        """The shard ``key`` holds nothing of ``chat_id`` any more. A chat no shard holds leaves
        the chat codes too, so the saved index keeps no name of a forgotten chat (a private chat's
        id is often its user's)."""
        self._take_chat(chat_id)
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
            keys = self._members(tenant, chat_id)
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
            keys = sorted(self._members(tenant, chat_id))
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
        shards: list[Shard | None] = (
            list(self._shards.made()) if keys is None else [self._shards.get(k) for k in keys]
        )
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
        await self._run(self._drop_if_empty, shard)
        self._schedule_builds([shard.key])

    def _drop_if_empty(self, shard: Shard) -> None:
        """Drop a shard whose every row went while its graph was built (its person forgotten
        meanwhile): kept, its (tenant, user id) stayed in RAM and in the manifest for good."""
        if shard.live == 0 and not shard.building and self._shards.get(shard.key) is shard:
            self._mark(shard.key)
            del self._shards[shard.key]

    def _install_thawed(self, shard: Shard, graph: Any) -> None:
        if self._shards.get(shard.key) is not shard or shard.graph_mapped_from is None:
            return
        if shard.n > graph.ntotal:
            graph.add(shard.vectors.take(np.arange(int(graph.ntotal), shard.n)))
        shard.graph, shard.graph_mapped_from, shard.graph_file = graph, None, None
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
        await self._run(self._drop_if_empty, shard)
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
        shard.graph, shard.graph_file, shard.graph_mapped_from = graph, None, None
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
            self._chats_at_open = None
            self._codes_not_taken.clear()
            self._set_chat_codes({})
            self._bucket_files.clear()  # rebuilt: every bucket is written anew by the next save
            return False
        # An older format, or names of chats no shard holds, are written anew by the next save.
        self.dirty = bool(self._dirty_buckets) or self._stale_chats > 0 or self._older_format
        self._schedule_builds()
        return True

    async def _check(self, check: Consistency) -> str | None:
        trusted = check.watermark is not None and self._saved_watermark == check.watermark
        self.caught_up = None
        if trusted:
            picks = self._sample_ids()
        else:
            ids = self.ids()
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

    def _sample_ids(self) -> np.ndarray:
        """Ids to compare with SQLite: the middle row of each of ``SAMPLES`` users spread over the
        index (without reading, let alone sorting, every id: 0.05 s with 200,000)."""
        keys = sorted(self._shards.keys())
        picked = [
            keys[i] for i in np.unique(np.linspace(0, len(keys) - 1, min(SAMPLES, len(keys))).astype(int))
        ]
        rows = [self._shards.live_ids(key) for key in picked]
        return np.array(sorted(int(r[len(r) // 2]) for r in rows if len(r)), dtype=np.int64)

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
        return {key for key in self._shards.keys() if np.isin(self._shards.live_ids(key), ids).any()}

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
            listed = index_manifest.listing(manifest)
            self._generation = max(self._generation, listed.generation)
            self._named_files = listed.files()
            rows = []
            with _collector_paused():
                for key, entry in listed.format_1:
                    self._load_format_1(key, entry, files)
                for bucket in listed.buckets:
                    ids_file, vectors_file = bucket.ids_file, bucket.vectors_file
                    spans = files.spans(ids_file, vectors_file, bucket.offsets, bucket.counts)
                    number = index_folder.bucket_of(ids_file)
                    if number is not None:
                        self._bucket_files[number] = (ids_file, vectors_file)
                    rows.append(BucketRows(bucket.keys, *spans, files.columns(ids_file)[1]))
                    for key, offset, count in zip(bucket.keys, bucket.offsets, bucket.counts, strict=True):
                        self._shards.wait(key, Waiting(files, ids_file, vectors_file, offset, count))
                    for place, graph_file in bucket.graphs.items():
                        self._map_graph(bucket.keys[place], graph_file)
            at_open = ChatsAtOpen(rows)
            # Chats no shard holds (files written before chats were dropped with their last row).
            # (Only shards of format 1 have joined their chats by now.)
            legacy = {self._chat_codes[chat] for _, chat in self._chat_members}
            held = {int(code) for code in at_open.codes()} | legacy
            self._stale_chats = sum(code not in held for code in self._chat_codes.values())
            self._set_chat_codes({name: code for name, code in self._chat_codes.items() if code in held})
            self._chats_at_open = at_open
            self._codes_not_taken = set(self._chat_codes.values())
            self._older_format = manifest["format"] != FORMAT
        except Exception as exc:  # numpy, json and FAISS all raise their own errors on a bad file
            return f"the index file is unreadable ({type(exc).__name__}: {exc})"
        return None

    @staticmethod
    def _make_waiting(key: ShardKey, where: Waiting) -> Shard:
        ids, chats = where.files.ids(where.ids_file, where.offset, where.size)
        vectors = where.files.vectors(where.vectors_file, where.offset, where.size)
        shard = Shard.mapped(key, ids, chats, vectors)
        shard.file_offset = where.offset
        return shard

    def _load_format_1(self, key: ShardKey, entry: dict[str, Any], files: _BucketFiles) -> None:
        """A shard of format 1, whose vectors sit in its rows file: read whole, and written anew
        by the next save."""
        ids, chats = files.rows(entry["rows"], entry["prefix"])
        shard = Shard(key, self.dim, capacity=len(ids))
        shard.append(ids, chats, files.rows_vectors(entry["rows"], entry["prefix"], len(ids)))
        self._mark(key)
        self._shards[key] = shard
        for code in np.unique(chats).tolist():
            self._add_member(key[0], self._chat_names[code], key)
        if entry.get("graph"):
            self._map_graph(key, entry["graph"])

    def _map_graph(self, key: ShardKey, graph_file: str) -> None:
        """Give a shard its saved graph, mapped, not read: its vectors are paged in as searches
        walk it. (A shard with a graph is made at once: it may have rows to thaw in.)"""
        shard = self._shards[key]
        graph = faiss.read_index(str(self.path / graph_file), faiss.IO_FLAG_MMAP_IFC)
        mapped.advise_random(self.path / graph_file)
        if graph.ntotal <= shard.n and graph.d == self.dim:
            shard.graph, shard.graph_file = graph, graph_file
            shard.graph_mapped_from = self.path / graph_file

    async def save(self, watermark: dict[str, int] | None = None) -> None:
        """Write what changed; ``watermark`` is SQLite's (see :meth:`load`) with the index in step
        with it: the caller holds every vector write back while it reads it and this runs."""
        await self._run(self._save_sync, watermark)
        self.dirty = False

    def claim(self, *, older_index_file: bool = False) -> None:
        """Refuse an index path that is not narrmem's own (see index_folder); ``older_index_file``:
        the database says an older narrmem kept this store's index in one FAISS file at the path."""
        index_folder.claim(self.path, FORMAT, older_index_file=older_index_file)

    def _save_sync(self, watermark: dict[str, int] | None) -> None:
        """Write the buckets and graphs that changed under names of a new generation, then the
        manifest naming them (the step that makes the save live), then delete what it no longer
        names. A failed save's generation is never written again by this process."""
        index_folder.claim(self.path, FORMAT)
        self._generation += 1
        generation = self._generation
        written: list[Path] = []
        by_bucket: dict[int, list[ShardKey]] = {}
        for key in sorted(self._shards.keys()):
            by_bucket.setdefault(_bucket(key), []).append(key)
        buckets: list[index_manifest.Bucket] = []
        for bucket in range(BUCKETS):
            keys = by_bucket.get(bucket, [])
            current = self._bucket_files.get(bucket)
            if (
                current is None
                or bucket in self._dirty_buckets
                or not all((self.path / name).exists() for name in current)
                or not all(self._placed(k, current[0]) for k in keys)
            ):
                current = index_folder.bucket_files(bucket, generation)
                self._write_bucket(keys, self.path / current[0], self.path / current[1])
                written += [self.path / current[0], self.path / current[1]]
                self._bucket_files[bucket] = current
            listed = index_manifest.Bucket(*current)
            buckets.append(listed)
            for key in keys:
                where = self._shards.waiting(key)
                if where is not None:
                    listed.add(key, where.offset, where.size)
                    continue
                shard = self._shards.peek(key)
                assert shard is not None and shard.file_offset is not None
                graph_name = None
                if shard.graph is not None and not shard.dead:
                    if shard.graph_file is None or not (self.path / shard.graph_file).exists():
                        name = index_folder.graph_file(_digest(shard.key), generation)
                        _atomic(self.path / name, lambda tmp, g=shard.graph: faiss.write_index(g, tmp))
                        written.append(self.path / name)
                        shard.graph_file = name
                    graph_name = shard.graph_file
                listed.add(key, shard.file_offset, shard.live, graph_name)
        manifest = index_manifest.manifest(self.dim, watermark, self._chat_codes, buckets, generation)
        # On disk before the manifest that names them: after a power loss, a manifest naming
        # files whose blocks never came would load zeros as other users' vectors.
        durable.sync_files(written)
        durable.sync_folder(self.path)
        _atomic(
            self.path / "manifest.json",
            lambda tmp: Path(tmp).write_text(json.dumps(manifest, ensure_ascii=False), encoding="utf-8"),
            synced=True,
        )
        self._named_files = index_manifest.Listing(buckets, []).files()
        self._drop_leftovers()
        self._dirty_buckets.clear()
        self._saved_watermark = watermark

    async def drop_leftovers(self) -> None:
        """Delete the files of a save that did not finish (a process killed before its manifest
        was written, or before it deleted what the manifest no longer names). Only for the
        process that writes the folder: a reader beside it could take a save under way for one."""
        await self._run(self._drop_leftovers)

    def _drop_leftovers(self) -> None:
        for leftover in index_folder.leftovers(self.path, {"manifest.json", *self._named_files}):
            leftover.unlink(missing_ok=True)

    def _placed(self, key: ShardKey, ids_file: str) -> bool:
        """Whether the shard's rows are in the bucket file ``ids_file`` already."""
        where = self._shards.waiting(key)
        if where is not None:
            return where.ids_file == ids_file
        shard = self._shards.peek(key)
        return shard is not None and shard.file_offset is not None

    def _write_bucket(self, keys: list[ShardKey], ids_path: Path, vectors_path: Path) -> None:
        """Both files of one bucket (ids with chat codes; vectors), the shards' live rows one
        after another, each file replaced whole; then its shards without tombstones read their
        vectors from the new file (a shard with tombstones keeps its rows: its graph's labels are
        row numbers, and the file holds only the live rows). A shard still waiting in the old
        files is copied from them and waits in the new ones."""
        placed: list[tuple[int, int, Shard | Waiting]] = []  # (offset, rows, source)
        total = 0
        for key in keys:
            source: Shard | Waiting | None = self._shards.peek(key) or self._shards.waiting(key)
            assert source is not None
            count = source.live if isinstance(source, Shard) else source.size
            placed.append((total, count, source))
            total += count
        table = np.empty((total, 2), dtype=np.int64)
        for offset, count, source in placed:
            if isinstance(source, Shard):
                live = source.alive[: source.n]
                ids, chats = source.ids[: source.n][live], source.chats[: source.n][live]
            else:
                ids, chats = source.files.ids(source.ids_file, source.offset, source.size)
            table[offset : offset + count, 0] = ids
            table[offset : offset + count, 1] = chats

        def write_vectors(tmp: str) -> None:
            if not total:  # nothing to map: a file of no rows
                np.save(tmp, np.empty((0, self.dim), dtype=np.float32))
                return
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(total, self.dim))
            for offset, count, source in placed:
                out[offset : offset + count] = (
                    source.live_rows()[2]
                    if isinstance(source, Shard)
                    else source.files.vectors(source.vectors_file, source.offset, source.size)
                )
            out.flush()
            del out

        _atomic(vectors_path, write_vectors)
        _atomic(ids_path, lambda tmp: np.save(tmp, table))
        files = _BucketFiles(self.path, self.dim)
        for (offset, count, source), key in zip(placed, keys, strict=True):
            if isinstance(source, Shard):
                source.file_offset = offset
                if not source.dead:
                    mapped_rows = files.vectors(vectors_path.name, offset, source.n)
                    source.vectors = VectorRows(self.dim, base=mapped_rows)
            else:
                self._shards.wait(key, Waiting(files, ids_path.name, vectors_path.name, offset, count))

    async def stop_builds(self) -> None:
        """Abandon running graph builds (within one chunk); the shards stay searchable exactly."""
        self._closing = True
        await self.settle()

    async def close(self) -> None:
        await self.stop_builds()
        self._builder.shutdown(wait=True)
        self._executor.shutdown(wait=True)


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

    def spans(
        self, ids_file: str, vectors_file: str, offsets: list[int], counts: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The shards' spans in one bucket's files, as arrays, once the files are known to hold
        them all (a shard made later must not fail)."""
        starts, sizes = np.array(offsets, dtype=np.int64), np.array(counts, dtype=np.int64)
        if len(starts) and (starts.min() < 0 or sizes.min() < 0):
            raise ValueError(f"{ids_file} has a shard of a negative span in the manifest")
        end = int((starts + sizes).max()) if len(starts) else 0
        if end > len(self.columns(ids_file)[0]):
            raise ValueError(f"{ids_file} is shorter than its manifest says")
        if end:
            self.vectors(vectors_file, 0, end)
        return starts, sizes

    def ids(self, name: str, offset: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """A shard's ids and chat codes (format 2), as read-only views."""
        ids, chats = self.columns(name)
        if offset < 0 or count < 0 or offset + count > len(ids):
            raise ValueError(f"{name} is shorter than its manifest says")
        return ids[offset : offset + count], chats[offset : offset + count]

    def columns(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """A bucket's ids and chat codes: its file is read once, whole, into one read-only column
        of each."""
        columns = self._ids.get(name)
        if columns is None:
            table = np.load(self.path / name, allow_pickle=False)
            if table.dtype != np.int64 or table.ndim != 2 or table.shape[1] != 2:
                raise ValueError(f"{name} holds rows of another shape")
            ids, chats = np.ascontiguousarray(table[:, 0]), table[:, 1].astype(np.int32)
            ids.flags.writeable = chats.flags.writeable = False
            columns = self._ids[name] = (ids, chats)
        return columns

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
        if not count:  # an empty file cannot be mapped
            return np.empty((0, self.dim), dtype=np.float32)
        mapped = self._vectors.get(name)
        if mapped is None:
            # A plain array over the mapping: its slices, one per shard, are then plain views
            # (a memmap's carry attributes of their own, copied for each).
            on_disk = np.load(self.path / name, mmap_mode="r", allow_pickle=False)
            mapped = self._vectors[name] = np.asarray(on_disk)
        if mapped.dtype != np.float32 or mapped.ndim != 2 or mapped.shape[1] != self.dim:
            raise ValueError(f"{name} holds vectors of another shape")
        if offset < 0 or count < 0 or offset + count > len(mapped):
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


def _span(entry: dict[str, Any]) -> tuple[int, int]:
    """A manifest entry's offset and count in its bucket's files."""
    return int(entry["offset"]), int(entry["count"])


def _digest(key: ShardKey) -> str:
    return hashlib.sha1(f"{key[0]}\x00{key[1]}".encode()).hexdigest()[:20]


def _bucket(key: ShardKey) -> int:
    return zlib.crc32(f"{key[0]}\x00{key[1]}".encode()) % BUCKETS


def _grow(array: np.ndarray, capacity: int) -> np.ndarray:
    grown = np.empty((capacity, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown


def _atomic(target: Path, write: Any, *, synced: bool = False) -> None:
    """Write beside and rename: a crash leaves the old file or the new one, never half of one;
    ``synced``: a power loss too (else the caller flushes the file before relying on it)."""
    tmp = target.with_name(target.name + ".tmp" + target.suffix)
    write(str(tmp))
    if synced:
        durable.replace_synced(tmp, target)
    else:
        os.replace(tmp, target)


def _matrix(vectors: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vectors, dtype=np.float32)
