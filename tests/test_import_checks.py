"""A malformed export is refused whole, naming the line and the field, and the store keeps what it
held: text columns that hold JSON or a time are read as such (a graph node's props, an edge's
provenance and validity, a purge's touched edges, an RTM tree and its parameters), an edge stays in
its nodes' scope, an importance history row stays in [0, 1], a memory id stored with other content
is named by its line, and a file of a newer format says so. Each of these imported with exit code 0
before 2026-12-06 and broke a later recall, traversal or purge."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import msg, run_narrmem, store_fingerprint, write_export

from narrmem import InputError
from narrmem.clock import ManualClock
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.testing import open_memory

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SCOPE = {"user_id": "u1", "chat_id": "c1"}
STORY = (
    "Once upon a time a king ruled. A threat came. A knight rode out. She found a village. They made peace."
)
CLI_MODEL = "all-MiniLM-L6-v2-int7"  # the model a data folder opened by the CLI names


async def _fill(memory: Any, clock: ManualClock) -> None:
    """Memories, a graph with a purge, an RTM tree and importance history."""
    said = [
        ("m1", "I live in Lisbon and I work at a small design studio", 0),
        ("m2", "I love rock music, it gets me through the week", 0.5),
        ("m3", "rock music again tonight, a great rock concert downtown", 1),
    ]
    for message_id, text, days in said:
        clock.set(START + timedelta(days=days))
        await memory.ingest(msg(message_id, text, ts=(START + timedelta(days=days)).isoformat()))
    likes = {"subject": "user", "relation": "likes", "object": "jazz"}
    lives_in = {"subject": "user", "relation": "lives_in", "object": "Lisbon"}
    for name, arguments in [
        ("memory_commit", {"triplets": [likes], **SCOPE}),
        ("memory_commit", {"triplets": [lives_in], **SCOPE}),
        ("memory_purge", {"filters": {"object": "jazz"}, "mode": "soft", **SCOPE}),
        ("rtm_create_narrative_tree", {"text": STORY, "title": "K", "maxBranchingFactor": 3}),
    ]:
        await memory.call_tool(name, arguments)
    clock.set(START + timedelta(days=20))
    await memory.decay()
    hits = await memory.recall("what music do I love?", user_id="u1", reinforce=True)
    await memory.mark_used([hit.id for hit in hits], user_id="u1")


@pytest.fixture(scope="module")
def export_lines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """A full export's lines (built once, before any test's store is chosen)."""
    folder = tmp_path_factory.mktemp("source")

    async def build() -> None:
        clock = ManualClock(START)
        reinforce = {"hippocampus": {"reinforce": True}}
        async with open_memory(folder / "data", clock=clock, plugin=reinforce) as memory:
            await _fill(memory, clock)
            await export_store(memory, folder / "full.jsonl")

    asyncio.run(build())
    text = (folder / "full.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _first(lines: list[dict[str, Any]], section: str, where: Callable[[dict[str, Any]], bool] = bool) -> int:
    """The index in ``lines`` of the first line of ``section`` (that ``where`` takes): its line
    number in the file is one more."""
    return next(i for i, line in enumerate(lines) if line.get("section") == section and where(line))


async def _refused(folder: Path, bad: Path, good: Path | None = None) -> InputError:
    """Import ``bad`` into a store holding something of its own (and ``good``, if given); the
    error it raises, once the store is checked to hold what it held before."""
    async with open_memory(folder) as memory:
        await memory.store.state_put("mine", "k", {"v": 1})
        if good is not None:
            await import_jsonl(memory, good)
        before = await store_fingerprint(memory)
        with pytest.raises(InputError) as caught:
            await import_jsonl(memory, bad)
        assert await store_fingerprint(memory) == before
    return caught.value


# (section of the line changed, column, bad text, the error's words)
TEXT_COLUMNS = [
    ("graph.nodes", "props", "{oops", "JSON text of an object"),
    ("graph.edges", "provenance", "[[[", "JSON text of an array of strings"),
    ("graph.edges", "valid_from", "yesterday", "ISO-8601 time with a timezone"),
    ("graph.purges", "edges", "nope", "JSON text of an array"),
    ("rtm.trees", "tree", "garbage", "JSON text of an object"),
    ("rtm.trees", "params", "garbage", "JSON text of an object"),
    ("rtm.trees", "tree", '{"version": 1}', "is not a narrative tree"),
    (
        "rtm.trees",
        "tree",
        '{"clauses": ["a"], "language": "en", "nodes": {"start": [0], "end": [1], '
        '"depth": [0, 1], "parent": [-1], "summary": ["a"]}}',
        "is not a narrative tree",
    ),
]


@pytest.mark.parametrize(("section", "column", "bad", "words"), TEXT_COLUMNS)
async def test_a_text_column_that_is_not_what_it_holds_is_refused(
    tmp_path: Path, export_lines: list[dict[str, Any]], section: str, column: str, bad: str, words: str
) -> None:
    lines = copy.deepcopy(export_lines)
    index = _first(lines, section)
    lines[index][column] = bad
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == (f"{section}[0].{column}", index + 1)
    assert words in str(error)


async def test_an_edge_moved_out_of_its_nodes_scope_is_refused(
    tmp_path: Path, export_lines: list[dict[str, Any]]
) -> None:
    lines = copy.deepcopy(export_lines)
    index = _first(lines, "graph.edges")
    lines[index].update(tenant="t9", user_id="evil")
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == ("graph.edges[0].tenant", index + 1)
    assert "'t9'" in str(error) and "nodes' scope" in str(error)


@pytest.mark.parametrize("column", ["vector", "topic_vector"])
async def test_a_node_vector_not_of_the_models_size_is_refused(
    tmp_path: Path, export_lines: list[dict[str, Any]], column: str
) -> None:
    lines = copy.deepcopy(export_lines)
    index = _first(lines, "graph.nodes")
    lines[index][column] = base64.b64encode(np.ones(5, dtype=np.float32).tobytes()).decode("ascii")
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == (f"graph.nodes[0].{column}", index + 1)
    assert "float32" in str(error)


async def test_an_importance_history_row_past_one_is_refused(
    tmp_path: Path, export_lines: list[dict[str, Any]]
) -> None:
    lines = copy.deepcopy(export_lines)
    index = _first(lines, "importance", lambda line: bool(line["events"]))
    lines[index]["events"][0]["new"] = 1e300
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == ("events.0.new", index + 1)


async def test_a_memory_stored_with_other_content_is_named_by_its_line(
    tmp_path: Path, export_lines: list[dict[str, Any]]
) -> None:
    good = write_export(tmp_path / "good.jsonl", export_lines)
    lines = copy.deepcopy(export_lines)
    index = _first(lines, "memories", lambda line: line["id"] != lines[1]["id"])
    lines[index]["text"] = "something else entirely"
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path, good)
    assert (error.field, error.line) == ("id", index + 1)
    assert f"memory {lines[index]['id']} is already stored with other content" in str(error)


async def test_a_newer_format_says_so(tmp_path: Path, export_lines: list[dict[str, Any]]) -> None:
    lines = copy.deepcopy(export_lines)
    lines[0]["version"] = 4
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == ("version", 1)
    assert "written by a newer narrmem (format version 4; this one reads 1 to 3)" in str(error)


def test_the_cli_exits_2_and_keeps_the_store(tmp_path: Path, export_lines: list[dict[str, Any]]) -> None:
    lines = copy.deepcopy(export_lines)
    lines[0]["model"] = CLI_MODEL  # the same dimensions; importing embeds nothing
    good = write_export(tmp_path / "good.jsonl", lines)
    index = _first(lines, "graph.nodes")
    lines[index]["props"] = "{oops"
    # A new node (id and name), so that only its props are at fault.
    lines[index]["id"] = max(line["id"] for line in lines if line.get("section") == "graph.nodes") + 1
    lines[index]["name"] = "a node of its own"
    bad = write_export(tmp_path / "bad.jsonl", lines)
    data = str(tmp_path / "data")

    def narrmem(*args: str) -> Any:
        return run_narrmem(*args, "--data", data, cwd=tmp_path, env=os.environ)

    assert narrmem("import", str(good), "--json").returncode == 0
    assert narrmem("export", str(tmp_path / "before.jsonl")).returncode == 0
    refused = narrmem("import", str(bad), "--json")
    assert refused.returncode == 2, refused.stderr
    assert f"line {index + 1}" in refused.stderr and "graph.nodes[0].props" in refused.stderr
    assert narrmem("export", str(tmp_path / "after.jsonl")).returncode == 0
    assert (tmp_path / "after.jsonl").read_bytes() == (tmp_path / "before.jsonl").read_bytes()


NUL = "\0"
TOKEN = "0123456789abcdef" * 2
DECISION = {"layer": "episode", "reason": "imported"}
MESSAGE = {
    "text": "hi",
    "user_id": "u1",
    "chat_id": "c1",
    "message_id": "m9",
    "ts": "2026-03-02T09:00:00+00:00",
}
IDS = {"tenant": "default", "user_id": "u1", "chat_id": "c1", "message_id": "m9"}
# (namespace, key, value, the field named): plugin state each of whose writers would fail to read
# it back, in a forget (every later forget of anyone, for some) or at every open.
BAD_STATE = [
    ("triage.impacts", "x", {"user": "u1", "scenes": [1]}, "key"),
    ("triage.impacts", f"default{NUL}c1{NUL}m1{NUL}", {"user": "u1", "scenes": ["a"]}, "value.scenes"),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic{NUL}ab",
        {"fired_at": "yesterday", "count": 3},
        "value.fired_at",
    ),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic{NUL}ab",
        {"fired_at": "2026-03-02T09:00:00", "count": 3},
        "value.fired_at",
    ),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic{NUL}ab",
        {"fired_at": "2026-03-02T09:00:00+00:00", "count": "3"},
        "value.count",
    ),
    ("proactive", f"default{NUL}u1", {"firings": []}, "key"),
    ("proactive", f"default{NUL}u1{NUL}topic", {"firings": {}}, "value"),
    ("proactive", f"default{NUL}u1{NUL}topic", {"firings": [], "labels": ["garden"]}, "value"),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic",
        {"firings": [{"fired_at": "2026-03-02T09:00:00+00:00", "count": 3}]},
        "value.firings.0",
    ),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic",
        {"firings": [{"fired_at": "2026-03-02", "count": 3, "memories": [1]}]},
        "value.firings.0.fired_at",
    ),
    (
        "proactive",
        f"default{NUL}u1{NUL}topic",
        {"firings": [{"fired_at": "2026-03-02T09:00:00+00:00", "count": 3, "memories": ["1"]}]},
        "value.firings.0.memories",
    ),
    ("narrmem.settling", "x", {**IDS, "decision": DECISION}, "key"),
    (
        "narrmem.settling",
        f"{TOKEN}:{0:012d}:{0:06d}",
        {**IDS, "decision": {"layer": 5}},
        "value.decision.layer",
    ),
    ("narrmem.settling", f"{TOKEN}:{0:012d}:{0:06d}", {"decision": DECISION}, "value.tenant"),
    (
        "narrmem.inbox",
        f"{TOKEN}:1",
        {"message": {**MESSAGE, "ts": 0}, "decision": DECISION},
        "value.message.ts",
    ),
    ("narrmem.edits", f"{TOKEN}:1", {**IDS, "message_id": 7}, "value.message_id"),
    ("narrmem.edits", f"{TOKEN}:1", {**IDS, "message": {**MESSAGE, "message_id": "other"}}, "value.message"),
    ("narrmem.forget_again", "job-1/", {"only": [1]}, "namespace"),
]


@pytest.mark.parametrize(("namespace", "key", "value", "field"), BAD_STATE)
async def test_plugin_state_its_writer_could_not_read_is_refused(
    tmp_path: Path, export_lines: list[dict[str, Any]], namespace: str, key: str, value: Any, field: str
) -> None:
    lines = copy.deepcopy(export_lines)
    where = _first(lines, "importance")
    lines.insert(where, {"section": "state", "namespace": namespace, "key": key, "value": value})
    path = write_export(tmp_path / "bad.jsonl", lines)
    error = await _refused(tmp_path / "data", path)
    assert (error.field, error.line) == (field, where + 1), str(error)


async def test_plugin_state_as_written_is_imported(
    tmp_path: Path, export_lines: list[dict[str, Any]]
) -> None:
    lines = copy.deepcopy(export_lines)
    good = [
        ("triage.impacts", f"default{NUL}c1{NUL}m1{NUL}", {"user": "u1", "scenes": [1, 2]}),
        (
            "proactive",
            f"default{NUL}u1{NUL}topic{NUL}ab",
            {"fired_at": "2026-03-02T09:00:00+00:00", "count": 3},
        ),
        (
            "proactive",
            f"default{NUL}u1{NUL}value",
            {"firings": [{"fired_at": "2026-03-02T09:00:00+00:00", "count": 2, "memories": [1, 2]}]},
        ),
        ("narrmem.edits", f"{TOKEN}:1", {**IDS, "message": {**MESSAGE, "tenant": "default"}}),
        ("someone.elses", "any key", {"anything": [1, "x"]}),
    ]
    where = _first(lines, "importance")
    for namespace, key, value in good:
        lines.insert(where, {"section": "state", "namespace": namespace, "key": key, "value": value})
    path = write_export(tmp_path / "good.jsonl", lines)
    async with open_memory(tmp_path / "data") as memory:
        counts = await import_jsonl(memory, path)
        assert counts["state"] >= len(good)
        for namespace, key, value in good:
            assert await memory.store.state_get(namespace, key) == value


async def test_a_forget_and_an_open_get_past_state_they_cannot_read(tmp_path: Path) -> None:
    """State put by another way than an import (a store of an older narrmem, a hand-made
    migration): a forget and the next open go on, the entry set aside."""
    folder = tmp_path / "data"
    async with open_memory(folder) as memory:
        await memory.ingest(msg("m1", "I live in Lisbon and I work at a small design studio"))
        await memory.store.state_put("triage.impacts", "x", {"user": "u1", "scenes": ["a"]})
        await memory.store.state_put(
            "triage.impacts", f"default{NUL}c1{NUL}m1{NUL}", {"user": "u1", "scenes": ["a", None]}
        )
        await memory.store.state_put("narrmem.settling", "x", {"tenant": "default"})
        await memory.store.state_put("narrmem.settling", f"{'f' * 32}:{0:012d}:{0:06d}", {"decision": 1})
    async with open_memory(folder) as memory:
        assert await memory.store.state_items("narrmem.settling") == []
        await memory.forget_messages(chat_id="c1", message_ids=["m1"])
        await memory.ingest(msg("m2", "I moved to Porto last week"))
        await memory.forget(user_id="u1")
        assert await memory.recall("where do I live", user_id="u1") == []
