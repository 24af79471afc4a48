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
loop and the pipe). The child is started as ``python -c`` calling :func:`child_main`, never by
``multiprocessing``, so a bot's own main script is not imported a second time; whatever its
libraries print goes to its standard error. It ends when its parent closes it, and when its input
closes (the parent exited or was killed): it never outlives the parent. POSIX only (the child
waits on its input with ``select``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pickle
import select
import signal
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from narrmem.errors import ModelProcessError
from narrmem.model_thread import SHORT_TEXTS, SLICE_TEXTS

_HEADER = struct.Struct("<Q")
__all__ = ["ModelProcess", "ModelProcessError", "ModelSpec", "child_main"]
_CHILD = "from narrmem.model_process import child_main; child_main()"


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
            child.stdin.write(_frame(("embed", request, list(texts))))
            await child.stdin.drain()
            return await answer
        except (ConnectionError, BrokenPipeError) as exc:
            raise ModelProcessError(f"{self.name}: the model's process has ended") from exc
        except asyncio.CancelledError:
            if self._pending.pop(request, None) is not None and self._running():
                child.stdin.write(_frame(("cancel", request)))
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
                    child.stdin.write(_frame(("stop",)))
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
                sys.executable, "-c", _CHILD, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise ModelProcessError(f"{self.name}: cannot start the model's process: {exc}") from exc
        assert child.stdin is not None and child.stdout is not None
        spec = pickle.dumps(self.spec, protocol=pickle.HIGHEST_PROTOCOL)
        child.stdin.write(_frame(("load", list(sys.path), spec, self.slice_texts)))
        try:
            await child.stdin.drain()
            kind, *rest = await _read_message(child.stdout)
        except (ConnectionError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
            code = await child.wait()
            ended = f"{self.name}: the model's process ended while loading (exit code {code})"
            raise ModelProcessError(ended) from exc
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


def _frame(message: tuple[Any, ...]) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


async def _read_message(stream: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await stream.readexactly(_HEADER.size))
    return pickle.loads(await stream.readexactly(size))


class _Work:
    """The child's queue: short requests first, then one slice of the oldest long request."""

    def __init__(self, slice_texts: int) -> None:
        self.slice_texts = slice_texts
        self.short: deque[tuple[int, list[str]]] = deque()
        self.long: deque[_LongRequest] = deque()
        self.stopping = False

    def empty(self) -> bool:
        return not (self.short or self.long)

    def add(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "embed":
            _, request, texts = message
            if len(texts) <= SHORT_TEXTS:
                self.short.append((request, texts))
            else:
                self.long.append(_LongRequest(request, texts, self.slice_texts))
        elif kind == "cancel":
            self.drop(message[1])
        elif kind == "stop":
            self.stopping = True

    def drop(self, request: int) -> None:
        self.short = deque(item for item in self.short if item[0] != request)
        self.long = deque(item for item in self.long if item.request != request)

    def next(self) -> tuple[int, list[str], _LongRequest | None, list[int]] | None:
        """The next texts to encode: (request, texts, its long request or None, rows)."""
        if self.short:
            request, texts = self.short.popleft()
            return request, texts, None, []
        if self.long:
            head = self.long[0]
            rows = head.take()
            if head.all_taken():
                self.long.popleft()
            return head.request, [head.texts[i] for i in rows], head, rows
        return None


class _LongRequest:
    def __init__(self, request: int, texts: list[str], slice_texts: int) -> None:
        self.request = request
        self.texts = texts
        # Slices of similar length waste little on padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        self.slices = deque(order[i : i + slice_texts] for i in range(0, len(order), slice_texts))
        self.left = len(self.slices)
        self.out: np.ndarray | None = None

    def take(self) -> list[int]:
        return self.slices.popleft()

    def all_taken(self) -> bool:
        return not self.slices

    def fill(self, rows: list[int], vectors: np.ndarray) -> bool:
        """Keep a slice's rows; True when it was the last."""
        if self.out is None:
            self.out = np.empty((len(self.texts), vectors.shape[1]), dtype=vectors.dtype)
        self.out[rows] = vectors
        self.left -= 1
        return self.left == 0


def child_main() -> None:
    """The child's side: load the model, then answer requests until told to stop or the parent goes."""
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when the model ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    replies = os.dup(1)
    os.dup2(2, 1)  # what the model's libraries print must not reach the parent's channel
    inbox = _Inbox(0)
    first = next(inbox.messages(block=True), None)
    if first is None:
        return
    _, path, spec_bytes, slice_texts = first
    sys.path[:] = path

    def send(message: tuple[Any, ...]) -> None:
        view = memoryview(_frame(message))
        while view:
            view = view[os.write(replies, view) :]

    try:
        encode = pickle.loads(spec_bytes).load()
    except Exception as exc:
        send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    send(("ready",))
    with contextlib.suppress(BrokenPipeError):  # the parent stopped reading: it has gone
        _answer(inbox, encode, send, _Work(max(1, slice_texts)))


def _answer(
    inbox: _Inbox,
    encode: Callable[[list[str]], np.ndarray],
    send: Callable[[tuple[Any, ...]], None],
    work: _Work,
) -> None:
    while True:
        # Between two runs of the model, take in what arrived; with nothing to run, wait for it.
        for message in inbox.messages(block=work.empty()):
            work.add(message)
        if inbox.closed and not work.stopping:
            return  # the parent has gone: nothing is left to answer
        item = work.next()
        if item is None:
            if work.stopping or inbox.closed:
                return
            continue
        request, texts, long, rows = item
        try:
            vectors = encode(texts)
        except Exception as exc:
            if long is not None:
                work.drop(request)
            send(("error", request, f"{type(exc).__name__}: {exc}"))
            continue
        if long is None:
            send(("rows", request, vectors))
        elif long.fill(rows, vectors):
            send(("rows", request, long.out))


class _Inbox:
    """Length-prefixed messages from a file descriptor, read as they arrive."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.closed = False

    def messages(self, *, block: bool) -> Iterator[Any]:
        """The messages already here; with ``block``, at least one (none once the input closed)."""
        while True:
            if len(self.buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self.buffer)
                if len(self.buffer) >= _HEADER.size + size:
                    payload = bytes(self.buffer[_HEADER.size : _HEADER.size + size])
                    del self.buffer[: _HEADER.size + size]
                    yield pickle.loads(payload)
                    block = False
                    continue
            if self.closed:
                return
            # A message begun is waited for whole: its rest is on its way.
            readable, _, _ = select.select([self.fd], [], [], None if block or self.buffer else 0)
            if not readable:
                return
            data = os.read(self.fd, 1 << 20)
            if not data:
                self.closed = True
                return
            self.buffer += data
