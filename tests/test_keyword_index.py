"""``storage.keyword_index = "tantivy"``: the same keyword hits as FTS5, scope checked on the rows,
kept current with SQLite across crashes, rebuilt without a forgotten user's words, and FTS5 again
whenever it cannot answer; ``"auto"`` (the default) keeps it once a user is large and searches
only large scopes on it."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, sql
from narrmem_plugins.storage_sqlite import keyword_index
from narrmem_plugins.storage_sqlite.keyword_index import STATE_FILE, KeywordDoc
from narrmem_plugins.storage_sqlite.store import user_token

from narrmem import StoreError
from narrmem.models import Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only

TANTIVY = {"storage": {"keyword_index": "tantivy"}}
# A chat of its own for the words a test looks for: in dm-u1 they would reach the two turns before
# them too (a reply's words join their keyword context), and a test of the index's mechanics counts
# the rows that hold a word.
TRIP = "trip-u1"
CHAT = [
    ("m1", "I adopted a greyhound named Pixel from the shelter", "u1"),
    ("m2", "my favourite food is spicy ramen with an egg", "u1"),
    ("m3", "we moved to Lisbon last spring, the light there is amazing", "u1"),
    ("m4", "the bakery shifts start at five and I am always tired", "u1"),
    ("m5", "I love ramen too, the spicier the better", "u2"),
    ("m6", "我最喜欢的食物是拉面", "u1"),
    ("m8", "I decided to quit my job at the bank", "u1"),
]
QUESTIONS = ["spicy ramen", "greyhound shelter", "Lisbon", "bakery tired", "拉面", "Pixel ramen Lisbon"]


async def fill(memory: Any) -> None:
    for message_id, text, user in CHAT:
        await memory.ingest(msg(message_id, text, user=user, chat=f"dm-{user}"))


def keyword_folder(folder: Path) -> Path:
    return folder / "keywords"


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_hits_are_fts5s_and_stay_in_their_scope(tmp_path: Path) -> None:
    hits: dict[str, list[list[int]]] = {}
    # Each message's context holds its own turns only: with the replies too, the six messages of
    # one chat share most words, and the two engines' BM25 (FTS5 scores per column) order the
    # near ties of this small store differently.
    alone = {"recall_hybrid": {"replies_in_context": False}}
    for engine in ("fts5", "tantivy"):
        async with open_memory(tmp_path / engine, storage={"keyword_index": engine}, plugin=alone) as memory:
            await fill(memory)
            hits[engine] = [
                [i for i, _ in await memory.store.search_keywords(Scope(user_id="u1"), q, 10)]
                for q in QUESTIONS
            ]
            if engine == "tantivy":
                ramen_u2 = await memory.store.search_keywords(Scope(user_id="u2"), "ramen", 10)
                assert [i for i, _ in ramen_u2] == [5]
                chat = await memory.store.search_keywords(Scope(user_id="u1", chat_id="dm-u2"), "ramen", 10)
                assert chat == []
                # Kinds are filtered inside the index too.
                u1 = Scope(user_id="u1")
                for kind in ("scene", "episode"):
                    found = [
                        i for i, _ in await memory.store.search_keywords(u1, "quit bank", 10, kinds=[kind])
                    ]
                    assert found and {r.kind for r in (await memory.store.get(found, u1)).values()} == {kind}
    # The same rows come first: the text, its weighting and the scope are FTS5's.
    assert [h[:1] for h in hits["tantivy"]] == [h[:1] for h in hits["fts5"]]
    assert all(set(t) == set(f) for t, f in zip(hits["tantivy"], hits["fts5"], strict=True))


async def test_a_row_filed_under_another_owner_never_leaves_its_scope(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        keywords = memory.store._keywords
        # A corrupted index entry: u2's ramen row claims to be u1's.
        stray = KeywordDoc(5, "episode", (user_token("default", "u1"),), "ramen ramen", "")
        keywords.apply([stray], [], keywords.changes)
        raw = await keywords.search([user_token("default", "u1")], ["ramen"], 10)
        assert 5 in [i for i, _ in raw]
        found = await memory.store.search_keywords(Scope(user_id="u1"), "ramen", 10)
        assert 5 not in [i for i, _ in found] and found


async def test_an_index_behind_sqlite_is_rebuilt_on_open(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
    # Written, and the index's record of it lost (the process died between the two commits).
    before = (keyword_folder(folder) / STATE_FILE).read_text()
    async with open_memory(folder, **TANTIVY) as memory:
        await memory.ingest(msg("m7", "a weekend of kayaking on the Tagus", chat=TRIP))
    (keyword_folder(folder) / STATE_FILE).write_text(before)
    state = json.loads((keyword_folder(folder) / STATE_FILE).read_text())
    [(count,)] = sql(folder, "SELECT count FROM keyword_changes")
    assert state["changes"] < count
    async with open_memory(folder, **TANTIVY) as memory:
        assert memory.store._keywords.changes == count
        hits = await memory.store.search_keywords(Scope(user_id="u1"), "kayaking", 10)
        assert len(hits) == 1
    assert names(tmp_path) == ["m"]
    assert not [name for name in names(folder) if name.startswith("keywords.")]


async def test_a_damaged_index_is_rebuilt(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
    (keyword_folder(folder) / "meta.json").write_text("{ not json")
    async with open_memory(folder, **TANTIVY) as memory:
        hits = await memory.store.search_keywords(Scope(user_id="u1"), "greyhound", 10)
        assert [i for i, _ in hits][:1] == [1]  # then the turns that had it as context


async def test_a_forget_rebuilds_the_index_without_the_user(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        before = set(names(keyword_folder(folder)))
        await memory.forget(user_id="u1")
        keywords = memory.store._keywords
        assert await keywords.search([user_token("default", "u1")], ["greyhound", "ramen"], 10) == []
        searcher = keywords._searcher
        assert searcher.num_docs == 1  # u2's message alone, and no deleted document kept
        after = set(names(keyword_folder(folder)))
        segments = {name.split(".")[0] for name in before if re.fullmatch(r"[0-9a-f]{32}\.\w+", name)}
        assert segments and not any(name.split(".")[0] in segments for name in after)
        assert [i for i, _ in await memory.store.search_keywords(Scope(user_id="u2"), "ramen", 10)] == [5]


async def test_when_the_index_fails_fts5_answers_and_the_next_open_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        keywords = memory.store._keywords

        def broken(*args: object) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(keywords, "_stage", broken)
        await memory.ingest(msg("m7", "a weekend of kayaking on the Tagus", chat=TRIP))
        await keywords.flush()  # the index's thread has tried the write by now
        assert keywords.changes is None
        assert not keywords._uncommitted  # nothing kept for searches it no longer answers
        hits = await memory.store.search_keywords(Scope(user_id="u1"), "kayaking", 10)
        assert len(hits) == 1  # FTS5 has it: the index, whose write failed, does not answer
        monkeypatch.undo()
    async with open_memory(folder, **TANTIVY) as memory:
        assert memory.store._keywords.changes is not None
        assert len(await memory.store.search_keywords(Scope(user_id="u1"), "kayaking", 10)) == 1


async def test_another_context_weight_and_a_reader_use_fts5(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        weighted = await memory.store.search_keywords(Scope(user_id="u1"), "ramen", 10, context_weight=0.2)
        assert [i for i, _ in weighted][:1] == [2]
        async with open_memory(folder, read_only=True, **TANTIVY) as reader:
            assert reader.store._keywords is None
            hits = await reader.store.search_keywords(Scope(user_id="u1"), "ramen", 10)
            assert [i for i, _ in hits][:1] == [2]


async def test_updates_and_deletes_reach_the_index(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        [record] = (await memory.store.get([3], Scope(user_id="u1"))).values()
        record.embed_text = "we moved to Porto last spring"
        await memory.store.update(record)
        u1 = Scope(user_id="u1")
        # The later turns keep Lisbon in their context; the updated row no longer has it.
        assert 3 not in [i for i, _ in await memory.store.search_keywords(u1, "Lisbon", 10)]
        assert [i for i, _ in await memory.store.search_keywords(u1, "Porto", 10)] == [3]
        await memory.store.delete([3], u1)
        assert await memory.store.search_keywords(u1, "Porto", 10) == []


async def test_without_the_package_the_error_names_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tantivy", None)
    with pytest.raises(StoreError, match=r"pip install tantivy"):
        await open_memory(tmp_path / "m", **TANTIVY)


async def test_a_folder_of_someone_elses_files_is_not_replaced(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    keyword_folder(folder).mkdir(parents=True)
    (keyword_folder(folder) / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="not a narrmem keyword index"):
        await open_memory(folder, **TANTIVY)
    assert (keyword_folder(folder) / "notes.txt").read_text() == "mine"


async def test_an_index_left_by_a_run_with_it_goes_when_the_store_runs_without_it(tmp_path: Path) -> None:
    """A store that ran with the tantivy index, opened with keyword_index = "fts5": the index was
    neither kept nor purged, and a forget made then left the forgotten words in it. Someone
    else's folder of that name stays, as ever."""
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
    assert (keyword_folder(folder) / STATE_FILE).is_file()
    fts5 = {"storage": {"keyword_index": "fts5"}}
    async with open_memory(folder, **fts5) as memory:
        assert not keyword_folder(folder).exists()
        await memory.forget(user_id="u1")
    assert not keyword_folder(folder).exists()  # nothing of u1's words in an index left aside
    async with open_memory(folder, **TANTIVY) as memory:  # back: built again from SQLite
        assert [i for i, _ in await memory.store.search_keywords(Scope(user_id="u2"), "ramen", 10)] == [5]
    # Another store of the same folder (a database of its own name) keeps the index it runs with.
    async with open_memory(
        folder, storage={"keyword_index": "tantivy", "database": "a.sqlite3", "index": "a-vec"}
    ):
        pass
    async with open_memory(
        folder, storage={"keyword_index": "fts5", "database": "b.sqlite3", "index": "b-vec"}
    ):
        assert (keyword_folder(folder) / STATE_FILE).is_file()
    theirs = tmp_path / "n"
    keyword_folder(theirs).mkdir(parents=True)
    (keyword_folder(theirs) / "notes.txt").write_text("mine")
    async with open_memory(theirs, **fts5):
        pass
    assert (keyword_folder(theirs) / "notes.txt").read_text() == "mine"


class CountingWriter:
    """Stands in for the index's writer, counting commits."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.commits = 0

    def commit(self) -> Any:
        self.commits += 1
        return self.writer.commit()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


async def test_a_search_sees_the_writes_before_their_commit_and_they_share_one(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        keywords = memory.store._keywords
        await keywords.flush()  # nothing left to commit
        writer = CountingWriter(keywords._writer)
        keywords._writer = writer
        release = threading.Event()
        keywords._thread.submit(release.wait, 10)  # the index's thread is busy: nothing commits
        try:
            for n, text in enumerate(["kayaking on the Tagus", "kayaking again", "more kayaking"]):
                await memory.ingest(msg(f"k{n}", text, chat=TRIP))
            u1 = Scope(user_id="u1")
            before = await memory.store.search_keywords(u1, "kayaking Tagus", 10)
            # Answered while the commit waits, with the three writes in it.
            assert writer.commits == 0 and len(before) == 3
            await memory.store.delete([before[0][0]], u1)
            assert before[0][0] not in [i for i, _ in await memory.store.search_keywords(u1, "kayaking", 10)]
        finally:
            release.set()
        await keywords.flush()
        assert writer.commits == 1  # the three messages and the delete: one commit
        assert keywords.changes == sql(tmp_path / "m", "SELECT count FROM keyword_changes")[0][0]
        after = await memory.store.search_keywords(u1, "kayaking Tagus", 10)
        assert [i for i, _ in after] == [i for i, _ in before[1:]]


async def test_writes_that_keep_coming_are_committed_an_interval_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        keywords = memory.store._keywords
        writer = CountingWriter(keywords._writer)
        keywords._writer = writer
        monkeypatch.setattr(keyword_index, "COMMIT_INTERVAL", 60.0)
        for n in range(6):
            await memory.ingest(msg(f"k{n}", f"kayaking on the Tagus, day {n}", chat="dm-u1"))
        await keywords._run(lambda: None)
        # The first write commits at once, the next wait for the interval; searches see them.
        assert writer.commits == 1
        assert len(await memory.store.search_keywords(Scope(user_id="u1"), "kayaking", 10)) == 6
        await keywords.flush()
        assert writer.commits == 2 and not keywords._uncommitted
        assert keywords.changes == sql(tmp_path / "m", "SELECT count FROM keyword_changes")[0][0]
        # Once the interval has passed, what waited is committed without being asked.
        monkeypatch.setattr(keyword_index, "COMMIT_INTERVAL", 1.0)
        await memory.ingest(msg("k6", "kayaking once more", chat="dm-u1"))
        assert writer.commits == 2
        await asyncio.sleep(1.5)
        await keywords._run(lambda: None)
        assert writer.commits == 3 and not keywords._uncommitted


async def test_an_uncommitted_write_scores_about_what_it_scores_once_committed(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        for n in range(30):  # a user with some history: word statistics worth the name
            await memory.ingest(
                msg(f"h{n}", f"day {n}: walked the dog, cooked ramen, read a novel", chat="dm-u1")
            )
        keywords = memory.store._keywords
        await keywords.flush()
        release = threading.Event()
        keywords._thread.submit(release.wait, 10)
        try:
            await memory.ingest(msg("new", "spicy ramen night with the kayaking club", chat=TRIP))
            pending = dict(
                await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen kayaking", 50)
            )
        finally:
            release.set()
        await keywords.flush()
        committed = dict(await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen kayaking", 50))
        new_id = max(committed)
        assert pending.keys() == committed.keys()
        # The estimate of BM25's average length is the one approximation (0.05 % off here).
        assert pending[new_id] == pytest.approx(committed[new_id], rel=0.05)
        # Ranked where the commit puts it.
        assert sorted(pending.values()).index(pending[new_id]) == sorted(committed.values()).index(
            committed[new_id]
        )


async def test_searches_during_a_rebuild_are_answered_in_full(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        u1 = Scope(user_id="u1")
        complete = sorted(i for i, _ in await store.search_keywords(u1, "ramen Lisbon", 10))
        gate = asyncio.Event()

        batches = store._keyword_batches

        async def slow_rows() -> AsyncIterator[list[KeywordDoc]]:
            async for docs in batches():
                yield docs[:2]
                await gate.wait()  # the rebuild stops here with two rows in its new folder
                yield docs[2:]

        store._keyword_batches = slow_rows
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.sleep(0.3)
        assert not rebuild.done()
        during = sorted(i for i, _ in await store.search_keywords(u1, "ramen Lisbon", 10))
        gate.set()
        await rebuild
        after = sorted(i for i, _ in await store.search_keywords(u1, "ramen Lisbon", 10))
        assert during == complete == after


async def test_a_forgotten_speakers_words_leave_the_others_context_in_the_index(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await memory.ingest(msg("g1", "my secret word is zanzibarite", user="u2", chat="group"))
        await memory.ingest(msg("g2", "that is a lovely word", user="u1", chat="group"))
        u1 = Scope(user_id="u1")
        assert await memory.store.search_keywords(u1, "zanzibarite", 10)  # u1's reply holds it as context
        await memory.forget(user_id="u2")
        assert await memory.store.search_keywords(u1, "zanzibarite", 10) == []
        keywords = memory.store._keywords
        assert keywords.changes is not None  # answered by the index itself
        assert await keywords.search([user_token("default", "u1")], ["zanzibarite"], 10) == []


def count_searches(memory: Any) -> list[list[str]]:
    """The scope tokens of every search the tantivy index answers from now on."""
    keywords = memory.store._keywords
    seen: list[list[str]] = []
    search = keywords.search

    async def counted(owner: list[str], *args: Any, **kwargs: Any) -> Any:
        seen.append(list(owner))
        return await search(owner, *args, **kwargs)

    keywords.search = counted
    return seen


async def test_auto_builds_the_index_once_a_user_is_large_and_searches_on_it(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    auto = {"storage": {"keyword_index": "auto", "keyword_threshold": 5}}
    async with open_memory(folder, **auto) as memory:
        await fill(memory)  # u1 writes six messages, u2 one
        assert memory.store._keywords_starting is not None  # started by the write that made u1 large
        await memory.store._keywords_starting
        assert (await memory.stats())["keyword_search"] == "tantivy"
        assert keyword_folder(folder).is_dir() and memory.store._keywords.changes is not None
        seen = count_searches(memory)
        big = [i for i, _ in await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen", 10)]
        small = [i for i, _ in await memory.store.search_keywords(Scope(user_id="u2"), "spicy ramen", 10)]
        assert seen == [[user_token("default", "u1")], [user_token("default", "u2")]]
        assert big and small and not set(big) & set(small)
        result = await memory.ingest(
            msg("m9", "ramen again tonight, the spicy kind", user="u1", chat="dm-u1")
        )
        found = [i for i, _ in await memory.store.search_keywords(Scope(user_id="u1"), "ramen tonight", 10)]
        assert len(seen) == 3 and result.memory_ids[0] == found[0]  # the write just made, through tantivy
    # Kept from then on: the next open finds the folder and opens it, whatever the users' sizes.
    async with open_memory(folder, storage={"keyword_index": "auto", "keyword_threshold": 1000}) as memory:
        assert memory.store._keywords is not None and memory.store._keywords.changes is not None
        seen = count_searches(memory)
        assert await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen", 10)
        assert seen == [[user_token("default", "u1")]]
    async with open_memory(folder, read_only=True) as reader:
        stats = await reader.stats()
        assert stats["keyword_search"] == "fts5 (read-only; the writer keeps tantivy)"


async def test_auto_without_a_large_user_keeps_fts5_alone(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, storage={"keyword_index": "auto", "keyword_threshold": 50}) as memory:
        await fill(memory)
        assert memory.store._keywords is None and memory.store._keywords_starting is None
        assert (await memory.stats())["keyword_search"] == "fts5"
        assert await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen", 10)
    assert not keyword_folder(folder).exists()


async def test_auto_opens_a_store_whose_user_is_large_with_the_index(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, storage={"keyword_index": "fts5"}) as memory:
        await fill(memory)
    async with open_memory(folder, storage={"keyword_index": "auto", "keyword_threshold": 5}) as memory:
        assert memory.store._keywords is not None and memory.store._keywords.changes is not None
        hits = await memory.store.search_keywords(Scope(user_id="u1"), "greyhound shelter", 10)
        assert hits and sql(folder, "SELECT text FROM memories WHERE id = ?", (hits[0][0],))[0][0].startswith(
            "I adopted a greyhound"
        )


async def test_auto_without_the_package_keeps_fts5_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "tantivy", None)
    async with open_memory(
        tmp_path / "m", storage={"keyword_index": "auto", "keyword_threshold": 5}
    ) as memory:
        await fill(memory)
        assert memory.store._keywords_starting is not None
        await memory.store._keywords_starting
        assert memory.store._keywords is None
        assert await memory.store.search_keywords(Scope(user_id="u1"), "spicy ramen", 10)
    assert "pip install tantivy" in caplog.text
