"""A rebuild of the tantivy keyword index (a purge's, or an open's) lets writes go on: they wait
only while it starts and while the new index takes the old one's place. What they change reaches
the new index, searches meanwhile are answered by the index in use, a write the index missed
meanwhile keeps the new one from answering, and one rebuild runs at a time."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, sql
from narrmem_plugins.storage_sqlite import store as store_module
from narrmem_plugins.storage_sqlite.keyword_index import STATE_FILE, KeywordDoc
from narrmem_plugins.storage_sqlite.store import user_token

from narrmem import StoreError, forgetting
from narrmem.models import Scope
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only

TANTIVY = {"storage": {"keyword_index": "tantivy"}}
U1 = Scope(user_id="u1")
CHAT = [
    ("m1", "I adopted a greyhound named Pixel from the shelter"),
    ("m2", "my favourite food is spicy ramen with an egg"),
    ("m3", "we moved to Lisbon last spring, the light there is amazing"),
    ("m4", "the bakery shifts start at five and I am always tired"),
]


async def fill(memory: Any) -> None:
    for message_id, text in CHAT:
        await memory.ingest(msg(message_id, text, user="u1", chat="dm-u1"))


def pause_after_first_batch(store: Any) -> tuple[asyncio.Event, asyncio.Event]:
    """Make the store's next rebuilds stop after their first batch of rows until ``gate`` is set;
    ``reading`` is set once one has."""
    gate, reading = asyncio.Event(), asyncio.Event()
    batches = store._keyword_batches

    async def slow() -> AsyncIterator[list[KeywordDoc]]:
        async for docs in batches():
            yield docs
            reading.set()
            await gate.wait()

    store._keyword_batches = slow
    return gate, reading


def building_folders(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("keywords."))


async def ids_for(store: Any, words: str) -> set[int]:
    return {i for i, _ in await store.search_keywords(U1, words, 20)}


async def test_writes_go_on_during_a_rebuild_and_reach_the_new_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two rows a batch: rows written meanwhile are read again by the batches after (and the
    # writes kept aside replace them), or not (and the kept writes add them).
    monkeypatch.setattr(store_module, "KEYWORD_BATCH", 2)
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        ramen = set(await store.from_messages("default", "dm-u1", ["m2"]))
        assert ramen <= await ids_for(store, "spicy ramen egg")
        gate, reading = pause_after_first_batch(store)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        try:
            await asyncio.wait_for(reading.wait(), 5)
            said = await asyncio.wait_for(
                memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1")), 5
            )
            await asyncio.wait_for(memory.forget_messages(chat_id="dm-u1", message_ids=["m2"]), 5)
            [lisbon] = await store.from_messages("default", "dm-u1", ["m3"])
            record = (await store.get([lisbon], None))[lisbon]
            record.text = record.embed_text = "we moved to Porto last spring"
            await asyncio.wait_for(store.update(record), 5)
            assert not rebuild.done()  # none of them waited for it
            # The index in use answers meanwhile, with every write.
            assert store._keyword_search() == "tantivy"
            owner = [user_token("default", "u1")]
            assert set(said.memory_ids) <= {i for i, _ in await keywords.search(owner, ["kayaking"], 20)}
            assert not ramen & {i for i, _ in await keywords.search(owner, ["ramen"], 20)}
        finally:
            gate.set()
            await rebuild
        [(count,)] = sql(tmp_path / "m", "SELECT count FROM keyword_changes")
        assert keywords.changes == count and store._mirrored()
        state = json.loads((tmp_path / "m" / "keywords" / STATE_FILE).read_text())
        assert state["changes"] == count
        assert set(said.memory_ids) <= await ids_for(store, "kayaking")
        assert ramen and not ramen & await ids_for(store, "spicy ramen egg")
        assert lisbon in await ids_for(store, "Porto")
        assert lisbon not in await ids_for(store, "Lisbon")
        assert building_folders(tmp_path / "m") == []


async def test_a_write_missed_during_a_rebuild_keeps_the_new_index_from_answering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        gate, reading = pause_after_first_batch(store)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        [lisbon] = await store.from_messages("default", "dm-u1", ["m3"])
        record = (await store.get([lisbon], None))[lisbon]
        record.text = record.embed_text = "we moved to Porto last spring"
        docs = store._keyword_docs

        async def unreadable(condition: str, params: Any) -> list[KeywordDoc]:
            raise OSError("disk read error")

        monkeypatch.setattr(store, "_keyword_docs", unreadable)
        await store.update(record)  # committed to SQLite, not read back for the index
        monkeypatch.setattr(store, "_keyword_docs", docs)
        # A write given to the rebuild after it: the count the new index ends with is SQLite's,
        # and yet it lacks the update.
        await memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1"))
        gate.set()
        await rebuild
        assert store._keywords.changes is None  # FTS5 answers, with the write
        assert lisbon in await ids_for(store, "Porto")
        assert not (folder / "keywords" / STATE_FILE).exists()  # the next open rebuilds it
    async with open_memory(folder, **TANTIVY) as memory:
        [(count,)] = sql(folder, "SELECT count FROM keyword_changes")
        assert memory.store._keywords.changes == count
        assert lisbon in await ids_for(memory.store, "Porto")


async def test_a_write_the_index_never_got_keeps_the_new_index_from_answering(tmp_path: Path) -> None:
    """Whatever the way (a write path that does not mirror its rows), SQLite's count at the end
    tells the new index it is behind."""
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        gate, reading = pause_after_first_batch(store)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        await store._write_many(
            [
                ("UPDATE memories SET context_text = 'zanzibarite' WHERE id = 1", ()),
                ("UPDATE memories_fts SET context = 'zanzibarite' WHERE rowid = 1", ()),
            ]
        )
        gate.set()
        await rebuild
        assert store._keywords.changes is None
        assert 1 in await ids_for(store, "zanzibarite")  # FTS5's answer


async def test_a_failed_rebuild_leaves_the_index_in_use_answering_with_every_write(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        gate, reading = pause_after_first_batch(store)
        batches = store._keyword_batches

        async def failing() -> AsyncIterator[list[KeywordDoc]]:
            async for docs in batches():
                yield docs
            raise OSError("disk read error")

        store._keyword_batches = failing
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        said = await memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1"))
        gate.set()
        with pytest.raises(OSError, match="disk read error"):
            await rebuild
        assert not keywords.rebuilding and keywords.changes is not None
        assert set(said.memory_ids) <= await ids_for(store, "kayaking")
        later = await memory.ingest(msg("m10", "the ferry to Cacilhas was late", chat="dm-u1"))
        assert set(later.memory_ids) <= await ids_for(store, "ferry Cacilhas")
        await keywords.flush()
        [(count,)] = sql(tmp_path / "m", "SELECT count FROM keyword_changes")
        assert keywords.changes == count
        assert building_folders(tmp_path / "m") == []


async def test_a_rebuild_that_cannot_start_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        theirs = folder / f"keywords.building-{os.getpid()}"
        theirs.mkdir()
        (theirs / "notes.txt").write_text("someone else's")
        with pytest.raises(StoreError, match="did not write"):
            await store._rebuild_keywords()
        assert (theirs / "notes.txt").read_text() == "someone else's"
        assert not keywords.rebuilding and keywords.changes is not None
        said = await memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1"))
        assert set(said.memory_ids) <= {
            i for i, _ in await keywords.search([user_token("default", "u1")], ["kayaking"], 20) or []
        }
        (theirs / "notes.txt").unlink()
        theirs.rmdir()
        await store._rebuild_keywords()  # and the next one runs
        assert keywords.changes is not None


async def test_one_rebuild_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        overlapping: list[bool] = []
        begin = keywords.begin_rebuild

        async def watched(*args: Any, **kwargs: Any) -> None:
            overlapping.append(keywords.rebuilding)
            await begin(*args, **kwargs)

        monkeypatch.setattr(keywords, "begin_rebuild", watched)
        gate, reading = pause_after_first_batch(store)
        first = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        second = asyncio.create_task(store._rebuild_keywords())
        await asyncio.sleep(0.2)
        gate.set()
        await asyncio.gather(first, second)
        assert overlapping == [False, False]
        assert keywords.changes is not None and await ids_for(store, "greyhound")


async def test_a_cancelled_rebuild_leaves_no_folder_behind(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        _, reading = pause_after_first_batch(memory.store)
        rebuild = asyncio.create_task(memory.store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        rebuild.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rebuild
        assert building_folders(folder) == []
        assert not memory.store._keywords.rebuilding and memory.store._keywords.changes is not None
    async with open_memory(folder, **TANTIVY) as memory:
        assert memory.store._keywords.changes is not None
        assert await ids_for(memory.store, "greyhound")


async def test_closing_during_a_rebuild_leaves_no_folder_behind(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        gate, reading = pause_after_first_batch(memory.store)
        rebuild = asyncio.create_task(memory.store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        await memory.close()
        gate.set()
        [outcome] = await asyncio.gather(rebuild, return_exceptions=True)
        assert isinstance(outcome, Exception)  # it cannot go on after the close
        assert building_folders(folder) == []
    async with open_memory(folder, **TANTIVY) as memory:
        [(count,)] = sql(folder, "SELECT count FROM keyword_changes")
        assert memory.store._keywords.changes == count
        assert await ids_for(memory.store, "greyhound")


async def test_the_purge_of_deleted_messages_lets_messages_in_while_the_index_is_rebuilt(
    tmp_path: Path,
) -> None:
    """The purge a deleted message schedules took the write turn for all of it: every message
    waited while the keyword index was rebuilt (18 s at a million memories). The rebuild runs
    outside the turn; the rest of the purge (the file's) inside it."""
    soon = {"storage": {"keyword_index": "tantivy", "purge_deleted_messages_after_s": 0}}
    async with open_memory(tmp_path / "m", **soon) as memory:
        await fill(memory)
        store = memory.store
        gate, reading = pause_after_first_batch(store)
        purged_in_turn = asyncio.Event()
        in_turn = store.purge_in_turn

        async def noted() -> None:
            await in_turn()
            purged_in_turn.set()

        store.purge_in_turn = noted
        ramen = set(await store.from_messages("default", "dm-u1", ["m2"]))
        await memory.forget_messages(chat_id="dm-u1", message_ids=["m2"])
        try:
            await asyncio.wait_for(reading.wait(), 5)  # the purge is rebuilding the index
            said = await asyncio.wait_for(
                memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1")), 5
            )
            assert said.stored and not purged_in_turn.is_set()
        finally:
            gate.set()
        await asyncio.wait_for(purged_in_turn.wait(), 10)
        assert set(said.memory_ids) <= await ids_for(store, "kayaking")
        assert not ramen & await ids_for(store, "spicy ramen egg")
        assert store._keywords.changes is not None


async def test_a_delete_made_while_a_purge_runs_is_purged_a_delay_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages deleted every few seconds made purges run back to back (each a rebuild of the
    keyword index and a pass over the file): one made while a purge runs waits the delay again."""
    delay = 0.5
    later = {"storage": {"keyword_index": "tantivy", "purge_deleted_messages_after_s": delay}}
    async with open_memory(tmp_path / "m", **later) as memory:
        await fill(memory)
        store = memory.store
        loop = asyncio.get_running_loop()
        runs: list[tuple[float, float]] = []
        gate = asyncio.Event()
        alongside = store.purge_alongside_writes

        async def timed(wait: Callable[[], Any] = gate.wait) -> None:
            began = loop.time()
            if not runs:
                await wait()  # the first purge is under way while the next message is deleted
            await alongside()
            runs.append((began, loop.time()))

        monkeypatch.setattr(store, "purge_alongside_writes", timed)
        await memory.forget_messages(chat_id="dm-u1", message_ids=["m1"])
        await asyncio.sleep(delay + 0.2)  # the first purge has begun and waits at the gate
        await memory.forget_messages(chat_id="dm-u1", message_ids=["m2"])
        gate.set()
        for _ in range(100):
            if len(runs) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(runs) == 2
        (_, first_end), (second_start, _) = runs
        assert second_start - first_end >= delay * 0.8


async def test_writes_made_after_the_rows_are_read_reach_the_new_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes kept aside after the rows' last batch (until the store holds writes back for
    the swap) are written into the new index at its last step."""
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        gate, filled = asyncio.Event(), asyncio.Event()
        fill_rebuild = keywords.fill_rebuild

        async def then_wait(batches: Any) -> None:
            await fill_rebuild(batches)
            filled.set()
            await gate.wait()

        monkeypatch.setattr(keywords, "fill_rebuild", then_wait)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(filled.wait(), 5)
        said = await memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1"))
        await memory.forget_messages(chat_id="dm-u1", message_ids=["m1"])
        gate.set()
        await rebuild
        [(count,)] = sql(tmp_path / "m", "SELECT count FROM keyword_changes")
        assert keywords.changes == count
        owner = [user_token("default", "u1")]
        assert set(said.memory_ids) <= {i for i, _ in await keywords.search(owner, ["kayaking"], 20) or []}
        assert await keywords.search(owner, ["greyhound"], 20) == []


async def test_a_failed_last_step_leaves_the_index_in_use_committing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        gate, reading = pause_after_first_batch(store)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        await asyncio.wait_for(reading.wait(), 5)
        for n in range(3):  # close together: their commit waits for the interval
            await memory.ingest(msg(f"k{n}", f"kayaking trip number {n} near Sintra", chat="dm-u1"))
        write_kept = keywords._write_kept
        calls = 0

        def fails_at_the_end(building: Any) -> None:
            nonlocal calls
            calls += 1
            if calls > 1:  # the last step's
                raise OSError("disk full")
            write_kept(building)

        monkeypatch.setattr(keywords, "_write_kept", fails_at_the_end)
        gate.set()
        with pytest.raises(OSError, match="disk full"):
            await rebuild
        monkeypatch.undo()
        later = await memory.ingest(msg("m10", "the ferry to Cacilhas was late", chat="dm-u1"))
        for _ in range(40):  # committed by the index's own timer, not by a flush asked for
            if not keywords._uncommitted:
                break
            await asyncio.sleep(0.05)
        assert not keywords._uncommitted
        [(count,)] = sql(tmp_path / "m", "SELECT count FROM keyword_changes")
        assert keywords.changes == count
        owner = [user_token("default", "u1")]
        assert set(later.memory_ids) <= {i for i, _ in await keywords.search(owner, ["ferry"], 20) or []}


async def test_a_miss_during_a_flush_under_way_is_not_undone_by_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush already past its check when the store reports a missed write set the index's
    count back when it ended, and recorded it in the folder: the index answered without the
    write, at once and after the next open."""
    folder = tmp_path / "m"
    async with open_memory(folder, **TANTIVY) as memory:
        await fill(memory)
        keywords = memory.store._keywords
        entered, release = threading.Event(), threading.Event()
        stage = keywords._stage

        def held(*args: Any) -> None:
            entered.set()
            release.wait(10)
            stage(*args)

        monkeypatch.setattr(keywords, "_stage", held)
        await memory.ingest(msg("m9", "we went kayaking near Sintra at dawn", chat="dm-u1"))
        keywords._thread.submit(keywords._flush)
        assert await asyncio.to_thread(entered.wait, 5)
        keywords.missed()
        release.set()
        await keywords.flush()
        assert keywords.changes is None
        assert json.loads((folder / "keywords" / STATE_FILE).read_text())["changes"] == -1
        monkeypatch.undo()
    async with open_memory(folder, **TANTIVY) as memory:
        [(count,)] = sql(folder, "SELECT count FROM keyword_changes")
        assert memory.store._keywords.changes == count


async def test_a_failed_part_of_a_purge_is_tried_again_and_the_other_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A failed purge is tried again a while later (30 s, then twice as long after each failure
    # in a row): shortened here.
    monkeypatch.setattr(forgetting, "PURGE_RETRY_FIRST_S", 0.2)
    soon = {"storage": {"keyword_index": "tantivy", "purge_deleted_messages_after_s": 0}}
    async with open_memory(tmp_path / "m", **soon) as memory:
        await fill(memory)
        store = memory.store
        calls: list[str] = []
        alongside, in_turn = store.purge_alongside_writes, store.purge_in_turn

        async def failing_once() -> None:
            calls.append("alongside")
            if calls.count("alongside") == 1:
                raise OSError("disk read error")
            await alongside()

        async def counted() -> None:
            calls.append("in turn")
            await in_turn()

        monkeypatch.setattr(store, "purge_alongside_writes", failing_once)
        monkeypatch.setattr(store, "purge_in_turn", counted)
        await memory.forget_messages(chat_id="dm-u1", message_ids=["m1"])
        for _ in range(100):
            if calls.count("alongside") == 2 and calls.count("in turn") == 2:
                break
            await asyncio.sleep(0.05)
        assert calls == ["alongside", "in turn", "alongside", "in turn"]
        assert await store._keywords.search([user_token("default", "u1")], ["greyhound"], 20) == []


async def test_searches_during_the_swap_go_to_fts5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the new index takes the old one's place (seconds at a million rows, waiting for
    merges), the old one's searcher no longer has the writes queued for it: FTS5 answers."""
    async with open_memory(tmp_path / "m", **TANTIVY) as memory:
        await fill(memory)
        store = memory.store
        keywords = store._keywords
        entered, release = threading.Event(), threading.Event()
        replace = keywords._replace

        def held(*args: Any) -> None:
            entered.set()
            release.wait(10)
            replace(*args)

        monkeypatch.setattr(keywords, "_replace", held)
        rebuild = asyncio.create_task(store._rebuild_keywords())
        try:
            assert await asyncio.to_thread(entered.wait, 5)
            owner = [user_token("default", "u1")]
            assert await keywords.search(owner, ["greyhound"], 20) is None
            assert await ids_for(store, "greyhound")  # FTS5's answer
        finally:
            release.set()
            await rebuild
        assert keywords.changes is not None
        assert await keywords.search([user_token("default", "u1")], ["greyhound"], 20)
