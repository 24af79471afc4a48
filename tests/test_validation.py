"""Malformed input at every boundary is an ``InputError`` naming the field, and leaves the store unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, on_sqlite, store_count

import narrmem
from narrmem import InputError, Memory, Message, UnknownToolError
from narrmem.models import MAX_QUERY_CHARS, MAX_TEXT_CHARS
from narrmem.testing import open_memory


def _without(data: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != key}


GOOD = msg("good", "a perfectly valid message")

BAD_MESSAGES: list[tuple[str, dict[str, Any], str]] = [
    ("missing text", _without(GOOD, "text"), "text"),
    ("missing user_id", _without(GOOD, "user_id"), "user_id"),
    ("missing chat_id", _without(GOOD, "chat_id"), "chat_id"),
    ("missing ts", _without(GOOD, "ts"), "ts"),
    ("missing message_id", _without(GOOD, "message_id"), "message_id"),
    ("user_id is a number", {**GOOD, "user_id": 123}, "user_id"),
    ("text is a list", {**GOOD, "text": ["hello"]}, "text"),
    ("meta is a string", {**GOOD, "meta": "not an object"}, "meta"),
    ("naive timestamp", {**GOOD, "ts": "2026-05-04T09:12:00"}, "ts"),
    ("not a timestamp", {**GOOD, "ts": "yesterday"}, "ts"),
    ("oversized text", {**GOOD, "text": "x" * (MAX_TEXT_CHARS + 1)}, "text"),
    ("empty user_id", {**GOOD, "user_id": ""}, "user_id"),
    ("oversized chat_id", {**GOOD, "chat_id": "c" * 201}, "chat_id"),
    ("unknown field", {**GOOD, "colour": "blue"}, "colour"),
    ("empty tenant", {**GOOD, "tenant": ""}, "tenant"),
]


@pytest.mark.parametrize(("case", "data", "field"), BAD_MESSAGES, ids=[c for c, _, _ in BAD_MESSAGES])
async def test_bad_message_names_the_field_and_stores_nothing(
    tmp_path: Path, case: str, data: dict[str, Any], field: str
) -> None:
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest(msg("before", "stored before the bad message"))
        with pytest.raises(InputError) as info:
            await mem.ingest(data)
        assert info.value.field == field
        assert field in str(info.value)
        assert (await mem.stats())["memories"] == 1
        assert await store_count(mem, "memory_sources") == 1
        if on_sqlite(mem):  # PostgreSQL's keyword index is in the row itself
            assert await store_count(mem, "memories_fts") == 1


def test_message_model_rejects_naive_timestamp_directly() -> None:
    with pytest.raises(ValueError, match="ts"):
        Message(text="hi there", user_id="u", chat_id="c", ts=datetime(2026, 1, 1), message_id="1")
    ok = Message(
        text="hi there", user_id="u", chat_id="c", ts=datetime(2026, 1, 1, tzinfo=UTC), message_id="1"
    )
    assert ok.tenant == "default"


def test_text_at_the_limit_is_accepted() -> None:
    Message.model_validate({**GOOD, "text": "x" * MAX_TEXT_CHARS})


@pytest.mark.parametrize(
    ("case", "data", "field"), BAD_MESSAGES[::3], ids=[c for c, _, _ in BAD_MESSAGES[::3]]
)
async def test_one_bad_message_in_a_batch_stores_nothing(
    tmp_path: Path, case: str, data: dict[str, Any], field: str
) -> None:
    batch = [msg(f"ok{i}", f"good message number {i} about gardening") for i in range(5)]
    batch.insert(3, data)
    # A small batch size: earlier batches must not be written before the bad one is seen.
    async with open_memory(tmp_path / "store", storage={"batch_size": 2}) as mem:
        with pytest.raises(InputError) as info:
            await mem.ingest_many(batch)
        assert info.value.field == f"messages[3].{field}"
        assert f"messages[3].{field}" in str(info.value)
        stats = await mem.stats()
        assert stats["memories"] == 0 and stats["vectors_indexed"] == 0


async def test_message_objects_and_dicts_mix_in_a_batch(memory: Memory) -> None:
    results = await memory.ingest_many(
        [Message.model_validate(msg("1", "a model instance")), msg("2", "a plain dict")]
    )
    assert [r.stored for r in results] == [True, True]


async def test_meta_that_is_not_json_is_an_input_error(tmp_path: Path) -> None:
    """``meta`` is stored as JSON: a value JSON cannot hold must be rejected up front like any
    other bad field, before any batch is written."""
    batch = [msg(f"ok{i}", f"good message number {i}") for i in range(4)]
    batch.append(msg("bad", "meta holds a set", meta={"tags": {"a", "b"}}))
    async with open_memory(tmp_path / "store", storage={"batch_size": 2}) as mem:
        with pytest.raises(InputError) as info:
            await mem.ingest_many(batch)
        assert (info.value.field or "").startswith("messages[4].meta")
        assert await store_count(mem) == 0


# --- recall arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": "", "user_id": "u1"}, "query"),
        ({"query": "x" * (MAX_QUERY_CHARS + 1), "user_id": "u1"}, "query"),
        ({"query": "cats", "user_id": "u1", "k": 0}, "k"),
        ({"query": "cats", "user_id": "u1", "k": 201}, "k"),
        ({"query": "cats", "user_id": ""}, "scope.user_id"),
    ],
)
async def test_bad_recall_arguments(memory: Memory, kwargs: dict[str, Any], field: str) -> None:
    query = kwargs.pop("query")
    with pytest.raises(InputError) as info:
        await memory.recall(query, **kwargs)
    assert info.value.field is not None
    assert info.value.field.endswith(field.split(".")[-1])


async def test_recall_without_scope_names_the_missing_field(memory: Memory) -> None:
    with pytest.raises(InputError) as info:
        await memory.recall("cats")
    assert "user_id" in str(info.value) and "chat_id" in str(info.value)
    assert info.value.field in {"user_id", "chat_id", "scope", "user_id/chat_id"}, info.value.field


# --- tools --------------------------------------------------------------------------------------


async def test_tools_ingest_and_recall_with_dict_and_json_string(memory: Memory) -> None:
    out = await memory.call_tool("narrmem_ingest", msg("1", "I keep bees on the roof of my building"))
    assert out == {
        "message_id": "1",
        "layer": "accumulate",
        "stored": True,
        "duplicate": False,
        "reason": "says something about the user's world",
        "memory_ids": out["memory_ids"],
        "written": True,
    }
    assert len(out["memory_ids"]) == 1
    again = await memory.call_tool(
        "narrmem_ingest", json.dumps(msg("1", "I keep bees on the roof of my building"))
    )
    assert again["duplicate"] is True

    as_dict = await memory.call_tool("narrmem_recall", {"query": "bees roof", "user_id": "u1"})
    as_json = await memory.call_tool("narrmem_recall", '{"query": "bees roof", "user_id": "u1", "k": 3}')
    # Scores carry importance after decay at the moment of the call, so they differ by a hair.
    for a, b in zip(as_dict["hits"], as_json["hits"], strict=True):
        assert a.pop("score") == pytest.approx(b.pop("score"), rel=1e-6)
    assert as_dict == as_json
    [hit] = as_dict["hits"]
    assert hit["message_ids"] == ["1"] and hit["text"] == "I keep bees on the roof of my building"
    json.dumps(as_dict)  # JSON-ready
    # The chat scope works through the tool too; another user's scope does not see it.
    assert (await memory.call_tool("narrmem_recall", {"query": "bees", "chat_id": "c1"}))["hits"]
    assert (await memory.call_tool("narrmem_recall", {"query": "bees", "user_id": "u2"}))["hits"] == []


async def test_unknown_tool(memory: Memory) -> None:
    with pytest.raises(UnknownToolError) as info:
        await memory.call_tool("narrmem_nope", {"query": "x", "user_id": "u1"})
    assert isinstance(info.value, InputError)
    assert info.value.field == "name"
    assert "narrmem_recall" in str(info.value)  # lists the known tools


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"query": "bees", "user_id": "u1", "colour": "red"}, "colour"),
        ({"user_id": "u1"}, "query"),
        ({"query": "", "user_id": "u1"}, "query"),
        ({"query": "bees", "user_id": "u1", "k": 0}, "k"),
        ({"query": "bees", "user_id": "u1", "k": 51}, "k"),
        ({"query": "bees", "user_id": "u1", "k": "many"}, "k"),
        ({"query": "bees", "user_id": 5}, "user_id"),
        ("{not json", "arguments"),
        ("[1, 2, 3]", "arguments"),
        ('"a string"', "arguments"),
    ],
)
async def test_bad_tool_arguments_name_the_field(memory: Memory, arguments: Any, field: str) -> None:
    await memory.ingest(msg("1", "I keep bees on the roof"))
    with pytest.raises(InputError) as info:
        await memory.call_tool("narrmem_recall", arguments)
    assert info.value.field == field
    assert (await memory.stats())["memories"] == 1


async def test_tool_recall_without_scope_names_the_field(memory: Memory) -> None:
    with pytest.raises(InputError) as info:
        await memory.call_tool("narrmem_recall", {"query": "bees"})
    assert "user_id" in str(info.value)
    assert info.value.field in {"user_id", "chat_id", "scope", "user_id/chat_id"}, info.value.field


async def test_tool_ingest_validates_like_ingest(memory: Memory) -> None:
    with pytest.raises(InputError) as info:
        await memory.call_tool("narrmem_ingest", {**GOOD, "ts": "2026-05-04T09:12:00"})
    assert info.value.field == "ts"
    assert (await memory.stats())["memories"] == 0


async def test_input_error_is_a_value_error_and_narrmem_error() -> None:
    err = InputError("bad", field="text", line=3)
    assert isinstance(err, ValueError) and isinstance(err, narrmem.NarrmemError)
    assert str(err) == "line 3, field 'text': bad"
