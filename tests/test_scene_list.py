"""``soul_narrative`` ``list`` pages through every scene of a scope, however many: read from the
store a window at a time down (created_at, id), so scenes past the first window are listed too,
filters find old matches, and scenes of one instant are neither skipped nor listed twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import narrmem_plugins.soul_narrative as soul
import pytest

from narrmem.clock import ManualClock
from narrmem.testing import open_memory

START = datetime(2026, 3, 1, 9, tzinfo=UTC)


async def _add(mem: Any, clock: ManualClock, count: int, *, tags: list[str], step: timedelta) -> list[int]:
    ids = []
    for _ in range(count):
        out = await mem.call_tool(
            "soul_narrative",
            {"action": "add", "user_id": "ann", "event": f"scene {len(ids)} {tags}", "tags": tags},
        )
        ids.append(out["scenes"][0]["id"])
        clock.advance(seconds=step.total_seconds())
    return ids


async def _pages(mem: Any, **ask: Any) -> list[int]:
    listed: list[int] = []
    request = {"action": "list", "user_id": "ann", "k": 4, **ask}
    while True:
        out = await mem.call_tool("soul_narrative", request)
        listed += [scene["id"] for scene in out["scenes"]]
        if not out["more"]:
            return listed
        request["before_id"] = listed[-1]


@pytest.fixture
def small_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(soul, "LIST_WINDOW", 5)


@pytest.mark.usefixtures("small_window")
async def test_every_scene_is_listed_past_the_window_once_newest_first(tmp_path: Path) -> None:
    clock = ManualClock(START)
    async with open_memory(tmp_path / "store", clock=clock) as mem:
        tagged = await _add(mem, clock, 3, tags=["harbour"], step=timedelta(minutes=1))
        # Scenes of one instant, more than a window: a keyset on time alone would loop or skip.
        same_instant = await _add(mem, clock, 12, tags=[], step=timedelta(0))
        clock.advance(minutes=1)
        newest = await _add(mem, clock, 9, tags=[], step=timedelta(minutes=1))
        everything = await _pages(mem)
        harbour = await _pages(mem, tag="harbour")
    assert everything == [*reversed(newest), *reversed(same_instant), *reversed(tagged)]
    assert harbour == list(reversed(tagged))  # the oldest, behind 21 newer scenes
