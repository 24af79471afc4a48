"""The proactive plugin's memory of what it fired keeps no words of the user: a topic's label goes
into its state key as a digest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _helpers import store_sql
from narrmem_plugins.proactive import NAME, state_key

from narrmem import Memory, Message, hookimpl
from narrmem.testing import open_memory

START = datetime(2026, 5, 4, 9, tzinfo=UTC)


class PluginErrors:
    """Every error a plugin raised that the host isolated and reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, BaseException]] = []

    @hookimpl
    def narrmem_plugin_error(self, plugin_name: str, hook_name: str, error: BaseException) -> None:
        self.seen.append((plugin_name, hook_name, error))


def _mention(day: int, marker: str) -> Message:
    return Message(
        text=f"the {marker} roadmap review came up again",
        user_id="u1",
        chat_id="c1",
        ts=START + timedelta(days=day),
        message_id=f"m{day}",
    )


async def _topic_events(mem: Memory, day: int, marker: str) -> list[Any]:
    result = await mem.ingest(_mention(day, marker))
    return [t for t in result.triggers if t.kind == "topic"]


async def test_a_fired_topic_is_remembered_without_its_words(tmp_path: Path) -> None:
    marker = "zqharbour7"
    async with open_memory(tmp_path / "m") as mem:
        fired = [await _topic_events(mem, day, marker) for day in range(3)]
        assert [len(f) for f in fired] == [0, 0, 1]
        assert marker in fired[2][0].label
        # Within the cooldown the same topic does not fire again: the state is found.
        assert await _topic_events(mem, 3, marker) == []
        rows = await store_sql(mem, "SELECT key, value FROM plugin_state WHERE namespace = ?", [NAME])
        assert rows
        assert not any(marker in key or marker in value for key, value in rows)
        assert await mem.store.state_get(NAME, state_key("default", "u1", "topic", fired[2][0].label))


async def test_state_written_under_the_old_plain_key_still_counts(tmp_path: Path) -> None:
    marker = "zqlantern5"
    async with open_memory(tmp_path / "m") as mem:
        for day in range(2):
            assert await _topic_events(mem, day, marker) == []
        label = f"{marker} roadmap"
        plain = f"default\0u1\0topic\0{label}"
        fired_at = (START + timedelta(days=1)).isoformat()
        await mem.store.state_put(NAME, plain, {"fired_at": fired_at, "count": 2})
        # The third mention would fire, but the old record says it fired a day ago (cooldown).
        assert await _topic_events(mem, 2, marker) == []


async def test_a_state_not_as_the_plugin_writes_it_counts_as_never_fired(tmp_path: Path) -> None:
    """Plugin state can come from an imported file: a count that is not a number or a time that is
    not one is read as no firing (and replaced by the next), never an error of the plugin's."""
    marker = "zqbeacon3"
    spoiled = [
        {"fired_at": "yesterday", "count": "1e400"},
        {"fired_at": "2026-05-05T09:00:00", "count": 1},  # no offset: not comparable with a message's time
        {"fired_at": 5, "count": True},
        {"count": -(2**70)},
    ]
    for n, state in enumerate(spoiled):
        errors = PluginErrors()
        async with open_memory(tmp_path / f"m{n}", plugins=[errors]) as mem:
            for day in range(2):
                assert await _topic_events(mem, day, marker) == []
            key = state_key("default", "u1", "topic", f"{marker} roadmap")
            await mem.store.state_put(NAME, key, state)
            fired = await _topic_events(mem, 2, marker)
            assert len(fired) == 1, state
            assert (await mem.store.state_get(NAME, key))["count"] == 3
        assert errors.seen == []
