"""A forget made while a plugin that scrubs is not loaded (disabled for a while, its package
reinstalled later) is scrubbed by that plugin at the first open that loads it again: it kept the
person's copies and, loaded again, showed them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, run_narrmem

from narrmem import Message, hookimpl
from narrmem.owed_forgets import NAMESPACE, SCRUBBERS_KEY
from narrmem.testing import open_memory
from narrmem.view import MemoryView

COPIES = "copies.by.user"
ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}


class KeepsCopies:
    """A plugin that keeps each user's words in its own state, and scrubs them at a forget."""

    @hookimpl
    async def narrmem_after_store(self, memory: MemoryView, message: Message) -> None:
        await memory.store.state_put(COPIES, _key(message.tenant, message.user_id), {"said": message.text})

    @hookimpl
    async def narrmem_after_forget(self, memory: MemoryView, tenant: str, user_id: str | None) -> None:
        if user_id is not None:
            await memory.store.state_delete(COPIES, _key(tenant, user_id))


def _key(tenant: str, user_id: str) -> str:
    return f"{tenant}\0{user_id}\0"


async def _state(folder: Path, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    async with open_memory(folder) as memory:
        return await memory.store.state_items(namespace)


async def test_a_plugin_absent_at_a_forget_scrubs_at_the_next_open_that_loads_it(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, plugins=[KeepsCopies()]) as memory:
        await memory.ingest(msg("m1", "my sister Lena lives in Porto", user="ann"))
        await memory.ingest(msg("m2", "I adopted a cat", user="bob"))
    async with open_memory(folder) as memory:  # the plugin disabled for a while
        await memory.forget(user_id="ann")
    owed = [key for key, _ in await _state(folder, NAMESPACE) if key != SCRUBBERS_KEY]
    assert [key.split("\0")[0] for key in owed] == ["test_owed_forgets.KeepsCopies"]
    async with open_memory(folder, plugins=[KeepsCopies()]) as memory:
        copies = await memory.store.state_items(COPIES)
        assert [key for key, _ in copies] == [_key("default", "bob")]
        assert [key for key, _ in await memory.store.state_items(NAMESPACE)] == [SCRUBBERS_KEY]


async def test_a_forget_with_every_plugin_loaded_owes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    async with open_memory(folder, plugins=[KeepsCopies()]) as memory:
        await memory.ingest(msg("m1", "my sister Lena lives in Porto", user="ann"))
        await memory.forget(user_id="ann")
        assert await memory.store.state_items(COPIES) == []
        assert [key for key, _ in await memory.store.state_items(NAMESPACE)] == [SCRUBBERS_KEY]


async def test_an_export_leaves_out_the_forgets_owed(tmp_path: Path) -> None:
    """They hold the ids of the people forgotten: a backup would carry them out of the store."""
    from narrmem.doors.transfer import export_store

    folder = tmp_path / "m"
    async with open_memory(folder, plugins=[KeepsCopies()]) as memory:
        await memory.ingest(msg("m1", "my sister Lena lives in Porto", user="ann"))
    async with open_memory(folder) as memory:
        await memory.forget(user_id="ann")
        await export_store(memory, tmp_path / "backup.jsonl")
    assert NAMESPACE not in (tmp_path / "backup.jsonl").read_text(encoding="utf-8")


@pytest.mark.sqlite_only("the command line on a --data folder")
async def test_a_plugin_gone_for_good_is_dropped_from_the_command_line(tmp_path: Path) -> None:
    """Its forgets waited in the store for good, and every open named it."""
    folder = tmp_path / "m"
    async with open_memory(folder, real_model=True, plugins=[KeepsCopies()]) as memory:
        await memory.ingest(msg("m1", "my sister Lena lives in Porto", user="ann"))
    async with open_memory(folder, real_model=True) as memory:
        await memory.forget(user_id="ann")
    listed = run_narrmem("owed-forgets", "--data", str(folder), "--json", cwd=tmp_path, env=ENV)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"test_owed_forgets.KeepsCopies": 1}
    unknown = run_narrmem("owed-forgets", "--data", str(folder), "--drop", "nope", cwd=tmp_path, env=ENV)
    assert unknown.returncode == 2 and "plugin" in unknown.stderr
    dropped = run_narrmem(
        "owed-forgets",
        "--data",
        str(folder),
        "--drop",
        "test_owed_forgets.KeepsCopies",
        "--json",
        cwd=tmp_path,
        env=ENV,
    )
    assert dropped.returncode == 0 and json.loads(dropped.stdout) == {"dropped": 1}
    async with open_memory(folder, real_model=True) as memory:
        await memory.ingest(msg("m2", "I adopted a cat", user="bob"))
        await memory.forget(user_id="bob")
        assert [key for key, _ in await memory.store.state_items(NAMESPACE)] == [SCRUBBERS_KEY]


@pytest.mark.sqlite_only("the command line on a --data folder")
async def test_the_listing_reads_beside_a_running_bot_and_changes_nothing(tmp_path: Path) -> None:
    """The listing opened the store for writing: it could not run beside the bot (which holds
    the folder), and its open changed the store (loaded plugins scrubbed, expired forget marks
    deleted) before it listed anything."""
    from datetime import UTC, datetime

    from _helpers import store_fingerprint

    from narrmem.clock import ManualClock

    folder = tmp_path / "m"
    async with open_memory(folder, real_model=True, plugins=[KeepsCopies()]) as memory:
        await memory.ingest(msg("m1", "my sister Lena lives in Porto", user="ann"))
    long_ago = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=UTC))  # its forget mark has expired
    async with open_memory(folder, real_model=True, clock=long_ago) as memory:
        await memory.forget(user_id="ann")
    async with open_memory(folder, real_model=True, read_only=True) as memory:
        before = await store_fingerprint(memory)
    listed = run_narrmem("owed-forgets", "--data", str(folder), "--json", cwd=tmp_path, env=ENV)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == {"test_owed_forgets.KeepsCopies": 1}
    async with open_memory(folder, real_model=True, read_only=True) as memory:
        assert await store_fingerprint(memory) == before
    async with open_memory(folder, real_model=True) as bot:  # holds the folder
        beside = run_narrmem("owed-forgets", "--data", str(folder), "--json", cwd=tmp_path, env=ENV)
        assert beside.returncode == 0, beside.stderr
        assert await bot.stats()
