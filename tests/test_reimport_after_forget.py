"""An export imported again after a person asked to be forgotten stored their words again: ingest
now leaves out a message said before a forget of its person, chat, person in the chat or itself
(as far as forget marks are kept), whatever the door (an import, a backfill over HTTP)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import ManualClock, Scope
from narrmem.ingest import SAID_BEFORE_A_FORGET
from narrmem.testing import open_memory

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def said(message_id: str, text: str, user: str, days_ago: float, chat: str = "group") -> dict[str, Any]:
    return msg(message_id, text, user=user, chat=chat, ts=(NOW - timedelta(days=days_ago)).isoformat())


HISTORY = [
    said("1", "my favourite food is spicy ramen with an egg", "ann", 30),
    said("2", "I adopted a greyhound named Pixel from the shelter", "bob", 29),
    said("3", "we moved to Lisbon last spring, the light is amazing", "ann", 28),
    said("4", "I decided to quit my job at the bank", "bob", 27),
    said("5", "the bakery shifts start at five and I am always tired", "cat", 26),
    *(said(f"d{n}", f"day {n} of the pottery course was about glazes", "dan", 25 - n) for n in range(6)),
]


async def texts(memory: Any, user: str) -> list[str]:
    hits = await memory.store.recent(Scope(user_id=user), kinds=["episode"], limit=100)
    return sorted(r.text for r in hits)


async def test_an_export_imported_again_after_a_forget_leaves_the_forgotten_out(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest_many(HISTORY)
        assert await texts(memory, "ann")
        await memory.forget(user_id="ann")
        await memory.forget_messages(chat_id="group", message_ids=["4"])  # bob deleted one message
        clock.advance(hours=1)
        later = said("6", "back again: I now live in Porto by the river", "ann", -0.01)
        results = await memory.ingest_many([*HISTORY, later])
        by_id = {r.message_id: r for r in results}
        assert not by_id["1"].stored and not by_id["3"].stored and not by_id["4"].stored
        assert "before a forget" in by_id["1"].reason
        assert by_id["6"].stored  # said after the forget: the person's new words
        assert by_id["2"].duplicate and by_id["5"].duplicate
        assert await texts(memory, "ann") == ["back again: I now live in Porto by the river"]
        assert await texts(memory, "bob") == ["I adopted a greyhound named Pixel from the shelter"]


async def test_a_few_messages_of_history_are_asked_too(tmp_path: Path) -> None:
    """A call of up to 8 messages is a bot's own traffic and is not asked (one sent again after a
    forget is new); the last part of an import, or a small export, says it is history."""
    clock = ManualClock(NOW)
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest_many(HISTORY[:3])
        await memory.forget(user_id="ann")
        clock.advance(hours=1)
        results = await memory.ingest_many(HISTORY[:3], history=True)
        assert [r.stored for r in results] == [False, False, False]  # bob's is a duplicate
        assert [r.reason == SAID_BEFORE_A_FORGET for r in results] == [True, False, True]
        assert await texts(memory, "ann") == []


async def test_the_import_commands_check_every_part_and_the_whole_file_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from narrmem.doors import cli

    monkeypatch.setattr(cli, "IMPORT_PART", 5)
    data = tmp_path / "data"
    export = tmp_path / "history.jsonl"
    export.write_text("".join(json.dumps(m) + "\n" for m in HISTORY), encoding="utf-8")
    assert await asyncio.to_thread(cli.main, ["ingest", str(export), "--data", str(data), "--json"]) == 0
    async with open_memory(data, real_model=True) as memory:
        await memory.forget(user_id="ann")
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["ingest", str(export), "--data", str(data), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["said_before_a_forget"] == 2 and summary["stored"] == 0
    # A message dated a year ahead, in the last part: refused before the first part is written.
    ahead = said("x", "a note from a phone whose clock ran a year ahead", "eve", -365)
    # Named by its line (a blank line before it), as every other error of the file is.
    lines = [json.dumps(m) for m in HISTORY]
    export.write_text("\n".join([*lines, "", json.dumps(ahead)]) + "\n", encoding="utf-8")
    fresh = tmp_path / "fresh"
    capsys.readouterr()
    assert await asyncio.to_thread(cli.main, ["ingest", str(export), "--data", str(fresh)]) == 2
    assert f"line {len(HISTORY) + 2}" in capsys.readouterr().err
    async with open_memory(fresh, real_model=True) as memory:
        assert await memory.store.stats() and (await memory.store.stats())["memories"] == 0


async def test_a_backup_exported_before_a_forget_is_not_imported_back(tmp_path: Path) -> None:
    """A store's export taken before someone was forgotten, imported into the store again (a
    backup restored beside what is there), brought them back, facts and all: it is refused, while
    the forget's marks are kept, naming no one."""
    from narrmem.doors.importing import import_jsonl
    from narrmem.doors.transfer import export_jsonl
    from narrmem.errors import InputError

    clock = ManualClock(NOW)
    backup, after = tmp_path / "backup.jsonl", tmp_path / "after.jsonl"
    async with open_memory(tmp_path / "m", clock=clock) as memory:
        await memory.ingest_many(HISTORY)
        await export_jsonl(memory, backup)
        clock.advance(hours=1)
        await memory.forget(user_id="ann")
        stats = await memory.stats()
        with pytest.raises(InputError, match="said and stored before a forget made since") as refused:
            await import_jsonl(memory, backup)
        assert refused.value.field == "memories" and "ann" not in str(refused.value)
        assert await texts(memory, "ann") == [] and await memory.stats() == stats
        # One deleted message's memory is enough; an export taken after the forgets imports.
        await export_jsonl(memory, after)
        await memory.forget_messages(chat_id="group", message_ids=["4"])
        with pytest.raises(InputError, match="before a forget"):
            await import_jsonl(memory, after)
        # Stored after the forgets, though said before them (the message sent again, and hers
        # dated in the second of her forget): theirs now, and an export of them imports.
        clock.advance(minutes=1)
        await memory.ingest(HISTORY[3])
        in_her_forgets_second = -1 / 24 + 0.4 / 86400  # said 0.4 s before it: days ago, negative
        await memory.ingest(
            said("7", "hello again, I am back in town for good", "ann", in_her_forgets_second)
        )
        latest = tmp_path / "latest.jsonl"
        await export_jsonl(memory, latest)
        assert (await import_jsonl(memory, latest))["imported"] == 0
        assert await texts(memory, "ann") == ["hello again, I am back in town for good"]
    async with open_memory(tmp_path / "fresh", clock=clock) as memory:
        # A store that never forgot anyone (a store lost and restored) has no marks to ask.
        assert (await import_jsonl(memory, backup))["imported"] > 0
        assert await texts(memory, "ann")
