"""A much-linked scene keeps a bounded record of what builds on it.

Each later scene that builds on an earlier one was added, by id, to the earlier scene's list of
what quotes it, for good, and each message quoted kept its plugin-state entry after its quote
fell out of the Impact (which shows the latest three): a scene a person kept coming back to grew
by one id, and the state by one entry per linked message, with every link. A person's forget read
every person's entries to find theirs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import decision_scene
from narrmem_plugins.triage.impacts import MAX_IMPACTS, NAMESPACE, QUOTED_KEPT, add_impact, drop_impacts

from narrmem.models import MemoryRecord, SceneDraft, Scope
from narrmem.testing import open_memory

START = dt.datetime(2026, 8, 1, 20, tzinfo=dt.UTC)
LINKS = QUOTED_KEPT + 6


def _scene(message_id: str, day: int, core: str) -> MemoryRecord:
    scene: MemoryRecord = decision_scene(message_id, day, core, START)
    return scene


async def test_a_much_linked_scene_keeps_its_latest_quotes_and_no_more(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        store = memory.store

        async def added(record: MemoryRecord) -> MemoryRecord:
            [memory_id] = await store.add([record], np.ones((1, memory.embedder.dim), dtype=np.float32))
            return (await store.get([memory_id], None))[memory_id]

        target = await added(_scene("v0", 0, "Friends matter more than a salary"))
        later = []
        for n in range(1, LINKS + 1):
            scene = await added(_scene(f"v{n}", n, f"Decision number {n} for friends"))
            target = (await store.get([target.id or 0], None))[target.id or 0]
            draft = SceneDraft.of(target)
            assert draft is not None
            await add_impact(memory, target, draft, scene, f"Decision number {n} for friends")
            later.append(scene)

        target = (await store.get([target.id or 0], None))[target.id or 0]
        assert target.meta["impacts"] == [s.id for s in later[-QUOTED_KEPT:]]
        entries = [key for key, _ in await store.state_items(NAMESPACE)]
        assert entries == sorted(f"default\0dm\0v{n}\0" for n in range(LINKS - MAX_IMPACTS + 1, LINKS + 1))

        # The latest scene's hooks run again after a stop: it is quoted once still.
        draft = SceneDraft.of(target)
        assert draft is not None
        await add_impact(memory, target, draft, later[-1], f"Decision number {LINKS} for friends")
        target = (await store.get([target.id or 0], None))[target.id or 0]
        assert target.text.count(f"Decision number {LINKS} for") == 1

        # A quote still shown goes with its message's forget.
        gone = await store.get([later[-1].id or 0], None)
        await store.delete([later[-1].id or 0], Scope(user_id="val", chat_id="dm"))
        assert await drop_impacts(memory, "default", "val", "dm", [f"v{LINKS}"], gone.values()) == 1
        target = (await store.get([target.id or 0], None))[target.id or 0]
        assert f"Decision number {LINKS} for" not in target.text
        assert f"default\0dm\0v{LINKS}\0" not in dict(await store.state_items(NAMESPACE))


async def test_a_persons_forget_takes_their_entries_without_reading_everyones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A person's forget found their entries by reading the whole namespace, every person's: a
    second per million linked messages, at each forget. The scenes it deletes name them."""
    async with open_memory(tmp_path / "m") as memory:
        store = memory.store

        async def linked(user: str) -> None:
            records = [
                _scene(f"{user}{k}", k, f"{user} choice {k}").model_copy(update={"user_id": user})
                for k in (0, 1)
            ]
            ids = await store.add(records, np.ones((2, memory.embedder.dim), dtype=np.float32))
            target, later = (await store.get(ids, None)).values()
            draft = SceneDraft.of(target)
            assert draft is not None
            await add_impact(memory, target, draft, later, f"{user} choice 1")

        await linked("val")
        await linked("bob")
        assert len(await store.state_items(NAMESPACE)) == 2
        state_items = store.state_items
        read_whole: list[str] = []

        async def watched(namespace: str) -> Any:
            read_whole.append(namespace)
            return await state_items(namespace)

        monkeypatch.setattr(store, "state_items", watched)
        await memory.forget(user_id="val")
        assert NAMESPACE not in read_whole
        monkeypatch.undo()
        assert [key for key, _ in await store.state_items(NAMESPACE)] == ["default\0dm\0bob1\0"]

        # Finished after a crash, with the rows gone before it: nothing deleted names them.
        await linked("ann")
        assert await drop_impacts(memory, "default", "ann", None, None, []) == 0
        assert [key for key, _ in await store.state_items(NAMESPACE)] == ["default\0dm\0bob1\0"]
