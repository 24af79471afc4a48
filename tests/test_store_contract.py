"""The storage contract: what every backend must do, run against each one (SQLite in a temporary
folder, PostgreSQL on a real private server with a fresh database per test)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _postgres import fresh_database
from narrmem_plugins.storage_postgres.store import PostgresStore
from narrmem_plugins.storage_sqlite.store import SQLiteStore

from narrmem.errors import InputError, StoreError
from narrmem.models import MAX_CONTEXT_CHARS, ContextLine, ImportanceChange, MemoryRecord, Scope
from narrmem.store import (
    AddsContext,
    FindsStoredMessages,
    ReadsWithVectors,
    RecordsModel,
    SQLCapable,
    WritesContext,
)

DIM = 8
MODEL = "contract-test-model"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=8)))


async def make_store(backend: str, tmp_path: Path, dsn: str | None = None, **kwargs: Any) -> Any:
    if backend == "sqlite":
        return SQLiteStore(
            tmp_path, database="narrmem.sqlite3", index="vectors", busy_timeout_ms=5000, **kwargs
        )
    return PostgresStore(dsn or await fresh_database("contract"), **kwargs)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    store = await make_store(request.param, tmp_path)
    await store.open(dim=DIM, model=MODEL)
    try:
        yield store
    finally:
        await store.close()


def unit(seed: int) -> np.ndarray:
    vector = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


def record(
    text: str,
    *,
    user: str = "u1",
    chat: str = "c1",
    tenant: str = "default",
    kind: str = "episode",
    mid: str | None = None,
    minutes: int = 0,
    **extra: Any,
) -> MemoryRecord:
    return MemoryRecord(
        kind=kind,
        tenant=tenant,
        user_id=user,
        chat_id=chat,
        speaker=user,
        text=text,
        importance=0.3,
        created_at=T0 + timedelta(minutes=minutes),
        stored_at=T0 + timedelta(minutes=minutes, seconds=1),
        message_ids=[mid or f"m-{text[:12]}-{minutes}"],
        meta={"layer": "accumulate", "z": 1, "a": [1, 2]},
        **extra,
    )


async def add(store: Any, *records: MemoryRecord, seeds: list[int] | None = None) -> list[int]:
    vectors = np.vstack([unit(s) for s in (seeds or list(range(len(records))))])
    return list(await store.add(list(records), vectors))


# --- writing and reading in scope -----------------------------------------------------------------


async def test_add_sets_ids_and_get_and_recent_stay_in_scope(store: Any) -> None:
    mine = [record(f"mine {i}", minutes=i) for i in range(3)]
    other_user = record("theirs", user="u2", chat="c1", minutes=5)
    other_tenant = record("elsewhere", tenant="t2", minutes=6)
    ids = await add(store, *mine, other_user, other_tenant)
    assert ids == [r.id for r in [*mine, other_user, other_tenant]]
    assert len(set(ids)) == 5

    got = await store.get(ids, Scope(user_id="u1"))
    assert set(got) == {r.id for r in mine}
    assert got[mine[0].id].model_dump() == mine[0].model_dump()  # lossless: offset, meta, provenance
    assert set(await store.get(ids, None)) == set(ids)
    assert set(await store.get(ids, Scope(chat_id="c1"))) == {*(r.id for r in mine), other_user.id}
    assert await store.get(ids, Scope(tenant="t2", user_id="u2")) == {}

    recent = await store.recent(Scope(user_id="u1"))
    assert [r.text for r in recent] == ["mine 2", "mine 1", "mine 0"]
    assert [r.text for r in await store.recent(Scope(user_id="u1"), limit=1)] == ["mine 2"]
    since = await store.recent(Scope(user_id="u1"), since=T0 + timedelta(minutes=1))
    assert [r.text for r in since] == ["mine 2", "mine 1"]
    until = await store.recent(Scope(user_id="u1"), until=T0 + timedelta(minutes=1))
    assert [r.text for r in until] == ["mine 1", "mine 0"]
    between = T0 + timedelta(minutes=1)
    only = await store.recent(Scope(user_id="u1"), since=between, until=between)
    assert [r.text for r in only] == ["mine 1"]
    assert [r.text for r in await store.recent(Scope(tenant="t2", user_id="u1"))] == ["elsewhere"]
    assert await store.recent(Scope(user_id="u1"), kinds=["scene"]) == []


async def test_recent_with_meta_has_keeps_the_records_that_state_the_value(store: Any) -> None:
    """``meta_has`` filters in the query: a string equal to the value or a list holding it; a
    value that only appears elsewhere in the meta, as part of a word, or under another user does
    not count; a key that cannot be a JSON path is an input error."""

    def said(text: str, minutes: int, meta: dict[str, Any], user: str = "u1") -> MemoryRecord:
        return record(text, user=user, minutes=minutes).model_copy(update={"meta": meta})

    rows = [
        said("tired list", 1, {"emotions": ["tired", "sad"]}),
        said("tired string", 2, {"emotions": "tired"}),
        said("tiredness", 3, {"emotions": ["tiredness"]}),
        said("elsewhere in meta", 4, {"emotions": ["happy"], "note": "tired"}),
        said("no emotions", 5, {"layer": "accumulate"}),
        said("quoted", 6, {"emotions": ['say "hi"', "tired"]}),
        said("other user", 7, {"emotions": ["tired"]}, user="u2"),
    ]
    await add(store, *rows)
    found = await store.recent(Scope(user_id="u1"), meta_has=("emotions", "tired"))
    assert [r.text for r in found] == ["quoted", "tired string", "tired list"]
    odd = await store.recent(Scope(user_id="u1"), meta_has=("emotions", 'say "hi"'))
    assert [r.text for r in odd] == ["quoted"]
    since = await store.recent(
        Scope(user_id="u1"), since=T0 + timedelta(minutes=2), meta_has=("emotions", "tired")
    )
    assert [r.text for r in since] == ["quoted", "tired string"]
    with pytest.raises(InputError, match="meta_has"):
        await store.recent(Scope(user_id="u1"), meta_has=("emotions') OR 1=1 --", "tired"))


async def test_search_vectors_is_nearest_first_in_scope_and_kind(store: Any) -> None:
    records = [record(f"r{i}", minutes=i) for i in range(6)]
    records.append(record("scene", kind="scene", minutes=7))
    records.append(record("other user's twin", user="u2", minutes=8))
    ids = await add(store, *records, seeds=[0, 1, 2, 3, 4, 10, 10, 10])
    found = await store.search_vectors(Scope(user_id="u1"), unit(10), 3)
    assert found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert {found[0][0], found[1][0]} == {ids[5], ids[6]}  # both exact twins, never u2's
    assert ids[7] not in [i for i, _ in found]
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(found))
    scenes = await store.search_vectors(Scope(user_id="u1"), unit(10), 5, kinds=["scene"])
    assert [i for i, _ in scenes] == [ids[6]]
    assert await store.search_vectors(Scope(user_id="nobody"), unit(10), 5) == []
    assert [i for i, _ in await store.search_vectors(Scope(user_id="u2"), unit(10), 5)] == [ids[7]]


async def test_search_keywords_english_and_chinese_in_scope(store: Any) -> None:
    ids = await add(
        store,
        record("I finally quit my job at the bank", minutes=1),
        record("我最近迷上了摇滚乐，每天都听", minutes=2),
        record("Bought a new guitar", minutes=3, context_text="we talked about the bank"),
        record("The bank called me again", user="u2", minutes=4),
    )
    scope = Scope(user_id="u1")
    bank = await store.search_keywords(scope, "what about the bank?", 10)
    assert bank[0][0] == ids[0]  # the body outranks the context
    assert {i for i, _ in bank} == {ids[0], ids[2]}  # never u2's row
    assert (await store.search_keywords(scope, "bank", 10, context_weight=0.0))[0][0] == ids[0]
    assert [i for i, _ in await store.search_keywords(scope, "摇滚", 10)] == [ids[1]]
    assert await store.search_keywords(Scope(user_id="u2"), "摇滚", 10) == []
    assert await store.search_keywords(scope, "the and of", 10) == []
    for nasty in ['bank" OR "', "bank) & !(x", "'; DROP TABLE memories; --", "bank:*", "NEAR(bank guitar)"]:
        assert {i for i, _ in await store.search_keywords(scope, nasty, 10)} <= {ids[0], ids[2]}
    assert [i for i, _ in await store.search_keywords(scope, "guitar", 10, kinds=["scene"])] == []
    assert len(await store.search_keywords(scope, "bank guitar", 1)) == 1


async def test_update_rewrites_text_and_keywords_not_scope(store: Any) -> None:
    [rid] = await add(store, record("likes jazz"))
    [stored] = (await store.get([rid], None)).values()
    stored.text = "likes opera"
    stored.importance = 0.8
    stored.meta = {"changed": True}
    stored.user_id = "someone-else"  # scope is not rewritten
    await store.update(stored)
    [again] = (await store.get([rid], Scope(user_id="u1"))).values()
    assert (again.text, again.importance, again.meta) == ("likes opera", 0.8, {"changed": True})
    assert await store.search_keywords(Scope(user_id="u1"), "jazz", 5) == []
    assert [i for i, _ in await store.search_keywords(Scope(user_id="u1"), "opera", 5)] == [rid]


async def test_add_context_appends_a_line_to_the_chats_episodes_only(store: Any) -> None:
    assert isinstance(store, AddsContext)
    earlier = record("I got it!!", mid="m1", context_text="Saturday 1 March 2025")
    scene = record("the news", kind="scene", mid="m1")
    elsewhere = record("I got it too", chat="c2", mid="m1")
    other_tenant = record("I got it as well", tenant="t2", mid="m1")
    ids = await add(store, earlier, scene, elsewhere, other_tenant)
    reply = 'u2 said, "congrats on the new job!"'
    changed = await store.add_context("default", "c1", ["m1", "m-none"], reply, source=("cited", "m2"))
    assert changed == [ids[0]]
    got = await store.get(ids, None)
    assert got[ids[0]].context_text == f"Saturday 1 March 2025\n{reply}"
    assert got[ids[0]].meta == {**earlier.meta, "cited": ["m2"]}
    assert got[ids[0]].importance == earlier.importance and got[ids[0]].text == earlier.text
    for other in (scene, elsewhere, other_tenant):
        assert (got[other.id].context_text, got[other.id].meta) == (other.context_text, other.meta)
    # Found by the reply's words now, at the context's weight; nothing else is.
    assert [i for i, _ in await store.search_keywords(Scope(chat_id="c1"), "job", 5)] == [ids[0]]
    assert await store.search_keywords(Scope(chat_id="c2"), "job", 5) == []
    # The same source again adds nothing (a hook that runs twice); a second reply is a new line.
    assert await store.add_context("default", "c1", ["m1"], reply, source=("cited", "m2")) == []
    await store.add_context("default", "c1", ["m1"], 'u2 said, "when do you start?"', source=("cited", "m3"))
    [again] = (await store.get([ids[0]], None)).values()
    assert again.context_text.count("\n") == 2 and again.meta["cited"] == ["m2", "m3"]
    # A line that would take the context past its limit is not added.
    assert (
        await store.add_context("default", "c1", ["m1"], "x" * MAX_CONTEXT_CHARS, source=("cited", "m4"))
        == []
    )
    assert (await store.get([ids[0]], None))[ids[0]].meta["cited"] == ["m2", "m3"]


async def test_context_lines_are_written_with_the_records_that_bring_them(store: Any) -> None:
    assert isinstance(store, WritesContext)
    first = record("I got it!!", mid="m1", context_text="Saturday 1 March 2025")
    elsewhere = record("I got it too", chat="c2", mid="m1")
    [first_id, elsewhere_id] = await add(store, first, elsewhere)
    # A batch: a reply, and the reply to it (whose line reaches a row written in the same call).
    reply = record("congrats on the new job!", user="u2", mid="m2", minutes=1)
    answer = record("thanks, I start in May", mid="m3", minutes=2)
    lines = {
        0: [ContextLine(message_ids=["m1", "m-none"], text="u2: congrats on the new job")],
        1: [ContextLine(message_ids=["m1", "m2"], text="u1: thanks, I start in May")],
    }
    vectors = np.stack([unit(20), unit(21)])
    ids = await store.add_with_context([reply, answer], vectors, lines)
    got = await store.get([first_id, elsewhere_id, *ids], None)
    assert got[first_id].context_text == (
        "Saturday 1 March 2025\nu2: congrats on the new job\nu1: thanks, I start in May"
    )
    assert got[first_id].meta["context_message_ids"] == ["m2", "m3"]
    assert got[ids[0]].context_text == "u1: thanks, I start in May"
    assert got[ids[0]].meta["context_message_ids"] == ["m3"]
    assert (got[elsewhere_id].context_text, got[elsewhere_id].meta) == (
        elsewhere.context_text,
        elsewhere.meta,
    )
    assert sorted(i for i, _ in await store.search_keywords(Scope(chat_id="c1"), "may", 5)) == sorted(
        [first_id, ids[0], ids[1]]
    )
    assert await store.search_keywords(Scope(chat_id="c2"), "job", 5) == []
    # A message stored already is not written again, and neither are its lines.
    again = record("congrats on the new job!", user="u2", mid="m2", minutes=1)
    late = [ContextLine(message_ids=["m1"], text="u2: a line of a message not written")]
    assert await store.add_with_context([again], np.stack([unit(22)]), {0: late}) == []
    assert again.id is None
    [after] = (await store.get([first_id], None)).values()
    assert "not written" not in after.context_text


async def test_delete_only_in_scope(store: Any) -> None:
    mine, theirs = await add(store, record("mine"), record("theirs", user="u2"))
    assert await store.delete([mine, theirs], Scope(user_id="u1")) == 1
    assert set(await store.get([mine, theirs], None)) == {theirs}
    assert await store.search_vectors(Scope(user_id="u1"), unit(0), 5) == []
    assert await store.search_keywords(Scope(user_id="u1"), "mine", 5) == []
    assert await store.delete([theirs], Scope(user_id="u1")) == 0


# --- provenance and idempotent ingest ------------------------------------------------------------


async def test_stored_message_ids_and_from_messages(store: Any) -> None:
    episode = record("said it", mid="m1")
    scene = record("the scene of it", kind="scene", mid="m1")
    ids = await add(store, episode, scene)
    assert await store.stored_message_ids("default", "c1", ["m1", "m2"]) == {"m1"}
    assert await store.stored_message_ids("default", "c2", ["m1"]) == set()
    assert await store.stored_message_ids("t2", "c1", ["m1"]) == set()
    assert await store.from_messages("default", "c1", ["m1"]) == sorted(ids)
    assert await store.from_messages("default", "c9", ["m1"]) == []


async def test_stored_messages_answers_many_chats_and_tenants_at_once(store: Any) -> None:
    await add(
        store,
        record("said in c1", mid="m1"),
        record("scene of it", kind="scene", mid="m2"),  # not an episode: m2 has none
        record("said in c2", chat="c2", mid="m1"),
        record("another tenant", tenant="t2", mid="m3"),
    )
    assert isinstance(store, FindsStoredMessages)
    asked = [
        ("default", "c1", "m1"),
        ("default", "c1", "m2"),
        ("default", "c2", "m1"),
        ("default", "c2", "m3"),
        ("t2", "c1", "m3"),
        ("t2", "c1", "m1"),
        ("default", "c1", "m1"),  # asked twice, found once
    ]
    assert await store.stored_messages(asked) == {
        ("default", "c1", "m1"),
        ("default", "c2", "m1"),
        ("t2", "c1", "m3"),
    }
    assert await store.stored_messages([]) == set()
    # More keys than one query binds: every one of them is looked up.
    many = [("default", f"c{n % 7}", f"x{n}") for n in range(1_200)]
    await add(store, *(record(f"m {n}", chat=chat, mid=mid) for n, (_, chat, mid) in enumerate(many[::100])))
    assert await store.stored_messages(many) == set(many[::100])


async def test_a_new_memory_never_gets_the_id_of_a_deleted_one(store: Any) -> None:
    first, second = await add(store, record("one", mid="m1"), record("two", mid="m2"))
    assert await store.delete([second], Scope(user_id="u1")) == 1
    [third, fourth] = await add(store, record("three", mid="m3"), record("four", mid="m4"))
    assert first < second < third < fourth
    assert await store.delete([first, third, fourth], Scope(user_id="u1")) == 3
    [fifth] = await add(store, record("five", mid="m5"))
    assert fifth > fourth
    assert [hit for hit, _ in await store.search_vectors(Scope(user_id="u1"), unit(0), 5)] == [fifth]


async def test_add_skips_an_episode_already_stored_and_what_was_made_from_it(store: Any) -> None:
    await add(store, record("first copy", mid="m1"))
    again = record("second copy", mid="m1")
    scene = record("scene of the second copy", kind="scene", mid="m1")
    fresh = record("another message", mid="m2")
    fresh_scene = record("scene of m2", kind="scene", mid="m2")
    elsewhere = record("same id, other chat", chat="c2", mid="m1")
    ids = await add(store, again, scene, fresh, fresh_scene, elsewhere)
    assert again.id is None and scene.id is None
    assert ids == [fresh.id, fresh_scene.id, elsewhere.id]
    texts = {r.text for r in (await store.get(range(1, 100), None)).values()}
    assert texts == {"first copy", "another message", "scene of m2", "same id, other chat"}
    # The same message twice in one call is stored once.
    one, two = record("dup a", mid="m3"), record("dup b", mid="m3")
    assert await add(store, one, two) == [one.id]
    assert two.id is None
    assert await store.search_keywords(Scope(user_id="u1"), "second", 5) == []


# --- forgetting -------------------------------------------------------------------------------------


async def test_forget_and_forget_jobs(store: Any) -> None:
    ids = await add(
        store,
        record("u1 in c1", mid="a"),
        record("u1 in c2", chat="c2", mid="b"),
        record("scene", kind="scene", mid="a"),
        record("u2 in c1", user="u2", mid="c"),
    )
    await store.set_importance(
        [ImportanceChange(memory_id=ids[0], importance=0.5, reinforced_at=T0, who="t", why="w")], T0
    )
    job = await store.begin_forget(tenant="default", user_id="u1", chat_id=None)
    assert job.sources == {"c1": ["a"], "c2": ["b"]}
    assert [j.id for j in await store.pending_forgets()] == [job.id]
    counts = await store.forget(tenant="default", user_id="u1", chat_id=None)
    assert counts["memories"] == 3 and counts["vectors"] == 3 and counts["episode"] == 2
    assert counts["scene"] == 1
    assert set(await store.get(ids, None)) == {ids[3]}
    assert await store.history(ids[0]) == []
    assert await store.search_vectors(Scope(user_id="u1"), unit(0), 5) == []
    assert await store.search_keywords(Scope(chat_id="c1"), "c1", 5) == [(ids[3], pytest.approx(1, abs=1))]
    assert await store.stored_message_ids("default", "c1", ["a", "c"]) == {"c"}
    await store.finish_forget(job)
    assert await store.pending_forgets() == []

    messages = await store.begin_forget(tenant="default", user_id=None, chat_id="c1", messages=["c", "c"])
    assert messages.messages == ["c"] and messages.sources == {"c1": ["c"]}
    with pytest.raises(StoreError):
        await store.begin_forget(tenant="default", user_id=None, chat_id=None, messages=["x"])
    [pending] = await store.pending_forgets()
    assert pending == messages
    await store.finish_forget(pending, purge=False)
    assert await store.pending_forgets() == []


async def test_forget_a_chat_keeps_the_users_other_chats(store: Any) -> None:
    ids = await add(store, record("c1 row", mid="a"), record("c2 row", chat="c2", mid="b"))
    counts = await store.forget(tenant="default", user_id=None, chat_id="c1")
    assert counts["memories"] == 1
    assert set(await store.get(ids, None)) == {ids[1]}
    other_tenant = await store.forget(tenant="t2", user_id="u1", chat_id=None)
    assert other_tenant["memories"] == 0


# --- import and export ------------------------------------------------------------------------------


async def test_export_import_round_trip_keeps_ids_and_vectors(
    store: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ids = await add(
        store,
        record("one", mid="a"),
        record("两个 with a NUL \x00 and a backslash \\0", mid="b", context_text="ctx \\ \x00"),
        seeds=[3, 4],
    )
    await store.delete([ids[0]], Scope(user_id="u1"))
    exported = [(r, v) async for r, v in store.export()]
    assert [r.id for r, _ in exported] == [ids[1]]
    assert np.allclose(exported[0][1], unit(4))

    target = await make_store(request.node.callspec.params["store"], tmp_path / "target")
    (tmp_path / "target").mkdir(exist_ok=True)
    await target.open(dim=DIM, model=MODEL)
    try:
        assert await target.import_records(exported) == {"imported": 1, "skipped": 0}
        assert await target.import_records(exported) == {"imported": 0, "skipped": 1}
        again = [(r, v) async for r, v in target.export()]
        assert [r.model_dump() for r, _ in again] == [r.model_dump() for r, _ in exported]
        assert np.array_equal(again[0][1], exported[0][1])
        changed = exported[0][0].model_copy(update={"text": "changed"})
        with pytest.raises(StoreError):
            await target.import_records([(changed, exported[0][1])])
        # New rows after an import with ids do not collide with the imported ones.
        [new_id] = await add(target, record("new", mid="n"))
        assert new_id > ids[1]
        assert [i for i, _ in await target.search_keywords(Scope(user_id="u1"), "两个", 5)] == [ids[1]]
    finally:
        await target.close()


# --- state, importance, vectors -------------------------------------------------------------------


async def test_plugin_state_and_compare_and_set(store: Any) -> None:
    assert await store.state_get("p", "k") is None
    await store.state_put("p", "k", {"n": 1, "s": "文"})
    assert await store.state_get("p", "k") == {"n": 1, "s": "文"}
    assert await store.state_put_if("p", "k", {"n": 2}, None) is False  # something is stored
    assert await store.state_put_if("p", "k", {"n": 2}, {"n": 0}) is False
    assert await store.state_put_if("p", "k", {"n": 2}, {"s": "文", "n": 1}) is True
    assert await store.state_get("p", "k") == {"n": 2}
    assert await store.state_put_if("p", "new", {"x": 1}, None) is True
    assert await store.state_put_if("p", "new", {"x": 2}, None) is False
    # Keys may join their parts with NUL (proactive's do); backslashes are kept as they are.
    await store.state_put("p", "t\0u1\0topic", {"n": 1})
    await store.state_put("p", "t\\0u1", {"n": 2})
    assert await store.state_get("p", "t\0u1\0topic") == {"n": 1}
    assert await store.state_put_if("p", "t\0u1\0topic", {"n": 3}, {"n": 1}) is True
    assert await store.state_delete("p", "t\0u1\0") == 1
    assert await store.state_get("p", "t\\0u1") == {"n": 2}
    assert await store.state_delete("p", "t\\") == 1
    await store.state_put("p", "k2", {})
    await store.state_put("q", "k", {})
    assert await store.state_delete("p", "k") == 2
    assert await store.state_get("p", "new") == {"x": 1}
    assert await store.state_get("q", "k") == {}


async def test_state_delete_if_deletes_only_the_value_read(store: Any) -> None:
    await store.state_put("p", "m:\0a", {"at": "1", "s": "文"})
    await store.state_put("p", "m:\0ab", {"at": "1"})
    assert await store.state_delete_if("p", "m:\0a", {"at": "2"}) is False  # renewed since read
    assert await store.state_delete_if("p", "m:\0none", {"at": "1"}) is False
    assert await store.state_delete_if("q", "m:\0a", {"at": "1", "s": "文"}) is False
    assert await store.state_get("p", "m:\0a") == {"at": "1", "s": "文"}
    assert await store.state_delete_if("p", "m:\0a", {"s": "文", "at": "1"}) is True
    assert await store.state_get("p", "m:\0a") is None
    assert await store.state_get("p", "m:\0ab") == {"at": "1"}  # one key, not a prefix
    assert await store.state_delete_if("p", "m:\0a", {"at": "1", "s": "文"}) is False


async def test_state_delete_takes_every_key_of_its_prefix_and_no_other(store: Any) -> None:
    """Prefixes ending at characters whose next one needs more bytes, or none (U+10FFFF), or
    whose next one is a surrogate, and keys with NUL, emoji and the highest code point after them."""
    prefixes = ["a\x7f", "a\u07ff", "a\ud7ff", "a\uffff", "a\U0010ffff", "a\0", "m:"]
    tails = ["", "\0", "x", "\x80", "\u0800", "\ue000", "\U0001f600", "\U0010ffff", "\U0010ffff\U0010ffff"]
    for n, prefix in enumerate(prefixes):
        for tail in tails:
            await store.state_put("d", prefix + tail, {"n": n})
    await store.state_put("d", "a", {"n": -1})
    await store.state_put("d", "b", {"n": -1})
    for prefix in prefixes:
        assert await store.state_delete("d", prefix) == len(tails), prefix
    assert [key for key, _ in await store.state_items("d")] == ["a", "b"]


async def test_state_written_with_records_lands_with_them_and_lists_in_key_order(store: Any) -> None:
    """``add(..., state=...)`` puts plugin state in the records' transaction: both or neither."""
    entries = [("settle", "b:2", {"n": 2}), ("settle", "a:1", {"n": 1}), ("other", "a", {})]
    ids = await store.add([record("kept", mid="s1")], np.vstack([unit(1)]), state=entries)
    assert len(ids) == 1
    assert await store.state_items("settle") == [("a:1", {"n": 1}), ("b:2", {"n": 2})]
    assert await store.state_items("other") == [("a", {})]
    assert await store.state_items("none") == []
    await store.state_put("settle", "c\0", {"n": 3})  # a NUL (escaped on PostgreSQL) comes back as put
    assert [key for key, _ in await store.state_items("settle")] == ["a:1", "b:2", "c\0"]
    # A write that fails (two vectors for one record) stores no state either.
    with pytest.raises(StoreError):
        await store.add([record("lost", mid="s2")], np.vstack([unit(2), unit(3)]), state=[("lost", "k", {})])
    assert await store.state_items("lost") == []


async def test_importance_history_and_decay_state(store: Any) -> None:
    a, b = await add(store, record("a", mid="a"), record("b", mid="b"))
    later = T0 + timedelta(days=3)
    written = await store.set_importance(
        [
            ImportanceChange(
                memory_id=a, importance=0.6, reinforced_at=later, old=0.3, who="hippo", why="used"
            )
        ],
        later,
    )
    assert written == [a]
    # Computed from a value that changed meanwhile (another call or worker reinforced it): not
    # written, no history row; without ``old`` a change is written whatever the value.
    stale = ImportanceChange(
        memory_id=a, importance=0.9, reinforced_at=later, old=0.3, who="hippo", why="used"
    )
    assert await store.set_importance([stale], later) == []
    assert (await store.get([a], None))[a].importance == 0.6
    [(at, who, why, old, new)] = [tuple(h.values()) for h in await store.history(a)]
    assert (who, why, old, new) == ("hippo", "used", 0.3, 0.6)
    assert datetime.fromisoformat(at) == later
    states = await store.importance_states(0, 10)
    assert [(s[0], s[1], s[2], s[3]) for s in states] == [
        (a, 0.6, later, 0.6),
        (b, 0.3, T0 + timedelta(0), None),
    ]
    assert await store.importance_states(a, 10) == [states[1]]
    await store.set_current_importance([(b, 0.05)], [(b, "hippo", "faded", 0.3, 0.05)], later)
    assert await store.count_below(0.1) == 1
    assert [h["why"] for h in await store.history(b)] == ["faded"]
    assert (await store.get([a], None))[a].importance == 0.6
    # A run of memories' histories in one read, each as history() gives it.
    assert await store.histories(a, b) == {a: await store.history(a), b: await store.history(b)}
    assert await store.histories(b, b) == {b: await store.history(b)}
    assert await store.histories(b + 1, b + 100) == {}


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_importance_history_keeps_the_newest_rows_of_each_memory(tmp_path: Path, backend: str) -> None:
    """A memory used every day gained a history row a day for good (a 50,000-user bot, some
    150,000 rows a day). ``history_kept`` rows are kept per memory, the newest, whichever way a
    row is written (a reinforcement, a decay pass's value, its cached value); other memories'
    rows are not touched, and 0 keeps every row."""
    from narrmem.store import DecayedImportance

    for kept in (3, 0):
        (tmp_path / f"kept-{kept}").mkdir()
        store = await make_store(backend, tmp_path / f"kept-{kept}", history_kept=kept)
        await store.open(dim=DIM, model=MODEL)
        try:
            a, b = await add(store, record("a", mid="a"), record("b", mid="b"))
            value = 0.3
            for day in range(1, 6):
                at = T0 + timedelta(days=day)
                change = ImportanceChange(
                    memory_id=a,
                    importance=value + 0.1,
                    reinforced_at=at,
                    old=value,
                    who="hippo",
                    why=f"d{day}",
                )
                assert await store.set_importance([change], at) == [a]
                value += 0.1
            await store.set_current_importance([(b, 0.2)], [(b, "hippo", "first", 0.3, 0.2)], T0)
            at = T0 + timedelta(days=6)
            await store.set_current_importance([(a, 0.7)], [(a, "hippo", "d6", 0.8, 0.7)], at)
            decayed = DecayedImportance(
                memory_id=a, value=0.6, importance=value, cached=0.7, history=("hippo", "d7")
            )
            assert await store.set_decayed_importance([decayed], T0 + timedelta(days=7)) == [a]
            whys = [h["why"] for h in await store.history(a)]
            assert whys == (["d5", "d6", "d7"] if kept else ["d1", "d2", "d3", "d4", "d5", "d6", "d7"])
            assert [h["why"] for h in await store.history(b)] == ["first"]
        finally:
            await store.close()


async def test_vectors_in_scope(store: Any) -> None:
    a, b = await add(store, record("a", mid="a"), record("b", user="u2", mid="b"), seeds=[5, 6])
    found = await store.vectors([a, b], Scope(user_id="u1"))
    assert set(found) == {a}
    assert np.allclose(found[a], unit(5))


async def test_get_with_vectors_reads_what_get_and_vectors_read_in_scope(store: Any) -> None:
    assert isinstance(store, ReadsWithVectors)
    mine = [record(f"mine {i}", mid=f"m{i}", minutes=i) for i in range(3)]
    other_chat = record("other chat", chat="c2", mid="c2")
    other_user = record("theirs", user="u2", mid="u2")
    other_tenant = record("elsewhere", tenant="t2", mid="t2")
    ids = await add(store, *mine, other_chat, other_user, other_tenant, seeds=[1, 2, 3, 4, 5, 6])
    # More ids than one statement's chunk, most of them not stored.
    asked = [*ids, *range(max(ids) + 1, max(ids) + 700)]
    for scope in (Scope(user_id="u1"), Scope(chat_id="c1"), Scope(tenant="t2", user_id="u1")):
        records, vectors = await store.get_with_vectors(asked, scope)
        expected = await store.get(asked, scope)
        assert {k: r.model_dump() for k, r in records.items()} == {
            k: r.model_dump() for k, r in expected.items()
        }
        expected_vectors = await store.vectors(asked, scope)
        assert set(vectors) == set(expected_vectors) == set(records)
        for memory_id, vector in vectors.items():
            assert np.array_equal(vector, expected_vectors[memory_id])
    records, _ = await store.get_with_vectors(ids, Scope(user_id="u1"))
    assert set(records) == {*(r.id for r in mine), other_chat.id}
    assert np.allclose(
        (await store.get_with_vectors([mine[1].id], Scope(user_id="u1")))[1][mine[1].id], unit(2)
    )
    assert await store.get_with_vectors([other_user.id, other_tenant.id], Scope(user_id="u1")) == ({}, {})


async def test_exclusive_lets_one_holder_in(store: Any) -> None:
    async with store.exclusive("decay") as first:
        async with store.exclusive("decay") as second:
            assert (first, second) == (True, False)
        async with store.exclusive("other") as other:
            assert other is True
    async with store.exclusive("decay") as again:
        assert again is True


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_reopen_with_another_model_is_refused(backend: str, tmp_path: Path) -> None:
    dsn = await fresh_database("model") if backend == "postgres" else None
    first = await make_store(backend, tmp_path, dsn)
    await first.open(dim=DIM, model=MODEL)
    await first.close()
    second = await make_store(backend, tmp_path, dsn)
    with pytest.raises(StoreError, match="holds vectors of model") as refused:
        await second.open(dim=DIM, model="another-model")
    # What it advises can be done: no export and import into a store of another model (its
    # vectors are this model's, refused there).
    assert "open it with the model it was written with" in str(refused.value)
    await second.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_the_recorded_model_is_read_before_opening_without_writing(
    backend: str, tmp_path: Path
) -> None:
    dsn = await fresh_database("recorded") if backend == "postgres" else None
    fresh = await make_store(backend, tmp_path, dsn)
    assert isinstance(fresh, RecordsModel)
    assert await fresh.recorded_model() is None
    # Asking created nothing: no database file, no tables.
    assert not list(await asyncio.to_thread(lambda: list(tmp_path.iterdir())))
    await fresh.open(dim=DIM, model=MODEL)
    await fresh.close()
    again = await make_store(backend, tmp_path, dsn)
    assert await again.recorded_model() == MODEL
    await again.close()
    unreachable = await make_store(
        backend, tmp_path / "elsewhere", "postgresql://nobody@127.0.0.1:1/none" if dsn else None
    )
    assert await unreachable.recorded_model() is None
    await unreachable.close()


async def test_users_are_listed_by_tenant_with_counts(store: Any) -> None:
    await add(
        store,
        record("a", minutes=0),
        record("b", chat="c2", kind="scene", minutes=3),
        record("c", user="u2", minutes=1),
        record("d", tenant="t2", minutes=2),
    )
    rows = await store.users("default")
    assert [(r["tenant"], r["user_id"], r["memories"], r["scenes"], r["chats"]) for r in rows] == [
        ("default", "u1", 2, 1, 2),
        ("default", "u2", 1, 0, 1),
    ]
    first, last = (datetime.fromisoformat(rows[0][key]) for key in ("first_at", "last_at"))
    assert (first, last) == (T0, T0 + timedelta(minutes=3))  # the same instants, told in UTC
    assert [r["tenant"] for r in await store.users(None)] == ["default", "default", "t2"]
    assert len(await store.users(None, limit=1)) == 1


async def test_users_page_by_user_id_within_a_tenant(store: Any) -> None:
    await add(
        store,
        *(record(f"m{n}", user=f"u{n}", minutes=n) for n in (3, 1, 4, 2)),
        record("other tenant", tenant="t2", user="u9"),
    )
    first = await store.users("default", limit=2)
    assert [r["user_id"] for r in first] == ["u1", "u2"]
    rest = await store.users("default", limit=2, after=first[-1]["user_id"])
    assert [r["user_id"] for r in rest] == ["u3", "u4"]
    assert await store.users("default", limit=2, after="u4") == []
    # A cursor that names no user still pages by order: the ids after it.
    assert [r["user_id"] for r in await store.users("default", after="u2x")] == ["u3", "u4"]
    with pytest.raises(InputError) as info:
        await store.users(None, after="u1")
    assert info.value.field == "after"


async def test_tenants_are_listed_distinct_and_in_order(store: Any) -> None:
    assert await store.tenants() == []
    await add(
        store,
        record("a", tenant="zeta"),
        record("b", tenant="alpha", user="u2"),
        record("c", tenant="alpha", user="u3"),
        record("d"),
    )
    assert await store.tenants() == ["alpha", "default", "zeta"]


# --- plugin tables (store.sql()) ------------------------------------------------------------------

TABLE = """CREATE TABLE IF NOT EXISTS demo_notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,       -- who wrote it? (a question mark in a comment is not a placeholder)
    score REAL NOT NULL,
    count INTEGER NOT NULL DEFAULT 0,
    blob BLOB,
    UNIQUE (owner, score)
)"""


async def test_one_sql_on_both_stores(store: Any) -> None:
    assert isinstance(store, SQLCapable)
    async with store.sql(write=True) as db:
        assert db.dialect in ("sqlite", "postgres")
        await db.execute(TABLE)
        await db.execute(TABLE)  # set up twice: nothing happens
        first = await db.fetchone(
            "INSERT INTO demo_notes (owner, score, count, blob) VALUES (?, ?, ?, ?) RETURNING id",
            ("ann?", 0.5, 2**40, b"\x00\x01"),
        )
        await db.executemany(
            "INSERT INTO demo_notes (owner, score) VALUES (?, ?)", [("bob", 1.0), ("cy", 2.0)]
        )
        again = await db.execute(
            "INSERT INTO demo_notes (owner, score) VALUES (?, ?) ON CONFLICT (owner, score) DO NOTHING",
            ("bob", 1.0),
        )
        bumped = await db.execute("UPDATE demo_notes SET count = count + 1 WHERE score >= ?", (1.0,))
    assert first is not None and isinstance(first[0], int)
    assert (again, bumped) == (0, 2)
    async with store.sql() as db:
        rows = await db.fetchall("SELECT owner, score, count, blob FROM demo_notes ORDER BY id")
        assert rows == [("ann?", 0.5, 2**40, b"\x00\x01"), ("bob", 1.0, 1, None), ("cy", 2.0, 1, None)]
        assert await db.fetchone("SELECT owner FROM demo_notes WHERE owner = ?", ("nobody",)) is None


async def test_a_failed_write_rolls_back_and_errors_are_typed(store: Any) -> None:
    async with store.sql(write=True) as db:
        await db.execute(TABLE)
    with pytest.raises(RuntimeError):
        async with store.sql(write=True) as db:
            await db.execute("INSERT INTO demo_notes (owner, score) VALUES (?, ?)", ("gone", 1.0))
            raise RuntimeError("the plugin failed half way")
    async with store.sql() as db:
        assert await db.fetchall("SELECT owner FROM demo_notes") == []
    with pytest.raises(StoreError, match="demo_notes"):
        async with store.sql(write=True) as db:
            await db.execute("INSERT INTO demo_notes (owner) VALUES (?)", ("no score",))
    with pytest.raises(StoreError, match="NUL"):
        async with store.sql(write=True) as db:
            await db.execute("INSERT INTO demo_notes (owner, score) VALUES (?, ?)", ("a\x00b", 1.0))
