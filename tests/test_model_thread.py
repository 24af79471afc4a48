"""The model's thread: a short request (a query) is not held behind a long one (an import's batch),
a long request's rows come back in its texts' order, and cancelled or failed work is handled."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from narrmem_plugins.embedder_onnx import OnnxEmbedder

from narrmem.model_thread import SHORT_TEXTS, ModelThread


class SlowModel:
    """Each call takes ``seconds`` and records which texts it ran; a text's vector is its length."""

    def __init__(self, seconds: float = 0.02) -> None:
        self.seconds = seconds
        self.calls: list[list[str]] = []
        self.started = threading.Event()

    def encode(self, texts: list[str]) -> np.ndarray:
        self.started.set()
        time.sleep(self.seconds)
        self.calls.append(list(texts))
        return np.array([[float(len(t)), 1.0] for t in texts], dtype=np.float32)


async def test_a_short_request_runs_before_the_rest_of_a_long_one() -> None:
    model = SlowModel()
    thread = ModelThread("test-model", slice_texts=4)
    try:
        long_texts = ["x" * (i % 7 + 1) for i in range(40)]  # 10 slices
        bulk = asyncio.ensure_future(thread.embed(model.encode, long_texts))
        await asyncio.to_thread(model.started.wait)
        query = await thread.embed(model.encode, ["where?"])
        assert not bulk.done()  # the query did not wait for the whole batch
        rows = await bulk
    finally:
        await thread.close()
    assert query.tolist() == [[6.0, 1.0]]
    position = model.calls.index(["where?"])
    assert position <= 2  # after the slice running when it came, at most one more
    assert len(model.calls) == 11
    assert all(len(call) <= 4 for call in model.calls)
    # Sliced by length, put back in order.
    assert rows[:, 0].tolist() == [float(len(t)) for t in long_texts]


async def test_requests_up_to_the_short_size_run_in_one_call() -> None:
    model = SlowModel(0.0)
    thread = ModelThread("test-model", slice_texts=2)
    try:
        await thread.embed(model.encode, [str(i) for i in range(SHORT_TEXTS)])
    finally:
        await thread.close()
    assert len(model.calls) == 1


async def test_a_cancelled_long_request_leaves_its_slices_unrun() -> None:
    model = SlowModel(0.03)
    thread = ModelThread("test-model", slice_texts=2)
    try:
        bulk = asyncio.ensure_future(thread.embed(model.encode, [str(i) for i in range(40)]))
        await asyncio.to_thread(model.started.wait)
        bulk.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bulk
        after = await thread.embed(model.encode, ["next"])
    finally:
        await thread.close()
    assert after.tolist() == [[4.0, 1.0]]
    assert len(model.calls) <= 3  # the slice running, perhaps one taken meanwhile, then "next"


async def test_a_failure_reaches_its_caller_and_the_thread_goes_on() -> None:
    def broken(texts: list[str]) -> np.ndarray:
        raise ValueError(f"cannot embed {texts}")

    model = SlowModel(0.0)
    thread = ModelThread("test-model")
    try:
        with pytest.raises(ValueError, match="cannot embed"):
            await thread.embed(broken, ["a"] * 20)
        assert (await thread.embed(model.encode, ["ok"])).tolist() == [[2.0, 1.0]]
    finally:
        await thread.close()
    with pytest.raises(RuntimeError, match="closed"):
        await thread.embed(model.encode, ["late"])


async def test_a_long_request_wakes_the_event_loop_once_not_once_a_slice() -> None:
    """Each wake-up is a write to the loop's socket, after which the model's thread waits for the
    interpreter lock while the loop runs Python: a slice must not cost one."""
    model = SlowModel(0.0)
    thread = ModelThread("test-model", slice_texts=2)
    loop = asyncio.get_running_loop()
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal wakeups
        if threading.current_thread().name == "test-model":
            wakeups += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        rows = await thread.embed(model.encode, ["x" * (i % 5 + 1) for i in range(40)])
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        await thread.close()
    assert len(model.calls) == 20
    assert wakeups == 1
    assert rows[:, 0].tolist() == [float(i % 5 + 1) for i in range(40)]


async def test_a_slice_that_fails_fails_the_request_and_the_slices_after_it_do_not_run() -> None:
    model = SlowModel(0.0)

    def fails_on_the_third(texts: list[str]) -> np.ndarray:
        if len(model.calls) == 2:
            raise ValueError("the third slice")
        return model.encode(texts)

    thread = ModelThread("test-model", slice_texts=2)
    try:
        with pytest.raises(ValueError, match="the third slice"):
            await thread.embed(fails_on_the_third, [str(i) for i in range(20)])
        assert (await thread.embed(model.encode, ["ok"])).tolist() == [[2.0, 1.0]]
    finally:
        await thread.close()
    assert len(model.calls) == 3  # two slices before the failure, then "ok"


async def test_close_runs_what_is_queued_first() -> None:
    model = SlowModel(0.01)
    thread = ModelThread("test-model", slice_texts=2)
    bulk = asyncio.ensure_future(thread.embed(model.encode, [str(i) for i in range(12)]))
    await asyncio.sleep(0)
    await thread.close()
    assert (await bulk).shape == (12, 2)


@pytest.mark.slow
async def test_the_real_model_answers_a_query_during_a_batch_with_the_vectors_it_gives_alone(
    tmp_path: Path,
) -> None:
    embedder = OnnxEmbedder(None, tmp_path)
    texts = [
        f"Message {i}: " + "we walked along the river and talked about the new job " * (i % 4 + 1)
        for i in range(96)
    ]
    try:
        await embedder.start()
        alone = np.vstack([await embedder.embed([text]) for text in texts[:12]])
        query_alone = await embedder.embed(["Where does Ann work now?"])
        embedder.forget_recent_texts()  # the model embeds them again, in a batch this time
        bulk = asyncio.ensure_future(embedder.embed(texts))
        await asyncio.sleep(0.05)
        query = await embedder.embed(["Where does Ann work now?"])
        query_done_first = not bulk.done()
        rows = await bulk
    finally:
        await embedder.close()
    assert query_done_first
    np.testing.assert_allclose(query, query_alone, atol=1e-6)
    # Every row is its own text's vector, though the batch ran in slices sorted by length.
    np.testing.assert_allclose(rows[:12], alone, atol=1e-5)
    assert float(np.min(np.sum(rows[:12] * alone, axis=1))) > 0.9999
