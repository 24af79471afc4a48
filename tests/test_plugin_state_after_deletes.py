"""What plugins keep of a person goes with every deletion of it, and what they keep stays bounded.

* RTM narrative trees (``rtm_trees``) know whose text they hold (the user and chat a tool call
  names) and go with the forget of that person or chat, of messages of that chat, of memories by
  id, and with retention; a tree whose owner is not known (built without one, or stored before
  trees kept one) goes with any forget of its tenant. The table holds at most
  ``[plugin.rtm] trees_kept`` trees.
* The triage plugin's entries of quoted messages (``triage.impacts``) never outlive the scenes
  they name, nor the person's forget.
* A persona set again unchanged writes nothing.
* The proactive plugin's firings name no deleted memory: a firing left with none goes.

Real SQLite and FAISS; ``TESTS_STORE=postgres`` runs the module on a real PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import decision_scene, msg, store_fingerprint, store_sql
from narrmem_plugins.proactive import NAME as PROACTIVE
from narrmem_plugins.proactive import firings_key
from narrmem_plugins.rtm import plugin_of
from narrmem_plugins.rtm.transfer import SECTION
from narrmem_plugins.triage.impacts import NAMESPACE as IMPACTS
from narrmem_plugins.triage.impacts import add_impact
from test_plugin_tables import storage_for

from narrmem import InputError, ManualClock, Memory, Message
from narrmem.models import MemoryRecord, SceneDraft, Scope
from narrmem.testing import open_memory

START = dt.datetime(2026, 5, 4, 9, tzinfo=dt.UTC)
CREATE = "rtm_create_narrative_tree"
TRAVERSE = "rtm_traverse_narrative"
WORDS = "garden tomato basil office meeting deadline trip Lisbon train sister birthday cake exam".split()


def transcript(speaker: str, seed: int = 0) -> str:
    rnd = random.Random(seed)
    return "\n".join(f"{speaker}: " + " ".join(rnd.choice(WORDS) for _ in range(10)) + "." for _ in range(12))


async def build(mem: Memory, speaker: str, *, seed: int = 0, **owner: str) -> str:
    made = await mem.call_tool(
        CREATE, {"text": transcript(speaker, seed), "title": f"talk of {speaker}", **owner}
    )
    return str(made["treeId"])


async def trees(mem: Memory) -> dict[str, tuple[str, str | None, str | None]]:
    rows = await store_sql(mem, "SELECT tree_id, tenant, user_id, chat_id FROM rtm_trees")
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


async def tree_ids(mem: Memory) -> dict[str, str]:
    """Each stored tree's tenant."""
    return {r[0]: r[1] for r in await store_sql(mem, "SELECT tree_id, tenant FROM rtm_trees")}


async def holding(mem: Memory, marker: str) -> int:
    [(n,)] = await store_sql(mem, "SELECT COUNT(*) FROM rtm_trees WHERE tree LIKE ?", (f"%{marker}%",))
    return int(n)


# --- RTM trees ----------------------------------------------------------------------------------


async def _forget_person(mem: Memory, ids: list[int]) -> None:
    await mem.forget(user_id="ann")


async def _forget_chat(mem: Memory, ids: list[int]) -> None:
    await mem.forget(chat_id="c1")


async def _forget_messages(mem: Memory, ids: list[int]) -> None:
    await mem.forget_messages(chat_id="c1", message_ids=["a1"])


async def _forget_memories(mem: Memory, ids: list[int]) -> None:
    await mem.forget_memories(ids[:1], user_id="ann")


async def _retention(mem: Memory, ids: list[int]) -> None:
    assert isinstance(mem.clock, ManualClock)
    mem.clock.set(START + dt.timedelta(days=800))
    counts = await mem.forget_inactive(before=START + dt.timedelta(days=400), force=True)
    assert counts["people"] == 1


FORGETS: dict[str, Callable[[Memory, list[int]], Coroutine[Any, Any, None]]] = {
    "person": _forget_person,
    "chat": _forget_chat,
    "messages": _forget_messages,
    "memories": _forget_memories,
    "retention": _retention,
}


@pytest.mark.parametrize("how", ["person", "chat", "retention"])
async def test_a_tree_of_text_no_one_owns_goes_with_a_forget_of_a_person_or_a_chat_of_its_tenant(
    tmp_path: Path, how: str
) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(START)) as mem:
        result = await mem.ingest(
            msg("a1", "I planted basil in the garden", user="ann", ts=START.isoformat())
        )
        ids = [r.id for r in result.records if r.id is not None]
        unowned = await build(mem, "ann")
        elsewhere = await mem.call_tool(
            CREATE, {"text": transcript("ann"), "title": "talk of ann", "tenant": "other"}
        )
        assert await holding(mem, "ann:") == 2
        await FORGETS[how](mem, ids)
        assert await tree_ids(mem) == {elsewhere["treeId"]: "other"}
        assert await holding(mem, "ann:") == 1
        with pytest.raises(InputError, match="no tree"):
            await mem.call_tool(TRAVERSE, {"treeId": unowned, "traversalDepth": 1})


@pytest.mark.parametrize("how", ["messages", "memories"])
async def test_a_message_or_memory_deleted_takes_the_trees_of_its_person_alone(
    tmp_path: Path, how: str
) -> None:
    """An edit or a delete comes every few seconds in a busy chat: it takes the trees its person's
    words may be in (in that chat, or across their chats), not every tree of the tenant."""
    async with open_memory(tmp_path / "m", clock=ManualClock(START)) as mem:
        result = await mem.ingest(
            msg("a1", "I planted basil in the garden", user="ann", ts=START.isoformat())
        )
        ids = [r.id for r in result.records if r.id is not None]
        in_chat = await build(mem, "ann", user_id="ann", chat_id="c1")
        across = await build(mem, "ann", user_id="ann")
        elsewhere = await build(mem, "ann", user_id="ann", chat_id="c2")
        bobs = await build(mem, "bob", user_id="bob", chat_id="c1")
        unowned = await build(mem, "dan")
        await FORGETS[how](mem, ids)
        left = await trees(mem)
        assert in_chat not in left and across not in left
        assert {elsewhere, bobs, unowned} <= set(left)
        # A delete of a message that made no memory takes nothing (an edit of small talk comes
        # every few seconds in a busy chat).
        await mem.forget_messages(chat_id="c1", message_ids=["never-stored"])
        assert set(await trees(mem)) == set(left)


async def test_a_tree_goes_with_the_forget_of_whose_text_it_holds(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(START)) as mem:
        ann = await build(mem, "ann", user_id="ann", chat_id="c1")
        bob = await build(mem, "bob", user_id="bob", chat_id="c2")
        cat = await build(mem, "cat", user_id="cat", chat_id="c3")
        group = await build(mem, "dan", chat_id="c4")
        assert (await trees(mem))[ann] == ("default", "ann", "c1")
        # The same text of another person is another tree.
        assert await build(mem, "ann", user_id="eve", chat_id="c1") != ann

        await mem.forget(user_id="ann")
        left = await trees(mem)
        assert ann not in left and bob in left and cat in left
        # A chat's tree holds anyone's words: it goes with any person's forget.
        assert group not in left

        await mem.ingest(
            msg("b9", "I moved to Porto last spring", user="bob", chat="c2", ts=START.isoformat())
        )
        await mem.forget_messages(chat_id="c2", message_ids=["b9"])
        assert bob not in await trees(mem)
        await mem.forget(chat_id="c3")
        assert cat not in await trees(mem)
        assert await holding(mem, "bob:") == 0 and await holding(mem, "cat:") == 0


async def test_a_tree_goes_with_memories_of_its_owner_deleted_by_id(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(START)) as mem:
        result = await mem.ingest(
            msg("a1", "I planted basil in the garden", user="ann", ts=START.isoformat())
        )
        ann = await build(mem, "ann", user_id="ann", chat_id="c1")
        bob = await build(mem, "bob", user_id="bob", chat_id="c1")
        await mem.forget_memories([r.id for r in result.records if r.id is not None], user_id="ann")
        assert list(await trees(mem)) == [bob]
        assert ann


async def test_a_tree_read_by_id_is_of_the_owner_asked(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as mem:
        ann = await build(mem, "ann", user_id="ann", chat_id="c1")
        read = await mem.call_tool(TRAVERSE, {"treeId": ann, "traversalDepth": 1, "user_id": "ann"})
        assert read["treeId"] == ann
        with pytest.raises(InputError) as raised:
            await mem.call_tool(TRAVERSE, {"treeId": ann, "traversalDepth": 1, "user_id": "bob"})
        assert raised.value.field == "user_id"
        # Text and title without parameters: the tree built for that owner, or a new one.
        again = await mem.call_tool(
            TRAVERSE,
            {"text": transcript("ann"), "title": "talk of ann", "traversalDepth": 1, "user_id": "bob"},
        )
        assert again["treeId"] != ann
        assert (await trees(mem))[again["treeId"]] == ("default", "bob", None)


async def test_the_trees_kept_are_bounded(tmp_path: Path) -> None:
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock, plugin={"rtm": {"trees_kept": 3}}) as mem:
        made = []
        for n in range(5):
            clock.set(START + dt.timedelta(minutes=n))
            made.append(await build(mem, f"p{n}", seed=n, user_id=f"p{n}"))
        assert sorted(await trees(mem)) == sorted(made[-3:])
        with pytest.raises(InputError, match="no tree"):
            await mem.call_tool(TRAVERSE, {"treeId": made[0], "traversalDepth": 1})
        # Kept per tenant: another tenant's trees push none of these out (they were counted
        # together, and a caller of one tenant deleted every other tenant's by building trees).
        for n in range(5):
            clock.set(START + dt.timedelta(minutes=10 + n))
            await build(mem, f"q{n}", seed=n, user_id=f"q{n}", tenant="other")
        kept = await trees(mem)
        assert set(made[-3:]) <= set(kept) and sum(t[0] == "other" for t in kept.values()) == 3


async def test_a_tree_another_worker_forgot_is_not_read_from_this_ones_cache(tmp_path: Path) -> None:
    storage = await storage_for("postgres")
    async with (
        open_memory(tmp_path / "w1", **storage) as one,
        open_memory(tmp_path / "w2", **storage) as two,
    ):
        ann = await build(one, "ann", user_id="ann", chat_id="c1")
        read = await two.call_tool(TRAVERSE, {"treeId": ann, "traversalDepth": 1})
        assert read["treeId"] == ann  # parsed and held by worker two
        await one.forget(user_id="ann")
        with pytest.raises(InputError, match="no tree"):
            await two.call_tool(TRAVERSE, {"treeId": ann, "traversalDepth": 1})


# The table as stores before 2026-12-07 made it: no owner columns.
OLD_TABLE = """CREATE TABLE rtm_trees (
    tree_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    title TEXT NOT NULL,
    text_sha TEXT NOT NULL,
    params TEXT NOT NULL,
    tree TEXT NOT NULL,
    created_at TEXT NOT NULL{written}
)"""


async def test_trees_stored_before_they_kept_an_owner_go_with_any_forget_of_their_tenant(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder) as mem:
        old = await build(mem, "ann")
        other = await mem.call_tool(CREATE, {"text": transcript("ann"), "title": "t", "tenant": "other"})
        columns = "tree_id, tenant, title, text_sha, params, tree, created_at"
        async with mem.store.sql(write=True) as db:
            rows = await db.fetchall(f"SELECT {columns} FROM rtm_trees")
            written = "" if db.dialect == "sqlite" else ",\n    written BIGINT GENERATED ALWAYS AS IDENTITY"
            await db.execute("DROP TABLE rtm_trees")
            await db.execute(OLD_TABLE.format(written=written))
            await db.executemany(f"INSERT INTO rtm_trees ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    async with open_memory(folder) as mem:
        assert await trees(mem) == {old: ("default", None, None), other["treeId"]: ("other", None, None)}
        read = await mem.call_tool(TRAVERSE, {"treeId": old, "traversalDepth": 1})
        assert read["treeId"] == old
        await mem.forget(user_id="someone")
        assert list(await trees(mem)) == [other["treeId"]]


async def test_trees_of_a_file_exported_before_owners_import_as_naming_no_one(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "a") as mem:
        ann = await build(mem, "ann", user_id="ann", chat_id="c1")
        old = await build(mem, "bob")
        exported = await plugin_of(mem).narrmem_export_records(memory=mem)
        assert exported is not None
        records = [record async for record in exported[SECTION]]
    assert {r["tree_id"]: (r["user_id"], r["chat_id"]) for r in records} == {
        ann: ("ann", "c1"),
        old: (None, None),
    }
    before = [{k: v for k, v in r.items() if k not in ("user_id", "chat_id")} for r in records]
    async with open_memory(tmp_path / "b") as mem:
        for dry_run in (True, False):
            counts = await plugin_of(mem).narrmem_import_records(
                memory=mem, sections={SECTION: before}, dry_run=dry_run
            )
            assert counts == {SECTION: 2}
        assert await trees(mem) == {ann: ("default", None, None), old: ("default", None, None)}
        await mem.forget(user_id="someone")
        assert await trees(mem) == {}


# --- triage: quoted messages ---------------------------------------------------------------------


def _scene(message_id: str, day: int, core: str) -> MemoryRecord:
    scene: MemoryRecord = decision_scene(message_id, day, core, START)
    return scene


async def _linked(memory: Memory) -> tuple[MemoryRecord, MemoryRecord]:
    """A scene of val's and a later one that builds on it (quoted in its Impact)."""
    store = memory.store

    async def added(record: MemoryRecord) -> MemoryRecord:
        [memory_id] = await store.add([record], np.ones((1, memory.embedder.dim), dtype=np.float32))
        return (await store.get([memory_id], None))[memory_id]

    target = await added(_scene("v0", 0, "Friends matter more than a salary"))
    later = await added(_scene("v1", 1, "Zqdecision one for friends"))
    draft = SceneDraft.of(target)
    assert draft is not None
    await add_impact(memory, target, draft, later, "Zqdecision one for friends")
    assert [k for k, _ in await store.state_items(IMPACTS)] == ["default\0dm\0v1\0"]
    return (await store.get([target.id or 0], None))[target.id or 0], later


async def test_the_quote_of_a_scene_deleted_by_id_goes_with_its_entry(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        target, later = await _linked(memory)
        assert "Zqdecision" in target.text
        await memory.forget_memories([later.id or 0], user_id="val")
        assert await memory.store.state_items(IMPACTS) == []
        target = (await memory.store.get([target.id or 0], None))[target.id or 0]
        assert "Zqdecision" not in target.text
        assert later.id not in target.meta.get("impacts", [])
        await memory.forget(user_id="val")
        assert await memory.store.state_items(IMPACTS) == []


async def test_the_entry_of_a_quoting_scene_deleted_by_id_goes(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        target, _ = await _linked(memory)
        await memory.forget_memories([target.id or 0], user_id="val")
        assert await memory.store.state_items(IMPACTS) == []


async def test_a_persons_forget_takes_an_entry_whose_later_scene_went_before(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        _, later = await _linked(memory)
        # Left as deletions before 2026-12-07 left it: the later scene gone, its entry kept.
        await memory.store.delete([later.id or 0], Scope(user_id="val", chat_id="dm"))
        await memory.forget(user_id="val")
        assert await memory.store.state_items(IMPACTS) == []


# --- graph: persona ------------------------------------------------------------------------------


async def test_an_unchanged_persona_writes_nothing(tmp_path: Path) -> None:
    clock = ManualClock(START)
    persona = {"user_id": "carol", "chat_id": "c1", "description": "a study buddy", "traits": ["patient"]}
    async with open_memory(tmp_path / "m", clock=clock) as mem:
        first = await mem.call_tool("persona_set", {**persona, "tone": "warm"})
        before = await store_fingerprint(mem)
        for day in (1, 2):
            clock.set(START + dt.timedelta(days=day))
            again = await mem.call_tool("persona_set", {**persona, "tone": "warm"})
            assert again == {"persona": first["persona"], "replaced": None, "superseded_edges": 0}
        assert await store_fingerprint(mem) == before
        changed = await mem.call_tool("persona_set", {**persona, "tone": "calm"})
        assert changed["persona"]["version"] == 2
        assert changed["replaced"] == first["persona"]
        got = await mem.call_tool("persona_get", {"user_id": "carol", "chat_id": "c1"})
        assert got["persona"]["tone"] == "calm"
        # A trait taken away by a purge: the same persona set again is written whole again.
        scope = {"user_id": "carol", "chat_id": "c1"}
        await mem.call_tool("memory_purge", {**scope, "filters": {"relation": "has_trait"}})
        restored = await mem.call_tool("persona_set", {**persona, "tone": "calm"})
        assert restored["persona"]["version"] == 3


# --- proactive: firings --------------------------------------------------------------------------


def _mention(day: int, user: str, chat: str, message_id: str) -> Message:
    return Message(
        text="the zqharbour7 roadmap review came up again",
        user_id=user,
        chat_id=chat,
        ts=START + dt.timedelta(days=day),
        message_id=message_id,
    )


async def _fired(mem: Memory, clock: ManualClock, user: str, chats: list[str]) -> list[int]:
    """Mentions of one topic by ``user`` a day apart, in ``chats`` in turn, until it fires; the
    memories of the firing."""
    for day, chat in enumerate(chats):
        clock.set(START + dt.timedelta(days=day))
        result = await mem.ingest(_mention(day, user, chat, f"{user}{day}"))
    assert [t.kind for t in result.triggers] == ["topic"]
    return await _firing_memories(mem, user)


async def _firing_memories(mem: Memory, user: str) -> list[int]:
    state = await mem.store.state_get(PROACTIVE, firings_key("default", user, "topic"))
    if state is None:
        return []
    return sorted(m for firing in state["firings"] for m in firing["memories"])


async def test_a_chats_forget_takes_its_firings(tmp_path: Path) -> None:
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock) as mem:
        assert await _fired(mem, clock, "ann", ["chanA"] * 3)
        await mem.forget(chat_id="chanA")
        assert await mem.store.state_get(PROACTIVE, firings_key("default", "ann", "topic")) is None


async def test_a_firing_drops_the_memories_deleted(tmp_path: Path) -> None:
    clock = ManualClock(START)
    async with open_memory(tmp_path / "m", clock=clock) as mem:
        named = await _fired(mem, clock, "bob", ["chanB", "chanC", "chanB"])
        in_c = {r.id for r in await mem.store.recent(Scope(chat_id="chanC"), limit=100)}
        assert in_c & set(named)
        await mem.forget(chat_id="chanC")
        kept = await _firing_memories(mem, "bob")
        assert kept == [m for m in named if m not in in_c]
        await mem.forget_memories(kept[:1], user_id="bob")
        assert await _firing_memories(mem, "bob") == kept[1:]
        await mem.forget_messages(chat_id="chanB", message_ids=["bob0", "bob2"])
        assert await mem.store.state_get(PROACTIVE, firings_key("default", "bob", "topic")) is None


async def test_a_message_forget_finished_after_a_crash_takes_the_chats_trees(tmp_path: Path) -> None:
    """Finished at the next open, a delete of a message has no records left to say whose words
    it took: every tree naming its chat goes, and every person's across their chats (the
    person's trees stayed for good)."""
    async with open_memory(tmp_path / "m") as mem:
        await mem.ingest(msg("a1", "I decided to quit my job at the bank", user="ann", chat="g"))
        ann = await build(mem, "ann", user_id="ann", chat_id="g")
        across = await build(mem, "ann", user_id="ann")
        elsewhere = await build(mem, "ann", user_id="ann", chat_id="h")
        # Stopped after the store's delete, before the plugins were told.
        job = await mem.store.begin_forget(tenant="default", user_id=None, chat_id="g", messages=["a1"])
        await mem.store.delete(await mem.store.from_messages("default", "g", ["a1"]), job.scope)
    async with open_memory(tmp_path / "m") as mem:
        assert await mem.store.pending_forgets() == []
        # Hers in that chat, and every person's across their chats; not another chat's.
        assert list(await trees(mem)) == [elsewhere] and ann and across
