"""The HTTP API of ``narrmem serve`` against the real app on a real store: every endpoint, every
error class, tenant keys, and the store unchanged after every refused request."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from _helpers import answer_status, msg, read_posted, store_fingerprint

from narrmem.clock import ManualClock
from narrmem.doors import transfer
from narrmem.doors.cli import main
from narrmem.doors.person_export import export_person
from narrmem.doors.server import KeyFile, KeyRing, WebhookOptions, create_app
from narrmem.doors.server.events import event_id
from narrmem.doors.server.openapi import render
from narrmem.doors.transfer import export_store
from narrmem.errors import ConfigError, InputError
from narrmem.memory import Memory
from narrmem.models import TriggerEvent
from narrmem.testing import open_memory
from narrmem.tools import tool_schemas

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DOCS = Path(__file__).parent.parent / "docs" / "openapi.json"


async def fingerprint(memory: Memory) -> list[Any]:
    """Everything a request could change: rows, history, plugin state, graph tables."""
    return await store_fingerprint(memory, keyword_tables=False)


class Server:
    def __init__(self, memory: Memory, folder: Path, client: httpx.AsyncClient) -> None:
        self.memory = memory
        self.folder = folder
        self.client = client

    async def refused(self, status: int, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The request gets ``status`` and leaves the store as it was."""
        before = await fingerprint(self.memory)
        response = await self.client.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        assert await fingerprint(self.memory) == before
        return response


async def _server(folder: Path, **app_options: Any) -> AsyncIterator[Server]:
    async with open_memory(folder, clock=ManualClock(NOW)) as memory:
        app = create_app(memory, **app_options)
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            yield Server(memory, folder, client)


@pytest.fixture
async def srv(tmp_path: Path) -> AsyncIterator[Server]:
    async for server in _server(tmp_path / "m"):
        yield server


TIRED = ["so tired today", "so tired again today", "still so tired today", "tired today again"]


# --- writing --------------------------------------------------------------------------------


async def test_ingest_is_idempotent_and_recall_explains(srv: Server) -> None:
    c = srv.client
    first = await c.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    assert first.status_code == 200
    body = first.json()
    assert body["layer"] == "scene" and body["stored"] and len(body["memory_ids"]) == 2
    again = (await c.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))).json()
    assert again["duplicate"] and not again["stored"]
    hits = (
        await c.post("/v1/recall", json={"query": "quit job", "scope": {"user_id": "u1"}, "explain": True})
    ).json()
    assert hits and hits[0]["message_ids"] == ["m1"]
    assert hits[0]["why"]["matched"] and hits[0]["why"]["dense"] > 0.2
    plain = (await c.post("/v1/recall", json={"query": "quit job", "scope": {"user_id": "u1"}})).json()
    assert [h["id"] for h in plain] == [h["id"] for h in hits] and plain[0]["why"] is None
    assert (await c.get("/v1/stats")).json()["memories"] == 2


async def test_ts_left_out_is_the_memory_clock_now_over_http_and_tools(srv: Server) -> None:
    data = msg("m1", "I love hiking in the mountains")
    del data["ts"]
    result = (await srv.client.post("/v1/ingest", json=data)).json()
    history = (await srv.client.get(f"/v1/memories/{result['memory_ids'][0]}/history")).json()
    assert datetime.fromisoformat(history["memory"]["created_at"]) == NOW
    tool = await srv.client.post("/v1/tools/narrmem_ingest", json={**data, "message_id": "m2"})
    assert tool.status_code == 200 and tool.json()["stored"]
    # The Python API stays strict.
    with pytest.raises(InputError, match="ts"):
        await srv.memory.ingest(data)


async def test_ingest_can_answer_on_receipt_or_once_written_and_a_bad_mode_is_422(srv: Server) -> None:
    c = srv.client
    pixel = msg("m1", "I adopted a greyhound named Pixel")
    refused = await srv.refused(422, "POST", "/v1/ingest?acknowledge=later", json=pixel)
    assert refused.json()["detail"][0]["loc"] == ["query", "acknowledge"]

    received = await c.post("/v1/ingest?acknowledge=on_receipt", json=pixel)
    assert received.status_code == 200, received.text
    body = received.json()
    assert body["stored"] and not body["written"] and not body["settled"] and body["memory_ids"] == []
    # This process's recall waits for what it received in the scope.
    hits = (await c.post("/v1/recall", json={"query": "greyhound", "scope": {"user_id": "u1"}})).json()
    assert [h["message_ids"] for h in hits] == [["m1"]]

    heard: list[TriggerEvent] = []

    async def hear(event: TriggerEvent) -> None:
        heard.append(event)

    srv.memory.on_trigger(hear)
    tired = [msg(f"t{i}", text) for i, text in enumerate(TIRED[:3])]
    written = (await c.post("/v1/ingest/batch?acknowledge=after_write", json={"messages": tired})).json()
    assert all(r["written"] and not r["settled"] and r["memory_ids"] for r in written)
    assert all(r["triggers"] == [] for r in written)
    await srv.memory.settle()
    # The trigger the third one made reached the callbacks afterwards, naming its message.
    assert [(e.label, e.cause_message_id) for e in heard] == [("tired", "t2")]


async def test_batch_stores_in_order_and_one_bad_message_stores_nothing(srv: Server) -> None:
    good = [msg(f"m{i}", f"I finally finished chapter {i} of my novel!") for i in range(3)]
    bad = [*good, {**msg("m9", "I adopted a cat"), "ts": "2026-05-04T09:12:00"}]
    response = await srv.refused(422, "POST", "/v1/ingest/batch", json={"messages": bad})
    assert any(e["loc"] == ["body", "messages", 3, "ts"] for e in response.json()["detail"])
    results = (await srv.client.post("/v1/ingest/batch", json={"messages": good})).json()
    assert [r["message_id"] for r in results] == ["m0", "m1", "m2"] and all(r["stored"] for r in results)


async def test_a_lone_surrogate_or_a_nan_in_a_body_is_422_naming_the_field(srv: Server) -> None:
    """What a client that cuts a string mid-emoji sends (a lone UTF-16 surrogate, a valid JSON
    escape) and what Python's json.dumps writes for a float that is not a number: refused naming
    the field, nothing stored. Before, pydantic refused them, and the answer, which echoed each
    error's input, could not be written as JSON: a 500."""
    json_type = {"Content-Type": "application/json"}
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    for path, body, field in [
        (
            "/v1/ingest",
            '{"text": "I adopted a cat \\ud83d", "user_id": "u1", "chat_id": "c1", "message_id": "s1"}',
            "text",
        ),
        (
            "/v1/ingest",
            '{"text": "I adopted a cat", "user_id": "u\\ud83d", "chat_id": "c1", "message_id": "s2"}',
            "user_id",
        ),
        (
            "/v1/ingest",
            '{"text": "a cat", "user_id": "u1", "chat_id": "c1", "message_id": "s3", "meta": {"k": NaN}}',
            "meta",
        ),
        ("/v1/recall", '{"query": "job \\ud83d", "scope": {"user_id": "u1"}}', "query"),
        ("/v1/recall", '{"query": "job", "scope": {"user_id": "u1"}, "k": NaN}', "k"),
        (
            "/v1/recall",
            '{"query": "job", "scope": {"user_id": "u1"}, "snippet_tokens": Infinity}',
            "snippet_tokens",
        ),
        ("/v1/forget", '{"user_id": "u\\ud83d"}', "user_id"),
    ]:
        response = await srv.refused(422, "POST", path, content=body.encode(), headers=json_type)
        detail = response.json()["detail"]
        assert any(field in error["loc"] for error in detail), (path, detail)
        assert all("input" not in error for error in detail)


async def test_batch_over_the_limit_is_413(tmp_path: Path) -> None:
    async for srv in _server(tmp_path / "m", max_batch=2):
        batch = {"messages": [msg(f"m{i}", "I adopted a cat") for i in range(3)]}
        response = await srv.refused(413, "POST", "/v1/ingest/batch", json=batch)
        assert "at most 2" in response.json()["detail"]


async def test_edit_delete_and_forget(srv: Server) -> None:
    c = srv.client
    await c.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    await c.post("/v1/ingest", json=msg("m2", "I adopted a greyhound named Pixel", chat="c2"))
    edited = (await c.post("/v1/edit", json=msg("m1", "I decided to stay at my job"))).json()
    assert edited["stored"]
    episodes = [r for r in edited["records"] if r["kind"] == "episode"]
    assert episodes[0]["meta"]["edits"][0]["text"] == "I decided to quit my job"
    deleted = (await c.post("/v1/messages/delete", json={"chat_id": "c2", "message_ids": ["m2"]})).json()
    assert deleted["memories"] >= 1
    assert (
        await c.post("/v1/recall", json={"query": "greyhound Pixel", "scope": {"user_id": "u1"}})
    ).json() == []
    counts = (await c.post("/v1/forget", json={"user_id": "u1"})).json()
    assert counts["memories"] >= 1
    assert (await c.get("/v1/users")).json() == []


async def test_reads_context_turn_summary_history_users_tools(srv: Server) -> None:
    c = srv.client
    stored = (await c.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))).json()
    await c.post("/v1/ingest", json=msg("m2", "I love hiking in the mountains", user="u2"))
    pack = (await c.post("/v1/context", json={"text": "should I quit my job?", "user_id": "u1"})).json()
    assert pack["hits"] and "quit my job" in pack["rendered"]
    turn = (
        await c.post("/v1/turn-context", json={"text": "my job", "user_id": "u1", "chat_id": "c1"})
    ).json()
    assert any(f["object"] == "quit their job" for f in turn["facts"])
    summary = (await c.get("/v1/summary", params={"user_id": "u1", "depth": 1})).json()
    assert "quit my job" in summary["retelling"]
    scene = stored["memory_ids"][1]
    history = (await c.get(f"/v1/memories/{scene}/history")).json()
    assert history["memory"]["kind"] == "scene" and history["projection"] and history["now"]
    users = (await c.get("/v1/users")).json()
    assert [(u["user_id"], u["scenes"]) for u in users] == [("u1", 1), ("u2", 0)]
    assert (await c.get("/v1/tenants")).json() == ["default"]
    tools = (await c.get("/v1/tools")).json()
    assert {"soul_narrative", "memory_recall"} <= {t["name"] for t in tools}
    listed = (await c.post("/v1/tools/soul_narrative", json={"action": "list", "user_id": "u1"})).json()
    assert [s["id"] for s in listed["scenes"]] == [scene]
    used = (await c.post("/v1/mark-used", json={"user_id": "u1", "memory_ids": [scene]})).json()
    assert "reinforced" in used
    assert (await c.post("/v1/decay", json={})).status_code == 200


async def test_people_kept_by_plugins_alone_are_listed_with_their_tenant(srv: Server) -> None:
    """A person the bot wrote a persona and facts of with tools, and of whom no message was
    kept, was in no list (nor their tenant), though the bot was given all of it."""
    c = srv.client
    for user in ("ann", "cat", "eve"):
        await c.post("/v1/ingest", json=msg(f"{user}1", f"I adopted a greyhound, says {user}", user=user))
    likes = {"subject": "user", "relation": "likes", "object": "jazz"}
    for user, tenant in (("bob", "default"), ("dan", "default"), ("zed", "tools")):
        commit = {"user_id": user, "chat_id": "c1", "tenant": tenant, "triplets": [likes]}
        assert (await c.post("/v1/tools/memory_commit", json=commit)).status_code == 200
    persona = {"user_id": "fay", "chat_id": "c2", "description": "a pirate who rhymes"}
    assert (await c.post("/v1/tools/persona_set", json=persona)).status_code == 200
    assert (await c.get("/v1/tenants")).json() == ["default", "tools"]
    listed = (await c.get("/v1/users", params={"tenant": "default"})).json()
    assert [(u["user_id"], u["plugins_only"], u["memories"]) for u in listed] == [
        ("ann", False, 1), ("bob", True, 0), ("cat", False, 1),
        ("dan", True, 0), ("eve", False, 1), ("fay", True, 0),
    ]  # fmt: skip
    # Page by page, each once.
    paged: list[str] = []
    after: str | None = None
    while True:
        params = {"tenant": "default", "limit": 2, **({"after": after} if after else {})}
        page = (await c.get("/v1/users", params=params)).json()
        if not page:
            break
        paged += [u["user_id"] for u in page]
        after = page[-1]["user_id"]
    assert paged == ["ann", "bob", "cat", "dan", "eve", "fay"]
    assert [u["user_id"] for u in (await c.get("/v1/users", params={"tenant": "tools"})).json()] == ["zed"]


async def test_export_streams_jsonl(srv: Server) -> None:
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    await srv.client.post("/v1/ingest", json=msg("m2", "I adopted a cat", tenant="other"))
    response = await srv.client.get("/v1/export", params={"tenant": "default"})
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert lines[0]["format"] == "narrmem-export" and lines[0]["dim"] == 384
    *memories, end = lines[1:]
    assert {line["tenant"] for line in memories} == {"default"} and len(memories) == 2
    assert all(line["vector"] for line in memories)
    # Last, the end line: a client whose download broke at a line's end knows it.
    assert end == {"section": "end", "lines": {"memories": 2}}
    everything = (await srv.client.get("/v1/export")).text
    # The whole store over HTTP is the same lossless export as `narrmem export` writes.
    await export_store(srv.memory, srv.folder / "whole.jsonl")
    assert everything == (srv.folder / "whole.jsonl").read_text(encoding="utf-8")
    memories = [json.loads(line) for line in everything.splitlines()[1:-1]]
    assert {line["tenant"] for line in memories if line["section"] == "memories"} == {"default", "other"}
    assert {line["section"] for line in memories} > {"memories"}


async def test_a_persons_export_streams_what_is_held_of_them_alone(srv: Server) -> None:
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    await srv.client.post("/v1/ingest", json=msg("m2", "I adopted a cat named Pixel", user="u2"))
    response = await srv.client.get("/v1/export/person", params={"user_id": "u1"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    header, *lines, end = [json.loads(line) for line in response.text.splitlines()]
    assert header["format"] == "narrmem-person" and (header["tenant"], header["user_id"]) == ("default", "u1")
    assert {line["user_id"] for line in lines if line["section"] == "memories"} == {"u1"}
    assert "Pixel" not in response.text and end["section"] == "end"
    # The same file as the library writes.
    await export_person(srv.memory, srv.folder / "u1.jsonl", tenant="default", user_id="u1")
    assert response.text == (srv.folder / "u1.jsonl").read_text(encoding="utf-8")
    await srv.refused(422, "GET", "/v1/export/person", params={"user_id": ""})
    await srv.refused(422, "GET", "/v1/export/person")


# --- errors ---------------------------------------------------------------------------------


async def test_bad_requests_are_4xx_naming_the_problem_and_change_nothing(srv: Server) -> None:
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    headers = {"content-type": "application/json"}
    bad_json = await srv.refused(400, "POST", "/v1/ingest", content=b'{"text": ', headers=headers)
    assert bad_json.json()["detail"][0]["type"] == "json_invalid"
    unknown = await srv.refused(422, "POST", "/v1/ingest", json={**msg("m2", "hi there"), "colour": "red"})
    assert unknown.json()["detail"][0]["loc"] == ["body", "colour"]
    wrong = await srv.refused(
        422, "POST", "/v1/recall", json={"query": "x", "scope": {"user_id": "u1"}, "k": 0}
    )
    assert wrong.json()["detail"][0]["loc"] == ["body", "k"]
    no_scope = await srv.refused(422, "POST", "/v1/forget", json={})
    assert "user_id or chat_id" in json.dumps(no_scope.json())
    huge = await srv.refused(413, "POST", "/v1/ingest", content=b"x" * 2_100_000, headers=headers)
    assert "exceeds" in huge.json()["detail"]
    tool_arg = await srv.refused(
        422, "POST", "/v1/tools/soul_narrative", json={"action": "fly", "user_id": "u1"}
    )
    assert tool_arg.json()["field"] == "action"
    missing = await srv.refused(
        422, "POST", "/v1/tools/soul_narrative", json={"action": "get", "user_id": "u1"}
    )
    assert missing.json()["field"] == "id"
    await srv.refused(404, "POST", "/v1/tools/no_such_tool", json={})
    await srv.refused(404, "GET", "/v1/memories/999/history")
    not_object = await srv.refused(422, "POST", "/v1/tools/soul_narrative", json=[1, 2])
    assert not_object.json()["detail"][0]["loc"] == ["body"]
    # A number is not a time (it was read as seconds since 1970), nor "5" a number, nor 1 a yes.
    for ts in (0, 1.5, "0", "1700000000"):
        for path in ("/v1/ingest", "/v1/edit", "/v1/tools/narrmem_ingest"):
            refused = await srv.refused(422, "POST", path, json={**msg("m9", "I moved to Porto"), "ts": ts})
            assert "ts" in json.dumps(refused.json()) and "ISO 8601" in json.dumps(refused.json())
    for field, value in (("k", "5"), ("k", True), ("reinforce", 0), ("reinforce", "no")):
        body = {"query": "x", "scope": {"user_id": "u1"}, field: value}
        assert (await srv.refused(422, "POST", "/v1/recall", json=body)).json()["detail"][0]["loc"] == [
            "body",
            field,
        ]


async def test_a_bounded_chunked_body_is_413(tmp_path: Path) -> None:
    async for srv in _server(tmp_path / "m", max_body_bytes=4096):

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b" " * 1000

        before = await fingerprint(srv.memory)
        response = await srv.client.post(
            "/v1/ingest", content=chunks(), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and await fingerprint(srv.memory) == before


async def test_read_only_store_refusal_is_409(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as writer:
        await writer.ingest(msg("m1", "I decided to quit my job"))
        async with open_memory(tmp_path / "m", read_only=True) as reader:
            app = create_app(reader)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
                response = await c.post("/v1/mark-used", json={"user_id": "u1", "memory_ids": [1]})
                assert response.status_code == 409 and "read-only" in response.json()["detail"]


# --- keys -----------------------------------------------------------------------------------


async def test_a_key_reaches_only_its_tenant(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    _, key_a = KeyFile(folder).create("A")
    entry_b, key_b = KeyFile(folder).create("B")
    ring = KeyRing.in_folder(folder, reload_seconds=0)
    async for srv in _server(folder, keys=ring):
        a = {"Authorization": f"Bearer {key_a}"}
        b = {"X-API-Key": key_b}
        stored = await srv.client.post(
            "/v1/ingest", json=msg("m1", "I decided to quit my job", tenant="B"), headers=b
        )
        assert stored.status_code == 200
        scene = stored.json()["memory_ids"][1]
        # Tenant A's key on tenant B: 403, nothing read or written.
        for method, path, kwargs in [
            ("POST", "/v1/ingest", {"json": msg("m2", "I adopted a cat", tenant="B")}),
            ("POST", "/v1/recall", {"json": {"query": "job", "scope": {"tenant": "B", "user_id": "u1"}}}),
            ("POST", "/v1/forget", {"json": {"tenant": "B", "user_id": "u1"}}),
            (
                "POST",
                "/v1/messages/delete",
                {"json": {"tenant": "B", "chat_id": "c1", "message_ids": ["m1"]}},
            ),
            (
                "POST",
                "/v1/tools/soul_narrative",
                {"json": {"tenant": "B", "action": "forget", "user_id": "u1", "id": scene}},
            ),
            ("GET", "/v1/users", {"params": {"tenant": "B"}}),
            ("GET", "/v1/export", {"params": {"tenant": "B"}}),
            ("GET", "/v1/export/person", {"params": {"tenant": "B", "user_id": "u1"}}),
            ("GET", f"/v1/memories/{scene}/history", {"params": {"tenant": "B"}}),
            ("POST", "/v1/decay", {"json": {}}),
        ]:
            response = await srv.refused(403, method, path, headers=a, **kwargs)
            assert "tenant" in response.json()["detail"]
        # Left out, the tenant is the key's own: A sees nothing of B.
        assert (
            await srv.client.post("/v1/recall", json={"query": "job", "scope": {"user_id": "u1"}}, headers=a)
        ).json() == []
        await srv.refused(404, "GET", f"/v1/memories/{scene}/history", headers=a)
        assert (await srv.client.get("/v1/tenants", headers=a)).json() == ["A"]
        assert (await srv.client.get("/v1/stats", headers=a)).json()["memories"] == 0
        exported = (await srv.client.get("/v1/export", headers=a)).text.splitlines()
        assert len(exported) == 2 and json.loads(exported[1]) == {"section": "end", "lines": {}}  # nothing
        person = (await srv.client.get("/v1/export/person", params={"user_id": "u1"}, headers=a)).text
        assert [json.loads(line)["section"] for line in person.splitlines()[1:]] == ["end"]
        theirs = (await srv.client.get("/v1/export/person", params={"user_id": "u1"}, headers=b)).text
        assert "quit my job" in theirs and json.loads(theirs.splitlines()[0])["tenant"] == "B"
        # No key, a wrong key, a revoked key: 401.
        await srv.refused(401, "GET", "/v1/users")
        await srv.refused(401, "GET", "/v1/users", headers={"X-API-Key": key_b[:-1] + "x"})
        KeyFile(folder).revoke(entry_b.id)
        await srv.refused(401, "GET", "/v1/users", headers=b)


async def test_a_key_file_that_goes_away_does_not_open_the_server(tmp_path: Path) -> None:
    """Keys required once stay required: a key file moved or deleted while the server runs leaves
    no key valid, instead of every tenant's memories open to anyone without a key."""
    folder = tmp_path / "m"
    folder.mkdir()
    _, key_b = KeyFile(folder).create("B")
    ring = KeyRing.in_folder(folder, reload_seconds=0)
    async for srv in _server(folder, keys=ring):
        b = {"X-API-Key": key_b}
        stored = await srv.client.post(
            "/v1/ingest", json=msg("m1", "I decided to quit my job", tenant="B"), headers=b
        )
        assert stored.status_code == 200
        await srv.refused(401, "GET", "/v1/users")
        moved = tmp_path / "keys-elsewhere.json"
        KeyFile(folder).path.rename(moved)
        for method, path, kwargs in [
            ("GET", "/v1/users", {"params": {"tenant": "B"}}),
            ("GET", "/v1/export", {}),
            ("POST", "/v1/recall", {"json": {"query": "job", "scope": {"tenant": "B", "user_id": "u1"}}}),
            ("POST", "/v1/decay", {"json": {}}),
        ]:
            await srv.refused(401, method, path, **kwargs)
            await srv.refused(401, method, path, headers=b, **kwargs)
        assert ring.required
        moved.rename(KeyFile(folder).path)  # back: its keys work again
        users = await srv.client.get("/v1/users", params={"tenant": "B"}, headers=b)
        assert users.status_code == 200 and users.json()


def test_keys_command_stores_only_a_salted_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "d")
    assert main(["keys", "create", "--tenant", "T", "--data", data, "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    text = (tmp_path / "d" / "server-keys.json").read_text()
    assert created["key"] not in text and created["key"].split("_", 2)[2] not in text
    assert main(["keys", "list", "--data", data, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["id"] == created["id"] and "digest" not in listed
    assert main(["keys", "revoke", created["id"], "--data", data]) == 0
    assert json.loads((tmp_path / "d" / "server-keys.json").read_text())["keys"][0]["revoked_at"]
    assert main(["keys", "revoke", "nope", "--data", data]) == 2


def test_a_foreign_keys_file_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "server-keys.json").write_text('{"mine": true}')
    assert main(["keys", "create", "--tenant", "T", "--data", str(tmp_path)]) == 2
    assert "not a narrmem key file" in capsys.readouterr().err
    assert (tmp_path / "server-keys.json").read_text() == '{"mine": true}'


def test_serving_beyond_loopback_without_a_key_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--data", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "not a loopback address" in err and "narrmem keys create" in err
    assert not (tmp_path / "d").exists()  # refused before anything was opened


def test_a_webhook_that_is_not_a_url_is_refused_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, ``--webhook 'http://[::1'`` started the server, and its first event stopped the
    sender (the client refused the URL with an error it did not catch): every event lost, no word."""
    for url in ("http://[::1", "notaurl", "ftp://example.com/hook", "http://"):
        assert main(["serve", "--data", str(tmp_path / "d"), "--webhook", url]) == 2, url
        err = capsys.readouterr().err
        assert "webhook" in err, err
        assert not (tmp_path / "d").exists()  # refused before anything was opened
    with pytest.raises(InputError) as info:
        WebhookOptions(url="http://[::1")
    assert info.value.field == "webhook"


# --- events, CORS, schema -------------------------------------------------------------------


def _tired(i: int) -> dict[str, Any]:
    when = (NOW - timedelta(days=6 - i)).isoformat()
    return msg(f"t{i}", TIRED[i], user="tom", chat="dm-tom", ts=when)


async def test_trigger_events_stream_and_patterns(srv: Server) -> None:
    async def listen() -> str:
        response = await srv.client.get("/v1/events", params={"max_events": 1, "idle_seconds": 20})
        return response.text

    listener = asyncio.ensure_future(listen())
    await asyncio.sleep(0.2)
    results = [(await srv.client.post("/v1/ingest", json=_tired(i))).json() for i in range(4)]
    assert [len(r["triggers"]) for r in results] == [0, 0, 1, 0]
    text = await asyncio.wait_for(listener, 20)
    [data] = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    event = json.loads(data)
    # Each frame names its event: the id a webhook receives for it too.
    [frame_id] = [line[4:] for line in text.splitlines() if line.startswith("id: ")]
    assert frame_id == event_id(TriggerEvent.model_validate(event))
    assert (event["kind"], event["label"], event["user_id"]) == ("emotion", "tired", "tom")
    patterns = (await srv.client.get("/v1/patterns", params={"user_id": "tom"})).json()
    assert any(c["label"] == "tired" and c["count"] == 4 for c in patterns["counts"])
    assert [t["label"] for t in patterns["triggers"]] == ["tired"]
    await srv.client.post("/v1/forget", json={"user_id": "tom"})
    assert (await srv.client.get("/v1/patterns", params={"user_id": "tom"})).json() == {
        "counts": [],
        "triggers": [],
    }


async def test_webhook_is_retried_until_delivered(tmp_path: Path) -> None:
    received: list[dict[str, Any]] = []
    answers = iter([500, 200])

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers, body = await read_posted(reader)
        received.append({**body, "header": headers["idempotency-key"]})
        await answer_status(writer, next(answers, 200))

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    webhook = WebhookOptions(url=f"http://127.0.0.1:{port}/hook", attempts=3, backoff=0.05, timeout=5)
    try:
        async for srv in _server(tmp_path / "m", webhook=webhook):
            for i in range(3):
                await srv.client.post("/v1/ingest", json=_tired(i))
            hub = srv.client._transport.app.state.narrmem.hub  # type: ignore[attr-defined]
            await hub.drain(10)
            assert len(received) == 2  # refused once, then delivered
            assert received[1]["event"]["label"] == "tired" and hub.delivered == 1
            # The same event under the same id, in the body and as Idempotency-Key: a receiver
            # whose answer was lost keeps one of the two (there was no id to tell them apart).
            [first, second] = received
            assert first["id"] == second["id"] == first["header"] == second["header"]
            assert first["id"] == event_id(TriggerEvent.model_validate(first["event"]))
            await hub.close()
    finally:
        listener.close()
        await listener.wait_closed()


async def test_cors_is_off_by_default(tmp_path: Path) -> None:
    preflight = {"Origin": "http://elsewhere.test", "Access-Control-Request-Method": "POST"}
    async for srv in _server(tmp_path / "a"):
        response = await srv.client.options("/v1/recall", headers=preflight)
        assert "access-control-allow-origin" not in response.headers
    async for srv in _server(tmp_path / "b", cors_origins=["http://elsewhere.test"]):
        response = await srv.client.options("/v1/recall", headers=preflight)
        assert response.headers["access-control-allow-origin"] == "http://elsewhere.test"


async def test_any_origin_is_refused_on_a_server_without_keys(tmp_path: Path) -> None:
    """``--cors-origin '*'`` let every web page read the export and pass the preflight of a forget
    on a server without keys; with keys, a page still needs one."""
    async with open_memory(tmp_path / "m") as memory:
        with pytest.raises(ConfigError, match="cors-origin"):
            create_app(memory, cors_origins=["*"])
        with pytest.raises(ConfigError, match="cors-origin"):
            create_app(
                memory, cors_origins=["https://mine.example", "*"], keys=KeyRing.in_folder(tmp_path / "m")
            )
        KeyFile(tmp_path / "m").create("A")
        create_app(memory, cors_origins=["*"], keys=KeyRing.in_folder(tmp_path / "m", reload_seconds=0))
    serve = ["serve", "--data", str(tmp_path / "n"), "--cors-origin", "*", "--port", "0"]
    assert await asyncio.wait_for(asyncio.to_thread(main, serve), 60) == 2


def test_checked_in_openapi_schema_matches_the_app() -> None:
    # Regenerate with: python -m narrmem.doors.server.openapi docs/openapi.json
    assert DOCS.read_text(encoding="utf-8") == render()


@pytest.mark.slow
async def test_real_model_over_http(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as memory:
        app = create_app(memory)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
            await c.post(
                "/v1/ingest/batch",
                json={
                    "messages": [
                        msg("m1", "I decided to quit my job at the bank"),
                        msg("m2", "I adopted a greyhound named Pixel"),
                    ]
                },
            )
            hits = (
                await c.post(
                    "/v1/recall",
                    json={"query": "what pet do I have?", "scope": {"user_id": "u1"}, "explain": True},
                )
            ).json()
            assert hits[0]["message_ids"] == ["m2"] and hits[0]["why"]["dense"] > 0.3


async def test_a_closed_memory_is_503_not_an_empty_answer(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:
        await memory.ingest(msg("m1", "I decided to quit my job"))
        app = create_app(memory)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
        recall = await client.post("/v1/recall", json={"query": "quit job", "scope": {"user_id": "u1"}})
        assert recall.status_code == 503 and "closed" in recall.text
        ingest = await client.post("/v1/ingest", json=msg("m2", "I moved to Porto"))
        assert ingest.status_code == 503


async def test_context_reinforces_as_the_bots_recall_does_and_a_look_changes_nothing(tmp_path: Path) -> None:
    hippocampus = {"reinforce": True, "reinforce_min_similarity": 0.0}
    async with open_memory(
        tmp_path / "m", clock=ManualClock(NOW), plugin={"hippocampus": hippocampus}
    ) as memory:
        transport = httpx.ASGITransport(create_app(memory))
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            await client.post("/v1/ingest", json=msg("m1", "I decided to quit my job at the bank"))
            memory.clock.advance(days=3)  # reinforcements are spaced: not on the day a memory is made
            ask = {"text": "I decided to quit my job at the bank", "user_id": "u1"}
            before = await fingerprint(memory)
            looked = await client.post("/v1/context", json={**ask, "reinforce": False})
            assert looked.status_code == 200 and looked.json()["hits"]
            assert await fingerprint(memory) == before
            used = await client.post("/v1/context", json=ask)
            assert used.status_code == 200 and used.json()["hits"]
            assert await fingerprint(memory) != before  # the answer's memory gained importance


async def test_a_page_of_another_site_rebound_to_loopback_is_refused(tmp_path: Path) -> None:
    """DNS rebinding: a site whose name resolves to 127.0.0.1 is of the server's own origin to
    the browser, and read and forgot everything of a server without keys. `narrmem serve` takes
    only the names it is reached by."""
    from narrmem.doors.server.commands import allowed_hosts

    hosts = allowed_hosts("127.0.0.1", ["memory.example.org"])
    assert {"127.0.0.1", "localhost", "[::1]", "memory.example.org"} <= set(hosts)
    assert allowed_hosts("0.0.0.0", []) == ["*"]  # every name of the machine: keys are required there
    with pytest.raises(InputError):
        allowed_hosts("127.0.0.1", ["evil.example/x"])
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(msg("m1", "my PIN is 4711"))
        app = create_app(memory, allowed_hosts=hosts)
        transport = httpx.ASGITransport(app)
        for name, status in (("rebind.attacker.test", 400), ("localhost", 200), ("[::1]", 200)):
            async with httpx.AsyncClient(transport=transport, base_url=f"http://{name}:8765") as client:
                assert (await client.get("/v1/users")).status_code == status, name
                forgot = await client.post("/v1/forget", json={"user_id": "u1"})
                assert forgot.status_code == (400 if status == 400 else 200)
                if status == 400:
                    assert (await memory.stats())["memories"] == 1


async def test_the_inspector_runs_only_its_own_script_and_is_not_framed(srv: Server) -> None:
    page = await srv.client.get("/ui/")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-frame-options"] == "DENY"
    answer = await srv.client.get("/v1/stats")
    assert answer.headers["x-content-type-options"] == "nosniff"


def test_an_address_it_cannot_listen_on_is_an_error_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """uvicorn ended the process with exit code 3 (after "narrmem serving ..." was printed), and
    ``narrmem mcp --http 99999`` with a traceback and exit code 1, having made a store first."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--data", str(tmp_path / "d")]) == 2
        err = capsys.readouterr().err
        assert f"field '--host/--port': cannot listen on 127.0.0.1:{port}" in err, err
        assert "narrmem serving" not in err
        assert main(["mcp", "--http", f"127.0.0.1:{port}", "--data", str(tmp_path / "d")]) == 2
        assert f"field '--http': cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert main(["mcp", "--http", "99999", "--data", str(tmp_path / "m")]) == 2
    assert "field '--http': must be 1 to 65535" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    assert (
        main(["migrate", "--from", str(tmp_path / "d"), "--to", str(tmp_path / "e"), "--queries", "-5"]) == 2
    )
    assert "field '--queries'" in capsys.readouterr().err


async def test_an_export_refused_for_an_unfinished_forget_is_a_409_not_a_cut_stream(
    srv: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal came from inside the stream: a 200 whose body stopped after its header."""
    # A forget left unfinished on purpose: the export need not wait for it to end.
    monkeypatch.setattr(transfer, "FORGETS_WAIT_S", 0.2)
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to learn the cello"))
    await srv.memory.store.begin_forget(tenant="default", user_id="u1", chat_id=None)
    answer = await srv.client.get("/v1/export")
    assert answer.status_code == 409, answer.text
    assert "forget(s) not finished" in answer.json()["detail"]


async def test_an_internal_error_carries_the_headers_of_every_answer(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Starlette answers a 500 from its outermost middleware, which the security headers' missed."""
    async with open_memory(tmp_path / "m", clock=ManualClock(NOW)) as memory:

        async def broken() -> Any:
            raise RuntimeError("a bug")

        monkeypatch.setattr(memory, "stats", broken)
        transport = httpx.ASGITransport(create_app(memory), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            answer = await client.get("/v1/stats")
    assert answer.status_code == 500
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-frame-options"] == "DENY"


# --- the inspector's reads: paging, tenants, query strings (audit 2026-12) ------------------


async def test_users_page_with_after_the_last_user_id(srv: Server) -> None:
    """The users list stopped at ``limit`` (1000) with no way to the rest."""
    for n in (3, 1, 5, 2, 4):
        await srv.client.post("/v1/ingest", json=msg(f"m{n}", "I adopted a cat", user=f"u{n}"))
    await srv.client.post("/v1/ingest", json=msg("m9", "I adopted a cat", user="u0", tenant="other"))
    first = (await srv.client.get("/v1/users", params={"limit": 2})).json()
    assert [u["user_id"] for u in first] == ["u1", "u2"]
    pages = [first]
    for _ in range(3):  # bounded: a server that ignored after gave the first page forever
        after = pages[-1][-1]["user_id"]
        pages.append((await srv.client.get("/v1/users", params={"limit": 2, "after": after})).json())
        if len(pages[-1]) < 2:
            break
    assert [[u["user_id"] for u in page] for page in pages] == [["u1", "u2"], ["u3", "u4"], ["u5"]]
    for bad in ("", "u\x00", "u" * 300):
        refused = await srv.refused(422, "GET", "/v1/users", params={"after": bad})
        assert refused.json()["detail"][0]["loc"] == ["query", "after"], bad
    with pytest.raises(InputError) as info:
        await srv.memory.users(None, after="u1")
    assert info.value.field == "after"


async def test_tenants_come_from_the_store_not_from_a_capped_list_of_users(
    srv: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/v1/tenants`` was built from the first 100,000 users: the tenants after them vanished."""
    for tenant in ("zeta", "alpha", "default"):
        await srv.client.post("/v1/ingest", json=msg(f"m-{tenant}", "I adopted a cat", tenant=tenant))
    real_users = srv.memory.users

    async def capped(tenant: str | None = None, **options: Any) -> list[dict[str, Any]]:
        return (await real_users(tenant, **options))[:1]  # as the cap cut a store of many users

    monkeypatch.setattr(srv.memory, "users", capped)
    assert (await srv.client.get("/v1/tenants")).json() == ["alpha", "default", "zeta"]
    # A store without tenants() (a third-party one) is still listed, the old way.
    monkeypatch.setattr(srv.memory, "users", real_users)
    monkeypatch.delattr(type(srv.memory.store), "tenants")
    assert (await srv.client.get("/v1/tenants")).json() == ["alpha", "default", "zeta"]


async def test_query_values_that_are_not_utf8_are_422_naming_the_parameter(srv: Server) -> None:
    """Starlette decoded them with replacement: ``user_id=%FF`` read the id U+FFFD, never sent."""
    await srv.client.post("/v1/ingest", json=msg("m1", "I decided to quit my job"))
    for path, name in [
        ("/v1/users?tenant=%FF", "tenant"),
        ("/v1/users?after=%C3", "after"),
        ("/v1/summary?user_id=%FF", "user_id"),
        ("/v1/summary?user_id=%ED%A0%80", "user_id"),  # a lone surrogate, encoded as UTF-8 would
        ("/v1/patterns?depth=1&user_id=%FF%FE", "user_id"),
        ("/v1/memories/1/history?tenant=%FF", "tenant"),
        ("/v1/export?tenant=%C3", "tenant"),
        ("/v1/events?tenant=%80&max_events=1", "tenant"),
        ("/v1/ingest?acknowledge=%FF", "acknowledge"),
    ]:
        method = "POST" if path.startswith("/v1/ingest") else "GET"
        body = {"json": msg("m2", "I adopted a cat")} if method == "POST" else {}
        refused = await srv.refused(422, method, path, **body)
        assert refused.json()["detail"][0]["loc"] == ["query", name], path
    # What is UTF-8 is read as it was sent.
    fine = await srv.client.get("/v1/users?tenant=caf%C3%A9+bar")
    assert fine.status_code == 200 and fine.json() == []


async def test_soul_narrative_list_pages_with_before_id(srv: Server) -> None:
    """The inspector's timeline showed the newest 200 scenes (the tool's most) with no way on."""
    added = []
    for n in range(5):
        srv.memory.clock.advance(minutes=1)
        body = {"action": "add", "user_id": "u1", "event": f"I finished chapter {n}"}
        added.append((await srv.client.post("/v1/tools/soul_narrative", json=body)).json()["scenes"][0]["id"])
    listed: list[int] = []
    ask: dict[str, Any] = {"action": "list", "user_id": "u1", "k": 2}
    for _ in range(5):  # bounded, should a cursor not move on
        page = (await srv.client.post("/v1/tools/soul_narrative", json=ask)).json()
        listed += [s["id"] for s in page["scenes"]]
        if not page["more"]:
            break
        ask = {**ask, "before_id": listed[-1]}
    assert listed == added[::-1]
    for bad, status in ((999, 422), (0, 422), ("x", 422)):
        refused = await srv.refused(
            status, "POST", "/v1/tools/soul_narrative", json={**ask, "before_id": bad}
        )
        assert "before_id" in refused.text
    other = await srv.refused(
        422,
        "POST",
        "/v1/tools/soul_narrative",
        json={"action": "get", "user_id": "u1", "id": 1, "before_id": 1},
    )
    assert other.json()["field"] == "before_id"
    # Another user's scene is no cursor.
    await srv.client.post(
        "/v1/tools/soul_narrative", json={"action": "add", "user_id": "u2", "event": "hi there"}
    )
    theirs = (
        await srv.client.post("/v1/tools/soul_narrative", json={"action": "list", "user_id": "u2"})
    ).json()
    refused = await srv.refused(
        422, "POST", "/v1/tools/soul_narrative", json={**ask, "before_id": theirs["scenes"][0]["id"]}
    )
    assert refused.json()["field"] == "before_id"


async def test_task_chains_lists_every_chat_with_tasks(srv: Server) -> None:
    """The inspector looked for task chains in the chats of the user's facts only."""
    tool = "/v1/tools/task_create"
    for chat, task in (("work", "draft"), ("work", "review"), ("dm", "plan_trip")):
        body = {"user_id": "u1", "chat_id": chat, "task_id": task, "description": f"{task} it"}
        assert (await srv.client.post(tool, json=body)).status_code == 200
    body = {"user_id": "u2", "chat_id": "work", "task_id": "theirs", "description": "not u1's"}
    await srv.client.post(tool, json=body)
    await srv.client.post(tool, json={**body, "tenant": "other", "user_id": "u1"})
    before = await fingerprint(srv.memory)
    chains = (await srv.client.post("/v1/tools/task_chains", json={"user_id": "u1", "limit": 1})).json()
    assert await fingerprint(srv.memory) == before  # reading changes nothing
    assert {c["chat_id"]: (c["total"], [t["task_id"] for t in c["tasks"]]) for c in chains["chains"]} == {
        "work": (2, ["review"]),
        "dm": (1, ["plan_trip"]),
    }
    only = (await srv.client.post("/v1/tools/task_chains", json={"user_id": "u1", "chat_id": "dm"})).json()
    assert [c["chat_id"] for c in only["chains"]] == ["dm"]


async def test_the_patterns_caption_says_the_counts_are_read_from_the_store(srv: Server) -> None:
    page = (await srv.client.get("/ui/")).text
    assert "since it started" not in page
    assert "Read from the store" in page


# --- the OpenAPI document says what the server does (audit 2026-12-06) ----------------------

SHARED_ERROR_STATUSES = {"400", "401", "403", "409", "413", "422", "501", "503"}


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, methods in document["paths"].items()
        if path.startswith("/v1/")
        for method, operation in methods.items()
    ]


def _body_schema(document: dict[str, Any], path: str) -> dict[str, Any]:
    """The request body's schema of ``POST path``, its references resolvable."""
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


def _schema_takes(schema: dict[str, Any], body: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(body)


async def test_the_document_declares_both_ways_of_giving_a_key_on_every_call(tmp_path: Path) -> None:
    """No security scheme was declared: a client generated from the document sent no key."""
    document = json.loads(render())
    schemes = document["components"]["securitySchemes"]
    assert schemes["HTTPBearer"] == {**schemes["HTTPBearer"], "type": "http", "scheme": "bearer"}
    assert schemes["APIKeyHeader"] == {**schemes["APIKeyHeader"], "type": "apiKey", "in": "header"}
    assert schemes["APIKeyHeader"]["name"] == "X-API-Key"
    for method, path, operation in _operations(document):
        assert {"HTTPBearer": []} in operation["security"], (method, path)
        assert {"APIKeyHeader": []} in operation["security"], (method, path)
    # Read as before: the bearer key first, then X-API-Key; none needed without keys.
    folder = tmp_path / "m"
    folder.mkdir()
    _, key = KeyFile(folder).create("A")
    async for srv in _server(folder, keys=KeyRing.in_folder(folder, reload_seconds=0)):
        for headers, status in (
            ({"Authorization": f"Bearer {key}"}, 200),
            ({"X-API-Key": key}, 200),
            ({"Authorization": f"Bearer {key}", "X-API-Key": "nmk_wrong"}, 200),
            ({"Authorization": "Bearer nmk_wrong", "X-API-Key": key}, 401),
            ({"Authorization": f"Basic {key}", "X-API-Key": key}, 200),
            ({}, 401),
        ):
            response = await srv.client.get("/v1/tenants", headers=headers)
            assert response.status_code == status, headers
            if status == 401:
                assert response.headers["www-authenticate"] == "Bearer"
    async for srv in _server(tmp_path / "open"):
        assert (await srv.client.get("/v1/tenants")).status_code == 200


async def test_the_document_declares_the_errors_sent_and_every_body_names_its_field(tmp_path: Path) -> None:
    """400, 401, 403, 404, 409, 413, 501 and 503 were sent but not declared; a 403, 413 or 404
    said no field, nor did pydantic's 422s; and an InputError's list index was a string in loc."""
    document = json.loads(render())
    for method, path, operation in _operations(document):
        declared = set(operation["responses"])
        assert SHARED_ERROR_STATUSES <= declared, (method, path, SHARED_ERROR_STATUSES - declared)
        for status in SHARED_ERROR_STATUSES:
            content = operation["responses"][status]["content"]
            assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    assert "404" in document["paths"]["/v1/memories/{memory_id}/history"]["get"]["responses"]
    assert "404" in document["paths"]["/v1/tools/{name}"]["post"]["responses"]
    error_schema = {"$ref": "#/components/schemas/ErrorBody", "components": document["components"]}

    folder = tmp_path / "m"
    folder.mkdir()
    _, key_a = KeyFile(folder).create("A")
    a = {"Authorization": f"Bearer {key_a}"}
    async for srv in _server(folder, keys=KeyRing.in_folder(folder, reload_seconds=0), max_batch=1):
        stored = await srv.client.post("/v1/ingest", json=msg("m1", "I adopted a cat", tenant="A"), headers=a)
        assert stored.status_code == 200
        batch = {"messages": [msg(f"b{i}", "I adopted a cat", tenant="A") for i in range(2)]}
        expected: list[tuple[int, str, str, dict[str, Any], str | None]] = [
            (401, "GET", "/v1/users", {}, None),
            (403, "GET", "/v1/users", {"params": {"tenant": "B"}, "headers": a}, "tenant"),
            (403, "POST", "/v1/forget", {"json": {"tenant": "B", "user_id": "u1"}, "headers": a}, "tenant"),
            (413, "POST", "/v1/ingest/batch", {"json": batch, "headers": a}, "messages"),
            (404, "GET", "/v1/memories/999/history", {"headers": a}, "memory_id"),
            (404, "GET", "/v1/memories/0/history", {"headers": a}, "memory_id"),
            (404, "POST", "/v1/tools/no_such_tool", {"json": {}, "headers": a}, "name"),
            # pydantic's own 422s name the field as narrmem's do.
            (422, "POST", "/v1/forget", {"json": {}, "headers": a}, "chat_id"),
            (
                422,
                "POST",
                "/v1/recall",
                {"json": {"query": "cat", "scope": {}}, "headers": a},
                "scope.chat_id",
            ),
            (
                422,
                "POST",
                "/v1/ingest",
                {"json": {**msg("m2", "hi"), "colour": "red"}, "headers": a},
                "colour",
            ),
            (
                422,
                "POST",
                "/v1/messages/delete",
                {"json": {"chat_id": "c1", "message_ids": ["m1", 5]}, "headers": a},
                "message_ids[1]",
            ),
            (
                422,
                "POST",
                "/v1/ingest/batch",
                {"json": {"messages": [{**msg("b1", "hi"), "ts": "soon"}]}, "headers": a},
                "messages[0].ts",
            ),
            (422, "GET", "/v1/summary", {"params": {"depth": 1}, "headers": a}, "user_id"),
        ]
        for status, method, path, options, field in expected:
            response = await srv.refused(status, method, path, **options)
            body = response.json()
            assert body.get("field") == field, (path, body)
            assert _schema_takes(error_schema, body), (path, body)
        # An InputError's list index is an integer in loc, as pydantic writes one.
        for path, body, loc in (
            ("/v1/messages/delete", {"chat_id": "c1", "message_ids": ["m1", ""]}, ["body", "message_ids", 1]),
            (
                "/v1/tools/memory_commit",
                {"user_id": "u1", "chat_id": "c1", "triplets": [["user", "likes", "tea"]]},
                ["body", "triplets", 0],
            ),
        ):
            refused = (await srv.refused(422, "POST", path, json=body, headers=a)).json()
            assert refused["detail"][0]["loc"] == loc and refused["detail"][0]["type"] == "narrmem_input"
            assert _schema_takes(error_schema, refused)
        bad_json = await srv.refused(
            400, "POST", "/v1/ingest", content=b'{"text": ', headers={**a, "content-type": "application/json"}
        )
        assert _schema_takes(error_schema, bad_json.json()) and "field" not in bad_json.json()

    # The Host check's refusal is JSON in the same shape, not text/plain.
    async with open_memory(tmp_path / "h") as memory:
        app = create_app(memory, allowed_hosts=["localhost"])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://evil.test") as c:
            refused_host = await c.get("/v1/users")
            assert refused_host.status_code == 400
            assert refused_host.headers["content-type"] == "application/json"
            assert refused_host.json() == {"detail": "Invalid host header", "field": "host"}
            assert _schema_takes(error_schema, refused_host.json())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as c:
            assert (await c.get("/v1/users")).status_code == 200


async def test_streams_are_declared_in_the_media_type_they_are_sent_in(srv: Server) -> None:
    """The export and the event stream were declared as application/json."""
    document = json.loads(render())
    streams = [("/v1/export", "application/x-ndjson"), ("/v1/export/person", "application/x-ndjson")]
    for path, media_type in [*streams, ("/v1/events", "text/event-stream")]:
        responses = document["paths"][path]["get"]["responses"]
        assert responses["200"]["content"] == {media_type: {"schema": {"type": "string"}}}, path
        assert "ErrorBody" in responses["403"]["content"]["application/json"]["schema"]["$ref"]
    await srv.client.post("/v1/ingest", json=msg("m1", "I adopted a cat"))
    export = await srv.client.get("/v1/export")
    assert export.headers["content-type"].split(";")[0] == "application/x-ndjson"
    events = await srv.client.get("/v1/events", params={"idle_seconds": 0.05, "keepalive": 0.05})
    assert events.headers["content-type"].split(";")[0] == "text/event-stream"
    assert events.headers["cache-control"] == "no-store"


async def test_the_document_says_a_scope_needs_user_id_or_chat_id(srv: Server) -> None:
    """Bodies without either validated against the document and were refused with 422; the
    rule is said on the HTTP bodies only: the tools' schemas keep an object at their root."""
    document = json.loads(render())
    await srv.client.post("/v1/ingest", json=msg("m1", "I drink tea every morning"))
    cases: list[tuple[str, dict[str, Any], bool]] = [
        ("/v1/forget", {}, False),
        ("/v1/forget", {"user_id": None}, False),
        ("/v1/forget", {"tenant": "default", "chat_id": None, "user_id": None}, False),
        ("/v1/context", {"text": "tea?"}, False),
        ("/v1/mark-used", {"memory_ids": [1]}, False),
        ("/v1/recall", {"query": "tea", "scope": {"tenant": "default"}}, False),
        ("/v1/recall", {"query": "tea", "scope": {"user_id": None}}, False),
        ("/v1/context", {"text": "tea?", "chat_id": "c1"}, True),
        ("/v1/mark-used", {"memory_ids": [1], "user_id": "u1"}, True),
        ("/v1/recall", {"query": "tea", "scope": {"chat_id": "c1", "user_id": None}}, True),
        ("/v1/forget", {"user_id": "u-none"}, True),
    ]
    for path, body, valid in cases:
        assert _schema_takes(_body_schema(document, path), body) is valid, (path, body)
        response = await srv.client.post(path, json=body)
        assert response.status_code == (200 if valid else 422), (path, body, response.text)
    for tool in tool_schemas(srv.memory.tools, "openai"):
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object" and "anyOf" not in parameters, tool["function"]["name"]


async def test_list_items_carry_their_bounds_in_the_document(srv: Server) -> None:
    """The server refused "" or a 201-character message id and memory ids -1 or 2**63; the
    document took them. Its refusals keep their words and fields."""
    document = json.loads(render())
    delete, mark_used = _body_schema(document, "/v1/messages/delete"), _body_schema(document, "/v1/mark-used")
    for bad in ("", "m" * 201, "m\x00"):
        assert not _schema_takes(delete, {"chat_id": "c1", "message_ids": [bad]}), bad
        refused = (
            await srv.refused(
                422, "POST", "/v1/messages/delete", json={"chat_id": "c1", "message_ids": [bad]}
            )
        ).json()
        assert refused["field"] == "message_ids[0]"
        assert refused["detail"][0]["msg"].startswith("field 'message_ids[0]': must ")
    assert _schema_takes(delete, {"chat_id": "c1", "message_ids": ["m" * 200]})
    for bad_id in (-1, 0, 2**63):
        assert not _schema_takes(mark_used, {"user_id": "u1", "memory_ids": [bad_id]}), bad_id
        refused = (
            await srv.refused(422, "POST", "/v1/mark-used", json={"user_id": "u1", "memory_ids": [bad_id]})
        ).json()
        assert refused["field"] == "memory_ids[0]"
        assert refused["detail"][0]["msg"] == "field 'memory_ids[0]': must be a positive integer"
    assert _schema_takes(mark_used, {"user_id": "u1", "memory_ids": [2**63 - 1]})


async def test_ids_without_nul_and_the_range_of_ts_are_in_the_document(srv: Server) -> None:
    """An id with NUL and a ts outside 1900..3000 validated against the document and got 422.
    The schema says so now; validation and its messages are as they were, tools' too."""
    document = json.loads(render())
    ingest = _body_schema(document, "/v1/ingest")
    for field in ("user_id", "chat_id", "message_id", "tenant", "speaker"):
        body = {**msg("n1", "I adopted a cat"), field: "a\x00b"}
        assert not _schema_takes(ingest, body), field
        refused = (await srv.refused(422, "POST", "/v1/ingest", json=body)).json()
        assert refused["detail"][0]["msg"] == "Value error, must not hold a NUL character"
        assert refused["field"] == field
    assert _schema_takes(ingest, msg("n1", "I adopted a cat"))
    assert not _schema_takes(_body_schema(document, "/v1/forget"), {"user_id": "u\x00"})
    parameters = document["paths"]["/v1/summary"]["get"]["parameters"]
    assert next(p for p in parameters if p["name"] == "user_id")["schema"]["pattern"] == "^[^\\u0000]*$"
    ts = document["components"]["schemas"]["IncomingMessage"]["properties"]["ts"]["description"]
    assert "1900-01-01" in ts and "3000-01-01" in ts and "offset" in ts
    for when in ("0001-01-01T00:00:00+00:00", "3000-01-01T00:00:00+00:00"):
        refused = (await srv.refused(422, "POST", "/v1/ingest", json={**msg("n2", "hi"), "ts": when})).json()
        assert "must lie from 1900-01-01 up to 3000-01-01 (UTC)" in refused["detail"][0]["msg"]
    # The tools' arguments leave the hint out (a model's prompt would pay for it on every id),
    # and still refuse a NUL with the same words.
    ingest_tool = srv.memory.tools.get("narrmem_ingest").input_schema()
    assert ingest_tool["type"] == "object" and "pattern" not in ingest_tool["properties"]["user_id"]
    with pytest.raises(InputError, match="user_id: Value error, must not hold a NUL character"):
        await srv.memory.call_tool("narrmem_recall", {"query": "cat", "user_id": "a\x00b"})


async def test_stats_with_a_tenant_key_counts_every_user_not_one_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's /v1/stats summed one users() page of 100,000: a tenant of more was undercounted.
    Pages are made small here (a store that gives at most two users a call)."""
    import narrmem.doors.server.app as server_app

    folder = tmp_path / "m"
    folder.mkdir()
    _, key = KeyFile(folder).create("A")
    async for srv in _server(folder, keys=KeyRing.in_folder(folder, reload_seconds=0)):
        a = {"X-API-Key": key}
        for n in range(5):
            await srv.client.post(
                "/v1/ingest", json=msg(f"m{n}", "I adopted a cat", user=f"u{n}", tenant="A"), headers=a
            )
        await srv.client.post(
            "/v1/ingest", json=msg("s1", "I decided to quit my job", user="u3", tenant="A"), headers=a
        )
        whole = (await srv.client.get("/v1/stats", headers=a)).json()
        real_users = srv.memory.users

        async def two_at_most(
            tenant: str | None = None, *, limit: int = 1000, after: str | None = None, real: Any = real_users
        ) -> Any:
            return await real(tenant, limit=min(limit, 2), after=after)

        monkeypatch.setattr(srv.memory, "users", two_at_most)
        monkeypatch.setattr(server_app, "USERS_PAGE", 2, raising=False)
        paged = (await srv.client.get("/v1/stats", headers=a)).json()
        assert paged == whole == {"tenant": "A", "users": 5, "memories": 7, "scenes": 1}


# --- typed answers for generated clients (audit 2026-12-06, a TypeScript bot) ------------------

UNTYPED_ANSWERS = {("post", "/v1/tools/{name}")}  # each tool's output: its own schema in GET /v1/tools


def _answer_schema(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


def _typed(schema: dict[str, Any], components: dict[str, Any]) -> bool:
    """Whether a client generated from ``schema`` knows the answer's fields: no bare object."""
    if "$ref" in schema:
        return True
    if "anyOf" in schema:
        return all(_typed(s, components) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return _typed(schema["items"], components)
    if schema.get("type") == "object":
        extra = schema.get("additionalProperties")
        return isinstance(extra, dict) and _typed(extra, components) and "properties" not in schema
    return schema.get("type") in {"string", "integer", "number", "boolean"}


async def test_every_answer_is_typed_and_what_the_server_sends_fits_it(tmp_path: Path) -> None:
    """context, turn-context, summary, history, users, patterns and stats were declared as bare
    objects: a client generated from the document got ``unknown`` and cast; fields always sent
    (memory_ids, sources, why) were optional, so ``result.memory_ids.length`` did not compile."""
    document = json.loads(render())
    components = document["components"]["schemas"]
    for method, path, _operation in _operations(document):
        if (method, path) in UNTYPED_ANSWERS or path in {"/v1/export", "/v1/export/person", "/v1/events"}:
            continue
        schema = _answer_schema(document, method, path)
        assert _typed(schema, components), (method, path, schema)
    for name in ("IngestResult", "Hit", "Why", "PatternCount", "TriggerEvent", "ContextReply", "UserRow"):
        schema = components[name]
        assert set(schema["required"]) == set(schema["properties"]), name

    sent: list[tuple[str, str, Any]] = []

    async def answered(srv: Server, method: str, path: str, route: str, **options: Any) -> Any:
        response = await srv.client.request(method, path, **options)
        assert response.status_code == 200, (path, response.text)
        sent.append((method.lower(), route, response.json()))
        return response.json()

    folder = tmp_path / "m"
    folder.mkdir()
    _, key = KeyFile(folder).create("A")
    a = {"Authorization": f"Bearer {key}"}
    # aclosing: a failed step is reported (the server's generator left open hung the test).
    keyed = _server(folder, keys=KeyRing.in_folder(folder, reload_seconds=0))
    async with contextlib.aclosing(keyed) as servers:
        srv = await anext(servers)
        tired = {"messages": [{**_tired(i), "tenant": "A"} for i in range(4)]}
        await answered(srv, "POST", "/v1/ingest/batch", "/v1/ingest/batch", json=tired, headers=a)
        scene = msg("m1", "I decided to quit my job and move to Lisbon", tenant="A")
        await answered(srv, "POST", "/v1/ingest", "/v1/ingest", json=scene, headers=a)
        edited = {**msg("m1", "I decided to quit my job and move to Porto"), "tenant": "A"}
        await answered(srv, "POST", "/v1/edit", "/v1/edit", json=edited, headers=a)
        ask = {"query": "quit job", "scope": {"user_id": "u1"}, "explain": True}
        hits = await answered(srv, "POST", "/v1/recall", "/v1/recall", json=ask, headers=a)
        context = {"text": "quit my job", "user_id": "u1"}
        assert (await answered(srv, "POST", "/v1/context", "/v1/context", json=context, headers=a))["hits"]
        turn = {"text": "did I quit my job?", "user_id": "u1", "chat_id": "c1"}
        answer = await answered(srv, "POST", "/v1/turn-context", "/v1/turn-context", json=turn, headers=a)
        assert answer["facts"] and answer["memories"]
        summary = await answered(
            srv, "GET", "/v1/summary", "/v1/summary", params={"user_id": "u1"}, headers=a
        )
        assert summary["units"]
        memory_id = hits[0]["id"]
        route = "/v1/memories/{memory_id}/history"
        mark = {"memory_ids": [memory_id], "user_id": "u1"}
        await answered(srv, "POST", "/v1/mark-used", "/v1/mark-used", json=mark, headers=a)
        history = await answered(srv, "GET", f"/v1/memories/{memory_id}/history", route, headers=a)
        assert history["projection"]
        patterns = await answered(
            srv, "GET", "/v1/patterns", "/v1/patterns", params={"user_id": "tom"}, headers=a
        )
        assert patterns["counts"] and patterns["triggers"]
        for user in ("u2", "u3"):
            await srv.client.post(
                "/v1/ingest", json=msg(f"x-{user}", "I adopted a cat", user=user, tenant="A"), headers=a
            )
        page = await answered(srv, "GET", "/v1/users", "/v1/users", params={"limit": 2}, headers=a)
        rest = await answered(
            srv, "GET", "/v1/users", "/v1/users", params={"limit": 2, "after": page[-1]["user_id"]}, headers=a
        )
        assert [row["user_id"] for row in page + rest] == ["tom", "u1", "u2", "u3"]
        await answered(srv, "GET", "/v1/stats", "/v1/stats", headers=a)
        await answered(srv, "GET", "/v1/tenants", "/v1/tenants", headers=a)
        await answered(srv, "GET", "/v1/tools", "/v1/tools", headers=a)
        delete = {"chat_id": "dm-tom", "message_ids": ["t1"]}
        await answered(srv, "POST", "/v1/messages/delete", "/v1/messages/delete", json=delete, headers=a)
        await answered(srv, "POST", "/v1/forget", "/v1/forget", json={"user_id": "u3"}, headers=a)
    async with contextlib.aclosing(_server(tmp_path / "open")) as servers:
        srv = await anext(servers)
        await srv.client.post("/v1/ingest", json=msg("m1", "I adopted a cat"))
        stats = await answered(srv, "GET", "/v1/stats", "/v1/stats")
        assert "narrmem.server.forgets" in stats["plugins"]  # a name that stays the same after a restart
        await answered(srv, "POST", "/v1/decay", "/v1/decay", json={})
    for method, route, body in sent:
        errors = [
            e.message
            for e in jsonschema.Draft202012Validator(_answer_schema(document, method, route)).iter_errors(
                body
            )
        ]
        assert errors == [], (method, route, errors)
    assert {route for _, route, _ in sent} >= {
        path for method, path, _ in _operations(document) if method in {"get", "post"}
    } - {"/v1/export", "/v1/export/person", "/v1/events", "/v1/tools/{name}"}


async def test_the_document_helps_generated_clients(srv: Server) -> None:
    """A 422 was declared as FastAPI's HTTPValidationError (no ``field``: ``error.field`` did not
    compile), and not at all on calls without parameters; ``tenant`` declared the default
    "default", which generated clients filled in and a tenant's key was refused with 403; the
    "user_id or chat_id" rule sat beside properties or a $ref, which openapi-typescript turned
    into a union that took a body without ``text``, or dropped; operation ids were
    ``context_v1_context_post``; no servers, no tags; a validator's reason was sent as ``{}``."""
    document = json.loads(render())
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for _method, path, operation in _operations(document):
        content = operation["responses"]["422"]["content"]
        assert content == {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}, path
        assert (
            operation["operationId"] == operation["operationId"].lower()
            and "v1" not in operation["operationId"]
        )
    assert document["paths"]["/v1/turn-context"]["post"]["operationId"] == "turn_context"
    for name, schema in document["components"]["schemas"].items():
        if name.endswith("Body") or name in {"Scope", "IncomingMessage", "DeleteMessages", "IngestBatch"}:
            assert "default" not in schema.get("properties", {}).get("tenant", {}), name
            assert "anyOf" not in schema, name
    scope = document["components"]["schemas"]["RecallBody"]["properties"]["scope"]
    assert set(scope) == {"allOf"} and scope["allOf"][0] == {"$ref": "#/components/schemas/Scope"}
    assert document["servers"] and {tag["name"] for tag in document["tags"]} == {
        tag for methods in document["paths"].values() for op in methods.values() for tag in op["tags"]
    }
    refused = await srv.refused(422, "POST", "/v1/recall", json={"query": "cat", "scope": {"user_id": None}})
    assert refused.json()["detail"][0]["ctx"] == {"error": "a scope needs user_id or chat_id (or both)"}
    not_utf8 = await srv.refused(422, "GET", "/v1/stats?x=%FF")
    assert not_utf8.json()["field"] == "x"


def test_an_event_id_is_what_the_event_says() -> None:
    """The same firing, made again (the hooks of its message run again at an open after a stop),
    has the same id; another firing (a higher count, other messages) another."""
    said = {
        "kind": "emotion",
        "label": "tired",
        "count": 3,
        "user_id": "tom",
        "chat_id": "dm",
        "message_ids": ["t0", "t1", "t2"],
        "cause_message_id": "t2",
        "suggestion": "Is something wearing you down?",
    }
    event = TriggerEvent.model_validate(said)
    assert event_id(TriggerEvent.model_validate({**said, "suggestion": "reworded"})) == event_id(event)
    for other in ({"count": 4}, {"message_ids": ["t1", "t2", "t3"]}, {"tenant": "acme"}, {"user_id": "ann"}):
        assert event_id(TriggerEvent.model_validate({**said, **other})) != event_id(event), other
