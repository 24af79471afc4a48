"""A plugin's tables are exported a page at a time as the file is written, not read whole first
(about 1.3 KB of memory a graph row: an export in the bot's own process, ``/v1/export``, grew it
by gigabytes on a store of millions of facts). Written to while it is read, the file still
imports: the rows an edge names were read after it."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from narrmem_plugins.graph import transfer as graph_transfer

from narrmem import Memory, hookimpl, table_transfer
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.errors import PluginError
from narrmem.testing import open_memory

SCOPE = {"user_id": "ann", "chat_id": "c1"}


async def _facts(memory: Memory, first: int, count: int) -> None:
    for start in range(first, first + count, 20):
        triplets = [
            {"subject": "user", "relation": "likes", "object": f"thing number {n} from the market"}
            for n in range(start, min(start + 20, first + count))
        ]
        await memory.call_tool("memory_commit", {"triplets": triplets, **SCOPE})


def _sections(path: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        record = json.loads(line)
        found.setdefault(record.pop("section"), []).append(record)
    return found


@pytest.mark.sqlite_only("one store is enough to measure what the export itself holds")
async def test_an_export_holds_a_page_of_a_plugins_rows_not_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 facts (6,000 rows, pages of 100): the export held every row of the graph's tables at
    once, 6.5 MB for 2.4 MB of them in the file."""
    monkeypatch.setattr(
        graph_transfer, "TABLES", [dataclasses.replace(s, page_rows=100) for s in graph_transfer.TABLES]
    )
    path = tmp_path / "export.jsonl"
    async with open_memory(tmp_path / "m") as memory:
        await _facts(memory, 0, 3000)
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            counts = await export_store(memory, path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert counts["graph.edges"] == 3000 and counts["graph.nodes"] == 3001
    graph_bytes = sum(len(line) for line in path.read_bytes().splitlines() if b'"section": "graph.' in line)
    held = peak - start
    assert held < graph_bytes * 0.5, (
        f"the export held {held / 1e6:.1f} MB for {graph_bytes / 1e6:.1f} MB of rows"
    )


async def test_a_graph_written_to_between_pages_still_exports_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of 7 rows, and between two pages of edges a fact purged and stated again, and a new
    one: each table is read on one state of the database, so the file holds one active copy of
    the fact (read on the shared connection, it held two, and the import refused the file), and
    the edges read name nodes the file holds (nodes are read after the edges)."""
    small = [dataclasses.replace(spec, page_rows=7) for spec in graph_transfer.TABLES]
    monkeypatch.setattr(graph_transfer, "TABLES", small)
    path = tmp_path / "export.jsonl"
    jazz = {"triplets": [{"subject": "user", "relation": "likes", "object": "jazz"}], **SCOPE}
    async with open_memory(tmp_path / "a") as memory:
        await memory.call_tool("memory_commit", jazz)
        await _facts(memory, 0, 40)
        original = table_transfer.export_page
        pages: list[str] = []

        async def export_page(db: Any, spec: Any, **kwargs: Any) -> Any:
            page = await original(db, spec, **kwargs)
            pages.append(spec.table)
            if spec.table == "graph_edges" and pages.count("graph_edges") == 1:
                await memory.call_tool(
                    "memory_purge", {"filters": {"object": "jazz"}, "mode": "soft", **SCOPE}
                )
                await memory.call_tool("memory_commit", jazz)
                await _facts(memory, 1000, 1)  # a new edge and a new node
            return page

        monkeypatch.setattr(table_transfer, "export_page", export_page)
        counts = await export_store(memory, path)
    assert pages.count("graph_edges") >= 6 and pages.count("graph_nodes") >= 6
    assert pages.index("graph_nodes") > max(i for i, table in enumerate(pages) if table == "graph_edges")
    sections = _sections(path)
    nodes = {node["id"] for node in sections["graph.nodes"]}
    assert counts["graph.edges"] == 41  # the state of the first page
    assert {edge["subject_id"] for edge in sections["graph.edges"]} <= nodes
    assert {edge["object_id"] for edge in sections["graph.edges"]} <= nodes
    async with open_memory(tmp_path / "b") as fresh:
        imported = await import_jsonl(fresh, path)
    assert imported["graph.edges"] == 41


class _ReadsBadly:
    """A plugin whose section is read as the export writes it, and fails on the way."""

    narrmem_name = "reads_badly"

    def __init__(self, failure: str) -> None:
        self.failure = failure

    @hookimpl
    async def narrmem_export_records(self, memory: Memory) -> dict[str, Any]:
        async def records() -> Any:
            yield {"id": 1}
            if self.failure == "raises":
                raise RuntimeError("its service went away")
            yield ["not", "an", "object"]

        return {"reads_badly.rows": records()}


@pytest.mark.parametrize(
    ("failure", "words"), [("raises", "failed while"), ("not an object", "not an object")]
)
async def test_a_plugin_whose_section_fails_as_it_is_read_is_named(
    tmp_path: Path, failure: str, words: str
) -> None:
    """Its records are read after its hook returned, past the host's checks: the failure named no
    plugin (a bare RuntimeError, a TypeError), and the export's file was left unfinished."""
    path = tmp_path / "export.jsonl"
    async with open_memory(tmp_path / "m", plugins=[_ReadsBadly(failure)]) as memory:
        with pytest.raises(PluginError, match="reads_badly") as info:
            await export_store(memory, path)
    assert words in str(info.value)
    assert not path.exists()


async def test_plugin_state_rows_that_go_before_a_page_do_not_make_the_export_skip_any(
    tmp_path: Path,
) -> None:
    """The plugins' small state was read in pages by offset while the memory worked: the inbox's
    and the settling's rows come and go with every message and sort before the plugins', so each
    one gone before a page made the next page skip a row (a trigger's or a summary's state left
    out of a nightly backup). Pages now follow the last key seen."""
    async with open_memory(tmp_path / "m") as memory:
        store = memory.store
        for n in range(600):
            await store.state_put("narrmem.aaa", f"passing {n:04d}", {"n": n})
        for n in range(2500):
            await store.state_put("zz_plugin", f"kept {n:04d}", {"n": n})
        dump = store.dump_rows
        pages = 0

        async def churning(table: str, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            nonlocal pages
            rows: list[dict[str, Any]] = await dump(table, *args, **kwargs)
            if table == "plugin_state":
                pages += 1
                if pages == 1:  # the passing rows go while the export is between pages
                    await store.state_delete("narrmem.aaa", "passing")
            return rows

        store.dump_rows = churning
        await export_store(memory, tmp_path / "backup.jsonl")
    kept = [r["key"] for r in _sections(tmp_path / "backup.jsonl")["state"] if r["namespace"] == "zz_plugin"]
    assert kept == [f"kept {n:04d}" for n in range(2500)]


async def test_the_importance_histories_are_read_a_page_at_a_time(tmp_path: Path) -> None:
    """The export read each memory's history on its own, a round trip per memory (hours a night
    for a store of tens of millions); it reads a page of them at once, the same rows."""
    async with open_memory(tmp_path / "m", plugin={"hippocampus": {"reinforce": True}}) as memory:
        results = await memory.ingest_many(
            [
                {
                    **SCOPE,
                    "text": f"I planted tree number {n} in the garden",
                    "message_id": f"m{n}",
                    "ts": "2026-05-04T09:12:00+00:00",
                }
                for n in range(30)
            ]
        )
        ids = [r.memory_ids[0] for r in results if r.memory_ids]
        await memory.mark_used(ids[::3], user_id="ann", chat_id="c1")
        store = memory.store
        one_by_one = 0
        history = store.history

        async def counted(memory_id: int) -> list[dict[str, Any]]:
            nonlocal one_by_one
            one_by_one += 1
            rows: list[dict[str, Any]] = await history(memory_id)
            return rows

        store.history = counted
        await export_store(memory, tmp_path / "backup.jsonl")
        assert one_by_one == 0
        exported = {r["memory_id"]: r["events"] for r in _sections(tmp_path / "backup.jsonl")["importance"]}
        assert exported and exported == {i: await history(i) for i in exported}
        assert set(ids[::3]) <= set(exported)
