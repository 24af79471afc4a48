"""Time comes from the injected clock wherever it is written down: a forget job's record (on
both stores) and a server key's creation and revocation. Before 2026-12-06 these read the
machine's clock; and a recall score's normalisation summed its sources in a hash-seeded order."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from _postgres import fresh_database

from narrmem.clock import ManualClock
from narrmem.doors.server.keys import KeyFile
from narrmem.testing import open_memory

LATER = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_forget_job_is_recorded_at_the_memorys_time(tmp_path: Path, backend: str) -> None:
    storage: dict[str, Any] = {}
    if backend == "postgres":
        storage = {"backend": "postgres", "dsn": await fresh_database("clock")}
    async with open_memory(tmp_path / "m", clock=ManualClock(LATER), storage=storage) as memory:
        await memory.ingest(msg("m1", "I decided to learn the cello"))
        job = await memory.store.begin_forget(tenant="default", user_id="u1", chat_id=None)
        sql: Any = memory.store
        rows = await sql.dump_rows("forget_jobs", 0, 10)
        assert [(r["id"], r["created_at"]) for r in rows] == [(job.id, "2031-03-04 05:06:07")]
        await memory.forget(user_id="u1")


def test_a_keys_times_are_the_clocks(tmp_path: Path) -> None:
    keys = KeyFile(tmp_path, clock=ManualClock(LATER))
    entry, _ = keys.create("acme")
    assert entry.created_at == "2031-03-04T05:06:07+00:00"
    assert keys.revoke(entry.id).revoked_at == "2031-03-04T05:06:07+00:00"


def test_normalised_fusion_scores_do_not_follow_the_hash_seed() -> None:
    script = (
        "from narrmem.models import Candidate\n"
        "from narrmem.ranking import reciprocal_rank_fusion as fuse\n"
        "c = [Candidate(memory_id=1, source=s, rank=0, score=1.0) for s in ('vector', 'keyword', 'facts')]\n"
        "print(repr(fuse(c, weights={'vector': 0.45, 'keyword': 1.0, 'facts': 0.3}, normalize=True)))\n"
    )
    seen = set()
    for seed in range(8):
        done = subprocess.run(
            [sys.executable, "-c", script], env={"PYTHONHASHSEED": str(seed)}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        seen.add(done.stdout)
    assert len(seen) == 1, seen


def test_a_manual_clock_advances_by_time_that_passes_across_daylight_saving() -> None:
    """An aware datetime's own arithmetic is wall-clock time: three hours from 00:30 on the day
    California leaves daylight saving time were four, and a day in spring 23 hours."""
    from zoneinfo import ZoneInfo

    california = ZoneInfo("America/Los_Angeles")
    clock = ManualClock(datetime(2026, 11, 1, 0, 30, tzinfo=california))
    before = clock.now()
    after = clock.advance(hours=3)
    assert after.astimezone(UTC) - before.astimezone(UTC) == timedelta(hours=3)
    assert after.tzinfo is california
    assert (after.hour, after.utcoffset()) == (2, timedelta(hours=-8))
    spring = ManualClock(datetime(2026, 3, 7, 12, 0, tzinfo=california))
    start = spring.now()
    assert spring.advance(days=1).astimezone(UTC) - start.astimezone(UTC) == timedelta(days=1)
