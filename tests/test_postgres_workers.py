"""Several bot workers on one PostgreSQL memory: two OS processes ingest the same two chats at
once. Every message is stored once, each sees the other's writes, no user sees another's
memories, and a trigger fires once."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import asyncpg
from _postgres import fresh_database

WORKER = Path(__file__).parent / "_pg_worker.py"


async def test_two_processes_share_one_memory(tmp_path: Path) -> None:
    dsn = await fresh_database("workers")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            dsn,
            str(tmp_path / f"data-{n}"),
            str(n),
            str(barrier),
            str(tmp_path / f"{n}.json"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for n in range(2)
    ]
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), timeout=300)
        assert proc.returncode == 0, err.decode()[-3000:]
    reports = [json.loads((tmp_path / f"{n}.json").read_text()) for n in range(2)]

    stored = reports[0]["stored"] + reports[1]["stored"]
    everything = {f"msg-{n}" for n in range(20)}
    # Each message was stored by exactly one worker; the other was told it was a duplicate.
    assert sorted(stored) == sorted(everything)
    for report in reports:
        assert set(report["stored"]) | set(report["duplicates"]) == everything
    # Both wrote something, so each recall below reads the other's writes too.
    assert reports[0]["stored"] and reports[1]["stored"]

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT chat_id, message_id, COUNT(*) FROM memory_sources WHERE is_episode GROUP BY 1, 2"
        )
        assert {r[2] for r in rows} == {1} and len(rows) == 20
        [episodes] = [r[0] for r in await conn.fetch("SELECT COUNT(*) FROM memories WHERE kind = 'episode'")]
        assert episodes == 20
        # The fired state went through the store (its keys hold NUL, which PostgreSQL text cannot).
        fired_state = await conn.fetchval("SELECT COUNT(*) FROM plugin_state WHERE namespace = 'proactive'")
        assert fired_state >= 1
    finally:
        await conn.close()

    def owner(message_id: str) -> str:
        return ["u1", "u2", "u1"][int(message_id.split("-")[1]) % 3]

    for report in reports:
        for user, n, found in report["recall"]:
            # Every hit is the asking user's own; a user finds each of their own messages.
            assert {owner(m) for m in found} <= {user}, (user, n, found)
            if owner(f"msg-{n}") == user:
                assert f"msg-{n}" in found, (user, n, found)

    # A topic crossing its threshold fires once in all, however the two workers interleaved.
    fired = Counter((user, kind, label) for r in reports for user, kind, label, _ in r["triggers"])
    assert any(kind == "topic" for _, kind, _ in fired), fired
    assert all(times == 1 for times in fired.values()), fired
