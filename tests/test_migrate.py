"""``narrmem migrate``: a data folder to PostgreSQL and back gives the same export (the graph's
sections too), every side table row survives, re-running copies nothing twice, and the result is
checked."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _postgres import fresh_database

from narrmem import hookimpl
from narrmem.config import load_settings
from narrmem.doors.migrate import migrate
from narrmem.doors.transfer import export_jsonl
from narrmem.models import ImportanceChange
from narrmem.testing import TestingPlugin, open_memory

T0 = datetime(2025, 1, 6, 20, 0, tzinfo=UTC)
TEXTS = [
    "I decided to quit my job at the bank",
    "so tired today after the long shift",
    "我决定下个月去云南旅行",
    "my sister finally got her driving licence",
    "I love playing rock music on my guitar every evening",
    "我最近迷上了摇滚乐",
]


def hashed() -> Any:
    return load_settings(embedder={"backend": "hash"})


async def fill(folder: Path) -> None:
    async with open_memory(folder) as mem:
        for n, text in enumerate(TEXTS * 3):
            await mem.ingest(
                {
                    "text": f"{text} ({n})",
                    "user_id": ["ann", "bo"][n % 2],
                    "chat_id": ["c1", "c2", "c3"][n % 3],
                    "message_id": f"m{n}",
                    "ts": (T0 + timedelta(hours=n)).isoformat(),
                    "speaker": ["Ann", "Bo"][n % 2],
                }
            )
        [first] = (await mem.store.get([1], None)).values()
        written = await mem.store.set_importance(
            [
                ImportanceChange(
                    memory_id=1,
                    importance=0.7,
                    reinforced_at=T0,
                    old=first.importance,
                    who="test",
                    why="used",
                )
            ],
            T0,
        )
        assert written == [1]
        await mem.store.state_put("someplugin", "k", {"v": [1, "二"]})
        # A forget of nobody left pending: its row must travel too.
        await mem.store.begin_forget(tenant="default", user_id="ghost", chat_id=None)
        await fill_graph(mem)


async def fill_graph(mem: Any) -> None:
    """Graph rows of every kind beside the facts the messages stated: a task chain, a persona
    replaced (an edge superseded by a later one), a purge, and node vectors a recall cached."""
    ann = {"user_id": "ann", "chat_id": "c1"}
    for task in ("Trip", "Budget"):
        await mem.call_tool(
            "task_create", {**ann, "task_id": task, "description": task, "info_nodes": ["Yunnan"]}
        )
    for description in ("a calm butler", "a cheerful guide"):
        await mem.call_tool("persona_set", {**ann, "description": description, "traits": ["polite"]})
    await mem.call_tool(
        "memory_commit", {**ann, "triplets": [{"subject": "user", "relation": "likes", "object": "Tea"}]}
    )
    await mem.call_tool("memory_purge", {**ann, "filters": {"object": "tea"}, "mode": "soft"})
    await mem.call_tool("memory_recall", {**ann, "query_intent": "Yunnan, guitar"})


async def dump(folder: Path, out: Path) -> tuple[bytes, dict[str, list[dict[str, Any]]]]:
    # An export is refused while a forget is pending (the one of nobody travels with the store):
    # an open that writes finishes it first, in either store alike.
    async with open_memory(folder):
        pass
    async with open_memory(folder, read_only=True) as mem:
        await export_jsonl(mem, out)
        side = {
            t: await mem.store.dump_rows(t, 0, 10_000)
            for t in ("memory_history", "plugin_state", "forget_jobs")
        }
    return await asyncio.to_thread(out.read_bytes), side


async def test_folder_to_postgres_and_back_is_lossless_and_resumable(tmp_path: Path) -> None:
    source, back = tmp_path / "source", tmp_path / "back"
    await fill(source)
    dsn = await fresh_database("migrate")
    options: dict[str, Any] = {"settings": hashed(), "plugins": [TestingPlugin()], "load_entrypoints": False}

    there = await migrate(str(source), dsn, progress=False, **options)
    assert there["verified"], there
    assert there["memories"]["imported"] == there["counts"]["memories"]["source"] > 0
    assert there["counts"]["memory_history"]["target"] >= 1
    assert there["counts"]["forget_jobs"]["target"] == 1
    assert there["recall"]["queries"] > 0 and there["recall"]["agreement"] >= 0.9

    again = await migrate(str(source), dsn, progress=False, **options)
    assert again["memories"] == {"imported": 0, "skipped": there["memories"]["imported"]}
    assert again["side_tables"]["memory_history"]["copied"] == 0
    assert again["side_tables"]["plugin_state"]["copied"] == 0
    # The target finished the copied pending forget when it was opened again (as any open does),
    # so the re-run copies the job once more: it stays pending until the source finishes it.
    assert again["side_tables"]["forget_jobs"]["copied"] == 1
    assert again["counts"] == there["counts"]

    home = await migrate(dsn, str(back), progress=False, **options)
    assert home["verified"], home
    original, original_side = await dump(source, tmp_path / "a.jsonl")
    returned, returned_side = await dump(back, tmp_path / "b.jsonl")
    # Everything (memories, history, importance after decay, plugin state, the graph, RTM trees)
    # comes back as it was: the exports are identical, byte for byte.
    assert there["not_migrated"] == {} and home["not_migrated"] == {}
    graph = {name: n for name, n in there["plugin_sections"].items() if name.startswith("graph.")}
    assert set(graph) == {"graph.nodes", "graph.edges", "graph.purges"} and all(graph.values())
    assert home["plugin_sections"] == there["plugin_sections"]
    for name, count in graph.items():
        assert sum(b'"section": "%s"' % name.encode() in line for line in original.splitlines()) == count
    assert returned == original
    memories = [line for line in original.splitlines() if b'"section": "memories"' in line]
    assert len(memories) == there["counts"]["memories"]["source"]
    assert returned_side == original_side
    # On PostgreSQL the graph goes on from the migrated rows: new ids follow theirs.
    async with open_memory(tmp_path / "worker", storage={"backend": "postgres", "dsn": dsn}) as mem:
        out = await mem.call_tool(
            "memory_commit",
            {
                "user_id": "ann",
                "chat_id": "c9",
                "triplets": [{"subject": "user", "relation": "plays", "object": "go"}],
            },
        )
        assert out["created"] == 1 and out["triplets"][0]["id"] > graph["graph.edges"]


class SourceOnlySection:
    """A plugin whose data the target cannot take (its import side is not loaded there)."""

    narrmem_name = "leftbehind"

    @hookimpl
    async def narrmem_export_records(self, memory: Any) -> dict[str, list[dict[str, Any]]] | None:
        return {"leftbehind.rows": [{"n": 1}, {"n": 2}]} if memory.read_only else None


async def test_plugin_data_left_behind_is_not_a_verified_migration(tmp_path: Path) -> None:
    source = tmp_path / "source"
    async with open_memory(source) as mem:
        await mem.ingest(
            {"text": TEXTS[0], "user_id": "ann", "chat_id": "c1", "message_id": "m1", "ts": T0.isoformat()}
        )
    plugins = [TestingPlugin(), SourceOnlySection()]
    report = await migrate(
        str(source), str(tmp_path / "target"), progress=False, settings=hashed(), plugins=plugins,
        load_entrypoints=False, queries=0,
    )  # fmt: skip
    assert report["counts_match"] and report["not_migrated"] == {"leftbehind.rows": 2}
    assert not report["verified"]


class RoundTrip:
    """A plugin whose section the target takes, noting what it was handed."""

    narrmem_name = "roundtrip"

    def __init__(self) -> None:
        self.handed: list[Any] = []

    @hookimpl
    async def narrmem_export_records(self, memory: Any) -> dict[str, list[dict[str, Any]]] | None:
        rows = [{"n": n, "text": f"row {n} é"} for n in range(1200)]
        return {"roundtrip.rows": rows} if memory.read_only else None

    @hookimpl
    async def narrmem_import_records(
        self, memory: Any, sections: dict[str, Any], dry_run: bool
    ) -> dict[str, int] | None:
        rows = sections.get("roundtrip.rows")
        if rows is None:
            return None
        self.handed.append((type(rows), len(rows), rows[1199], list(rows)[:2]))
        return {"roundtrip.rows": len(rows)}


async def test_plugin_sections_are_spooled_to_a_file_not_held(tmp_path: Path) -> None:
    """A plugin's section was read whole into a list before the target took it: a graph of
    millions of rows took gigabytes at the migration of a store that outgrew one process."""
    source = tmp_path / "source"
    async with open_memory(source) as mem:
        await mem.ingest(
            {"text": TEXTS[0], "user_id": "ann", "chat_id": "c1", "message_id": "m1", "ts": T0.isoformat()}
        )
    plugin = RoundTrip()
    report = await migrate(
        str(source), str(tmp_path / "target"), progress=False, settings=hashed(),
        plugins=[TestingPlugin(), plugin], load_entrypoints=False, queries=0,
    )  # fmt: skip
    assert report["verified"] and report["plugin_sections"]["roundtrip.rows"] == 1200
    assert len(plugin.handed) == 2  # the dry run, then the import
    kind, count, last, first = plugin.handed[-1]
    assert kind is not list and count == 1200
    assert last == {"n": 1199, "text": "row 1199 é"} and first == [
        {"n": 0, "text": "row 0 é"},
        {"n": 1, "text": "row 1 é"},
    ]
