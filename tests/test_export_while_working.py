"""An export made while the memory goes on working (ingest, recall, mark_used, forget), as
``/v1/export`` runs beside the bot: every line of the file names only what the file holds, a
forget that runs meanwhile fails the export instead of leaving its person in the file, a tenant's
export is not held up by (nor told of) another tenant's forget, and plugin sections are each one
plugin's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _helpers import msg

from narrmem import hookimpl
from narrmem.doors import transfer
from narrmem.doors.importing import import_jsonl
from narrmem.doors.server import KeyFile, KeyRing, create_app
from narrmem.doors.transfer import (
    END,
    IMPORTANCE,
    MEMORIES,
    export_header,
    export_store,
    export_text,
    no_forget_pending,
)
from narrmem.errors import PluginError, StoreError
from narrmem.memory import Memory
from narrmem.testing import open_memory

FILLED = 2500  # memories before the export: its memories section is read in three pages
# Recall and mark_used reinforce (the tests' default turns it off): used memories get history.
REINFORCING = {"hippocampus": {"reinforce": True}}


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://narrmem.test")


def _partials(target: Path) -> list[Path]:
    """What an export to ``target`` left of its file being written."""
    return list(target.parent.glob(f".{target.name}.*.partial"))


def _note(n: int, *, user: str = "u1", chat: str = "c1", tenant: str = "default") -> dict[str, Any]:
    return msg(
        f"m{n}",
        f"note {n}: my sister's wedding in Porto is on a sunny Saturday, and I adopted cat {n}",
        user=user,
        chat=chat,
        tenant=tenant,
    )


async def _filled(memory: Memory) -> None:
    await memory.ingest_many([_note(n, user=f"u{n % 7}", chat=f"c{n % 7}") for n in range(FILLED)])
    await memory.settle()
    # A used memory has importance history: the importance section begins with its line.
    first = await memory.recall("wedding in Porto", user_id="u0", chat_id="c0", reinforce=False)
    await memory.mark_used([hit.id for hit in first[:2]], user_id="u0", chat_id="c0")


async def _write(memory: Memory, path: Path, lines: AsyncIterator[tuple[str, str]]) -> dict[str, int]:
    """An export's file, written from ``lines`` as ``export_store`` writes it."""
    counts: dict[str, int] = {}
    with path.open("w", encoding="utf-8") as out:
        out.write(export_header(memory))
        async for section, text in lines:
            out.write(text)
            counts[section] = counts.get(section, 0) + 1
    return counts


async def _working_during(
    memory: Memory, lines: AsyncIterator[tuple[str, str]]
) -> AsyncIterator[tuple[str, str]]:
    """The export's lines; once its memories section is read (at the importance section's first
    line), the bot goes on: new memories, recalled and used."""
    worked = False
    async for section, text in lines:
        if section != MEMORIES and not worked:
            worked = True
            for n in range(3):
                await memory.ingest(_note(FILLED + n, user="late", chat="late"))
            await memory.settle()
            hits = await memory.recall("wedding in Porto", user_id="late", chat_id="late", reinforce=True)
            assert hits
            await memory.mark_used([hit.id for hit in hits], user_id="late", chat_id="late")
        yield section, text
    assert worked


async def test_an_export_made_while_the_bot_writes_imports(tmp_path: Path) -> None:
    """Memories written and used after the memories section was read have no line in it: their
    importance lines are left out as well (a line naming a memory the file lacks made the import
    refuse the whole file), and the file imports whole."""
    path = tmp_path / "during.jsonl"
    async with open_memory(tmp_path / "a", plugin=REINFORCING) as memory:
        await _filled(memory)
        counts = await _write(memory, path, _working_during(memory, export_text(memory)))
        late = await memory.recall("wedding in Porto", user_id="late", chat_id="late", reinforce=False)
    assert counts[MEMORIES] >= FILLED // 2 and counts[IMPORTANCE] >= 1 and counts[END] == 1
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    in_file = {line["id"] for line in lines if line["section"] == MEMORIES}
    assert late and not {hit.id for hit in late} & in_file  # written after the section was read
    assert {line["memory_id"] for line in lines if line["section"] == IMPORTANCE} <= in_file
    async with open_memory(tmp_path / "b") as fresh:
        imported = await import_jsonl(fresh, path)
    assert imported["imported"] == counts[MEMORIES]
    assert imported[IMPORTANCE] >= 1


class _ForgetsDuringExport:
    """Forgets ``user`` when the export's plugin sections are read (after the memories)."""

    narrmem_name = "forgets_during_export"

    def __init__(self) -> None:
        self.user: str | None = None

    @hookimpl
    async def narrmem_export_records(self, memory: Memory) -> dict[str, list[dict[str, Any]]] | None:
        if self.user is not None:
            user, self.user = self.user, None
            await memory.forget(user_id=user, tenant="B")
        return None


async def test_a_forget_during_an_export_fails_it_and_leaves_no_file(tmp_path: Path) -> None:
    """The forgotten person's memories were read before the forget: a file with them would bring
    them back on import. The export fails naming why, and neither the file nor its partial copy
    is left."""
    path = tmp_path / "export.jsonl"
    plugin = _ForgetsDuringExport()
    async with open_memory(tmp_path / "a", plugins=[plugin]) as memory:
        await memory.ingest_many([_note(n, user=f"u{n % 3}", tenant="B") for n in range(30)])
        await memory.settle()
        plugin.user = "u1"
        with pytest.raises(StoreError, match="forget ran while the export was read"):
            await export_store(memory, path)
        assert not path.exists()
        assert _partials(path) == []
        # Exported again once the forget is over: whole, without the person.
        await export_store(memory, path)
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    assert lines[-1]["section"] == END
    assert [line for line in lines if line["section"] == MEMORIES]
    assert not [line for line in lines if line.get("user_id") == "u1"]


async def test_a_forget_during_a_streamed_export_cuts_the_stream(tmp_path: Path) -> None:
    """Over HTTP the answer has begun (200) when the forget lands: the stream stops before its end
    line, so the client (and ``narrmem import``) knows the file is cut short."""
    folder = tmp_path / "m"
    folder.mkdir()
    plugin = _ForgetsDuringExport()
    async with open_memory(folder, plugins=[plugin]) as memory:
        await memory.ingest_many([_note(n, user=f"u{n % 3}", tenant="B") for n in range(30)])
        await memory.settle()
        plugin.user = "u1"
        app = create_app(memory)
        # As a client sees a server's answer: what was sent before the app failed (the ASGI
        # transport would otherwise raise the app's error instead).
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://narrmem.test") as client:
            answer = await client.get("/v1/export")
        assert answer.status_code == 200
        received = [json.loads(line) for line in answer.text.splitlines()]
        assert len(received) > 1  # the header and memories went out
        assert END not in {line.get("section") for line in received}
        # Python's own stream, the same.
        plugin.user = "u2"
        seen: list[str] = []
        with pytest.raises(StoreError, match="forget ran while the export was read"):
            async for section, _ in export_text(memory):
                seen.append(section)
        assert seen and END not in seen


class _FailingScrub:
    """Fails to scrub one user's copies: that user's forget stays recorded, not finished."""

    narrmem_name = "failing_scrub"

    @hookimpl
    async def narrmem_after_forget(self, user_id: str | None) -> None:
        if user_id == "alice-secret-id":
            raise RuntimeError("scrub failed")


async def _tenant_a_forget_pending(memory: Memory) -> None:
    await memory.ingest(msg("1", "I adopted a greyhound named Pixel", user="alice-secret-id", tenant="A"))
    await memory.ingest(msg("1", "I adopted a cat named Miso", user="bob", tenant="B"))
    await memory.settle()
    with pytest.raises(PluginError):
        await memory.forget(user_id="alice-secret-id", tenant="A")
    assert [job.tenant for job in await memory.store.pending_forgets()] == ["A"]


async def test_a_tenant_export_is_neither_blocked_nor_told_of_another_tenant_forget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant A's unfinished forget deletes nothing of tenant B's: B's export goes on, and no
    error shows B's caller A's scope. A's own export (and the whole store's) is refused."""
    # A forget left unfinished on purpose: the export need not wait for it to end.
    monkeypatch.setattr(transfer, "FORGETS_WAIT_S", 0.2)
    async with open_memory(tmp_path / "m", plugins=[_FailingScrub()]) as memory:
        await _tenant_a_forget_pending(memory)
        lines = [json.loads(text) async for _, text in export_text(memory, tenant="B")]
        assert [line["user_id"] for line in lines if line["section"] == MEMORIES] == ["bob"]
        await no_forget_pending(memory, tenant="B")
        for tenant in ("A", None):
            with pytest.raises(StoreError, match="forget"):
                async for _ in export_text(memory, tenant=tenant):
                    pass
        with pytest.raises(StoreError) as refused:
            async for _ in export_text(memory, tenant="A"):
                pass
        assert "alice-secret-id" in str(refused.value)  # tenant A's own caller is told its scope


async def test_a_tenant_key_export_over_http_ignores_another_tenant_forget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tenant B's key asks ``/v1/export`` while tenant A's forget is not finished: 200 with B's
    memories, and nothing of A's (its user's id above all) in the answer."""
    # A forget left unfinished on purpose: the export need not wait for it to end.
    monkeypatch.setattr(transfer, "FORGETS_WAIT_S", 0.2)
    folder = tmp_path / "m"
    folder.mkdir()
    _, key_a = KeyFile(folder).create("A")
    _, key_b = KeyFile(folder).create("B")
    async with open_memory(folder, plugins=[_FailingScrub()]) as memory:
        await _tenant_a_forget_pending(memory)
        app = create_app(memory, keys=KeyRing.in_folder(folder, reload_seconds=0))
        async with _client(app) as client:
            answer = await client.get("/v1/export", headers={"X-API-Key": key_b})
            assert "alice-secret-id" not in answer.text and "'A'" not in answer.text
            assert answer.status_code == 200, answer.text
            lines = [json.loads(line) for line in answer.text.splitlines()]
            assert [line["user_id"] for line in lines if line.get("section") == MEMORIES] == ["bob"]
            assert lines[-1]["section"] == END
            refused = await client.get("/v1/export", headers={"X-API-Key": key_a})
            assert refused.status_code == 409


class _Exports:
    """A plugin that exports the sections given."""

    def __init__(self, name: str, sections: dict[str, list[dict[str, Any]]]) -> None:
        self.narrmem_name = name
        self.sections = sections

    @hookimpl
    def narrmem_export_records(self) -> dict[str, list[dict[str, Any]]]:
        return self.sections


async def test_two_plugins_exporting_one_section_is_an_error_naming_both(tmp_path: Path) -> None:
    """One section of two plugins: merged, one plugin's records were dropped without a word."""
    plugins = [
        _Exports("notes", {"notes.more.rows": [{"a": 1}]}),
        _Exports("notes.more", {"notes.more.rows": [{"b": 2}]}),
    ]
    async with open_memory(tmp_path / "m", plugins=plugins) as memory:
        await memory.ingest(_note(1))
        with pytest.raises(PluginError, match=r"section 'notes\.more\.rows'") as refused:
            await export_store(memory, tmp_path / "export.jsonl")
        assert "'notes'" in str(refused.value) and "'notes.more'" in str(refused.value)
        assert not (tmp_path / "export.jsonl").exists()


async def test_a_section_outside_its_plugin_name_is_an_error(tmp_path: Path) -> None:
    """A section is named after its plugin (``graph.edges``): one named after another plugin's
    would be handed to that plugin on import."""
    async with open_memory(
        tmp_path / "m", plugins=[_Exports("notes", {"graph.edges": [{"a": 1}]})]
    ) as memory:
        with pytest.raises(PluginError, match=r"plugin 'notes' exports section 'graph\.edges'"):
            async for _ in export_text(memory):
                pass


def _forget_after_the_first_memory(memory: Memory, user: str, tenant: str) -> None:
    """Forget ``user`` of ``tenant`` once the store's export has given its first memory."""
    original = memory.store.export

    async def export(*args: Any, **kwargs: Any) -> Any:
        forgot = False
        async for item in original(*args, **kwargs):
            yield item
            if not forgot:
                forgot = True
                await memory.forget(user_id=user, tenant=tenant)

    memory.store.export = export  # type: ignore[method-assign]


async def test_a_tenant_export_goes_on_while_another_tenant_forgets(tmp_path: Path) -> None:
    """Tenant A's user forgotten while tenant B's export was read deleted nothing B's file holds:
    B's export failed all the same ("a forget ran while the export was read"), so a tenant's
    backup failed whenever any other tenant's user was forgotten meanwhile."""
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest_many([_note(n, user=f"u{n % 3}", tenant="B") for n in range(12)])
        await memory.ingest_many([_note(n, user="alice", tenant="A") for n in range(3)])
        await memory.settle()
        _forget_after_the_first_memory(memory, "alice", "A")
        lines = [json.loads(text) async for _, text in export_text(memory, tenant="B")]
        assert lines[-1]["section"] == END
        assert len([line for line in lines if line["section"] == MEMORIES]) == 12
        assert not await memory.recall("garden", user_id="alice", tenant="A", reinforce=False)


async def test_a_tenant_export_fails_when_its_own_exported_person_is_forgotten_meanwhile(
    tmp_path: Path,
) -> None:
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest_many([_note(n, user=f"u{n % 3}", tenant="B") for n in range(12)])
        await memory.settle()
        [first, *_] = [record async for record, _ in memory.store.export()]
        _forget_after_the_first_memory(memory, first.user_id or "", "B")
        with pytest.raises(StoreError, match="forget ran while the export was read"):
            async for _ in export_text(memory, tenant="B"):
                pass


@pytest.mark.sqlite_only("reads the SQLite log's bytes")
async def test_a_forget_while_an_export_reads_leaves_no_byte_in_the_log_once_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export reads a plugin's tables on a snapshot, which holds the log back: the forget's
    truncation of the log waited the writers' whole busy timeout in the write turn (every write
    held ten seconds), gave up without a word, and the forgotten words stayed in the log until
    the store was closed, weeks later for a bot that runs for weeks."""
    import asyncio

    from narrmem_plugins.storage_sqlite import store as sqlite_store

    monkeypatch.setattr(sqlite_store, "LOG_RETRY_S", 0.05, raising=False)
    folder = tmp_path / "m"

    def holding(needle: bytes) -> list[str]:
        return [path.name for path in folder.rglob("*") if path.is_file() and needle in path.read_bytes()]

    async with open_memory(folder) as memory:
        triplet = {"subject": "user", "relation": "likes", "object": "sailing boats"}
        await memory.call_tool("memory_commit", {"user_id": "bob", "chat_id": "g", "triplets": [triplet]})
        await memory.ingest(msg("a1", "my secret word is zanzibarquux forever", user="ann", chat="g"))
        await memory.settle()
        lines = export_text(memory)
        async for section, _ in lines:
            if section.startswith("graph."):
                break  # the export's reader waits, its snapshot held
        await memory.forget(user_id="ann")
        await lines.aclose()
        for _ in range(100):
            if not holding(b"zanzibarquux"):
                break
            await asyncio.sleep(0.05)
        assert holding(b"zanzibarquux") == []  # the memory still open


@pytest.mark.sqlite_only("reads the SQLite log's bytes")
async def test_a_log_a_reader_held_through_the_close_is_truncated_at_the_next_open(tmp_path: Path) -> None:
    folder = tmp_path / "m"

    def holding(needle: bytes) -> list[str]:
        return [path.name for path in folder.rglob("*") if path.is_file() and needle in path.read_bytes()]

    async with open_memory(folder) as memory:
        await memory.ingest(msg("a1", "my secret word is zanzibarquux forever", user="ann", chat="g"))
        await memory.settle()
        reading = memory.store.snapshot()
        await reading.__aenter__()  # a reader that outlives the store's close
        await memory.forget(user_id="ann")
    await reading.__aexit__(None, None, None)
    assert holding(b"zanzibarquux") == ["narrmem.sqlite3-wal"]  # the close could not empty it
    async with open_memory(folder):
        assert holding(b"zanzibarquux") == []
