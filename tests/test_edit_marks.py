"""The marks of edits under way (narrmem.edit_marks): put and deleted on a shared store, left
nowhere once the edit ends, and a stopped process's marks deleted by the next open."""

from __future__ import annotations

from pathlib import Path

from narrmem.edit_marks import NAMESPACE
from narrmem.testing import open_memory


async def test_a_stopped_processs_marks_are_deleted_by_the_next_open(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as memory:
        ids = {"tenant": "t", "user_id": "ann", "chat_id": "c", "message_id": "1"}
        await memory.store.state_put(NAMESPACE, "0123456789abcdef0123456789abcdef:e1", ids)
        await memory.store.state_put(NAMESPACE, "fedcba9876543210fedcba9876543210:e2", ids)
        assert len(await memory.store.state_items(NAMESPACE)) == 2
    async with open_memory(tmp_path) as memory:
        assert await memory.store.state_items(NAMESPACE) == []
