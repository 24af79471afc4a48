"""Forget means gone: a durable job finished after a crash, nothing of the user left in any byte of
the data folder, other people's words never in a user's scenes, one process per folder."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, on_sqlite, sql, store_sql

import narrmem
from narrmem import hookimpl
from narrmem.doors import transfer
from narrmem.doors.transfer import export_store
from narrmem.errors import PluginError, StoreError
from narrmem.testing import open_memory

GROUP = "group-1"


def _group_chat() -> list[dict[str, Any]]:
    """A busy group chat: bob's words carry his secret, and ann writes scenes right after him."""
    lines = [
        ("b1", "bob", "my locker code is zqlocker77 and I keep zqbike12 in the hall"),
        ("a1", "ann", "so tired after that locker talk, honestly"),
        ("b2", "bob", "zqlocker77 again, I decided to change zqbike12 tomorrow"),
        ("a2", "ann", "I decided to quit my job at the bank"),
        ("b3", "bob", "remember this: zqbike12 lives in the garage now"),
        ("a3", "ann", "I finally finished the marathon!"),
        ("b4", "bob", "I live in Lisbon near zqlocker77 street"),
    ]
    return [
        msg(mid, text, user=user, chat=GROUP, speaker=user.title(), ts=f"2026-05-04T09:1{n}:00+00:00")
        for n, (mid, user, text) in enumerate(lines)
    ]


BOB_MARKERS = (b"zqlocker77", b"zqbike12")
# Rows that still hold bob's words: his own, or another's keyword context or embedded text.
BOB_ROWS = (
    "SELECT id FROM memories WHERE user_id = 'bob' OR text LIKE '%zq%' OR context_text LIKE '%zq%' "
    "OR embed_text LIKE '%zq%'"
)


def _files_with(folder: Path, markers: tuple[bytes, ...]) -> dict[str, int]:
    found: dict[str, int] = {}
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits = sum(data.count(m) for m in markers)
            if hits:
                found[str(path.relative_to(folder))] = hits
    return found


async def test_a_scene_holds_only_its_speakers_words(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest_many(_group_chat())
        scenes = await mem.store.recent(narrmem.Scope(user_id="ann"), kinds=["scene"])
        assert len(scenes) >= 2
        for scene in scenes:
            assert "zq" not in scene.text and "zq" not in (scene.embed_text or "")
            assert all("zq" not in str(tag) for tag in scene.meta.get("tags", []))


async def test_forget_leaves_no_byte_of_the_user_in_the_data_folder(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(_group_chat())
        # Bob's words reach other rows too: ann's keyword context, a chat-scope recall's history.
        await mem.recall("zqlocker77 zqbike12", chat_id=GROUP, reinforce=True)
        await mem.recall("what is the zqlocker77 code", user_id="bob", reinforce=True)
        assert await store_sql(mem, BOB_ROWS)
        if on_sqlite(mem):  # the bytes of the data folder are the SQLite store's
            assert _files_with(folder, BOB_MARKERS)
        await mem.forget(user_id="bob")
        hits = await mem.recall("zqlocker77 tired after the locker talk", chat_id=GROUP, k=20)
        assert all("zq" not in h.text for h in hits)
        assert [h.user_id for h in hits] and {h.user_id for h in hits} == {"ann"}
        assert await store_sql(mem, BOB_ROWS) == []
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(0,)]
        assert await store_sql(mem, "SELECT COUNT(*) FROM memory_history WHERE why LIKE '%zq%'") == [(0,)]
    assert _files_with(folder, BOB_MARKERS) == {}


class _CrashingScrubber:
    """A plugin whose scrub fails the first time, as a kill -9 inside the after-forget hooks would."""

    narrmem_name = "crashing_scrubber"

    def __init__(self) -> None:
        self.fail = True

    @hookimpl(tryfirst=True)
    def narrmem_after_forget(self, user_id: str | None) -> None:
        if self.fail and user_id == "bob":
            raise RuntimeError("killed in the middle of forgetting")


async def test_an_interrupted_forget_is_finished_on_the_next_open(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    scrubber = _CrashingScrubber()
    async with open_memory(folder, plugins=[scrubber]) as mem:
        await mem.ingest_many(_group_chat())
        with pytest.raises(PluginError, match="killed"):
            await mem.forget(user_id="bob")
        # The memories went before the plugin failed; the job stays recorded.
        assert await store_sql(mem, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(0,)]
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(1,)]
    async with open_memory(folder) as mem:
        # No forget asked: the open finished the one that was interrupted.
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(0,)]
        assert await store_sql(mem, BOB_ROWS) == []
    assert _files_with(folder, BOB_MARKERS) == {}


class _FailingMessageScrub:
    """A plugin whose scrub of message ``m1`` fails while ``fail`` is set (its service is down)."""

    narrmem_name = "failing_message_scrub"

    def __init__(self) -> None:
        self.fail = False

    @hookimpl(tryfirst=True)
    def narrmem_after_forget(self, messages: list[str] | None) -> None:
        if self.fail and messages == ["m1"]:
            raise RuntimeError("the scrub's service is down")


async def test_a_forget_again_stopped_halfway_is_finished_as_it_began(tmp_path: Path) -> None:
    """A forget again (of a message that a forget took while this process wrote it) deletes what
    this process wrote of it, not what was stored under its id since: an edit's new text. Stopped
    by a plugin that fails, it is finished by the next open the same way, not by the message's id."""
    from narrmem.models import Scope

    folder = tmp_path / "store"
    scrub = _FailingMessageScrub()
    new_text = "SELECT COUNT(*) FROM memories WHERE text LIKE '%zqnew22%'"
    async with open_memory(folder, plugins=[scrub]) as mem:
        first = await mem.ingest(msg("m1", "I live in Lisbon by the zqold11 bridge", user="ann", chat="c"))
        await mem.edit(msg("m1", "I live in Porto now, on zqnew22 street", user="ann", chat="c"))
        scrub.fail = True
        with pytest.raises(PluginError, match="service is down"):
            await mem._forgetting.again(Scope(tenant="default", chat_id="c"), ["m1"], first.memory_ids)
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(1,)]
        assert await store_sql(mem, new_text) == [(1,)]
    async with open_memory(folder) as mem:
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(0,)]
        assert await store_sql(mem, new_text) == [(1,)]
        assert await mem.store.state_items("narrmem.forget_again") == []
        [hit] = await mem.recall("where does ann live?", user_id="ann", k=5)
        assert "zqnew22" in hit.text


async def test_a_forget_again_deletes_the_pattern_that_cites_the_message(tmp_path: Path) -> None:
    """What the message's hooks made of it with other messages (a repeated mood's scene, which
    quotes it) goes with what this process wrote of it; the other messages stay."""
    from datetime import UTC, datetime, timedelta

    from narrmem.clock import ManualClock
    from narrmem.models import Scope

    start = datetime(2026, 7, 1, 9, tzinfo=UTC)
    texts = ["so tired today", "so tired again today", "still so tired today zqthird33"]
    async with open_memory(tmp_path / "store", clock=ManualClock(start + timedelta(days=3))) as mem:
        results = [
            await mem.ingest(
                msg(f"m{i}", text, user="ann", chat="dm", ts=(start + timedelta(days=i)).isoformat())
            )
            for i, text in enumerate(texts, start=1)
        ]
        patterns = "SELECT message_ids FROM memories WHERE meta LIKE '%pattern%'"
        assert [json.loads(ids) for (ids,) in await store_sql(mem, patterns)] == [["m1", "m2", "m3"]]
        await mem._forgetting.again(Scope(tenant="default", chat_id="dm"), ["m3"], results[2].memory_ids)
        assert await store_sql(mem, patterns) == []
        left = await store_sql(mem, "SELECT message_ids FROM memories ORDER BY id")
        assert [json.loads(ids) for (ids,) in left] == [["m1"], ["m2"]]
        assert await store_sql(mem, "SELECT COUNT(*) FROM forget_jobs") == [(0,)]


async def test_deleting_a_message_takes_only_what_it_stated(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    edges = "SELECT n.name FROM graph_edges e JOIN graph_nodes n ON n.id = e.object_id ORDER BY n.name"
    async with open_memory(folder) as mem:
        await mem.ingest(msg("m1", "I live in Lisbon", user="ann", chat="c"))
        await mem.ingest(msg("m2", "I like rock music", user="ann", chat="c"))
        before = await store_sql(mem, edges)
        await mem.forget_messages(chat_id="c", message_ids=["m2"])
        after = await store_sql(mem, edges)
    assert {name.lower() for (name,) in before} == {"lisbon", "rock music"}
    assert {name.lower() for (name,) in after} == {"lisbon"}


async def test_history_rows_say_why_never_what_was_asked(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder, plugin={"hippocampus": {"reinforce": True}}) as mem:
        await mem.ingest(msg("m1", "I decided to quit my job at the bank", user="ann"))
        hits = await mem.recall("zqasked55: I decided to quit my job at the bank", user_id="ann")
        assert hits
        events = (await mem.history(hits[0].id))["events"]
        asked = await store_sql(mem, "SELECT COUNT(*) FROM memory_history WHERE why LIKE '%zqasked55%'")
    assert [e["why"] for e in events if e["who"] == "recall"] == ["relevance"]
    assert asked == [(0,)]


@pytest.mark.sqlite_only("migrates a database file written by an old version of the SQLite store")
def test_an_old_stores_history_loses_its_query_text_on_open(tmp_path: Path) -> None:
    from narrmem_plugins.storage_sqlite import schema

    folder = tmp_path / "store"
    folder.mkdir()
    con = sqlite3.connect(folder / "narrmem.sqlite3")
    for script in schema.MIGRATIONS[:3]:
        con.executescript(script)
    con.execute("PRAGMA user_version = 3")
    con.execute(
        "INSERT INTO memories (kind, tenant, user_id, chat_id, text, importance, created_at, created_ts, "
        "message_ids, meta) VALUES ('episode', 'default', 'u', 'c', 'hello', 0.3, "
        "'2026-01-01T00:00:00+00:00', 0, '[]', '{}')"
    )
    con.execute(
        "INSERT INTO memory_history (memory_id, at, who, why, old, new) "
        "VALUES (1, '2026-01-02T00:00:00+00:00', 'recall', 'recalled for: my locker code is 1234', 0.3, 0.35)"
    )
    con.commit()
    con.close()
    code = (
        "import asyncio, sys\n"
        "from narrmem.testing import open_memory\n"
        "async def main():\n"
        "    async with open_memory(sys.argv[1]):\n"
        "        pass\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code, str(folder)], check=True, timeout=120)
    assert sql(folder, "SELECT why FROM memory_history") == [("recalled",)]
    assert sql(folder, "PRAGMA auto_vacuum") == [(2,)]
    assert b"1234" not in (folder / "narrmem.sqlite3").read_bytes()


HOLD_OPEN = """
import asyncio, sys
from datetime import datetime, timezone
from narrmem.testing import open_memory
async def main():
    async with open_memory(sys.argv[1]) as mem:
        await mem.ingest({"text": "I decided to learn the cello", "user_id": "u", "chat_id": "c",
                          "ts": datetime(2026, 5, 1, tzinfo=timezone.utc), "message_id": "m1"})
        print("open", flush=True)
        sys.stdin.readline()
asyncio.run(main())
"""


@pytest.mark.sqlite_only("one process per data folder is the SQLite store's lock; PostgreSQL is shared")
def test_a_second_process_on_the_same_folder_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    async def open_and_count() -> int:
        async with open_memory(folder) as mem:
            return int((await mem.stats())["memories"])

    async def read_beside(message: dict[str, Any]) -> list[str]:
        async with open_memory(folder, read_only=True) as mem:
            hits = await mem.recall("cello", user_id="u", reinforce=True)
            with pytest.raises(narrmem.StoreError, match="read-only"):
                await mem.ingest(message)
            with pytest.raises(narrmem.StoreError, match="read-only"):
                await mem.forget(user_id="u")
            return [h.text for h in hits]

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(narrmem.StoreError) as info:
            asyncio.run(open_and_count())
        assert str(folder) in str(info.value) and str(holder.pid) in str(info.value)
        # Reading beside the holder works and sees its rows; writing is refused.
        assert asyncio.run(read_beside(msg("m2", "I decided to sell the car"))) == [
            "I decided to learn the cello"
        ]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert asyncio.run(open_and_count()) >= 1  # free again once the holder closed


@pytest.mark.sqlite_only("the lock file is the SQLite store's")
async def test_a_lock_file_narrmem_did_not_write_is_never_overwritten(tmp_path: Path) -> None:
    """A file at the lock's name that is not a process id is someone else's: the open is refused
    and the file is left as it was (before, it was emptied and a process id written in it)."""
    folder = tmp_path / "store"
    folder.mkdir()
    theirs = folder / "narrmem.sqlite3.lock"
    theirs.write_text("keep me: notes of my own\n", encoding="utf-8")
    with pytest.raises(narrmem.StoreError, match="not a narrmem lock file"):
        async with open_memory(folder):
            pass
    assert theirs.read_text(encoding="utf-8") == "keep me: notes of my own\n"
    # A number is not proof either (a count, a port of the user's) where no database was locked.
    theirs.write_text("8080\n", encoding="utf-8")
    with pytest.raises(narrmem.StoreError, match="not a narrmem lock file"):
        async with open_memory(folder):
            pass
    assert theirs.read_text(encoding="utf-8") == "8080\n"
    theirs.write_text("", encoding="utf-8")  # an empty file holds nothing to lose: taken
    async with open_memory(folder) as mem:
        await mem.ingest(msg("m1", "I decided to learn the cello"))
    assert theirs.read_text(encoding="utf-8") == f"narrmem lock, process {os.getpid()}\n"
    # A stopped process's lock, as narrmem wrote it before it signed its locks: beside the database.
    theirs.write_text("4242\n", encoding="utf-8")
    async with open_memory(folder) as mem:
        assert (await mem.stats())["memories"] >= 1


async def test_a_scene_is_read_and_written_through_its_model(tmp_path: Path) -> None:
    from narrmem.models import MemoryRecord, SceneDraft

    async with open_memory(tmp_path / "store") as mem:
        result = await mem.ingest(msg("m1", "I decided to move to Lisbon next spring", user="ann"))
        assert result.scene is not None
        draft = SceneDraft.of(result.scene)
        assert draft is not None and draft.core == "I decided to move to Lisbon next spring"
        assert result.scene.text == draft.render()
        episode = next(r for r in result.records if r.kind == "episode")
        assert SceneDraft.of(episode) is None
        broken = MemoryRecord.model_validate({**result.scene.model_dump(), "meta": {"fields": {"core": 5}}})
        assert SceneDraft.of(broken) is None  # a hand-written meta of another shape is not a scene's
        assert (
            SceneDraft.of(MemoryRecord.model_validate({**result.scene.model_dump(), "meta": draft.stored()}))
            == draft
        )


async def test_forget_empties_the_topic_counters_cache_of_message_words(tmp_path: Path) -> None:
    from narrmem_plugins.triage.topics import _analysed

    async with open_memory(tmp_path / "m") as mem:
        for n in range(3):
            await mem.ingest(
                msg(f"r{n}", f"my sourdough starter smells of apples again, day {n}", user="bob")
            )
        assert _analysed.cache_info().currsize > 0  # the counter read bob's words
        await mem.forget(user_id="bob")
    assert _analysed.cache_info().currsize == 0


async def test_forget_empties_the_topic_counters_cache_of_chinese_words(tmp_path: Path) -> None:
    from narrmem_plugins.triage.topics import content_bigrams

    async with open_memory(tmp_path / "m") as mem:
        for n in range(3):
            await mem.ingest(msg(f"z{n}", f"我的酸面包酵母又闻起来像苹果了，第{n}天", user="bob"))
        assert content_bigrams.cache_info().currsize > 0  # the counter compared bob's words
        await mem.forget(user_id="bob")
    assert content_bigrams.cache_info().currsize == 0


async def test_forget_empties_the_answer_models_cache_of_texts(tmp_path: Path) -> None:
    from narrmem_plugins.answer_ranking import text_signals

    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest(msg("a1", "I keep bees on the roof of the Brixton flat", user="bob"))
        assert await mem.recall("Where are the bees kept?", user_id="bob")
        assert text_signals.cache_info().currsize > 0  # the ranking read bob's words
        await mem.forget(user_id="bob")
    assert text_signals.cache_info().currsize == 0


STALE = b"zqstale0gap42"


def _plant_in_a_page_gap(database: Path) -> int:
    """Write ``STALE`` into the unused gap of a b-tree leaf page (between its cell pointers and its
    cells), where SQLite leaves bytes of cells it moved to another page while rebalancing, beyond
    secure_delete's reach. Returns the page number."""
    data = bytearray(database.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    for number in range(1, len(data) // page_size):  # page 0 starts with the file header
        page = number * page_size
        kind = data[page]
        if kind not in (10, 13):  # index and table leaves
            continue
        cells = int.from_bytes(data[page + 3 : page + 5], "big")
        content = int.from_bytes(data[page + 5 : page + 7], "big") or 65536
        gap_start = page + 8 + 2 * cells
        if page + content - gap_start > len(STALE) + 16:
            data[gap_start + 8 : gap_start + 8 + len(STALE)] = STALE
            database.write_bytes(bytes(data))
            return number
    raise AssertionError("no leaf page with room in its gap")


@pytest.mark.sqlite_only("the bytes of the SQLite file's pages")
@pytest.mark.parametrize("rewrite", [True, False])
async def test_a_forget_rewrites_the_file_so_no_stale_bytes_stay_in_page_gaps(
    tmp_path: Path, rewrite: bool
) -> None:
    folder = tmp_path / "store"
    storage = {"forget_rewrites_file": rewrite}
    async with open_memory(folder, storage=storage) as mem:
        await mem.ingest_many(_group_chat())
    database = folder / "narrmem.sqlite3"
    assert (
        not (folder / "narrmem.sqlite3-wal").exists() or not (folder / "narrmem.sqlite3-wal").stat().st_size
    )
    _plant_in_a_page_gap(database)
    async with open_memory(folder, storage=storage) as mem:
        assert await mem.recall("zqlocker77", user_id="bob", k=3, reinforce=False)  # the store reads fine
        await mem.forget(user_id="bob")
    # With the rewrite nothing of the old pages stays; without it, the gap keeps what it held.
    assert (STALE in database.read_bytes()) is not rewrite
    if rewrite:
        assert _files_with(folder, BOB_MARKERS) == {}


DM = b"dm-zq5551234"  # a private chat's id: on Telegram, its user's own id


def _direct_and_group(user: str) -> list[dict[str, Any]]:
    return [
        msg("d1", "my zq locker is in the hall and I work at the bank", user=user, chat=DM.decode()),
        msg("d2", "I decided to quit my job at the bank", user=user, chat=DM.decode()),
        msg("g1", "I finally finished the marathon!", user=user, chat=GROUP),
        msg("g2", "I live in Lisbon near the river", user="bob", chat=GROUP),
    ]


@pytest.mark.parametrize("scope", [{"user_id": "ann"}, {"chat_id": DM.decode()}])
async def test_a_forget_leaves_no_name_of_the_chats_it_emptied_in_the_data_folder(
    tmp_path: Path, scope: dict[str, str]
) -> None:
    """The vector index keeps chats by name; a chat that nothing is left of leaves it, and a chat
    that still holds memories (the group) keeps working, as does one written afterwards."""
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(_direct_and_group("ann"))
        await mem.settle()
        if on_sqlite(mem):
            assert _files_with(folder, (DM,))
        await mem.forget(**scope)
        assert {h.user_id for h in await mem.recall("where does he live", chat_id=GROUP)} >= {"bob"}
        await mem.ingest(msg("n1", "a new chat about the harbour", user="carl", chat="new-chat"))
        assert [h.user_id for h in await mem.recall("the harbour", chat_id="new-chat")] == ["carl"]
    assert _files_with(folder, (DM,)) == {}
    async with open_memory(folder) as mem:  # the index as saved opens as it is, names and all
        assert [h.user_id for h in await mem.recall("the harbour", chat_id="new-chat")] == ["carl"]
        assert "bob" in {h.user_id for h in await mem.recall("where does he live", chat_id=GROUP)}


async def test_an_index_saved_with_names_of_emptied_chats_drops_them_at_the_next_save(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(_direct_and_group("ann"))
    if not (folder / "vectors" / "manifest.json").exists():
        pytest.skip("the store keeps no vector index files")
    manifest_path = folder / "vectors" / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    manifest["chats"]["gone-zq5559876"] = max(manifest["chats"].values()) + 1  # as saved before
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    async with open_memory(folder) as mem:
        assert [h.user_id for h in await mem.recall("marathon", chat_id=GROUP)][:1] == ["ann"]
    assert _files_with(folder, (b"gone-zq5559876",)) == {}


async def test_a_forget_finished_at_the_next_open_drops_what_the_stopped_process_received(
    tmp_path: Path,
) -> None:
    """A process received a message of Ann's (on receipt, not yet written) and stopped while it
    forgot her, its job recorded: the next open finishes the forget first, and the inbox then
    finds nothing of hers to write."""
    from narrmem.inbox import NAMESPACE, _entry

    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest(msg("1", "hello there, a first note", user="ann", chat="c", tenant="t"))
        received = narrmem.Message.model_validate(
            msg("2", "my zqsecret77 plan is Oslo", user="ann", chat="c", tenant="t")
        )
        # As the stopped process left it: its entry, under an owner that is gone, and the job.
        await mem.store.state_put(
            NAMESPACE, "gone-owner:000000000001", _entry(received, narrmem.TriageDecision(layer="accumulate"))
        )
        await mem.store.begin_forget(tenant="t", user_id="ann", chat_id=None)
    async with open_memory(folder) as mem:
        await mem.settle()
        assert await mem.store.pending_forgets() == []
        assert await mem.store.recent(narrmem.Scope(tenant="t", user_id="ann"), limit=100) == []


async def test_an_export_refuses_a_store_whose_forget_is_not_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stopped in the middle of forgetting Bob; then an export, which opens the folder
    read-only and so finishes nothing: it held Bob, and an import of it brought him back."""
    # A forget left unfinished on purpose: the export need not wait for it to end.
    monkeypatch.setattr(transfer, "FORGETS_WAIT_S", 0.2)
    folder = tmp_path / "store"
    async with open_memory(folder) as mem:
        await mem.ingest_many(_group_chat())
        store: Any = mem.store

        async def stopped(**_: Any) -> dict[str, int]:
            raise RuntimeError("the process stopped here")

        store.forget = stopped
        with pytest.raises(RuntimeError, match="stopped"):
            await mem.forget(user_id="bob")
    async with open_memory(folder, read_only=True) as mem:
        with pytest.raises(StoreError, match=r"forget.*not finished.*user 'bob'"):
            await export_store(mem, tmp_path / "backup.jsonl")
    assert not (tmp_path / "backup.jsonl").exists()
    async with open_memory(folder) as mem:  # a process that writes finishes it, then exports
        await export_store(mem, tmp_path / "backup.jsonl")
    text = (tmp_path / "backup.jsonl").read_text(encoding="utf-8")
    assert not any(marker.decode() in text for marker in BOB_MARKERS) and "ann" in text


async def test_an_export_refuses_a_forget_whose_plugins_have_not_scrubbed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store deleted Bob's memories, then a plugin failed to scrub (its service down) and the
    job stayed: the graph still holds his facts. An export then would carry them, and an import of
    it bring them back with no job to remove them; it is refused until the forget is finished."""
    # A forget left unfinished on purpose: the export need not wait for it to end.
    monkeypatch.setattr(transfer, "FORGETS_WAIT_S", 0.2)
    folder = tmp_path / "store"
    scrubber = _CrashingScrubber()
    async with open_memory(folder, plugins=[scrubber]) as mem:
        await mem.ingest_many(_group_chat())
        with pytest.raises(PluginError, match="killed"):
            await mem.forget(user_id="bob")
        assert await store_sql(mem, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(0,)]
        with pytest.raises(StoreError, match=r"forget.*not finished.*user 'bob'"):
            await export_store(mem, tmp_path / "backup.jsonl")
    assert not (tmp_path / "backup.jsonl").exists()
    async with open_memory(folder) as mem:  # the plugin is back: the open finishes the forget
        await export_store(mem, tmp_path / "backup.jsonl")
    assert "bob" not in (tmp_path / "backup.jsonl").read_text(encoding="utf-8").lower()


@pytest.mark.sqlite_only("the bytes of the SQLite file's pages and of its keyword index")
async def test_a_deleted_messages_words_leave_the_files_at_the_purge_after_it(tmp_path: Path) -> None:
    """An FTS5 delete leaves the row's terms in the index's segments until they are merged: a
    deleted message's words stayed in the file for good (found as 7-character term tails)."""
    gone = (b"zqlocker77", b"ocker77", b"zqpin4821", b"pin4821")
    kept = (b"zqteapot55",)

    async def written(mem: Any) -> None:
        await mem.ingest(
            msg("m1", "my locker code is zqlocker77 and my pin is zqpin4821", user="bob", chat="c")
        )
        await mem.ingest(msg("m2", "I keep my tea in the zqteapot55 by the window", user="bob", chat="c"))
        assert await mem.forget_messages(chat_id="c", message_ids=["m1"]) == {"memories": 1}

    async with open_memory(tmp_path / "soon", storage={"purge_deleted_messages_after_s": 0.2}) as mem:
        await written(mem)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if not _files_with(tmp_path / "soon", gone):
                break
        assert _files_with(tmp_path / "soon", gone) == {}  # while the memory is still open
        assert _files_with(tmp_path / "soon", kept)
        hits = await mem.recall("zqteapot55", user_id="bob", reinforce=False)
        assert [h.message_ids for h in hits][:1] == [["m2"]]
    async with open_memory(tmp_path / "later") as mem:  # the default waits; closing purges
        await written(mem)
    assert _files_with(tmp_path / "later", gone) == {}
    assert _files_with(tmp_path / "later", kept)


def _fts_levels(path: Path) -> int:
    """How many levels FTS5's structure record lists (after its 4-byte cookie, a varint)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        [(block,)] = db.execute("SELECT block FROM memories_fts_data WHERE id = 10").fetchall()
    value, at = 0, 4
    while True:
        byte = block[at]
        value, at = (value << 7) | (byte & 0x7F), at + 1
        if not byte & 0x80:
            return value


@pytest.mark.sqlite_only("FTS5's structure is the SQLite store's")
async def test_purges_do_not_pile_up_levels_in_the_keyword_index(tmp_path: Path) -> None:
    """Each purge merged the keyword index with FTS5's 'optimize', which put the merged segment
    one level higher every time: after about 2,000 forgets the index had 2,000 levels, FTS5 took
    it for corrupt, and every later write failed ("database disk image is malformed")."""
    folder = tmp_path / "m"
    async with open_memory(folder, storage={"forget_rewrites_file": False}) as memory:
        await memory.ingest(msg("keep", "I keep bees on the roof of my building"))
        store: Any = memory.store
        # What a deleted message does to the keyword index, many times over, each followed by
        # the purge its forget runs (the levels began to grow after a few hundred, two at a time).
        for i in range(1, 700):
            async with store.transaction() as db:
                await db.execute(
                    "INSERT INTO memories_fts (rowid, body, context, owner) VALUES (?, ?, '', '')",
                    (10_000 + i, f"word{i} hello"),
                )
            if i % 3 == 0:
                async with store.transaction() as db:
                    await db.execute("DELETE FROM memories_fts WHERE rowid = ?", (10_000 + i - 1,))
            await store.purge_deleted()
        await memory.ingest(msg("after", "the bees made honey this summer"))
        hits = await memory.recall("bees honey", user_id="u1", chat_id="c1", k=5)
    assert _fts_levels(folder / "narrmem.sqlite3") <= 2
    assert {h.message_ids[0] for h in hits} == {"keep", "after"}
