"""A full export is lossless: a store with a graph (facts, a superseded fact, a purge, a persona, a task),
RTM trees, importance history (decay and reinforcement) and plugin state (a fired trigger) is exported,
imported into a fresh store and exported again, byte for byte the same; the fresh store answers as the
old one did. Old exports (memories only) still import; a section no plugin takes, or a bad plugin
record, is an error naming it, and nothing of the file is written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, store_sql, write_export
from test_mcp import STORY

from narrmem import InputError
from narrmem.clock import ManualClock
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.table_transfer import Column, _bits, _kind
from narrmem.testing import open_memory

pytestmark = pytest.mark.slow

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SCOPE = {"user_id": "u1", "chat_id": "c1"}
REINFORCE = {"hippocampus": {"reinforce": True}}


def _at(days: float) -> str:
    return (START + timedelta(days=days)).isoformat()


async def _fill(memory: Any, clock: ManualClock) -> None:
    """Everything a store keeps besides memories: graph, trees, history, state."""
    said = [
        ("m1", "I live in Lisbon and I work at a small design studio", 0),
        ("m2", "I love rock music, it gets me through the week", 0.5),
        ("m3", "rock music again tonight, a great rock concert downtown", 1),
        ("m4", "more rock music this weekend, rock is my thing", 2),
        ("m5", "I decided to quit my job at the studio next month", 3),
    ]
    for message_id, text, days in said:
        clock.set(START + timedelta(days=days))
        await memory.ingest(msg(message_id, text, ts=_at(days)))
    calls: list[tuple[str, dict[str, Any]]] = [
        (
            "memory_commit",
            {"triplets": [{"subject": "user", "relation": "likes", "object": "jazz"}], **SCOPE},
        ),
        (
            "memory_commit",
            {"triplets": [{"subject": "user", "relation": "dislikes", "object": "jazz"}], **SCOPE},
        ),
        ("memory_purge", {"filters": {"object": "jazz"}, "mode": "soft", **SCOPE}),
        ("persona_set", {"description": "a patient mentor", "tone": "calm", **SCOPE}),
        ("task_create", {"task_id": "plan_move", "description": "plan the move", **SCOPE}),
        ("rtm_create_narrative_tree", {"text": STORY, "title": "The Lost Kingdom", "maxBranchingFactor": 3}),
    ]
    for name, arguments in calls:
        await memory.call_tool(name, arguments)
    clock.set(START + timedelta(days=20))
    await memory.decay()
    hits = await memory.recall("what music do I love?", user_id="u1", reinforce=True)
    await memory.mark_used([h.id for h in hits], user_id="u1")
    clock.set(START + timedelta(days=40))
    await memory.decay()


async def test_export_fresh_store_export_is_identical(tmp_path: Path) -> None:
    clock = ManualClock(START)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    async with open_memory(tmp_path / "a", real_model=True, clock=clock, plugin=REINFORCE) as memory:
        await _fill(memory, clock)
        written = await export_store(memory, first)
        old_history = {
            h.id: await memory.history(h.id)
            for h in await memory.recall("rock", user_id="u1", reinforce=False)
        }
        old_facts = await memory.call_tool("memory_recall", {"query_intent": "user,likes", **SCOPE})
    for section in ("importance", "state", "graph.nodes", "graph.edges", "graph.purges", "rtm.trees"):
        assert written.get(section, 0) > 0, (section, written)
    lines = [json.loads(line) for line in first.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["version"] == 3
    importance = [line for line in lines if line.get("section") == "importance"]
    assert any(line["events"] for line in importance)  # reinforcement, kept in the history
    assert any(line["current"] is not None for line in importance)  # importance after decay
    assert {line["status"] for line in lines if line.get("section") == "graph.edges"} >= {"active", "deleted"}

    async with open_memory(tmp_path / "b", real_model=True, clock=clock, plugin=REINFORCE) as memory:
        counts = await import_jsonl(memory, first)
        assert counts["imported"] == written["memories"] and counts["skipped"] == 0
        for section in ("graph.nodes", "graph.edges", "graph.purges", "rtm.trees", "state"):
            assert counts[section] == written[section], section
        await export_store(memory, second)
        # It answers as the old store did: the same history, the same facts, the same tree.
        assert {i: await memory.history(i) for i in old_history} == old_history
        assert await memory.call_tool("memory_recall", {"query_intent": "user,likes", **SCOPE}) == old_facts
        tree_id = next(line for line in lines if line.get("section") == "rtm.trees")["tree_id"]
        tree = await memory.call_tool("rtm_traverse_narrative", {"treeId": tree_id, "traversalDepth": 2})
        assert tree["treeId"] == tree_id and tree["retelling"]
        # A second import of the same file changes nothing.
        again = await import_jsonl(memory, first)
        assert again["imported"] == 0 and not any(v for k, v in again.items() if k != "skipped")
    assert second.read_bytes() == first.read_bytes()


async def test_an_old_export_still_imports(tmp_path: Path) -> None:
    """Version 1 files hold memories only, with no section on their lines."""
    path = tmp_path / "v1.jsonl"
    async with open_memory(tmp_path / "a") as memory:
        await memory.ingest(msg("m1", "I adopted a greyhound named Pixel"))
        await export_store(memory, path)
    header, *lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    old = [line for line in lines if line.pop("section") == "memories"]
    path.write_text(
        "".join(json.dumps(line) + "\n" for line in [{**header, "version": 1}, *old]), encoding="utf-8"
    )
    async with open_memory(tmp_path / "b") as memory:
        assert (await import_jsonl(memory, path))["imported"] == len(old)
        assert (await memory.stats())["memories"] == len(old)


async def _export_with_a_fact(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """The export of a store with one memory and one graph fact, and its lines."""
    path = tmp_path / "export.jsonl"
    async with open_memory(tmp_path / "a") as memory:
        await memory.ingest(msg("m1", "I live in Lisbon"))
        await memory.call_tool(
            "memory_commit",
            {"triplets": [{"subject": "user", "relation": "likes", "object": "jazz"}], **SCOPE},
        )
        await export_store(memory, path)
    return path, [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(
    ("spoil", "words", "field"),
    [
        (
            lambda line: line.update(section="graph.nodes"),
            "no loaded plugin takes section 'graph.nodes'",
            "section",
        ),
        (lambda line: line.update(status=3), "must be text or null", "graph.edges[0].status"),
        # Past what a 64-bit column holds: the database's driver would refuse it untyped.
        (lambda line: line.update(id=2**63), "must fit in a 64-bit integer", "graph.edges[0].id"),
        (
            lambda line: line.update(count=-(2**63) - 1),
            "must fit in a 64-bit integer",
            "graph.edges[0].count",
        ),
        (
            lambda line: line.update(colour="red"),
            "graph_edges has no column 'colour'",
            "graph.edges[0].colour",
        ),
        (lambda line: line.update(section="nonsense"), "unknown section 'nonsense'", "section"),
    ],
)
async def test_a_bad_plugin_section_writes_nothing(
    tmp_path: Path, spoil: Any, words: str, field: str
) -> None:
    path, lines = await _export_with_a_fact(tmp_path)
    edge = next(line for line in lines if line.get("section") == "graph.edges")
    spoil(edge)
    write_export(path, lines)
    # The first case imports a node table into a memory without the graph plugin.
    plugins = {"disabled": ["graph"]} if "no loaded plugin" in words else ()
    async with open_memory(tmp_path / "b", plugins=plugins) as memory:
        with pytest.raises(InputError) as caught:
            await import_jsonl(memory, path)
        assert (await memory.stats())["memories"] == 0
        if not plugins:
            assert await store_sql(memory, "SELECT COUNT(*) FROM graph_nodes") == [(0,)]
    assert words in str(caught.value) and caught.value.field == field


def _edge_twice(lines: list[dict[str, Any]]) -> None:
    lines.append(dict(next(line for line in lines if line.get("section") == "graph.edges")))


def _edge_of(spoil: Any) -> Any:
    def spoiled(lines: list[dict[str, Any]]) -> None:
        spoil(next(line for line in lines if line.get("section") == "graph.edges"))

    return spoiled


@pytest.mark.parametrize(
    ("spoil", "field"),
    [
        (_edge_of(lambda edge: edge.update(status="bogus")), "graph.edges[0]"),  # a CHECK
        (_edge_of(lambda edge: edge.update(confidence=7)), "graph.edges[0]"),  # a CHECK
        (_edge_of(lambda edge: edge.update(subject_id=999)), "graph.edges[0]"),  # a reference
        (_edge_twice, "graph.edges[-1]"),  # one id twice: the copy, last
    ],
)
async def test_a_record_its_table_refuses_is_named_and_nothing_is_written(
    tmp_path: Path, spoil: Any, field: str
) -> None:
    """Each value well formed, the row refused by the table's own constraints: met before at the
    write, after the memories' commit, it left the memories imported without their graph."""
    path, lines = await _export_with_a_fact(tmp_path)
    spoil(lines)
    write_export(path, lines)
    async with open_memory(tmp_path / "b") as memory:
        with pytest.raises(InputError) as caught:
            await import_jsonl(memory, path)
        assert (await memory.stats())["memories"] == 0
        assert await store_sql(memory, "SELECT COUNT(*) FROM graph_nodes") == [(0,)]
    edges = sum(line.get("section") == "graph.edges" for line in lines)
    assert caught.value.field == field.replace("[-1]", f"[{edges - 1}]")
    said = str(caught.value)
    assert "refuses it" in said or "names a row that neither" in said or "in the section twice" in said


@pytest.mark.parametrize(
    ("declared", "dialect", "bits"),
    [
        ("INTEGER", "sqlite", 64),
        ("integer", "postgres", 32),
        ("bigint", "postgres", 64),
        ("smallint", "postgres", 16),
        ("double precision", "postgres", 64),
    ],
)
def test_an_integer_column_takes_what_its_database_holds(declared: str, dialect: str, bits: int) -> None:
    column = Column("n", _kind(declared), _bits(declared, dialect))
    assert column.bits == bits
    if column.kind == "integer":
        assert column.check((1 << (bits - 1)) - 1) is None
        assert column.check(-(1 << (bits - 1))) is None
        assert column.check(1 << (bits - 1)) == f"must fit in a {bits}-bit integer"
        assert column.check(-(1 << (bits - 1)) - 1) == f"must fit in a {bits}-bit integer"
    else:
        assert column.check(1 << 63) == "must fit in a 64-bit integer"
