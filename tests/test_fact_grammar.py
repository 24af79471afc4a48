"""Facts about the user read as a third person would say them, end to end: the ingest note, the
graph fact in the turn context never say "user plans quit my job" (the memory keeps its words)."""

from __future__ import annotations

from pathlib import Path

from _helpers import msg

from narrmem import Memory


async def test_a_stated_plan_becomes_a_third_person_fact(tmp_path: Path) -> None:
    async with Memory.open(tmp_path) as memory:
        result = await memory.ingest(msg("m1", "I decided to quit my job", user="ann", chat="dm-ann"))
        facts = [note for note in result.notes if note.startswith("fact:")]
        assert facts == ["fact: user plans to quit their job"]
        context = await memory.turn_context("what about work?", user_id="ann", chat_id="dm-ann")
        assert "- user plans to quit their job" in context["rendered"]  # the memory itself stays verbatim
