"""``narrmem mcp`` as a third-party client meets it, with the official SDK's client over stdio: a chosen
subset of tools (``--tools`` or ``[mcp] tools``), ``ts`` left out of an ingest, a user's persona and
summary as resources, and the memory guide prompt."""

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
from _helpers import msg, store_fingerprint
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from narrmem import InputError, Scope
from narrmem.doors.mcp_server import PROMPT, TOOL_GROUPS, memory_guide, resource_uri, select_tools
from narrmem.testing import open_memory

pytestmark = pytest.mark.slow

ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}
USER = "ana:1/x"  # a user id that must be percent-encoded in a resource address
CORE_AND_PERSONA = {*TOOL_GROUPS["core"], *TOOL_GROUPS["persona"]}


def _server(data: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "narrmem.doors.cli", "mcp", "--data", str(data), *extra], env=ENV
    )


async def test_a_subset_of_tools_resources_and_the_guide_over_stdio(tmp_path: Path) -> None:
    async with Client(_server(tmp_path / "data", "--tools", "core,persona")) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert listed == CORE_AND_PERSONA
        refused = await client.call_tool("memory_commit", {"user_id": USER, "triplets": []})
        assert refused.is_error and "not served" in refused.content[0].text

        # No ts: the memory's clock says when (the Python API stays strict).
        said = {
            "text": "I adopted a greyhound named Pixel",
            "user_id": USER,
            "chat_id": "c1",
            "message_id": "m1",
        }
        ingested = await client.call_tool("narrmem_ingest", said)
        assert not ingested.is_error, ingested.content
        assert ingested.structured_content["stored"] is True
        persona = {"description": "a cheerful librarian", "tone": "warm", "user_id": USER}
        assert not (await client.call_tool("persona_set", persona)).is_error

        resources = {r.uri: r for r in (await client.list_resources()).resources}
        assert set(resources) == {resource_uri(USER, "persona"), resource_uri(USER, "summary")}
        assert "ana%3A1%2Fx" in resource_uri(USER, "summary")
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert templates == {"narrmem://users/{user_id}/persona", "narrmem://users/{user_id}/summary"}
        persona_text = (await client.read_resource(resource_uri(USER, "persona"))).contents[0].text
        assert "cheerful librarian" in persona_text
        # A chat's own persona too: one set for a single chat read "(no persona set)".
        pirate = {"description": "a pirate who rhymes", "user_id": USER, "chat_id": "c7"}
        assert not (await client.call_tool("persona_set", pirate)).is_error
        persona_text = (await client.read_resource(resource_uri(USER, "persona"))).contents[0].text
        assert "cheerful librarian" in persona_text and "In chat c7: a pirate who rhymes" in persona_text
        summary_text = (await client.read_resource(resource_uri(USER, "summary"))).contents[0].text
        assert "greyhound" in summary_text.lower()
        with pytest.raises(MCPError, match="unknown resource"):
            await client.read_resource("narrmem://users/ana/diary")

        [prompt] = (await client.list_prompts()).prompts
        assert prompt.name == PROMPT and {a.name for a in prompt.arguments or []} == {"user_id", "chat_id"}
        guide = await client.get_prompt(PROMPT, {"user_id": USER, "chat_id": "c1"})
        text = guide.messages[0].content.text
        assert "narrmem_recall" in text and "narrmem_ingest" in text and "persona_get" in text
        assert "memory_commit" not in text  # only what is served
        assert f"user_id '{USER}'" in text
        with pytest.raises(MCPError, match="unknown prompt"):
            await client.get_prompt("nope")

    async with open_memory(tmp_path / "data", real_model=True, read_only=True) as memory:
        [episode] = [
            r for r in await memory.store.recent(Scope(user_id=USER), limit=10) if r.kind == "episode"
        ]
    assert abs(episode.created_at - datetime.now(UTC)) < timedelta(minutes=10)


async def test_config_chooses_the_tools_and_a_bad_name_is_an_error(tmp_path: Path) -> None:
    config = tmp_path / "narrmem.toml"
    config.write_text('[mcp]\ntools = ["rtm", "narrmem_recall"]\n', encoding="utf-8")
    async with Client(_server(tmp_path / "data", "--config", str(config))) as client:
        listed = {t.name for t in (await client.list_tools()).tools}
    assert listed == {*TOOL_GROUPS["rtm"], "narrmem_recall"}


def _tools(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "narrmem.doors.cli", "tools", *args, "--data", str(data)]
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300, check=False)


def test_tools_prints_a_group_and_a_bad_name_exits_2(tmp_path: Path) -> None:
    done = _tools(tmp_path / "d", "--tools", "core,grph")
    assert done.returncode == 2 and "'grph'" in done.stderr and "groups: all, core, graph" in done.stderr
    printed = _tools(tmp_path / "d", "--format", "mcp", "--tools", "tasks")
    assert printed.returncode == 0, printed.stderr
    assert sorted(t["name"] for t in json.loads(printed.stdout)) == sorted(TOOL_GROUPS["tasks"])
    # Printing schemas writes nothing: it made a store in a folder that held none.
    assert not (tmp_path / "d").exists()


async def test_tools_prints_beside_a_running_bot_and_leaves_its_store_as_it_was(tmp_path: Path) -> None:
    """The bot holds its folder (one writer per folder): before, ``narrmem tools`` opened it for
    writing and was refused ("in use by process ...") where the read commands work."""
    async with open_memory(tmp_path / "d", real_model=True) as bot:
        await bot.ingest(msg("m1", "I adopted a cat"))
        before = await store_fingerprint(bot)
        printed = await asyncio.to_thread(_tools, tmp_path / "d", "--tools", "core")
        assert printed.returncode == 0, printed.stderr
        assert sorted(t["function"]["name"] for t in json.loads(printed.stdout)) == sorted(
            TOOL_GROUPS["core"]
        )
        assert await store_fingerprint(bot) == before


async def test_groups_cover_every_built_in_tool_once(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        names = memory.tools.names()
    grouped = [name for group in TOOL_GROUPS.values() for name in group]
    assert sorted(grouped) == sorted(names) and len(set(grouped)) == len(grouped)
    assert select_tools(names, ["all"]) == names
    assert select_tools(names, ["other", "core"]) == list(TOOL_GROUPS["core"])
    with pytest.raises(InputError) as caught:
        select_tools(names, ["triag"], field="mcp.tools")
    assert caught.value.field == "mcp.tools"
    assert "memory_commit" not in memory_guide(list(TOOL_GROUPS["core"]), "default", None, None)


def test_a_line_the_transport_refuses_is_answered_and_the_server_goes_on(tmp_path: Path) -> None:
    """Over stdio, a line the transport's JSON-RPC parser refuses (a lone UTF-16 surrogate, which a
    JavaScript client sends for half an emoji; a number of thousands of digits; broken JSON) got
    no answer at all, and the client waited until its own timeout. Each is now answered with an
    error (the field named when it can be), a notification gets none, and the server goes on."""
    import select

    command = [sys.executable, "-m", "narrmem.doors.cli", "mcp", "--data", str(tmp_path / "d")]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV)
    assert server.stdin is not None and server.stdout is not None

    def send(line: str) -> None:
        assert server.stdin is not None
        server.stdin.write(line.encode() + b"\n")
        server.stdin.flush()

    def answer(seconds: float = 60) -> dict[str, Any] | None:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], seconds)
        return json.loads(server.stdout.readline()) if ready else None

    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    call = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"narrmem_recall","arguments":%s}}'
    try:
        send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))
        assert answer() is not None
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        send(call % (2, '{"user_id":"u1","query":"hi \\ud800"}'))
        refused = answer()
        assert refused is not None and refused["id"] == 2 and refused["error"]["code"] == -32602
        assert "params.arguments.query" in refused["error"]["message"]
        send(call % (3, '{"user_id":"u1","query":"hi","k":%s}' % ("9" * 5000)))
        too_long = answer()
        assert too_long is not None and too_long["id"] == 3 and too_long["error"]["code"] == -32602
        assert "params.arguments.k" in too_long["error"]["message"]
        send('{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"reason":"\\ud800"}}')
        send("{not json")
        broken = answer()
        assert broken is not None and broken["id"] is None and broken["error"]["code"] == -32700
        send(call % (4, '{"user_id":"u1","query":"hi"}'))  # the notification got no answer
        fine = answer()
        assert fine is not None and fine["id"] == 4 and "result" in fine
    finally:
        server.stdin.close()
        server.wait(timeout=60)
