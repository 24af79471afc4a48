"""Tool arguments are strict JSON: a value of the wrong JSON type is an InputError naming the field,
for every registered tool, through ``Memory.call_tool`` (a dict or JSON text) and through an MCP
client connected to the server in process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from mcp import Client

from narrmem import InputError, Memory
from narrmem.doors.mcp_server import build_server
from narrmem.testing import open_memory

U1 = {"user_id": "u1", "chat_id": "c1"}
# A string where JSON wants a number or a boolean, and a number where it wants a string.
WRONG = {"integer": "5", "number": "0.5", "boolean": "true", "string": 5}


@pytest_asyncio.fixture
async def mem(tmp_path: Path) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "m") as memory:
        yield memory


def scalar_fields(schema: dict[str, Any]) -> dict[str, str]:
    """Top-level properties of a tool's input schema with one scalar JSON type (optional or not)."""
    out = {}
    for name, prop in schema.get("properties", {}).items():
        types = {p.get("type") for p in prop.get("anyOf", [prop])} - {"null"}
        if len(types) == 1 and (kind := types.pop()) in WRONG:
            out[name] = kind
    return out


async def test_every_tool_refuses_a_value_of_the_wrong_json_type(mem: Memory) -> None:
    checked = 0
    for name in mem.tools.names():
        for field, kind in scalar_fields(mem.tools.get(name).input_schema()).items():
            for arguments in ({field: WRONG[kind]}, json.dumps({field: WRONG[kind]})):
                with pytest.raises(InputError) as info:
                    await mem.call_tool(name, arguments)
                message = str(info.value)
                assert f"{field}: " in message and "not the " in message, (name, field, message)
            checked += 1
    # Every tool family is covered: graph, RTM and the core tools.
    assert checked >= 40


async def test_every_tool_refuses_a_nul_in_an_id_and_names_the_field(mem: Memory) -> None:
    """PostgreSQL text cannot hold NUL: an id with one is refused by the tool's arguments, as the
    core's calls refuse it, not by the database once the tool runs."""
    checked = 0
    for name in mem.tools.names():
        fields = mem.tools.get(name).input_schema().get("properties", {})
        for field in ("user_id", "chat_id", "tenant"):
            if field not in fields:
                continue
            with pytest.raises(InputError) as info:
                await mem.call_tool(name, {field: "a\x00b"})
            assert f"{field}: Value error, must not hold a NUL character" in str(info.value), (name, field)
            checked += 1
    assert checked >= 20


WRONG_TYPES = [
    ("memory_recall", {**U1, "query_intent": "rock", "depth": "2"}, "depth"),
    ("memory_recall", {**U1, "query_intent": "rock", "include_speculative": "no"},
     "include_speculative"),
    ("memory_commit", {**U1, "triplets": [{"subject": "user", "relation": "likes", "object": "rock"}],
                       "speculative": "true"}, "speculative"),
    ("memory_commit", {**U1, "triplets": [{"subject": "user", "relation": "likes", "object": "rock",
                                           "confidence": "0.5"}]}, "triplets.0.confidence"),
    ("memory_purge", {**U1, "filters": {"relation": "likes"}, "dry_run": "true"}, "dry_run"),
    ("task_query", {**U1, "limit": "5"}, "limit"),
    ("rtm_traverse_narrative", {"text": "One. Two.", "title": "t", "traversalDepth": "1"},
     "traversalDepth"),
    ("rtm_generate_ensemble", {"text": "One. Two.", "title": "t", "ensembleSize": 1.0}, "ensembleSize"),
    ("narrmem_recall", {"query": "rock", "user_id": "u1", "k": "3"}, "k"),
    ("memory_recall", {"user_id": 7, "query_intent": "rock"}, "user_id"),
    ]  # fmt: skip


@pytest.mark.parametrize(("tool", "arguments", "field"), WRONG_TYPES)
async def test_wrong_types_name_the_field(
    mem: Memory, tool: str, arguments: dict[str, Any], field: str
) -> None:
    with pytest.raises(InputError) as info:
        await mem.call_tool(tool, arguments)
    assert info.value.field == field, str(info.value)


async def test_json_types_that_are_right_still_pass(mem: Memory) -> None:
    out = await mem.call_tool(
        "memory_recall",
        {**U1, "query_intent": "rock", "depth": 2, "include_speculative": False,
         "time_range": {"from": "2026-01-01T00:00:00+00:00"}},
    )  # fmt: skip
    assert out["edges"] == []
    # An integer is a fine JSON number for a float field.
    committed = await mem.call_tool(
        "memory_commit",
        {**U1, "triplets": [{"subject": "user", "relation": "likes", "object": "rock", "confidence": 1}]},
    )
    assert committed["triplets"][0]["confidence"] == 1.0


async def test_mcp_clients_get_the_same_typed_errors(mem: Memory) -> None:
    async with Client(build_server(mem)) as client:
        for tool, arguments, field in WRONG_TYPES:
            result = await client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            assert f"field '{field}'" in result.content[0].text, result.content[0].text
