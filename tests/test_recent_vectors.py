"""The embedder keeps the vectors of the texts it embedded last: a text met again (a scene's
sentence, embedded by triage first) costs no second model run, every row is still its own
text's vector, and a forget empties it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from narrmem.models import Scope
from narrmem.recent_vectors import ForgetsRecentTexts, RecentVectors
from narrmem.testing import open_memory

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)
SCENE_MESSAGE = "Don't forget the dentist appointment on Tuesday at 8 tonight!"


class CountingModel:
    """A fake model for the pure logic: each text's vector is a function of the text alone."""

    def __init__(self, *, fail: bool = False) -> None:
        self.asked: list[list[str]] = []
        self.fail = fail

    async def __call__(self, texts: list[str]) -> np.ndarray:
        self.asked.append(list(texts))
        if self.fail:
            raise RuntimeError("the model failed")
        return np.array([[len(t), sum(map(ord, t)) % 97, 1.0] for t in texts], dtype=np.float32)


def expected(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), sum(map(ord, t)) % 97, 1.0] for t in texts], dtype=np.float32)


async def test_a_text_met_again_is_not_embedded_again_and_each_row_stays_its_own() -> None:
    recent, model = RecentVectors(size=8), CountingModel()
    first = await recent.embed(["a", "bb", "a"], 3, model)
    again = await recent.embed(["ccc", "bb", "a", "ccc"], 3, model)
    assert model.asked == [["a", "bb"], ["ccc"]]  # a text once per request, a kept one never
    np.testing.assert_array_equal(first, expected(["a", "bb", "a"]))
    np.testing.assert_array_equal(again, expected(["ccc", "bb", "a", "ccc"]))
    again[:] = 0  # the caller's array is its own: what is kept does not change with it
    np.testing.assert_array_equal(await recent.embed(["bb"], 3, model), expected(["bb"]))
    assert len(model.asked) == 2


async def test_only_the_last_texts_are_kept_and_a_failed_run_keeps_nothing() -> None:
    recent, model = RecentVectors(size=3), CountingModel()
    await recent.embed(["a", "b", "c"], 3, model)
    await recent.embed(["a"], 3, model)  # used: now the newest
    await recent.embed(["d"], 3, model)  # pushes out the oldest, "b"
    assert len(recent) == 3
    await recent.embed(["a", "b", "c", "d"], 3, model)
    assert model.asked[-1] == ["b"]
    broken = CountingModel(fail=True)
    with pytest.raises(RuntimeError):
        await recent.embed(["e"], 3, broken)
    recent.clear()
    assert len(recent) == 0
    await recent.embed(["a"], 3, model)
    assert model.asked[-1] == ["a"]


@pytest.mark.asyncio
async def test_a_scenes_sentence_reaches_the_model_once_and_a_forget_empties_what_is_kept(
    tmp_path: Path,
) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as mem:
        embedder = mem.embedder
        assert isinstance(embedder, ForgetsRecentTexts)
        await embedder.embed(["warm up"])
        asked: list[str] = []
        run_model = embedder._run_model  # type: ignore[attr-defined]

        async def counting(texts: list[str]) -> np.ndarray:
            asked.extend(texts)
            return await run_model(texts)

        embedder._run_model = counting  # type: ignore[attr-defined]
        message = {"user_id": "maria", "chat_id": "c1", "text": SCENE_MESSAGE, "ts": T0, "message_id": "m1"}
        [result] = await mem.ingest_many([message])
        assert result.layer == "scene" and result.scene is not None
        scene = result.scene
        assert scene.id is not None
        # Triage embedded the sentence to weigh it; the scene written from it is that sentence.
        assert scene.index_text in asked
        assert asked.count(scene.index_text) == 1
        assert len(asked) == len(set(asked))

        # The scene's stored vector is the one the model gives its text on its own.
        embedder.forget_recent_texts()
        [fresh] = await embedder.embed([scene.index_text])
        stored = (await mem.store.vectors([scene.id], Scope(user_id="maria")))[scene.id]
        np.testing.assert_allclose(stored, fresh, atol=1e-5)

        assert len(embedder.recent) > 0  # type: ignore[attr-defined]
        await mem.forget(user_id="maria")
        assert len(embedder.recent) == 0  # type: ignore[attr-defined]


async def test_texts_are_kept_by_digest_whatever_they_hold() -> None:
    recent, model = RecentVectors(size=4), CountingModel()
    long_text, odd = "x" * 16_000, "a lone surrogate \ud800 and 中文"
    await recent.embed([long_text, odd], 3, model)
    again = await recent.embed([odd, long_text], 3, model)
    assert len(model.asked) == 1
    np.testing.assert_array_equal(again, expected([odd, long_text]))
    assert all(len(key) == 16 for key in recent._vectors)  # no text is kept, only its digest
