"""The MCP server, talked to by the official SDK's own client: over stdio (``narrmem mcp`` as a
subprocess) and over streamable HTTP on loopback. Every tool is listed with its schemas, answers a
valid call with structured content that matches its output schema, and answers bad calls with a
tool error that names the field."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, get_default_environment

from narrmem import Scope
from narrmem.testing import open_memory
from narrmem.tools import tool_schemas

pytestmark = pytest.mark.slow

STORY = (
    "Once upon a time a wise king ruled a small kingdom by the sea. A growing threat came from the "
    "north, and the king called his council. The youngest knight offered to ride out alone. She "
    "crossed the mountains in winter; she found the source of the threat. It was a starving village, "
    "not an army. The king sent grain instead of soldiers, and the kingdom had peace for a generation."
)
SCOPE = {"user_id": "u1", "chat_id": "c1"}
VALID: dict[str, dict[str, Any]] = {
    "narrmem_ingest": {
        "text": "I adopted a greyhound named Pixel",
        "ts": "2026-05-01T10:00:00+00:00",
        "message_id": "m1",
        **SCOPE,
    },
    "narrmem_recall": {"query": "what pet do I have?", "k": 3, **SCOPE},
    "soul_narrative": {
        "action": "add",
        "event": "Decided to leave the bank.",
        "category": "decision",
        **SCOPE,
    },
    "rtm_create_narrative_tree": {
        "text": STORY,
        "title": "The Lost Kingdom",
        "type": "story",
        "maxBranchingFactor": 4,
        "maxRecallDepth": 4,
    },
    "rtm_traverse_narrative": {"text": STORY, "title": "The Lost Kingdom", "traversalDepth": 1},
    "rtm_generate_ensemble": {"text": STORY, "title": "The Lost Kingdom", "ensembleSize": 50},
    "rtm_find_optimal_depth": {"text": STORY, "title": "The Lost Kingdom", "targetRecallLength": 3},
    "memory_commit": {
        "triplets": [{"subject": "idiom_chain_current", "relation": "content", "object": "为所欲为"}],
        **SCOPE,
    },
    "memory_recall": {"query_intent": "idiom_chain_current,content", "depth": 2, **SCOPE},
    "memory_facts": {"limit": 5, **SCOPE},
    "memory_purge": {"filters": {"subject": "nothing_like_this"}, "mode": "soft", "dry_run": True, **SCOPE},
    "task_create": {
        "task_id": "Task_idiom_chain",
        "description": "Idiom chain game",
        "info_nodes": ["idiom_chain_current"],
        **SCOPE,
    },
    "task_set_state": {"task_id": "Task_idiom_chain", "state": "paused", **SCOPE},
    "task_query": {"limit": 5, **SCOPE},
    "task_chains": {"limit": 5, **SCOPE},
    "persona_set": {"description": "a cheerful catgirl", "tone": "playful", **SCOPE},
    "persona_get": {**SCOPE},
    "context_rewrite": {
        "messages": [
            {"role": "user", "content": "what do you remember?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c0", "type": "function", "function": {"name": "memory_recall", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c0", "content": "{}"},
        ],
        "summary": "I made 1 tool call: memory_recall found nothing relevant.",
    },
}
SEED_TOOLS = {
    "memory_commit",
    "memory_purge",
    "memory_recall",
    "task_create",
    "task_set_state",
    "context_rewrite",
    "rtm_create_narrative_tree",
    "rtm_traverse_narrative",
    "rtm_generate_ensemble",
    "rtm_find_optimal_depth",
    "soul_narrative",
}


def _bad_calls(name: str, schema: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """(arguments, the field the error must name): an unknown field, a missing required one, and a
    wrong type, derived from the tool's own input schema."""
    valid = VALID[name]
    calls = [({**valid, "bogus_field": 1}, "bogus_field")]
    required = [r for r in schema.get("required", []) if r in valid]
    if required:
        calls.append(({k: v for k, v in valid.items() if k != required[0]}, required[0]))
    field = next(k for k, v in valid.items() if isinstance(v, str | int) and k in schema["properties"])
    calls.append(({**valid, field: {"not": "this type"}}, field))
    return calls


async def _exercise(client: Any, expected: set[str]) -> set[str]:
    listed = (await client.list_tools()).tools
    names = {t.name for t in listed}
    assert expected <= names
    for tool in listed:
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.name in VALID, f"no sample call for {tool.name}"
        result = await client.call_tool(tool.name, VALID[tool.name])
        assert not result.is_error, (tool.name, result.content)
        jsonschema.validate(result.structured_content, tool.output_schema)
        for arguments, field in _bad_calls(tool.name, tool.input_schema):
            bad = await client.call_tool(tool.name, arguments)
            assert bad.is_error, (tool.name, arguments)
            assert field in bad.content[0].text, (tool.name, field, bad.content[0].text)
    unknown = await client.call_tool("no_such_tool", {})
    assert unknown.is_error and "no_such_tool" in unknown.content[0].text
    other_tenant = await client.call_tool("narrmem_recall", {**VALID["narrmem_recall"], "tenant": "other"})
    assert other_tenant.is_error and "tenant" in other_tenant.content[0].text
    return names


async def test_stdio_server_with_the_sdk_client(tmp_path: Path) -> None:
    # The client passes the server a few variables only: narrmem's own (the test's store) go too.
    ours = {k: v for k, v in os.environ.items() if k.startswith("NARRMEM_")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "narrmem.doors.cli", "mcp", "--data", str(tmp_path / "data")],
        env={**get_default_environment(), **ours},
    )
    async with Client(params) as client:
        names = await _exercise(client, SEED_TOOLS | {"narrmem_ingest", "narrmem_recall"})
    assert names
    # The store survived every bad call: the valid ingest and the valid scene are there, no more.
    async with open_memory(tmp_path / "data", real_model=True, read_only=True) as mem:
        stored = await mem.store.recent(Scope(user_id=VALID["narrmem_recall"]["user_id"]), limit=50)
    assert sorted((r.kind, tuple(r.message_ids)) for r in stored) == [("episode", ("m1",)), ("scene", ())]


@pytest.mark.sqlite_only("a data folder held by the writing process")
async def test_read_only_beside_a_running_bot(tmp_path: Path) -> None:
    """`narrmem mcp --read-only` beside a bot that holds the store (a desktop assistant looking at
    the bot's memory): reads answer, with what the bot writes meanwhile, and every write is a tool
    error naming read-only that changes nothing. Before, the only way was a writable open, refused
    "in use"; a graph write failed quoting its SQL ("INSERT INTO graph_nodes ...")."""
    from narrmem.doors.mcp_server import resource_uri

    folder = tmp_path / "bot"
    ours = {k: v for k, v in os.environ.items() if k.startswith("NARRMEM_")}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "narrmem.doors.cli", "mcp", "--read-only", "--data", str(folder)],
        env={**get_default_environment(), **ours},
    )
    async with open_memory(folder, real_model=True) as bot:
        await bot.ingest_many([_said("m1", "I adopted a greyhound named Pixel")])
        await bot.call_tool("memory_commit", {**SCOPE, "triplets": [_LIKES_TEA]})
        pixel = (await bot.recall("greyhound", user_id="u1", reinforce=False))[0].id
        events = (await bot.history(pixel))["events"]
        async with Client(params) as client:
            # What the bot writes while the server runs is read, by its meaning too (the reader's
            # vector index was the one it opened with: a question sharing no word with the new
            # message did not find it).
            await bot.ingest_many([_said("m2", "I decided to quit my job at the bank")])
            await bot.ingest_many([_said("m3", "My sister moved to Lisbon")])
            before = await bot.store.table_counts()
            found = await client.call_tool("narrmem_recall", {"query": "did I quit my job?", **SCOPE})
            assert not found.is_error and "quit my job" in found.structured_content["hits"][0]["text"]
            family = await client.call_tool(
                "narrmem_recall", {"query": "where does her sibling live?", **SCOPE}
            )
            assert family.structured_content["hits"][0]["text"] == "My sister moved to Lisbon"
            assert family.structured_content["hits"][0]["sources"].get("vector") is not None
            pet = await client.call_tool("narrmem_recall", {"query": "what pet do I have?", **SCOPE})
            assert pet.structured_content["hits"][0]["id"] == pixel
            facts = await client.call_tool("memory_facts", SCOPE)
            assert {"tea", "quit their job at the bank"} == {
                f["object"] for f in facts.structured_content["facts"]
            }
            summary = await client.read_resource(resource_uri("u1", "summary"))
            assert "greyhound" in summary.contents[0].text
            for name in ("narrmem_ingest", "memory_commit", "soul_narrative", "rtm_create_narrative_tree"):
                refused = await client.call_tool(name, {**VALID[name], **_NEW.get(name, {})})
                assert refused.is_error and "read-only" in refused.content[0].text, (name, refused.content)
            assert await bot.store.table_counts() == before
        # The recalls reinforced nothing.
        assert (await bot.history(pixel))["events"] == events


_NEW = {"narrmem_ingest": {"message_id": "m9", "text": "I moved to Porto"}}
_LIKES_TEA = {"subject": "u1", "relation": "likes", "object": "tea"}


def _said(message_id: str, text: str) -> Any:
    from narrmem import Message

    return Message(text=text, ts="2026-05-01T10:00:00+00:00", message_id=message_id, **SCOPE)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_streamable_http_on_loopback(tmp_path: Path) -> None:
    port = _free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "narrmem.doors.cli",
        "mcp",
        "--http",
        f"127.0.0.1:{port}",
        "--data",
        str(tmp_path / "d"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        for _ in range(300):  # the model loads first: up to 30 s
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            await _exercise(client, SEED_TOOLS)
        # A client that initializes and never ends its session leaves nothing kept for it (one
        # kept per client, 30 minutes each, refused every new client past 10,000).
        hello = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "a bot", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient() as http:
            answer = await http.post(f"http://127.0.0.1:{port}/mcp", json=hello, headers=headers)
        assert answer.status_code == 200, answer.text
        assert "mcp-session-id" not in answer.headers
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=30)


async def test_schemas_for_function_calling(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        openai = tool_schemas(memory.tools, "openai")
        anthropic = tool_schemas(memory.tools, "anthropic")
        mcp = tool_schemas(memory.tools, "mcp")
        # A call an LLM produced, arguments as a JSON string.
        produced = json.dumps({"query": "pets", "user_id": "u1"})
        assert (await memory.call_tool("narrmem_recall", produced))["hits"] == []
    assert (
        {t["function"]["name"] for t in openai} == {t["name"] for t in anthropic} == {t["name"] for t in mcp}
    )
    recall = next(t for t in openai if t["function"]["name"] == "narrmem_recall")["function"]
    assert (
        recall["parameters"]["additionalProperties"] is False and "query" in recall["parameters"]["required"]
    )
    assert all("outputSchema" in t for t in mcp)
