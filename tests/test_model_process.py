"""The model in a process of its own: the same vectors as on the model's thread, short requests
before the rest of a long one, failures reported as typed errors, and a child that never outlives
its parent or its ``close``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import msg
from _model_specs import BrokenModel, LengthModel
from narrmem_plugins.embedder_onnx import OnnxEmbedder

from narrmem.config import load_settings
from narrmem.embed import SentenceTransformerEmbedder, ThreadedEmbedder
from narrmem.errors import ConfigError
from narrmem.model_process import ModelProcess, ModelProcessError
from narrmem.model_thread import SHORT_TEXTS
from narrmem.testing import open_memory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


async def _first_call(log: Path) -> None:
    for _ in range(2000):
        if await asyncio.to_thread(log.exists):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the child never ran the model")


async def test_rows_come_back_in_order_from_the_child() -> None:
    model = ModelProcess("test-model", LengthModel(), slice_texts=3)
    try:
        texts = ["x" * (i % 11 + 1) for i in range(50)]  # long: sliced by length in the child
        rows = await model.embed(texts)
        short = await model.embed(["four"])
    finally:
        await model.close()
    assert rows[:, 0].tolist() == [float(len(t)) for t in texts]
    assert short.tolist()[0][0] == 4.0
    child = int(rows[0, 1])
    assert child != os.getpid() and child == model.pid


async def test_a_short_request_is_taken_before_the_rest_of_a_long_one(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    model = ModelProcess("test-model", LengthModel(seconds=0.02, log=str(log)), slice_texts=2)
    try:
        await model.start()
        long_texts = [f"t{i:02d}" for i in range(40)]  # 20 slices of 20 ms
        bulk = asyncio.ensure_future(model.embed(long_texts))
        await _first_call(log)
        query = await model.embed(["where?"])
        assert not bulk.done()  # the query did not wait for the whole batch
        await bulk
    finally:
        await model.close()
    calls = log.read_text().splitlines()
    assert len(calls) == 21
    assert calls.index("where?") <= 3  # after the slice running when it came, and little more
    assert query[0, 0] == 6.0


async def test_requests_up_to_the_short_size_run_in_one_call(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    model = ModelProcess("test-model", LengthModel(log=str(log)), slice_texts=2)
    try:
        await model.embed([str(i) for i in range(SHORT_TEXTS)])
        await model.embed([str(i) for i in range(SHORT_TEXTS + 1)])
    finally:
        await model.close()
    sizes = [len(line.split("|")) for line in log.read_text().splitlines()]
    assert sizes[0] == SHORT_TEXTS and all(size <= 2 for size in sizes[1:])


async def test_a_failing_text_fails_its_request_only() -> None:
    model = ModelProcess("test-model", LengthModel(fail_on="bad"), slice_texts=2)
    try:
        with pytest.raises(ModelProcessError, match="cannot embed 'bad'"):
            await model.embed(["fine", "bad"])
        with pytest.raises(ModelProcessError, match="cannot embed 'bad'"):
            await model.embed(["a" * i for i in range(1, 20)] + ["bad"])
        rows = await model.embed(["still", "here"])
    finally:
        await model.close()
    assert rows[:, 0].tolist() == [5.0, 4.0]


async def test_a_model_that_cannot_load_is_a_typed_error_at_start() -> None:
    model = ModelProcess("test-model", BrokenModel())
    with pytest.raises(ModelProcessError, match="did not load: RuntimeError: no weights"):
        await model.start()
    await model.close()


async def test_what_the_model_prints_does_not_reach_the_channel(capfd: pytest.CaptureFixture[str]) -> None:
    model = ModelProcess("test-model", LengthModel(print_on_load=True))
    try:
        rows = await model.embed(["hello"])
    finally:
        await model.close()
    assert rows[0, 0] == 5.0
    assert "a library that prints" in capfd.readouterr().err


async def test_a_killed_child_fails_its_waiting_request_and_the_next_call_starts_another() -> None:
    model = ModelProcess("test-model", LengthModel(seconds=0.05), slice_texts=1)
    try:
        await model.start()
        first = model.pid
        assert first is not None
        waiting = asyncio.ensure_future(model.embed([str(i) for i in range(40)]))
        await asyncio.sleep(0.2)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(ModelProcessError, match="ended"):
            await waiting
        rows = await model.embed(["again"])
        assert model.pid != first
        assert rows[0, 1] == float(model.pid or 0)
    finally:
        await model.close()


async def test_a_cancelled_request_leaves_the_child_serving(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    model = ModelProcess("test-model", LengthModel(seconds=0.02, log=str(log)), slice_texts=1)
    try:
        bulk = asyncio.ensure_future(model.embed([f"b{i}" for i in range(100)]))
        await _first_call(log)
        bulk.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bulk
        rows = await model.embed(["after"])
        ran = len(log.read_text().splitlines())
    finally:
        await model.close()
    assert rows[0, 0] == 5.0
    assert ran < 100  # the slices not started were dropped, not run


async def test_close_ends_the_child_and_refuses_later_calls() -> None:
    model = ModelProcess("test-model", LengthModel())
    await model.embed(["x"])
    pid = model.pid
    assert pid is not None and _alive(pid)
    await model.close()
    assert not _alive(pid)
    with pytest.raises(ModelProcessError, match="closed"):
        await model.embed(["y"])


def test_the_child_ends_when_its_parent_is_killed(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from _model_specs import LengthModel
        from narrmem.model_process import ModelProcess

        async def main():
            model = ModelProcess("orphan", LengthModel())
            await model.embed(["x"])
            print(model.pid, flush=True)
            await asyncio.sleep(60)

        asyncio.run(main())
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()


async def test_the_onnx_model_in_its_process_gives_the_threads_vectors(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    on_thread = OnnxEmbedder(None, cache, quantize="int7")
    in_process = OnnxEmbedder(None, cache, quantize="int7", runs_in="process")
    texts = ["I moved to Lisbon in May", "我喜欢在周末去爬山"]
    texts += [f"note {i}: the cat is {i} years old" for i in range(30)]
    try:
        await on_thread.start()
        await in_process.start()
        expected = await on_thread.embed(texts)
        got = await in_process.embed(texts)
        one = await in_process.embed(["what city do I live in?"])
        assert in_process.model_pid is not None and in_process.model_pid != os.getpid()
    finally:
        await on_thread.close()
        await in_process.close()
    np.testing.assert_array_equal(got, expected)
    assert one.shape == (1, 384)
    assert abs(float(np.linalg.norm(one)) - 1.0) < 1e-5


async def test_a_memory_whose_model_runs_in_its_process(tmp_path: Path) -> None:
    mem = await open_memory(tmp_path / "data", real_model=True, embedder={"runs_in": "process"})
    try:
        pid = mem.embedder.model_pid
        assert pid is not None and _alive(pid)
        chat = [f"day {i}: I fixed the garden fence and watered the tomatoes" for i in range(12)]
        chat.append("I adopted a grey cat called Miso today, she sleeps on my keyboard")
        messages = [msg(f"m{i}", text, user="ana") for i, text in enumerate(chat)]
        await mem.ingest_many(messages)  # one long request, answered by the child
        await mem.ingest(msg("b1", "My cat Rex hates the vet", user="bo"))
        hits = await mem.recall("what is my cat's name?", user_id="ana")
        assert hits and "Miso" in hits[0].text
        assert all(hit.user_id == "ana" for hit in hits)
    finally:
        await mem.close()
    assert not _alive(pid)


def test_where_the_model_runs_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"embedder\.runs_in"):
        load_settings(embedder={"runs_in": "sometimes"})


async def test_the_sentence_transformers_model_in_its_process_gives_the_threads_vectors() -> None:
    on_thread = SentenceTransformerEmbedder(runs_in="thread")
    in_process = SentenceTransformerEmbedder(runs_in="process")
    texts = ["I moved to Lisbon in May"] + [f"note {i}: the cat is {i} years old" for i in range(10)]
    try:
        expected = await on_thread.embed(texts)
        got = await in_process.embed(texts)
        assert in_process.model_pid is not None
    finally:
        await on_thread.close()
        await in_process.close()
    np.testing.assert_allclose(got, expected, atol=1e-6)


class LengthEmbedder(ThreadedEmbedder):
    """A built-in-style embedder around the test model, in its process."""

    dim = 2
    name = "length"
    batch_size = 1

    def __init__(self) -> None:
        super().__init__("test-embed", 1, "process")

    def _prepare(self) -> LengthModel:
        return LengthModel(seconds=0.01)


async def test_callers_that_come_while_the_model_loads_share_one_process() -> None:
    embedder = LengthEmbedder()
    try:
        rows = await asyncio.gather(*(embedder.embed([f"text {i}"]) for i in range(6)))
        pids = {int(row[0, 1]) for row in rows}
        assert pids == {embedder.model_pid}
    finally:
        await embedder.close()


async def test_an_embedder_without_prepare_keeps_its_model_on_the_thread() -> None:
    class OnTheThread(ThreadedEmbedder):
        dim = 2

        def __init__(self) -> None:
            super().__init__("test-embed", 1, "process")

        def _encode(self, texts: list[str]) -> np.ndarray:
            return np.array([[float(len(t)), float(os.getpid())] for t in texts], dtype=np.float32)

    embedder = OnTheThread()
    try:
        rows = await embedder.embed(["abc"])
    finally:
        await embedder.close()
    assert not embedder.in_process and embedder.model_pid is None
    assert rows.tolist() == [[3.0, float(os.getpid())]]


def test_one_shot_commands_keep_the_model_on_a_thread_and_imports_give_it_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from narrmem.doors.cli import main

    spawned: list[str] = []
    real_spawn = ModelProcess._spawn

    async def counted(self: ModelProcess) -> None:
        spawned.append(self.name)
        await real_spawn(self)

    monkeypatch.setattr(ModelProcess, "_spawn", counted)
    monkeypatch.setenv("NARRMEM_EMBEDDER__RUNS_IN", "auto")
    data = str(tmp_path / "data")
    assert main(["triage", "--data", data, "I moved to Lisbon last spring"]) == 0
    assert spawned == []
    messages = tmp_path / "chat.jsonl"
    messages.write_text(json.dumps(msg("m1", "I moved to Lisbon last spring", user="ana")) + "\n")
    assert main(["ingest", "--data", data, str(messages)]) == 0
    assert len(spawned) == (1 if len(os.sched_getaffinity(0)) >= 2 else 0)
    monkeypatch.setenv("NARRMEM_EMBEDDER__RUNS_IN", "process")
    assert main(["recall", "--data", data, "--user", "ana", "where do I live?"]) == 0
    assert len(spawned) >= 1 and "Lisbon" in capsys.readouterr().out


def _children() -> set[int]:
    """This process's living children."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


async def test_a_start_cancelled_while_the_model_loads_leaves_no_process() -> None:
    """An open under a timeout, or a Ctrl-C at start-up, cancels the start while the child loads
    its model: the child was not the embedder's yet, so no close ended it, and each such open
    left one (a loaded model, 100 MiB) until the bot's process ended."""
    before = _children()
    for _ in range(3):
        model = ModelProcess("test-model", LengthModel(load_seconds=2.0))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(model.embed(["text"]), 0.3)
        await model.close()
    assert _children() - before == set()
