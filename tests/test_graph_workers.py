"""The graph on PostgreSQL, where several workers share one database: each sees what the others
wrote, writes at the same moment take turns as they do on SQLite, and node names compare the same
way on both backends (ASCII letters case-insensitively, as SQLite's NOCASE)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _helpers import msg
from narrmem_plugins.graph.backend import dialect_sql
from test_graph import START, U1, clock, commit, edges, mem, recall, rows, said, storage
from test_plugin_tables import storage_for

from narrmem import Memory, PluginError
from narrmem.testing import open_memory

# The fixtures: a test taking ``mem`` runs on SQLite and on PostgreSQL.
__all__ = ["clock", "mem", "storage"]


async def test_two_workers_on_postgres_see_each_others_graph(tmp_path: Path) -> None:
    shared = await storage_for("postgres")
    async with (
        open_memory(tmp_path / "w1", **shared) as one,
        open_memory(tmp_path / "w2", **shared) as two,
    ):
        await commit(one, ("user", "likes", "rock"))
        assert said(await recall(two, "rock")) == {("user", "likes", "rock")}
        # The other worker's statement confirms the same triplet instead of repeating it.
        again = await commit(two, ("user", "likes", "Rock"))
        assert again["confirmed"] == 1 and again["triplets"][0]["count"] == 2
        # A contradiction written by one worker retires what the other wrote.
        out = await commit(two, ("user", "dislikes", "rock"))
        assert [(e["relation"], e["object"]) for e in out["superseded"]] == [("likes", "rock")]
        assert said(await recall(one, "rock")) == {("user", "dislikes", "rock")}
        await two.call_tool("task_create", {**U1, "task_id": "T1", "description": "plan the trip"})
        await one.call_tool("persona_set", {**U1, "description": "a calm butler", "traits": ["polite"]})
        assert [t["task_id"] for t in (await one.call_tool("task_query", U1))["tasks"]] == ["T1"]
        persona = await two.call_tool("persona_get", U1)
        assert persona["persona"]["description"] == "a calm butler"
        assert (await one.stats())["graph"] == (await two.stats())["graph"]


async def test_workers_writing_the_same_triplet_at_once_take_turns(tmp_path: Path) -> None:
    shared = await storage_for("postgres")
    async with (
        open_memory(tmp_path / "w1", **shared) as one,
        open_memory(tmp_path / "w2", **shared) as two,
    ):
        writes = [
            commit(mem, ("user", "lives_in", "Paris"), ("Paris", "located_at", "France"))
            for mem in (one, two)
        ]
        results = await asyncio.gather(
            *writes, *(commit(m, ("user", "lives_in", "Paris")) for m in (one, two))
        )
        assert sum(r["created"] for r in results) == 2  # each triplet once; every other write confirms it
        [row] = await edges(one, "e.relation = 'lives_in'")
        assert (row["status"], row["count"]) == ("active", 4)
        assert await rows(one, "SELECT COUNT(*) FROM graph_nodes WHERE name = 'Paris'") == [(1,)]


async def test_names_compare_the_same_on_both_backends(mem: Memory) -> None:
    await commit(mem, ("user", "likes", "Rock"), ("user", "likes", "ROCK"), ("user", "likes", "rock"))
    [(count,)] = await rows(mem, "SELECT COUNT(*) FROM graph_nodes WHERE type = 'EntityNode'")
    assert count == 2  # user and Rock: ASCII letters fold
    [row] = await edges(mem, "e.relation = 'likes'")
    assert (row["object"], row["count"]) == ("Rock", 3)
    # Letters outside ASCII fold too when a node is written, on either backend: one node.
    await commit(mem, ("user", "knows", "Émile"), ("user", "knows", "émile"))
    [row] = await edges(mem, "e.relation = 'knows'")
    assert (row["object"], row["count"]) == ("Émile", 2)
    # Filters compare names the same way; a substring filter folds ASCII letters too.
    dry = {**U1, "mode": "soft", "dry_run": True}
    assert (await mem.call_tool("memory_purge", {**dry, "filters": {"object": "rOcK"}}))["matched"] == 1
    found = await mem.call_tool("memory_purge", {**dry, "filters": {"object_contains": "MIL"}})
    assert found["matched"] == 1
    assert said(await recall(mem, "ROCK", depth=1)) == {("user", "likes", "Rock")}


def test_the_graph_sql_on_each_backend() -> None:
    sql = "SELECT 1 FROM t s WHERE nocase(s.name) IN (nocase(?), nocase(?)) AND instr(lower(x), ?) > 0"
    assert dialect_sql(sql, "sqlite") == "SELECT 1 FROM t s WHERE s.name IN (?, ?) AND instr(lower(x), ?) > 0"
    fold = "'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'"
    assert dialect_sql(sql, "postgres") == (
        f"SELECT 1 FROM t s WHERE translate(s.name, {fold}) IN (translate(?, {fold}), "
        f"translate(?, {fold})) AND strpos(translate(x, {fold}), ?) > 0"
    )


async def test_read_only_on_a_database_without_the_graph_leaves_it_idle(tmp_path: Path) -> None:
    """A PostgreSQL database written before the graph ran there has no graph tables; opened
    read-only (an export, the source of a migration) the graph cannot make them and stays idle."""
    shared = await storage_for("postgres")
    async with open_memory(tmp_path / "w1", plugins={"disabled": ["graph"]}, **shared) as mem:
        await mem.ingest(msg("m1", "I like rock", ts=START.isoformat()))
    async with open_memory(tmp_path / "w2", read_only=True, **shared) as reader:
        assert "graph" not in await reader.stats()
        with pytest.raises(PluginError, match="not started"):
            await recall(reader, "rock")
    # Opened to write, the graph makes its tables and runs.
    async with open_memory(tmp_path / "w3", **shared) as writer:
        await commit(writer, ("user", "likes", "jazz"))
        assert said(await recall(writer, "jazz")) == {("user", "likes", "jazz")}
