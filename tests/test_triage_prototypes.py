"""The scene prototypes (the sentences triage compares a scene candidate with) are embedded once
per memory: in the background as a warm memory opens, or by the first scene decision of a memory
opened cold. Real model: the vectors are the model's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from _helpers import msg
from narrmem_plugins.triage import Triage
from narrmem_plugins.triage.prototypes import PROTOTYPES

from narrmem import Memory
from narrmem.config import load_settings
from narrmem.embed import ThreadedEmbedder
from narrmem.testing import open_memory

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

SENTENCES = {sentence for kind in PROTOTYPES.values() for sentence in kind}
SCENE = "I decided to move to Lisbon next spring."


def _kept(embedder: ThreadedEmbedder) -> int:
    """How many prototype sentences the embedder has embedded since its last forget."""
    return sum(1 for sentence in SENTENCES if sentence in embedder.recent)


async def _until(condition: object, seconds: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        if callable(condition) and condition():
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_warm_memory_embeds_them_as_it_opens_and_the_first_scene_does_not(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "warm", real_model=True) as mem:
        embedder = mem.embedder
        assert isinstance(embedder, ThreadedEmbedder)
        # Nothing is ingested or recalled: only the open can have asked for them.
        assert await _until(lambda: _kept(embedder) == len(SENTENCES))
        asked: list[str] = []
        embed = embedder.embed

        async def spy(texts: list[str]) -> np.ndarray:
            asked.extend(texts)
            return await embed(texts)

        embedder.embed = spy  # type: ignore[method-assign]
        result = await mem.ingest(msg("m1", SCENE))
        assert result.layer == "scene"
        assert asked, "the scene's own texts are embedded"
        assert not SENTENCES & set(asked)


async def test_a_cold_memory_does_not_load_the_model_for_them_and_its_first_scene_does(
    tmp_path: Path,
) -> None:
    settings = load_settings(None, data_dir=str(tmp_path / "cold"))
    mem = await Memory.open(settings=settings, warm=False, load_entrypoints=False)
    try:
        embedder = mem.embedder
        assert isinstance(embedder, ThreadedEmbedder)
        await asyncio.sleep(0.3)
        assert not embedder.model_loaded
        assert _kept(embedder) == 0
        decision = await mem.triage(msg("m1", SCENE))
        assert decision.layer == "scene"
        assert _kept(embedder) == len(SENTENCES)
    finally:
        await mem.close()


async def test_embedded_in_one_request_they_are_the_vectors_of_each_kind_alone(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "same", real_model=True) as mem:
        vectors = await mem.host.plugin(Triage).prototype_vectors(mem)
        assert isinstance(mem.embedder, ThreadedEmbedder)
        mem.embedder.forget_recent_texts()
        for kind, sentences in PROTOTYPES.items():
            alone = await mem.embedder.embed(list(sentences))
            np.testing.assert_allclose(vectors[kind], alone, atol=1e-6)


async def test_closing_while_they_are_embedded_leaves_nothing_running(tmp_path: Path) -> None:
    mem = await open_memory(tmp_path / "closing", real_model=True)
    await mem.close()  # straight after the open: the background embedding is stopped or done
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    assert not [task for task in pending if "_embed_prototypes" in repr(task.get_coro())]
