"""The mem0 peer of the speed benchmark (``bench/peers.py``): it runs offline, times adds and searches,
and keeps each user's search to that user's memories. Skipped where mem0 is not installed (the
``peers`` extra)."""

from __future__ import annotations

import socket
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import peers

pytestmark = pytest.mark.slow

TOPICS = {
    "alice": ["I am training for the Berlin marathon", "My knee hurts after long runs", "I run at 6 am"],
    "bob": ["I bake sourdough bread on Sundays", "My starter is called Gerald", "I want a new oven"],
}


def _traffic() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    start = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
    messages = []
    for i in range(20):
        user = "alice" if i % 2 == 0 else "bob"
        messages.append(
            {
                "text": f"{TOPICS[user][i // 2 % 3]} (note {i})",
                "user_id": user,
                "chat_id": f"dm-{user}",
                "message_id": f"m-{i}",
                "ts": (start + timedelta(minutes=i)).isoformat(),
            }
        )
    queries = [
        {"query": "how is the running going?", "user_id": "alice"},
        {"query": "what does she bake?", "user_id": "alice"},
        {"query": "bread and ovens", "user_id": "bob"},
        {"query": "marathon training", "user_id": "bob"},
        {"query": "any injuries?", "user_id": "alice"},
    ]
    return messages, queries


def _no_network(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"the mem0 peer opened a connection: {args}")


async def test_mem0_peer_times_adds_and_searches_per_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in peers.OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MEM0_DIR", str(tmp_path / "mem0-home"))  # read when mem0 is imported
    pytest.importorskip("mem0")
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    messages, queries = _traffic()

    result = await peers.run_mem0(messages, queries, workdir=tmp_path / "run", seed=3)

    assert result["add"]["samples"] == 20 and result["search"]["samples"] == 5
    for op in ("add", "search"):
        assert 0 < result[op]["p50_ms"] <= result[op]["p95_ms"]
    assert result["memories"] == 20
    assert result["memories_by_user"] == {"alice": 10, "bob": 10}
    assert result["mean_hits_by_user"]["alice"] > 0 and result["mean_hits_by_user"]["bob"] > 0
    assert result["foreign_hits"] == 0  # bob's "marathon" search finds none of alice's memories
    assert result["llm_calls"] == 0
    assert result["version"] and result["seed"] == 3
    assert "api_key" not in str(result["config"])
