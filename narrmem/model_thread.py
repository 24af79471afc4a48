"""The embedding model's one thread, with two lanes: short requests before long ones.

The model runs on one thread, so calls never overlap and the event loop never waits on it. With a
plain executor the calls queue in order, and a recall's query that arrives while an import embeds
a batch of 256 messages waits for the whole batch: seconds. Here a long request is cut into
slices, and a short request (a query, a message or two) is taken before the next slice of any long
one: it waits at most for the slice running. A long request loses nothing by it: its slices run
back to back on the thread, without a trip through the event loop between them, and a short
request it waits for (triage's embedding of a scene candidate, during an import) was work it would
otherwise have waited for at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

import numpy as np

from narrmem.model_child import SHORT_TEXTS

__all__ = ["SHORT_TEXTS", "SLICE_TEXTS", "ModelThread"]
T = TypeVar("T")

SHORT, LONG, LAST = 0, 1, 2
SLICE_TEXTS = 2  # a long request is run this many texts at a time


class ModelThread:
    """One thread that runs the model's work, short requests first (see the module's docstring)."""

    def __init__(self, name: str, *, slice_texts: int = SLICE_TEXTS) -> None:
        self.name = name
        self.slice_texts = max(1, slice_texts)
        self._queue: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the model's thread, in the short lane (loading the model, say)."""
        result: T = await asyncio.wrap_future(self._submit(SHORT, fn, args))
        return result

    async def embed(self, encode: Callable[[list[str]], np.ndarray], texts: Sequence[str]) -> np.ndarray:
        """``encode`` over ``texts`` on the model's thread, one row per text in their order. More than
        ``SHORT_TEXTS`` texts run in the long lane, in slices of similar length (little padding)."""
        texts = list(texts)
        if len(texts) <= SHORT_TEXTS:
            return await self.call(encode, texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        parts = [order[i : i + self.slice_texts] for i in range(0, len(order), self.slice_texts)]
        # The slices tell the event loop nothing: only the whole request's end is signalled. Each
        # signal is a write to the loop's wake-up socket, after which the model's thread takes the
        # interpreter lock back, waiting while the loop runs Python: once a request, not a slice.
        whole: Future[np.ndarray] = Future()
        collected = _Collected(whole, len(texts), len(parts))
        slices = [
            self._submit(LONG, collected.run, (encode, [texts[i] for i in part], part)) for part in parts
        ]
        try:
            return await asyncio.wrap_future(whole)
        except BaseException:
            for future in slices:
                future.cancel()  # slices not started yet are skipped
            raise

    async def close(self) -> None:
        """Run what is queued, then stop the thread."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is None:
                return
            self._queue.put((LAST, next(self._order), None))
        await asyncio.to_thread(thread.join)

    def _submit(self, lane: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}: the model's thread is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()
            self._queue.put((lane, next(self._order), _Job(future, fn, args)))
        return future

    def _work(self) -> None:
        while True:
            _, _, job = self._queue.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                job.future.set_result(job.fn(*job.args))
            except BaseException as exc:  # the caller's to handle, on its own task
                job.future.set_exception(exc)


class _Collected:
    """The rows of one long request, filled in slice by slice on the model's thread (so without a
    lock); the last slice completes ``whole``. A slice after a failure or a cancel does nothing."""

    def __init__(self, whole: Future[np.ndarray], texts: int, slices: int) -> None:
        self.whole = whole
        self.texts = texts
        self.left = slices
        self.out: np.ndarray | None = None

    def run(self, encode: Callable[[list[str]], np.ndarray], texts: list[str], rows: list[int]) -> None:
        if self.whole.done():
            return
        try:
            vectors = encode(texts)
            if self.out is None:
                self.out = np.empty((self.texts, vectors.shape[1]), dtype=vectors.dtype)
            self.out[rows] = vectors
            self.left -= 1
            if self.left == 0:
                self.whole.set_result(self.out)
        except InvalidStateError:
            pass  # the caller cancelled the request while its last slice ran
        except BaseException as exc:  # the caller's to handle, on its own task
            with contextlib.suppress(InvalidStateError):
                self.whole.set_exception(exc)


class _Job:
    __slots__ = ("args", "fn", "future")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future = future
        self.fn = fn
        self.args = args
