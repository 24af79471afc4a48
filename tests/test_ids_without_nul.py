"""An id with a NUL character is refused at the door on every backend (PostgreSQL text cannot hold
one): a clear error naming the field, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import msg

from narrmem.errors import InputError
from narrmem.testing import open_memory


@pytest.mark.parametrize("field", ["user_id", "chat_id", "message_id", "tenant", "speaker"])
async def test_a_message_id_with_nul_is_refused_and_nothing_is_written(field: str, tmp_path: Path) -> None:
    async with open_memory(tmp_path) as mem:
        bad = {**msg("m1", "I decided to quit my job at the bank"), field: "ann\x00"}
        with pytest.raises(InputError) as raised:
            await mem.ingest(bad)
        assert raised.value.field == field and "NUL" in str(raised.value)
        with pytest.raises(InputError) as edited:
            await mem.edit(bad)
        assert edited.value.field == field
        assert (await mem.store.stats())["memories"] == 0


async def test_a_scope_with_nul_is_refused_before_any_forget(tmp_path: Path) -> None:
    async with open_memory(tmp_path) as mem:
        await mem.ingest(msg("m1", "I decided to quit my job at the bank", user="ann"))
        before = await mem.store.stats()
        with pytest.raises(InputError) as raised:
            await mem.forget(user_id="ann", tenant="default\x00")
        assert raised.value.field == "tenant"
        assert await mem.store.stats() == before
        assert await mem.store.pending_forgets() == []
