"""Shards made from the index files when first needed, and the chats they held when opened.

Opening a store of 50,000 users used to make 50,000 shard objects and join each to its chats
(about 17 µs a user in Python, 0.8 of a 1.3 s open at a million memories) before the first
message could be answered, though a bot's next hour touches a few hundred of them. Now the open
records where each user's rows lie in the files; a shard is made on the first search or write
that names its user, and a chat's members are worked out from the files' chat columns the first
time that chat is searched or changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar

import numpy as np

ShardKey = tuple[str, str]  # (tenant, user_id)


class Rows(Protocol):
    @property
    def live(self) -> int: ...

    def live_ids(self) -> np.ndarray: ...


S = TypeVar("S", bound=Rows)


class Files(Protocol):
    """A bucket's files as opened (their ids read, their vectors mapped)."""

    def ids(self, name: str, offset: int, count: int) -> tuple[np.ndarray, np.ndarray]: ...

    def vectors(self, name: str, offset: int, count: int) -> np.ndarray: ...


class Waiting(NamedTuple):
    """Where a shard not made yet has its rows: ``size`` rows from ``offset`` in a bucket's files
    as ``files`` opened them (all of them live: the files hold no tombstones). A save that writes
    the bucket anew gives its waiting shards new entries. (A tuple: an open makes one per user.)"""

    files: Files
    ids_file: str
    vectors_file: str
    offset: int
    size: int


class ShardTable(Generic[S]):
    """The shards by key: the ones made, and the ones still waiting in the files.

    ``make`` turns a waiting entry into its shard. Searches run on the index's thread and a few
    on the event loop, so a shard is made under a lock of its own: two callers never make two
    shards of one user.
    """

    def __init__(self, make: Callable[[ShardKey, Waiting], S]) -> None:
        self._make = make
        self._made: dict[ShardKey, S] = {}
        self._waiting: dict[ShardKey, Waiting] = {}
        self._making = threading.Lock()

    def get(self, key: ShardKey) -> S | None:
        shard = self._made.get(key)
        if shard is not None or key not in self._waiting:
            return shard
        with self._making:
            shard = self._made.get(key)
            if shard is None:
                shard = self._made[key] = self._make(key, self._waiting[key])
                del self._waiting[key]
            return shard

    def __getitem__(self, key: ShardKey) -> S:
        shard = self.get(key)
        if shard is None:
            raise KeyError(key)
        return shard

    def wait(self, key: ShardKey, where: Waiting) -> None:
        self._waiting[key] = where

    def waiting(self, key: ShardKey) -> Waiting | None:
        return self._waiting.get(key)

    def peek(self, key: ShardKey) -> S | None:
        """The shard if it is made (a waiting one stays in its files)."""
        return self._made.get(key)

    def __setitem__(self, key: ShardKey, shard: S) -> None:
        self._waiting.pop(key, None)
        self._made[key] = shard

    def __delitem__(self, key: ShardKey) -> None:
        self._waiting.pop(key, None)
        self._made.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._made or key in self._waiting

    def __len__(self) -> int:
        return len(self._made) + len(self._waiting)

    def keys(self) -> list[ShardKey]:
        return [*self._made, *self._waiting]

    def made(self) -> list[S]:
        """The shards made so far (a waiting one has no graph, no tombstones, nothing to build)."""
        return list(self._made.values())

    def live(self, key: ShardKey) -> int:
        shard = self._made.get(key)
        if shard is not None:
            return shard.live
        where = self._waiting.get(key)
        return 0 if where is None else where.size

    def lives(self) -> Iterator[int]:
        for shard in list(self._made.values()):
            yield shard.live
        for where in list(self._waiting.values()):
            yield where.size

    def live_ids(self, key: ShardKey) -> np.ndarray:
        shard = self._made.get(key)
        if shard is not None:
            return shard.live_ids()
        where = self._waiting.get(key)
        if where is None:
            return np.zeros(0, dtype=np.int64)
        return where.files.ids(where.ids_file, where.offset, where.size)[0]

    def clear(self) -> None:
        self._made.clear()
        self._waiting.clear()


@dataclass(frozen=True)
class BucketRows:
    """One bucket file's chat column and the shards whose rows it holds (``offsets``, ``counts``)."""

    keys: Sequence[ShardKey]
    offsets: np.ndarray
    counts: np.ndarray
    chats: np.ndarray


class ChatsAtOpen:
    """Which shards held rows of each chat (by code) when the files were opened.

    Worked out once, from the buckets' columns with numpy, on first need; the index keeps each
    chat's members as sets from then on, taking a chat's members from here the first time the
    chat is searched or changed."""

    def __init__(self, buckets: Sequence[BucketRows]) -> None:
        self._buckets = list(buckets)
        self._keys: list[ShardKey] = []
        self._codes: np.ndarray | None = None
        self._owners = np.zeros(0, dtype=np.int64)
        self._lock = threading.Lock()

    def codes(self) -> np.ndarray:
        """The chat codes some row holds (sorted, distinct)."""
        held = [np.unique(b.chats) for b in self._buckets if len(b.chats)]
        return np.unique(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)

    def keys_of(self, code: int) -> list[ShardKey]:
        codes = self._pairs()
        lo, hi = np.searchsorted(codes, [code, code + 1])
        return [self._keys[int(i)] for i in self._owners[lo:hi]]

    def _pairs(self) -> np.ndarray:
        with self._lock:
            if self._codes is None:
                self._codes, self._owners = self._work_out()
                self._buckets = []
            return self._codes

    def _work_out(self) -> tuple[np.ndarray, np.ndarray]:
        codes: list[np.ndarray] = []
        owners: list[np.ndarray] = []
        for bucket in self._buckets:
            first = len(self._keys)
            self._keys.extend(bucket.keys)
            owner = _owner_of_rows(bucket, first)
            covered = owner >= 0
            # (owner, chat) pairs, each once: rows of a shard lie together, so a pair starts
            # wherever the pair differs from the row before; the sort is over those starts only.
            pair = (owner[covered] << 32) | bucket.chats[covered].astype(np.int64)
            starts = np.flatnonzero(np.diff(pair, prepend=-1) != 0)
            pair = np.unique(pair[starts])
            codes.append(pair & 0xFFFFFFFF)
            owners.append(pair >> 32)
        if not codes:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        all_codes, all_owners = np.concatenate(codes), np.concatenate(owners)
        order = np.argsort(all_codes, kind="stable")
        return all_codes[order], all_owners[order]


def _owner_of_rows(bucket: BucketRows, first: int) -> np.ndarray:
    """For each row of the bucket, the index (from ``first``) of the shard holding it, or -1."""
    order = np.argsort(bucket.offsets, kind="stable")
    offsets, counts = bucket.offsets[order], bucket.counts[order]
    ends = offsets + counts
    if len(offsets) and offsets[0] == 0 and np.array_equal(ends[:-1], offsets[1:]):
        owner = np.full(len(bucket.chats), -1, dtype=np.int64)
        owner[: int(ends[-1])] = np.repeat(order + first, counts)
        return owner
    owner = np.full(len(bucket.chats), -1, dtype=np.int64)
    for index, start, count in zip(order, offsets, counts, strict=True):
        owner[int(start) : int(start) + int(count)] = first + int(index)
    return owner
