"""A forget that changed nothing skips the purge (the keyword index's rebuild and the file's
rewrite, 40 s at a million memories): a second forgetme, or a person forgotten in each of a bot's
300 servers, paid it every time. One that deleted anything, in the store or a plugin, purges."""

from __future__ import annotations

import asyncio
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


async def test_a_forget_interrupted_in_its_purge_is_purged_when_finished_at_the_next_open(
    tmp_path: Path,
) -> None:
    """The next open finishes it by a forget job of its own, which finds the rows gone already:
    nothing changed since that job began, yet the interrupted one's bytes are still in the files."""
    secret = "zanzibarquokka"
    async with open_memory(tmp_path / "m") as memory:
        for i in range(20):
            await memory.ingest(msg(f"m{i}", f"my secret word is {secret} number {i}", user="u1"))

        async def killed() -> None:
            raise asyncio.CancelledError  # the process stopped while it purged

        memory.store.purge_deleted = killed
        with pytest.raises(asyncio.CancelledError):
            await memory.forget(user_id="u1")
        assert await memory.store.pending_forgets()
    async with open_memory(tmp_path / "m") as memory:
        assert await memory.store.pending_forgets() == []
    files = b"".join(p.read_bytes() for p in (tmp_path / "m").rglob("*") if p.is_file())
    assert secret.encode() not in files
