"""A forget that changed nothing skips the purge (the keyword index's rebuild and the file's
rewrite, 40 s at a million memories): a second forgetme, or a person forgotten in each of a bot's
300 servers, paid it every time. One that deleted anything, in the store or a plugin, purges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem.host import hookimpl
from narrmem.testing import open_memory

pytestmark = pytest.mark.sqlite_only


def counting_purges(memory: Any) -> list[int]:
    purges: list[int] = []
    purge = memory.store.purge_deleted

    async def counted() -> None:
        purges.append(1)
        await purge()

    memory.store.purge_deleted = counted
    return purges


async def test_a_forget_of_someone_with_nothing_stored_purges_nothing(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m") as memory:
        await memory.ingest(msg("m1", "my favourite food is spicy ramen with an egg", user="u1"))
        purges = counting_purges(memory)
        gone = await memory.forget(user_id="u1")
        assert gone["memories"] >= 1 and len(purges) == 1
        again = await memory.forget(user_id="u1")  # a second forgetme
        elsewhere = await memory.forget(user_id="u1", tenant="server-2")  # a server they never wrote in
        assert again["memories"] == elsewhere["memories"] == 0
        assert len(purges) == 1
        assert await memory.store.pending_forgets() == []


class KeepsItsOwnRows:
    """A plugin with a table of its own, scrubbed at a forget."""

    @hookimpl
    async def narrmem_after_forget(self, memory: Any, tenant: str, user_id: str | None, **_: Any) -> None:
        async with memory.store.sql(write=True) as db:
            await db.execute("DELETE FROM notes WHERE user_id = ?", (user_id,))


async def test_a_forget_that_only_a_plugin_deleted_for_still_purges(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", plugins=[KeepsItsOwnRows()]) as memory:
        async with memory.store.sql(write=True) as db:
            await db.execute("CREATE TABLE notes (user_id TEXT, note TEXT)")
            await db.execute("INSERT INTO notes VALUES ('u7', 'allergic to penicillin')")
        purges = counting_purges(memory)
        gone = await memory.forget(user_id="u7")
        assert gone["memories"] == 0
        assert len(purges) == 1
