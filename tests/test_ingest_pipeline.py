"""``ingest_many`` in batches: the next batch is triaged while the model embeds this one, results
keep their order, and a batch whose embedding fails leaves nothing of the batches after it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.models import Message, TriageDecision
from narrmem.testing import HashEmbedder, open_memory

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)


class SlowEmbedder(HashEmbedder):
    """Embeds on a thread, slowly, and notes when each call starts and ends; ``fail_on`` makes the
    call that holds that text fail."""

    def __init__(self, seconds: float = 0.2, fail_on: str | None = None) -> None:
        self.seconds = seconds
        self.fail_on = fail_on
        self.calls: list[tuple[float, float, list[str]]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        if self.fail_on is not None and any(self.fail_on in text for text in texts):
            raise RuntimeError("the model failed")

        def work() -> np.ndarray:
            time.sleep(self.seconds)
            return np.vstack([self.vector(t) for t in texts])

        vectors = await asyncio.to_thread(work)
        self.calls.append((started, time.perf_counter(), list(texts)))
        return vectors


class Plugins:
    """Registers the slow embedder and notes when each message is triaged (then defers to the
    built-in triage by answering nothing)."""

    def __init__(self, embedder: SlowEmbedder) -> None:
        self.embedder = embedder
        self.triaged: dict[str, float] = {}
        self.lock = threading.Lock()

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register("slow", lambda settings: self.embedder)

    @hookimpl(tryfirst=True)
    def narrmem_triage(self, message: Message) -> TriageDecision | None:
        self.triaged[message.message_id] = time.perf_counter()
        return None


def messages(n: int) -> list[dict[str, Any]]:
    return [
        {
            "text": f"I planted tomato number {i} in the garden of the house on Elm street today.",
            "user_id": "ann",
            "chat_id": "garden",
            "ts": T0 + timedelta(minutes=i),
            "message_id": f"g{i}",
        }
        for i in range(n)
    ]


@pytest.mark.asyncio
async def test_the_next_batch_is_triaged_while_this_one_embeds(tmp_path: Path) -> None:
    embedder = SlowEmbedder(seconds=0.3)
    plugins = Plugins(embedder)
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    async with open_memory(tmp_path / "m", plugins=[plugins], **settings) as mem:
        results = await mem.ingest_many(messages(12))
        found = await mem.recall("tomato number 7", user_id="ann", k=1, reinforce=False)
    assert [r.message_id for r in results] == [f"g{i}" for i in range(12)]
    assert all(r.stored for r in results)
    assert found and found[0].message_ids == ["g7"]
    batches = [call for call in embedder.calls if any(" said, " in text for text in call[2])]
    assert len(batches) == 3
    first_started, first_ended, _ = batches[0]
    # The second batch's messages were triaged during the first batch's embedding, not after it.
    assert all(first_started < plugins.triaged[f"g{i}"] < first_ended for i in range(4, 8))
    # Three embeddings of 0.3 s with triage hidden behind them.
    assert batches[-1][1] - first_started < 3 * 0.3 + 0.25


@pytest.mark.asyncio
async def test_a_failed_embedding_leaves_nothing_of_the_batches_after_it(tmp_path: Path) -> None:
    texts = messages(12)
    embedder = SlowEmbedder(seconds=0.05)
    plugins = Plugins(embedder)
    settings: dict[str, Any] = {"embedder": {"backend": "slow"}, "storage": {"batch_size": 4}}
    async with open_memory(tmp_path / "m", plugins=[plugins], **settings) as mem:
        first = await mem.ingest_many(texts[:4])
        assert all(r.stored for r in first)
        embedder.fail_on = "tomato number 8 "
        with pytest.raises(RuntimeError, match="the model failed"):
            await mem.ingest_many(texts)
        stats = await mem.stats()
        await asyncio.sleep(0.2)  # a batch prepared ahead, were it left running, would write now
        assert (await mem.stats())["memories"] == stats["memories"]
        hits = await mem.recall("tomato", user_id="ann", k=20, reinforce=False)
    kept = {mid for hit in hits for mid in hit.message_ids}
    # The first batch was stored before (a duplicate now), the second is stored; the third
    # failed, and nothing of it was written.
    assert {"g8", "g9", "g10", "g11"}.isdisjoint(kept)
    assert {"g0", "g4"} <= kept
