"""The model's own process: the child's side of :mod:`narrmem.model_process`, and the wire format
both sides speak (length-prefixed pickles).

This file is loaded on its own in the child (from its path, not as part of the ``narrmem``
package), so that the child imports only the standard library and numpy before the model's own
module: the package would cost a third of a second of every start. It must import nothing from
narrmem.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

HEADER = struct.Struct("<Q")
SHORT_TEXTS = 8  # a request of at most this many texts takes the short lane (here and on the thread)


def frame(message: tuple[Any, ...]) -> bytes:
    """One message as it goes over the pipe."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(payload)) + payload


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
        self.out: Any | None = None

    def take(self) -> list[int]:
        return self.slices.popleft()

    def all_taken(self) -> bool:
        return not self.slices

    def fill(self, rows: list[int], vectors: Any) -> bool:
        """Keep a slice's rows; True when it was the last."""
        if self.out is None:
            self.out = np.empty((len(self.texts), vectors.shape[1]), dtype=vectors.dtype)
        self.out[rows] = vectors
        self.left -= 1
        return self.left == 0


def main() -> None:
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
        view = memoryview(frame(message))
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
    encode: Callable[[list[str]], Any],
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
            if len(self.buffer) >= HEADER.size:
                (size,) = HEADER.unpack_from(self.buffer)
                if len(self.buffer) >= HEADER.size + size:
                    payload = bytes(self.buffer[HEADER.size : HEADER.size + size])
                    del self.buffer[: HEADER.size + size]
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


if __name__ == "__main__":
    main()
