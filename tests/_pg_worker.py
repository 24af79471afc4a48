"""One bot worker for tests/test_postgres_workers.py: ingests the shared chats into a PostgreSQL
memory at the same time as another process, then recalls. Writes what it saw as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from narrmem.testing import open_memory

T0 = datetime(2025, 5, 5, 9, 0, tzinfo=UTC)
WORDS = [f"{a}{b}" for a in ("vel", "mor", "tan", "kip", "zor") for b in ("ax", "ub", "en", "ol")]


def messages() -> list[dict[str, Any]]:
    """Two chats: a group (u1 and u2) and u1's direct chat. u1 keeps coming back to sailing."""
    out: list[dict[str, Any]] = []
    for n, word in enumerate(WORDS):
        user, chat = [("u1", "group"), ("u2", "group"), ("u1", "direct")][n % 3]
        text = (
            f"I went sailing on my boat near the harbor {word} again"
            if user == "u1"
            else f"I planted tomatoes in my garden beside the {word} fence"
        )
        out.append(
            {
                "text": text,
                "user_id": user,
                "chat_id": chat,
                "message_id": f"msg-{n}",
                "speaker": user,
                "ts": (T0 + timedelta(minutes=n)).isoformat(),
            }
        )
    return out


def wait_for(barrier: Path, name: str, count: int) -> None:
    (barrier / f"{name}-{sys.argv[3]}").touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.glob(f"{name}-*"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(name)
        time.sleep(0.01)


async def main() -> dict[str, Any]:
    dsn, folder, worker, barrier, _ = (
        sys.argv[1],
        Path(sys.argv[2]),
        sys.argv[3],
        Path(sys.argv[4]),
        sys.argv[5],
    )
    batch = messages() if worker == "0" else list(reversed(messages()))
    report: dict[str, Any] = {"stored": [], "duplicates": [], "triggers": [], "recall": []}
    async with open_memory(folder, storage={"backend": "postgres", "dsn": dsn}) as mem:
        wait_for(barrier, "start", 2)
        for message in batch:  # one at a time, so the two processes interleave
            [result] = await mem.ingest_many([message])
            if result.duplicate:
                report["duplicates"].append(message["message_id"])
            elif result.stored:
                report["stored"].append(message["message_id"])
            report["triggers"].extend([t.user_id, t.kind, t.label, t.count] for t in result.triggers)
        wait_for(barrier, "ingested", 2)
        for n, word in enumerate(WORDS):
            for user in ("u1", "u2"):
                hits = await mem.recall(word, user_id=user, k=5, reinforce=False)
                report["recall"].append([user, n, sorted({m for h in hits for m in h.message_ids})])
    return report


Path(sys.argv[5]).write_text(json.dumps(asyncio.run(main())))
