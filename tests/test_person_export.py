"""What narrmem holds of one person, as a file they can be given (``narrmem export --user``,
:mod:`narrmem.doors.person_export`): the other half of forgetting. Everything a forget of the
person deletes or changes in the store's database is in their export, row by row, and nothing of
anyone else is; reading it changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, on_sqlite, store_sql
from narrmem_plugins.storage_postgres.escape import unesc

from narrmem import InputError, hookimpl
from narrmem.clock import ManualClock
from narrmem.doors.person_export import export_person
from narrmem.doors.transfer import export_store
from narrmem.store import ImportanceChange
from narrmem.testing import open_memory

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ANN = [
    ("dm-ann", "I live in Lisbon now, we moved in January"),
    ("dm-ann", "My sister Maria is a nurse in Porto"),
    ("dm-ann", "I decided to quit my job at the bank and start a bakery"),
    ("dm-ann", "our roadmap for the product is a mess"),
    ("dm-ann", "spent the whole afternoon on the product roadmap"),
    ("dm-ann", "the product roadmap meeting went badly again"),
    ("dm-ann", "so tired today"),
    ("dm-ann", "so tired again today"),
    ("dm-ann", "still so tired today"),
    ("group", "I'll bring the cake to the team lunch on Friday"),
    ("group", "I have been learning the cello for two years"),
]
BOB = [
    ("dm-bob", "I live in Madrid and I play the drums"),
    ("group", "I'll bring drinks to the team lunch on Friday"),
    ("group", "my dog Rex is sick, I'm worried"),
]
# Kept by the store for itself, not of anyone: counters of changes, and the FTS5 index, whose
# rows are the memories' own words (each deleted with its memory, which the file holds).
NOT_A_PERSONS = ("keyword_changes", "vector_changes", "sqlite_sequence", "meta", "forget_jobs")


def _said(person: str, n: int, chat: str, text: str) -> dict[str, Any]:
    when = START + timedelta(days=n // 3, hours=n)
    return msg(f"{person}-{n}", text, user=person, chat=chat, ts=when.isoformat())


async def _a_month_of_ann_and_bob(memory: Any) -> None:
    ann = [_said("ann", n, chat, text) for n, (chat, text) in enumerate(ANN)]
    bob = [_said("bob", n, chat, text) for n, (chat, text) in enumerate(BOB)]
    # Bob answers in the group two minutes after Ann: his turn's keyword context holds her words.
    bob[1]["ts"] = (datetime.fromisoformat(ann[9]["ts"]) + timedelta(minutes=2)).isoformat()
    await memory.ingest_many(sorted(ann + bob, key=lambda m: m["ts"]))
    await memory.edit(_said("ann", 1, "dm-ann", "My sister Maria is a doctor in Porto"))
    await memory.call_tool(
        "memory_commit",
        {
            "user_id": "ann",
            "chat_id": "dm-ann",
            "triplets": [{"subject": "user", "relation": "likes", "object": "pastel de nata"}],
        },
    )
    await memory.call_tool(
        "memory_commit",
        {
            "user_id": "bob",
            "chat_id": "dm-bob",
            "triplets": [{"subject": "user", "relation": "likes", "object": "jazz"}],
        },
    )
    # Trees of each one's words, and one of a text that names no one.
    for person, chat, (_, said) in (("ann", "dm-ann", ANN[2]), ("bob", "dm-bob", BOB[0])):
        story = f"{said}. Then the week went on. It rained, and I stayed at home reading. {said}."
        await memory.call_tool(
            "rtm_create_narrative_tree", {"text": story, "title": person, "user_id": person, "chat_id": chat}
        )
    await memory.call_tool(
        "rtm_create_narrative_tree", {"text": "A story nobody owns. It ends.", "title": "x"}
    )
    # Used in an answer: reinforced, with its history.
    for person in ("ann", "bob"):
        hits = await memory.recall("where do you live", user_id=person, reinforce=False)
        await memory.mark_used([hit.id for hit in hits[:2]], user_id=person)


async def _tables(memory: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Every row of every table of the store's database (either backend), by its values."""
    if on_sqlite(memory):
        names = [n for (n,) in await store_sql(memory, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    else:
        names = [
            n
            for (n,) in await store_sql(
                memory,
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'",
            )
        ]
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        if name in NOT_A_PERSONS or name.startswith("memories_fts"):
            continue
        if on_sqlite(memory):
            columns = [c[1] for c in await store_sql(memory, f"PRAGMA table_info('{name}')")]
        else:
            columns = [
                c
                for (c,) in await store_sql(
                    memory,
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position",
                    [name],
                )
            ]
        listed = ", ".join(f'"{c}"' for c in columns)
        rows = await store_sql(memory, f'SELECT {listed} FROM "{name}"')
        found[name] = {repr(row): dict(zip(columns, row, strict=True)) for row in rows}
    return found


def _read(path: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    sections: dict[str, list[dict[str, Any]]] = {}
    for line in lines[1:]:
        sections.setdefault(line.pop("section"), []).append(line)
    return lines[0], sections


def _covers(table: str, row: dict[str, Any], sections: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the export holds ``row`` of ``table``: by the memory it belongs to, by its state
    key, or as one of a plugin's records (by its id)."""
    memories = {m["id"] for m in sections.get("memories", [])}
    # Another's memory holding the person's words as keyword context, which their forget scrubs.
    holding = {c["memory_id"] for c in sections.get("recall_hybrid.context", [])}
    if table in ("memories", "memory_words"):  # PostgreSQL's keyword rows are by the memory's id
        return row["id"] in memories or row["id"] in holding
    if "memory_id" in row:
        return row["memory_id"] in memories
    held = [r for section, records in sections.items() if "." in section for r in records]
    if table == "plugin_state":
        state = {(s["namespace"], s["key"]) for s in [*sections.get("state", []), *held] if "namespace" in s}
        return (row["namespace"], unesc(row["key"])) in state
    if table == "rtm_trees" and row["user_id"] is None:
        # A tree that names no one may hold anyone's words: any forget of its tenant takes it, and
        # no one person is given it.
        return True
    # A plugin's row, by its key (graph rows by id, trees by tree_id), in the section of its table.
    key = "tree_id" if "tree_id" in row else "id"
    section = f"{table.split('_', 1)[0]}.{table.split('_', 1)[1]}" if "_" in table else table
    return any(r.get(key) == row.get(key) for r in sections.get(section, []))


async def test_everything_a_forget_takes_of_a_person_is_in_their_export(tmp_path: Path) -> None:
    data = tmp_path / "data"
    clock = ManualClock(START + timedelta(days=10))
    # Reinforced when used (the tests' default leaves importance alone).
    async with open_memory(data, clock=clock, plugin={"hippocampus": {"reinforce": True}}) as memory:
        await _a_month_of_ann_and_bob(memory)
        await memory.settle()
        before = await _tables(memory)
        counts = await export_person(memory, tmp_path / "ann.jsonl", tenant="default", user_id="ann")
        # Reading changed nothing: no importance, no history, no state.
        assert await _tables(memory) == before
        await memory.forget(user_id="ann")
        after = await _tables(memory)
    header, sections = _read(tmp_path / "ann.jsonl")
    assert header["format"] == "narrmem-person" and header["user_id"] == "ann"
    assert counts["memories"] == len(sections["memories"]) > 0 and sections["end"]
    # Nobody else's: every memory and every plugin record is ann's.
    assert {m["user_id"] for m in sections["memories"]} == {"ann"}
    assert all(r.get("user_id", "ann") == "ann" for s, rs in sections.items() if "." in s for r in rs)
    texts = " ".join(m["text"] for m in sections["memories"])
    assert "Lisbon" in texts and "Madrid" not in texts and "Rex" not in texts
    # Not what others said around her turns, nor their message ids; where her words are kept in
    # Bob's turn, by id.
    whole = (tmp_path / "ann.jsonl").read_text(encoding="utf-8")
    assert "drinks" not in whole and "bob-" not in whole
    assert not any("context_text" in m or "context_message_ids" in m["meta"] for m in sections["memories"])
    [copy] = sections["recall_hybrid.context"]
    assert copy["chat_id"] == "group" and "ann-9" in copy["message_ids"]
    # Her edit's earlier text, her reinforcement's history, her graph, her firings.
    assert any("nurse" in json.dumps(m["meta"]) for m in sections["memories"])
    assert sections.get("importance") and sections.get("graph.edges")
    assert any(s["namespace"] == "proactive" for s in sections.get("state", []))
    [tree] = sections["rtm.trees"]
    assert tree["user_id"] == "ann" and "bakery" in json.dumps(tree["tree"])
    # Every row the forget deleted or changed is in the file.
    missing = [
        (table, row)
        for table, rows in before.items()
        for key, row in rows.items()
        if after.get(table, {}).get(key) != row and not _covers(table, row, sections)
    ]
    assert not missing, [(table, {k: str(v)[:40] for k, v in row.items()}) for table, row in missing]
    # And the forget deleted something of each kind the file holds.
    assert any(
        table.startswith("graph_")
        for table, rows in before.items()
        if rows.keys() - after.get(table, {}).keys()
    )


def test_the_command_writes_a_persons_export_and_import_refuses_it(tmp_path: Path) -> None:
    import asyncio

    data = tmp_path / "data"

    async def fill() -> None:
        async with open_memory(data, real_model=True) as memory:
            await _a_month_of_ann_and_bob(memory)

    asyncio.run(fill())

    def narrmem(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "narrmem.doors.cli", *args], capture_output=True, text=True, check=False
        )

    out = tmp_path / "bob.jsonl"
    done = narrmem("export", str(out), "--user", "bob", "--data", str(data), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    header, sections = _read(out)
    assert header["user_id"] == "bob" and report["exported"] == len(sections["memories"]) > 0
    assert {m["user_id"] for m in sections["memories"]} == {"bob"}
    refused = narrmem("import", str(out), "--data", str(tmp_path / "other"))
    assert refused.returncode == 2 and "one person's own export" in refused.stderr
    if os.environ.get("TESTS_STORE", "sqlite") == "sqlite":
        assert not (tmp_path / "other").exists()  # no store made for a refused file
    bad = narrmem("export", str(tmp_path / "x.jsonl"), "--user", "", "--data", str(data))
    assert bad.returncode == 2 and "field 'user'" in bad.stderr and not (tmp_path / "x.jsonl").exists()
    alone = narrmem("export", str(tmp_path / "y.jsonl"), "--tenant", "t", "--data", str(data))
    assert alone.returncode == 2 and "--user" in alone.stderr
    blank = narrmem("export", str(tmp_path / "z.jsonl"), "--user", "bob", "--tenant", "", "--data", str(data))
    assert blank.returncode == 2 and "field 'tenant'" in blank.stderr


async def test_what_waits_to_be_written_is_theirs_and_what_names_another_is_not(tmp_path: Path) -> None:
    from narrmem.chat_moves import MOVED
    from narrmem.edit_marks import NAMESPACE as EDITS
    from narrmem.inbox import NAMESPACE as INBOX
    from narrmem.inbox import _entry
    from narrmem.models import Message, TriageDecision
    from narrmem.settling import NAMESPACE as SETTLING

    data = tmp_path / "data"
    async with open_memory(data) as memory:
        await memory.ingest(msg("ann-1", "I live in Lisbon", user="ann", chat="dm-ann"))
        waiting = Message.model_validate(
            msg("ann-2", "my test came back positive", user="ann", chat="dm-ann")
        )
        # As a process stopped before writing it leaves it, received and acknowledged.
        await memory.store.state_put(
            INBOX, "stopped:0001", _entry(waiting, TriageDecision(layer="accumulate"))
        )
        # Kept by a chat whose id is the person's: a chat's note. Under her key, a value naming her
        # by another name is hers.
        await memory.store.state_put(MOVED, "default\0ann\0", {"to": "-100ann"})
        await memory.store.state_put("a.plugin", "default\0ann\0x", {"user": "Ann Smith"})
        # An edit of hers under way (its mark, ids only), hooks owed for a message of hers.
        marked = {"tenant": "default", "user_id": "ann", "chat_id": "dm-ann", "message_id": "ann-1"}
        await memory.store.state_put(EDITS, "mark:1", marked)
        await memory.store.state_put(SETTLING, "batch:1", {**marked, "owed": ["proactive"]})
    async with open_memory(data, read_only=True) as memory:
        await export_person(memory, tmp_path / "ann.jsonl", tenant="default", user_id="ann")
    _, sections = _read(tmp_path / "ann.jsonl")
    state = {(s["namespace"], s["key"]) for s in sections["state"]}
    assert {(INBOX, "stopped:0001"), ("a.plugin", "default\0ann\0x"), (EDITS, "mark:1")} <= state
    assert (SETTLING, "batch:1") in state and MOVED not in {ns for ns, _ in state}


async def test_a_forget_elsewhere_does_not_stop_it_and_no_other_file_is_replaced(tmp_path: Path) -> None:
    from narrmem.doors.person_export import person_text

    async with open_memory(tmp_path / "data") as memory:
        for n in range(3):
            await memory.ingest(msg(f"ann-{n}", f"I keep bees, hive number {n}", user="ann", chat="dm-ann"))
        await memory.ingest(msg("zed-1", "I sail on weekends", user="zed", chat="dm-zed", tenant="other"))
        await memory.ingest(msg("bob-1", "I sail too", user="bob", chat="dm-bob"))
        lines = person_text(memory, "default", "ann")
        first = await anext(lines)
        # Another tenant's person, and another person of hers: nothing of the file goes.
        await memory.forget(user_id="zed", tenant="other")
        await memory.forget(user_id="bob")
        rest = [section async for section, _ in lines]
        assert first[0] == "memories" and rest[-1] == "end"
        # Only a person's export written before is replaced, never another file.
        precious = tmp_path / "notes.txt"
        precious.write_text("mine", encoding="utf-8")
        backup = tmp_path / "backup.jsonl"
        await export_store(memory, backup)
        for path in (precious, backup):
            before = path.read_bytes()
            with pytest.raises(InputError, match="replaces only files it wrote"):
                await export_person(memory, path, tenant="default", user_id="ann")
            assert path.read_bytes() == before
        again = tmp_path / "ann.jsonl"
        await export_person(memory, again, tenant="default", user_id="ann")
        await export_person(memory, again, tenant="default", user_id="ann")
        assert _read(again)[0]["user_id"] == "ann"


@pytest.mark.parametrize(
    ("forgotten", "marks_kept"),
    [({"user_id": "zoe"}, 604800), ({"chat_id": "dm"}, 604800), ({"user_id": "zoe"}, 0)],
)
async def test_a_forget_of_a_person_known_by_tools_alone_stops_their_export(
    tmp_path: Path, forgotten: dict[str, str], marks_kept: int
) -> None:
    """A person of whom the store holds no memory (facts a bot wrote with the tools), forgotten
    (or their chat) while their export was read: the export checked that its memories were
    still stored, none, and finished with part of their facts."""
    from narrmem.doors.person_export import person_text
    from narrmem.errors import StoreError

    async def commit(person: str, chat: str, thing: str) -> None:
        triplet = {"subject": "user", "relation": "likes", "object": thing}
        await memory.call_tool("memory_commit", {"user_id": person, "chat_id": chat, "triplets": [triplet]})

    async with open_memory(tmp_path / "data", storage={"forget_marks_kept_s": marks_kept}) as memory:
        for n in range(3):
            await commit("zoe", "dm", f"thing {n}")
        lines = person_text(memory, "default", "zoe")
        await anext(lines)
        await memory.forget(**forgotten)
        with pytest.raises(StoreError, match="a forget ran while the export was read"):
            [section async for section, _ in lines]
        # Another person's forget meanwhile does not stop it.
        await commit("zoe", "dm", "thing again")
        await commit("bob", "dm-bob", "blues")
        lines = person_text(memory, "default", "zoe")
        await anext(lines)
        await memory.forget(user_id="bob")
        assert [section async for section, _ in lines][-1] == "end"


async def test_a_forget_is_told_though_an_id_is_given_again_to_a_new_fact(tmp_path: Path) -> None:
    """The graph's ids may be given again once their rows are deleted: a chat's forget took her
    facts, new ones took their ids, and the check by id alone let the export finish holding the
    forgotten facts."""
    from narrmem.doors.person_export import person_text
    from narrmem.errors import StoreError

    async def commit(chat: str, thing: str) -> None:
        triplet = {"subject": "user", "relation": "likes", "object": thing}
        await memory.call_tool("memory_commit", {"user_id": "zoe", "chat_id": chat, "triplets": [triplet]})

    async with open_memory(tmp_path / "data") as memory:
        for n in range(3):
            await commit("dm", f"thing {n}")
        lines = person_text(memory, "default", "zoe")
        async for section, _ in lines:
            if section.startswith("graph."):
                break
        await memory.forget(chat_id="dm")
        for n in range(3):
            await commit("dm2", f"other {n}")
        with pytest.raises(StoreError, match="a forget ran while the export was read"):
            [section async for section, _ in lines]


async def test_a_persons_export_goes_on_while_another_of_their_chat_is_forgotten(tmp_path: Path) -> None:
    """Read again when a forget ran meanwhile, what the file holds of the person must still be
    kept by its name, not word for word: another's forget took the keyword context of theirs
    that held her words, and a fact she stated again counted one more, and failed her export."""
    from narrmem.doors.person_export import person_text

    async with open_memory(tmp_path / "data") as memory:
        for n in range(4):
            await memory.ingest(msg(f"z{n}", f"I decided to study pottery, week {n}", user="zoe", chat="g"))
            await memory.ingest(msg(f"b{n}", f"bob sails the harbour boats, week {n}", user="bob", chat="g"))
        triplet = {"subject": "user", "relation": "likes", "object": "pottery"}
        await memory.call_tool("memory_commit", {"user_id": "zoe", "chat_id": "g", "triplets": [triplet]})
        await memory.settle()
        lines = person_text(memory, "default", "zoe")
        async for section, _ in lines:
            if section.startswith("graph."):
                break  # her facts are being read (a slow client)
        await memory.call_tool("memory_commit", {"user_id": "zoe", "chat_id": "g", "triplets": [triplet]})
        await memory.forget(user_id="bob")
        assert [section async for section, _ in lines][-1] == "end"


async def test_a_persons_importance_history_is_read_by_a_query_on_them(tmp_path: Path) -> None:
    """Read by tenant, the history of every memory of the id range came back, others' among
    them, for the export to drop."""
    async with open_memory(tmp_path / "data") as memory:
        for n in range(3):
            for person in ("ann", "bob"):
                text = f"{person} says: my hive number {n} of bees swarmed today"
                await memory.ingest(msg(f"{person}-{n}", text, user=person, chat="group"))
        records = await memory.store.get(list(range(1, 50)), None)
        ids = sorted(records)
        at = datetime.now(UTC)
        for memory_id, record in records.items():
            change = ImportanceChange(
                memory_id=memory_id,
                importance=record.importance / 2,
                reinforced_at=at,
                old=record.importance,
                who="test",
                why="halved",
            )
            assert await memory.store.set_importance([change], at) == [memory_id]
        owners = {i: r.user_id for i, r in records.items()}
        history = await memory.store.histories(ids[0], ids[-1], tenant="default", user_id="ann")
        assert history and {owners[i] for i in history} == {"ann"}
        everyone = await memory.store.histories(ids[0], ids[-1], tenant="default")
        assert {owners[i] for i in everyone} == {"ann", "bob"}


async def test_pages_of_a_scope_give_every_memory_once_in_any_century(tmp_path: Path) -> None:
    """Pages end with every memory of their oldest instant, and the next leaves those out by id:
    read up to a microsecond before it, a store's float time past the 23rd century gave the same
    page for ever."""
    from narrmem.models import Scope
    from narrmem.store import scope_pages

    for year in (2026, 2900):
        async with open_memory(
            tmp_path / str(year), clock=ManualClock(datetime(year, 1, 2, tzinfo=UTC))
        ) as memory:
            times = [f"{year}-01-01T00:00:00.{i:06d}+00:00" for i in (1, 2, 3, 3, 3, 4)]
            await memory.ingest_many(
                [msg(f"m{i}", f"a note on the garden, number {i}", ts=ts) for i, ts in enumerate(times)]
            )
            await memory.settle()
            for size in (1, 2, 5):
                given = [
                    r.id
                    async for page in scope_pages(
                        memory.store, Scope(user_id="u1"), kinds=["episode"], page=size
                    )
                    for r in page
                ]
                assert sorted(given) == sorted(set(given)) and len(given) == len(times), (year, size, given)


@pytest.mark.sqlite_only("makes the SQLite store fail one message's write")
@pytest.mark.parametrize("forget", ["the chat's forget", "her edit of it, written"])
async def test_a_waiting_message_forgotten_while_the_export_is_read_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forget: str
) -> None:
    """A message of hers waiting to be written is in her export; the forget of its chat while
    the export was read deleted it (or her edit of it, its new words stored under its id), and
    the check, which let what waits come and go, finished."""
    import asyncio
    import sqlite3

    from narrmem_plugins.storage_sqlite.store import SQLiteStore

    from narrmem.doors.person_export import person_text
    from narrmem.errors import StoreError

    async with open_memory(tmp_path / "data", storage={"acknowledge": "on_receipt"}) as memory:
        await memory.ingest(msg("z0", "I decided to study pottery this year", user="zoe", chat="g"))
        await memory.settle()
        for name in ("add_with_context", "add_while_embedding", "add"):
            written = getattr(SQLiteStore, name)

            def failing_for_one(written: Any) -> Any:
                async def write(self: Any, records: Any, *args: Any, **kwargs: Any) -> Any:
                    if any("zanzibarquux" in r.text for r in records):
                        raise sqlite3.OperationalError("database is locked")
                    return await written(self, records, *args, **kwargs)

                return write

            monkeypatch.setattr(SQLiteStore, name, failing_for_one(written))
        await memory.ingest(msg("z1", "my secret word is zanzibarquux", user="zoe", chat="dm"))
        await asyncio.sleep(0.3)
        lines = person_text(memory, "default", "zoe")
        async for _, text in lines:
            if "zanzibarquux" in text:
                break  # the waiting message is in the file
        if forget == "the chat's forget":
            await memory.forget(chat_id="dm")
        else:
            assert (await memory.edit(msg("z1", "my secret word is gone now", user="zoe", chat="dm"))).stored
        with pytest.raises(StoreError, match="a forget ran while the export was read"):
            [section async for section, _ in lines]


async def test_quotes_that_come_and_go_do_not_stop_an_export_and_a_tree_forgotten_does(
    tmp_path: Path,
) -> None:
    """A scene keeps its newest three quotes: a fourth link took her oldest quote's entry while
    her export was read, an unrelated forget ran, and the export failed as if she had been
    forgotten. A tree of hers that a forget took, her only trace, still stops it."""
    import datetime as dt

    import numpy as np
    from _helpers import decision_scene
    from narrmem_plugins.triage.impacts import add_impact

    from narrmem.doors.person_export import person_text
    from narrmem.errors import StoreError
    from narrmem.models import SceneDraft

    start = dt.datetime(2026, 8, 1, 20, tzinfo=dt.UTC)
    async with open_memory(tmp_path / "data") as memory:
        store = memory.store
        await memory.ingest(msg("e1", "the bakery opens at five", user="eve", chat="h"))
        await memory.settle()

        async def added(record: Any) -> Any:
            [memory_id] = await store.add([record], np.ones((1, memory.embedder.dim), dtype=np.float32))
            return (await store.get([memory_id], None))[memory_id]

        target = await added(decision_scene("v0", 0, "Friends matter more than a salary", start))

        async def link(n: int) -> None:
            nonlocal target
            scene = await added(decision_scene(f"v{n}", n, f"Decision number {n} for friends", start))
            target = (await store.get([target.id], None))[target.id]
            await add_impact(memory, target, SceneDraft.of(target), scene, f"Decision number {n} for friends")

        for n in range(1, 4):
            await link(n)
        lines = person_text(memory, "default", "val")
        async for section, _ in lines:
            if section == "triage.impacts":
                break
        await link(4)
        await memory.forget_messages(chat_id="h", message_ids=["e1"])
        assert [section async for section, _ in lines][-1] == "end"

        tree = {
            "text": "I went to Lisbon. It rained all week.",
            "title": "t",
            "user_id": "zoe",
            "chat_id": "dm",
        }
        await memory.call_tool("rtm_create_narrative_tree", tree)
        lines = person_text(memory, "default", "zoe")
        async for section, _ in lines:
            if section == "rtm.trees":
                break
        await memory.forget(user_id="zoe")
        with pytest.raises(StoreError, match="a forget ran while the export was read"):
            [section async for section, _ in lines]


async def test_hooks_owed_for_her_written_message_may_end_while_the_export_is_read(tmp_path: Path) -> None:
    """An entry of hooks owed holds no words: ended meanwhile (the hooks ran) beside another's
    forget, it was taken for a forget of her waiting message."""
    from narrmem.doors.person_export import person_text
    from narrmem.settling import NAMESPACE as SETTLING

    async with open_memory(tmp_path / "data") as memory:
        await memory.ingest(msg("z1", "I love jazz and I live in Lisbon", user="zoe", chat="dm"))
        await memory.ingest(msg("b1", "I sail on weekends", user="bob", chat="dm-bob"))
        await memory.settle()
        owed = {"tenant": "default", "user_id": "zoe", "chat_id": "dm", "message_id": "z1"}
        await memory.store.state_put(SETTLING, "batch:1", {**owed, "owed": ["proactive"]})
        lines = person_text(memory, "default", "zoe")
        async for section, _ in lines:
            if section == "state":
                break
        await memory.store.state_delete(SETTLING, "batch:1")  # the owed hooks ran
        await memory.forget(user_id="bob")
        assert [section async for section, _ in lines][-1] == "end"


async def test_pages_of_a_scope_end_though_the_store_orders_times_otherwise_than_the_records() -> None:
    """A store whose kept time of a memory orders otherwise than the memory's own ``created_at``
    gave two pages in turn for ever (a person's export hung in a busy run)."""
    from narrmem.models import MemoryRecord, Scope
    from narrmem.store import scope_pages

    def at(seconds: float) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)

    # The store's own times (its index), and the records' (what they say): in the other order.
    kept = {1: 1.0, 2: 3.0}
    records = {
        1: MemoryRecord(id=1, user_id="ann", chat_id="c", text="one", created_at=at(10)),
        2: MemoryRecord(id=2, user_id="ann", chat_id="c", text="two", created_at=at(5)),
    }

    class Store:
        async def recent(
            self,
            scope: Scope,
            *,
            since: datetime | None = None,
            until: datetime | None = None,
            kinds: Any = None,
            limit: int = 100,
        ) -> list[MemoryRecord]:
            lowest = -1e18 if since is None else (since - at(0)).total_seconds()
            highest = 1e18 if until is None else (until - at(0)).total_seconds()
            ids = sorted((i for i, t in kept.items() if lowest <= t <= highest), key=lambda i: -kept[i])
            return [records[i] for i in ids[:limit]]

    pages = []
    async for found in scope_pages(Store(), Scope(user_id="ann"), page=1):  # type: ignore[arg-type]
        pages.append([r.id for r in found])
        assert len(pages) < 10
    assert sorted(i for found in pages for i in found) == [1, 2]


class _SlowForgetOf:
    """A plugin whose part of one person's forget takes a while (a service of its own to tell)."""

    narrmem_name = "slow_forget"

    def __init__(self, user_id: str) -> None:
        self.user_id = user_id
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    @hookimpl
    async def narrmem_after_forget(self, user_id: str | None) -> None:
        if user_id == self.user_id:
            self.started.set()
            await self.release.wait()


async def test_another_persons_forget_under_way_waits_and_does_not_stop_the_export(tmp_path: Path) -> None:
    """A forget of another person still under way when a person's export began, or when it
    ended, failed the export (a data-access request answered at random while others asked to be
    forgotten): the export waits for it to end, then goes on."""
    from narrmem.doors.person_export import person_text

    slow = _SlowForgetOf("bob")
    async with open_memory(tmp_path / "data", plugins=[slow]) as memory:
        for n in range(3):
            await memory.ingest(msg(f"z{n}", f"I decided to study pottery, week {n}", user="zoe", chat="g"))
            await memory.ingest(msg(f"b{n}", f"bob sails the harbour boats, week {n}", user="bob", chat="g"))
        await memory.settle()
        lines = person_text(memory, "default", "zoe")
        await anext(lines)
        forget = asyncio.create_task(memory.forget(user_id="bob"))
        await slow.started.wait()  # under way as her export ends
        asyncio.get_running_loop().call_later(0.3, slow.release.set)
        assert [section async for section, _ in lines][-1] == "end"
        assert (await forget)["memories"] >= 3
        # Under way as it begins: the same.
        slow.started.clear()
        slow.release.clear()
        slow.user_id = "zoe2"
        await memory.ingest(msg("x1", "zoe2 keeps bees on the roof", user="zoe2", chat="h"))
        forget = asyncio.create_task(memory.forget(user_id="zoe2"))
        await slow.started.wait()
        asyncio.get_running_loop().call_later(0.3, slow.release.set)
        assert [section async for section, _ in person_text(memory, "default", "zoe")][-1] == "end"
        await forget
