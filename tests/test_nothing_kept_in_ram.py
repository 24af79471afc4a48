"""What a long-lived process keeps of what is deleted: nothing. A plugin's failure is kept as its
names, not as the error whose traceback held the failing hook's records; a memory deleted by id
leaves no chat turn or cached text behind (the next message's keyword context took its words
from the turn cache); a person forgotten while their vector shard's graph is built leaves no
shard (their user id stayed in RAM and in the index's manifest for good); the text caches hold
no long text (16,384 entries keyed by 16,000-character texts held gigabytes)."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from narrmem_plugins import answer_ranking
from narrmem_plugins.recall_hybrid import HybridRecall
from narrmem_plugins.triage import topics

from narrmem import ManualClock, PluginError, Scope, hookimpl
from narrmem.testing import open_memory

T0 = datetime(2026, 5, 1, 9, tzinfo=UTC)
MARK = "zq" + "lighthouse"


def said(message_id: str, text: str, user: str, minutes: float, chat: str = "g1") -> dict[str, Any]:
    return msg(message_id, text, user=user, chat=chat, ts=(T0 + timedelta(minutes=minutes)).isoformat())


class FailsOnce:
    narrmem_name = "fails_once"

    def __init__(self) -> None:
        self.failed = False

    @hookimpl
    def narrmem_after_forget(self, removed: list[Any]) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("graph table locked")


def strings_holding(mark: str) -> int:
    """Objects holding a string with ``mark`` in it, but modules' globals (this one's ``MARK``)."""
    gc.collect()
    found = 0
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "__name__" in obj:
            continue
        for ref in gc.get_referents(obj):  # a loop, not a generator: its cell would hold ``mark``
            if isinstance(ref, str) and mark in ref:
                found += 1
                break
    return found


async def test_a_plugins_failure_is_kept_as_names_not_with_the_records_it_held(tmp_path: Path) -> None:
    plugin = FailsOnce()
    async with open_memory(
        tmp_path / "m", clock=ManualClock(T0 + timedelta(days=1)), plugins=[plugin]
    ) as memory:
        await memory.ingest_many(
            [said(f"m{k}", f"I am a {MARK}{k} keeper of the old tower", "ann", k) for k in range(50)]
        )
        failed = False
        try:  # not pytest.raises: its record of the error would hold the frames itself
            await memory.forget(user_id="ann")
        except PluginError:
            failed = True
        assert failed
        await memory.forget(user_id="ann")  # finished
        assert memory.host.errors[-1] == ("fails_once", "narrmem_after_forget", "RuntimeError")
        assert await memory.store.recent(Scope(user_id="ann"), limit=10) == []
        assert strings_holding(MARK) == 0


async def test_a_memory_deleted_by_id_leaves_no_turn_or_cached_text(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(T0 + timedelta(hours=1))) as memory:
        for k in range(4):
            await memory.ingest(said(f"a{k}", f"my {MARK}{k} password hint is my cat's name", "ann", 2 * k))
            await memory.ingest(said(f"b{k}", f"garden tomatoes are ripening, batch {k}", "bob", 2 * k + 1))
        await memory.settle()
        hybrid = memory.host.plugin(HybridRecall)
        assert any(MARK in text for _, _, text in hybrid._recent[("default", "g1")])
        ann = await memory.store.recent(Scope(user_id="ann"), limit=100)
        await memory.forget_memories([r.id for r in ann if r.id is not None], user_id="ann")
        del ann
        assert ("default", "g1") not in hybrid._recent
        assert topics._analysed.cache_info().currsize == 0
        await memory.ingest(said("b9", "I finally planted the tomatoes in the garden today", "bob", 20))
        [new] = await memory.store.recent(Scope(chat_id="g1"), kinds=["episode"], limit=1)
        assert new.message_ids == ["b9"] and MARK not in (new.context_text or "")
        assert strings_holding(MARK) == 0


@pytest.mark.sqlite_only("the SQLite store's vector index")
async def test_a_person_forgotten_while_their_graph_is_built_leaves_no_shard(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    storage = {"hnsw_threshold": 2000, "hnsw_ef_construction": 400, "hnsw_m": 48}
    async with open_memory(folder, clock=ManualClock(T0 + timedelta(days=30)), storage=storage) as memory:
        batch = [
            said(f"m{i}", f"note {i} about kayak lighthouse number {i * 7}", "ann", i, "dm")
            for i in range(2100)
        ]
        await memory.ingest_many(batch[:1990])
        await memory.ingest_many(batch[1990:])  # crosses the threshold: a build starts
        index = memory.store._index
        shard = index._shards.peek(("default", "ann"))
        assert shard is not None and shard.building
        await memory.forget(user_id="ann")
        await index.settle()
        assert ("default", "ann") not in index._shards
    assert '"ann"' not in (folder / "vectors" / "manifest.json").read_text(encoding="utf-8")


def test_long_texts_are_not_cached() -> None:
    topics.forget_cached_words()
    answer_ranking.forget_cached_texts()
    long = " ".join(f"word{n} lighthouse keeper" for n in range(2000))
    topics.topic_words([long])
    topics.content_bigrams(long)
    answer_ranking.text_signals(long)
    assert topics._analysed.cache_info().currsize == 0
    assert topics.content_bigrams.cache_info().currsize == 0
    assert answer_ranking.text_signals.cache_info().currsize == 0
    topics.topic_words(["the lighthouse keeper moved to Porto"])
    assert topics._analysed.cache_info().currsize == 1
