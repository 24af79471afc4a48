"""``Memory.forget_memories``: a memory deleted by id (a scene forgotten with ``soul_narrative``'s
``forget``) goes as a forget's memories go: every plugin is told (``narrmem_after_delete``), its
words leave the files at the next purge (a close runs it), and the messages it came from stay.
Before, the tool deleted the row in the store alone: no plugin heard of it, and neither the
embedder's recent texts nor the purge a deleted message gets were reached."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _helpers import msg, on_sqlite

from narrmem import hookimpl
from narrmem.testing import open_memory

MARKER = b"zqlighthousekeeper"


class HearsDeletes:
    narrmem_name = "hears_deletes"

    def __init__(self) -> None:
        self.heard: list[tuple[str, list[int]]] = []

    @hookimpl
    def narrmem_after_delete(self, tenant: str, removed: list[Any]) -> None:
        self.heard.append((tenant, [r.id for r in removed]))


def _files_with(folder: Path, marker: bytes) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and marker in p.read_bytes()]


async def test_a_scene_forgotten_by_id_tells_the_plugins_and_leaves_the_files(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    ear = HearsDeletes()
    async with open_memory(folder, plugins=[ear]) as mem:
        await mem.ingest(msg("m1", "I adopted a greyhound named Pixel", user="ann"))
        added = await mem.call_tool(
            "soul_narrative",
            {"action": "add", "user_id": "ann", "event": f"Ann dreamt of being a {MARKER.decode()}"},
        )
        scene = added["scenes"][0]["id"]
        # Another user's id is out of scope: nothing happens to it.
        assert (await mem.forget_memories([scene], user_id="bob")) == {"memories": 0}
        assert ear.heard == []
        await mem.call_tool("soul_narrative", {"action": "forget", "user_id": "ann", "id": scene})
        assert ear.heard == [("default", [scene])]
        texts = [h.text for h in await mem.recall("greyhound Pixel", user_id="ann", reinforce=False)]
        sqlite = on_sqlite(mem)
    assert any("Pixel" in text for text in texts)  # the message's memories stay
    if sqlite:
        assert _files_with(folder, MARKER) == []


class FailsToHear:
    narrmem_name = "fails_to_hear"

    @hookimpl
    def narrmem_after_delete(self) -> None:
        raise RuntimeError("its own service is down")


async def test_a_plugin_that_fails_to_hear_a_delete_holds_no_other_back(tmp_path: Path) -> None:
    ear = HearsDeletes()
    async with open_memory(tmp_path / "store", plugins=[FailsToHear(), ear]) as mem:
        added = await mem.call_tool(
            "soul_narrative", {"action": "add", "user_id": "ann", "event": "Ann sailed to Zqisland"}
        )
        scene = added["scenes"][0]["id"]
        assert await mem.forget_memories([scene], user_id="ann") == {"memories": 1}
        errors = [(plugin, hook) for plugin, hook, _ in mem.host.errors]
    assert ear.heard == [("default", [scene])]
    assert ("fails_to_hear", "narrmem_after_delete") in errors
