"""The embedding model in a process of its own.

On its own thread (:mod:`narrmem.model_thread`) the model shares Python's interpreter lock with the
event loop: most of its work (the tokenizer's, onnxruntime's run) lets go of the lock, and each
time it takes it back it waits while the loop runs Python, up to the interpreter's switch interval.
In an import the loop always has Python to run (triage, writes, hooks), so the model waits once
per text. In a child process the model has an interpreter of its own: it never waits on the
loop's, and an import's whole request goes to it at once and comes back as one answer.

The child keeps :mod:`narrmem.model_thread`'s two lanes: a request of at most ``SHORT_TEXTS`` texts
(a query, a message) is taken before the next slice of a long one (an import's batch), so a recall
during an import waits at most for one slice.

The two processes talk over the child's standard input and output, in length-prefixed pickles,
read and written by the event loop itself (asyncio's subprocess streams: no thread between the
loop and the pipe). The child runs :mod:`narrmem.model_child`, started as ``python -c``, never by
``multiprocessing``, so a bot's own main script is not imported a second time; whatever its
libraries print goes to its standard error. It ends when its parent closes it, and when its input
closes (the parent exited or was killed): it never outlives the parent. POSIX only (the child
waits on its input with ``select``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from narrmem import model_child
from narrmem.errors import ModelProcessError
from narrmem.model_child import HEADER, frame
from narrmem.model_thread import SLICE_TEXTS
from narrmem.to_the_end import to_the_end

__all__ = ["ModelProcess", "ModelProcessError", "ModelSpec"]
# The child loads narrmem/model_child.py from its path, without the narrmem package (see there).
_CHILD = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('narrmem_model_child', sys.argv[1]); "
    "child = importlib.util.module_from_spec(spec); spec.loader.exec_module(child); child.main()"
)


@runtime_checkable
class ModelSpec(Protocol):
    """What the child process needs to run a model: a picklable value (its module importable in the
    child, which gets the parent's ``sys.path``) whose ``load`` returns the model's encode function:
    texts to unit-length float32 rows."""

    def load(self) -> Callable[[list[str]], np.ndarray]: ...


class ModelProcess:
    """A child process that runs one model's encode (see the module's docstring). It belongs to the
    event loop that started it."""

    def __init__(self, name: str, spec: ModelSpec, *, slice_texts: int = SLICE_TEXTS) -> None:
        self.name = name
        self.spec = spec
        self.slice_texts = max(1, slice_texts)
        self._child: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[np.ndarray]] = {}
        self._ids = itertools.count(1)
        self._starting = asyncio.Lock()
        self._closed = False

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def _running(self) -> bool:
        return self._child is not None and self._child.returncode is None and not self._reader_done()

    def _reader_done(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def start(self) -> None:
        """Start the child and wait until its model is loaded (a failure to load is raised here). A
        child that ended (killed, say) is started again by the next call."""
        if self._running():
            return
        async with self._starting:
            if self._closed:
                raise ModelProcessError(f"{self.name}: the model's process is closed")
            if not self._running():
                await self._spawn()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The model's rows for ``texts``, in their order."""
        if not self._running():
            await self.start()
        child = self._child
        assert child is not None and child.stdin is not None
        request = next(self._ids)
        answer: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._pending[request] = answer
        try:
            child.stdin.write(frame(("embed", request, list(texts))))
            await child.stdin.drain()
            return await answer
        except (ConnectionError, BrokenPipeError) as exc:
            raise ModelProcessError(f"{self.name}: the model's process has ended") from exc
        except asyncio.CancelledError:
            if self._pending.pop(request, None) is not None and self._running():
                child.stdin.write(frame(("cancel", request)))
            raise
        finally:
            self._pending.pop(request, None)

    async def close(self) -> None:
        """Let the child answer what it was asked, then end it."""
        async with self._starting:
            self._closed = True
            child = self._child
            if child is None:
                return
            if child.returncode is None and child.stdin is not None:
                with contextlib.suppress(ConnectionError, BrokenPipeError):
                    child.stdin.write(frame(("stop",)))
                    await child.stdin.drain()
                    child.stdin.close()
                try:
                    await asyncio.wait_for(child.wait(), 30)
                except TimeoutError:
                    child.kill()
                    await child.wait()
            if self._reader is not None:
                await self._reader

    async def _spawn(self) -> None:
        try:
            child = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _CHILD,
                str(Path(model_child.__file__)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ModelProcessError(f"{self.name}: cannot start the model's process: {exc}") from exc
        assert child.stdin is not None and child.stdout is not None
        spec = pickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL)
        child.stdin.write(frame(("load", list(sys.path), spec, self.slice_texts)))
        try:
            await child.stdin.drain()
            kind, *rest = await _read_message(child.stdout)
        except (ConnectionError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
            code = await child.wait()
            ended = f"{self.name}: the model's process ended while loading (exit code {code})"
            raise ModelProcessError(ended) from exc
        except BaseException:
            # Cancelled while it loads (an open under a timeout, a Ctrl-C at start-up): not this
            # embedder's yet, so no close would end it, and each such open left one behind, its
            # model loaded (100 MiB), until the bot's process ended.
            child.kill()
            await to_the_end(child.wait())
            raise
        if kind != "ready":
            await child.wait()
            raise ModelProcessError(f"{self.name}: the model did not load: {rest[0]}")
        self._child = child
        self._reader = asyncio.create_task(self._read_replies(child, child.stdout))

    async def _read_replies(self, child: asyncio.subprocess.Process, stdout: asyncio.StreamReader) -> None:
        try:
            while True:
                kind, request, value = await _read_message(stdout)
                answer = self._pending.pop(request, None)
                if answer is None or answer.done():
                    continue  # cancelled while the child ran it
                if kind == "rows":
                    answer.set_result(value)
                else:
                    answer.set_exception(ModelProcessError(f"{self.name}: the model failed: {value}"))
        except asyncio.IncompleteReadError:
            pass
        code = await child.wait()
        ended = ModelProcessError(f"{self.name}: the model's process ended (exit code {code})")
        waiting, self._pending = self._pending, {}
        for answer in waiting.values():
            if not answer.done():
                answer.set_exception(ended)


async def _read_message(stream: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
    return pickle.loads(await stream.readexactly(size))
