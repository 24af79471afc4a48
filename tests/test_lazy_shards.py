"""An opened index makes a user's shard only when a search or a write names that user, and takes a
chat's members from the files the first time the chat is searched or changed; every search, write,
forget and save answers as an index that made every shard at once would. The manifest lists each
bucket's shards as columns (format 3); one of format 2 still opens, and is rewritten."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from narrmem_plugins.storage_sqlite.lazy_shards import BucketRows, ChatsAtOpen
from narrmem_plugins.storage_sqlite.vector_index import SAMPLES, Consistency, IndexOptions, Owner, VectorIndex

DIM = 16
OPTIONS = IndexOptions(hnsw_threshold=10_000)
USERS = 300
CHATS = ("lobby", "dev", "random")


def unit(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def owners_of(n: int) -> list[Owner]:
    """Users spread over two tenants; each user writes in a chat of their own and in some shared
    ones (the chat ids "lobby" are the same in both tenants, and are different chats)."""
    owners = []
    for i in range(n):
        user = i % USERS
        chat = f"dm-{user}" if i % 4 == 0 else CHATS[(i // 7 + user) % len(CHATS)]
        owners.append(Owner(f"t{user % 2}", f"u{user}", chat))
    return owners


async def built(path: Path) -> tuple[np.ndarray, np.ndarray, list[Owner]]:
    ids = np.arange(1, 3001, dtype=np.int64)
    vectors = unit(len(ids), seed=5)
    owners = owners_of(len(ids))
    index = VectorIndex(path, DIM, OPTIONS)
    await index.add(ids, vectors, owners)
    await index.save({"changes": 1, "last_id": 3000})
    await index.close()
    return ids, vectors, owners


async def opened(path: Path, ids: np.ndarray, vectors: np.ndarray, owners: list[Owner]) -> VectorIndex:
    index = VectorIndex(path, DIM, OPTIONS)
    samples = {int(i): (v, o.shard) for i, v, o in zip(ids, vectors, owners, strict=True)}
    check = dataclasses.replace(Consistency.known(ids, samples), watermark={"changes": 1, "last_id": 3000})
    assert await index.load(check), index.rebuilt_reason
    return index


def exact(
    ids: np.ndarray,
    vectors: np.ndarray,
    owners: list[Owner],
    query: np.ndarray,
    scope: dict[str, str],
    k: int,
) -> list[int]:
    inside = np.array(
        [
            o.tenant == scope["tenant"]
            and ("user_id" not in scope or o.user_id == scope["user_id"])
            and ("chat_id" not in scope or o.chat_id == scope["chat_id"])
            for o in owners
        ]
    )
    scores = vectors[inside] @ query
    return [int(i) for i in ids[inside][np.argsort(-scores, kind="stable")][:k]]


async def hits(index: VectorIndex, query: np.ndarray, scope: dict[str, str], k: int = 10) -> list[int]:
    found = await index.search(
        query, k, tenant=scope["tenant"], user_id=scope.get("user_id"), chat_id=scope.get("chat_id")
    )
    return [i for i, _ in found]


SCOPES = [
    {"tenant": "t0", "chat_id": "lobby"},
    {"tenant": "t1", "chat_id": "lobby"},
    {"tenant": "t1", "chat_id": "dev"},
    {"tenant": "t0", "chat_id": "dm-8"},
    {"tenant": "t1", "user_id": "u7"},
    {"tenant": "t0", "user_id": "u100", "chat_id": "random"},
]


async def test_an_open_makes_no_shard_until_one_is_named_and_answers_as_before(tmp_path: Path) -> None:
    ids, vectors, owners = await built(tmp_path / "index")
    index = await opened(tmp_path / "index", ids, vectors, owners)
    try:
        assert len(index._shards.made()) <= SAMPLES  # the users of the rows checked against SQLite
        assert len(index._shards) == USERS and index.size == len(ids)
        assert index.largest_scope() == max(
            sum(o.shard == k for o in owners) for k in {o.shard for o in owners}
        )
        made = len(index._shards.made())
        await hits(index, vectors[0], {"tenant": "t1", "user_id": "u299"})
        assert len(index._shards.made()) <= made + 1
        for query in unit(4, seed=9):
            for scope in SCOPES:
                assert await hits(index, query, scope) == exact(ids, vectors, owners, query, scope, 10), scope
        assert np.array_equal(index.ids(), ids)
    finally:
        await index.close()


async def test_writes_forgets_and_saves_beside_waiting_shards_keep_every_answer(tmp_path: Path) -> None:
    ids, vectors, owners = await built(tmp_path / "index")
    index = await opened(tmp_path / "index", ids, vectors, owners)
    try:
        # New rows for a few users (their buckets hold many users still waiting), a new chat,
        # and a forget of a user nobody searched: then the files are saved.
        new_ids = np.arange(5001, 5061, dtype=np.int64)
        new_vectors = unit(60, seed=11)
        new_owners = [Owner("t0", f"u{2 * (i % 5)}", "lobby" if i % 2 else "new-chat") for i in range(60)]
        await index.add(new_ids, new_vectors, new_owners)
        gone = np.array([int(i) for i, o in zip(ids, owners, strict=True) if o.shard == ("t0", "u8")])
        await index.remove(gone, [("t0", "u8")])
        await index.save({"changes": 2, "last_id": 5060})
        # Only the users named were made: a bucket written anew keeps its other shards waiting.
        assert len(index._shards.made()) <= SAMPLES + 6
    finally:
        await index.close()
    keep = ~np.isin(ids, gone)
    all_ids = np.concatenate([ids[keep], new_ids])
    all_vectors = np.concatenate([vectors[keep], new_vectors])
    all_owners = [o for o, k in zip(owners, keep, strict=True) if k] + new_owners
    again = VectorIndex(tmp_path / "index", DIM, OPTIONS)
    assert await again.load(Consistency.known(all_ids, {})), again.rebuilt_reason
    try:
        scopes = [*SCOPES, {"tenant": "t0", "chat_id": "new-chat"}, {"tenant": "t0", "user_id": "u8"}]
        for query in unit(4, seed=10):
            for scope in scopes:
                want = exact(all_ids, all_vectors, all_owners, query, scope, 10)
                assert await hits(again, query, scope) == want, scope
        assert await hits(again, vectors[0], {"tenant": "t0", "chat_id": "dm-8"}) == []
        manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
        assert "dm-8" not in manifest["chats"]  # the forgotten user's own chat left with her rows
    finally:
        await again.close()


async def test_an_index_of_format_2_opens_and_is_written_in_format_3(tmp_path: Path) -> None:
    ids, vectors, owners = await built(tmp_path / "index")
    path = tmp_path / "index" / "manifest.json"
    manifest = json.loads(path.read_text())
    tenants = manifest.pop("tenants")
    manifest["shards"] = [
        {
            "tenant": tenants[t],
            "user_id": user,
            "ids": bucket["ids"],
            "vectors": bucket["vectors"],
            "offset": offset,
            "count": count,
        }
        for bucket in manifest.pop("buckets")
        for t, user, offset, count in zip(
            bucket["tenant"], bucket["user"], bucket["offset"], bucket["count"], strict=True
        )
    ]
    manifest["format"] = 2
    path.write_text(json.dumps(manifest))
    index = VectorIndex(tmp_path / "index", DIM, OPTIONS)
    assert await index.load(Consistency.known(ids, {})), index.rebuilt_reason
    try:
        assert index.dirty
        for scope in SCOPES:
            assert await hits(index, vectors[3], scope) == exact(ids, vectors, owners, vectors[3], scope, 10)
        await index.save({"changes": 1, "last_id": 3000})
    finally:
        await index.close()
    assert json.loads(path.read_text())["format"] == 3


async def test_a_manifest_naming_rows_its_files_lack_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    ids, _, _ = await built(tmp_path / "index")
    path = tmp_path / "index" / "manifest.json"
    manifest = json.loads(path.read_text())
    bucket = next(b for b in manifest["buckets"] if b["user"])
    bucket["count"][-1] += 1000  # past the end of the bucket's files
    path.write_text(json.dumps(manifest))
    index = VectorIndex(tmp_path / "index", DIM, OPTIONS)
    try:
        assert not await index.load(Consistency.known(ids, {}))
        assert "shorter than its manifest" in (index.rebuilt_reason or "")
    finally:
        await index.close()


def test_chat_members_at_open_with_rows_out_of_order_and_gaps() -> None:
    keys = [("t", "a"), ("t", "b"), ("u", "c")]
    # Rows: b at 0..2, a gap at 3, a at 4..5, c at 6..8; chat codes per row.
    chats = np.array([1, 2, 1, 9, 1, 1, 2, 2, 3], dtype=np.int32)
    at_open = ChatsAtOpen([BucketRows(keys, np.array([4, 0, 6]), np.array([2, 3, 3]), chats)])
    assert sorted(at_open.keys_of(1)) == [("t", "a"), ("t", "b")]
    assert sorted(at_open.keys_of(2)) == [("t", "b"), ("u", "c")]
    assert at_open.keys_of(3) == [("u", "c")]
    assert at_open.keys_of(9) == []  # a row no shard owns
    contiguous = ChatsAtOpen([BucketRows(keys, np.array([3, 0, 5]), np.array([2, 3, 4]), chats)])
    assert contiguous.keys_of(9) == [("t", "a")] and contiguous.keys_of(3) == [("u", "c")]
