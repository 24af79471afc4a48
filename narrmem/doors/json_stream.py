"""A large JSON file read in passes, without holding it whole.

A chat export is one JSON document: a busy group's history is hundreds of megabytes, and parsed
whole it took about twelve times its size in memory (300,000 Telegram messages, a 66 MB file,
peaked at 800 MB before a message was stored). Here the arrays that hold the messages are left
hollow: :func:`skeleton` reads everything else of the document (a chat's id, type and name, a
server's), and :func:`items` gives the hollow arrays' items one at a time, each pass a fresh read.

The parser is ijson with its C backend (yajl): a well-kept streaming parser, the only one on PyPI
that builds plain Python values from events at C speed. Where it and :func:`json.loads` could
disagree, the file is not streamed (:func:`skeleton` returns ``None``) and the caller reads it
whole as before, which also names the fault exactly: yajl turns a lone surrogate escape
(``"\\ud800"``) into ``?`` where narrmem refuses the file, rejects integers past 64 bits that
Python reads, and stops at a byte order mark.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from narrmem.checks import MAX_JSON_DEPTH

try:
    # The C backend by name: ijson falls back to others where it did not build, whose readings of
    # the cases above are not the ones checked here (the file is then read whole).
    _YAJL: Any = ijson.get_backend("yajl2_c")
except ImportError:
    _YAJL = None

_BOM = b"\xef\xbb\xbf"
# Any surrogate escape, a valid pair's too: a file that writes one is read whole (exports write
# emoji as UTF-8; an escaped backslash before "ud8.." only costs the stream).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# Whitespace to yajl, not to json.loads (which refuses the file).
_NOT_WHITESPACE = re.compile(rb"[\x0b\x0c]")
_CHUNK = 1 << 16
# What is read: a file by its path, or the bytes of one that cannot be read twice (a pipe).
Source = Path | bytes
_OPEN = frozenset({"start_map", "start_array"})
_CLOSE = frozenset({"end_map", "end_array"})


class NotStreamable(Exception):
    """The file holds what only the whole-file reader judges as :func:`json.loads` does."""


class Hollow(list[Any]):
    """A hollow array of :func:`skeleton`: empty here, its items given by :func:`items` under
    ``number`` (the hollow arrays' order in the document)."""

    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number


class _Checked:
    """The file as ijson reads it, refusing what yajl reads otherwise than ``json.loads``."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._tail = b""
        self._first = True

    def read(self, size: int = _CHUNK) -> bytes:
        data = self._raw.read(size)
        if self._first and data:
            self._first = False
            data = data.removeprefix(_BOM)  # harmless; Windows editors add one
        # The last bytes of the chunk before: an escape cut between two reads is still found.
        if _SURROGATE_ESCAPE.search(self._tail + data):
            raise NotStreamable("a surrogate escape")
        if _NOT_WHITESPACE.search(data):
            raise NotStreamable("a vertical tab or form feed")
        self._tail = data[-5:]
        return data


def opened(source: Source) -> contextlib.AbstractContextManager[BinaryIO]:
    """The file to read, from its start."""
    return source.open("rb") if isinstance(source, Path) else io.BytesIO(source)


def _events(source: Source) -> Iterator[tuple[str, str, Any]]:
    if _YAJL is None:
        raise NotStreamable("ijson's C backend is not installed")
    with opened(source) as raw:
        try:
            yield from _YAJL.parse(_Checked(raw), use_float=True, buf_size=_CHUNK)
        # Bytes yajl takes for UTF-8 and Python does not (an encoded surrogate, an overlong form).
        except (ijson.JSONError, UnicodeDecodeError) as exc:
            raise NotStreamable(str(exc)) from exc


def skeleton(path: Source, hollow: frozenset[str]) -> Any | None:
    """The document with every array at one of the ``hollow`` prefixes (ijson's dotted paths,
    ``chats.list.item.messages``) left a :class:`Hollow`; ``None`` if the file is not to be
    streamed (then read it whole). Syntax is checked to the end: a file cut short is found here,
    before any of it is used."""
    stack: list[Any] = []
    keys: list[str | None] = []
    root: list[Any] = []
    numbered = 0
    inside = 0  # depth within a hollow array: its items are skipped here
    try:
        for prefix, event, value in _events(path):
            if event in _OPEN and len(stack) + inside >= MAX_JSON_DEPTH:
                return None  # the whole-file reader says how deep
            if inside:
                inside += 1 if event in _OPEN else -1 if event in _CLOSE else 0
                continue
            if event == "map_key":
                keys[-1] = value
                continue
            if event == "start_array" and prefix in hollow:
                node: Any = Hollow(numbered)
                numbered += 1
                inside = 1
            elif event in _OPEN:
                node = {} if event == "start_map" else []
            elif event in _CLOSE:
                stack.pop()
                keys.pop()
                continue
            else:
                node = value
            parent = stack[-1] if stack else root
            if isinstance(parent, dict):
                parent[keys[-1]] = node
            else:
                parent.append(node)
            if event in _OPEN and not isinstance(node, Hollow):
                stack.append(node)
                keys.append(None)
    except NotStreamable:
        return None
    return root[0] if root else None


def items(path: Source, hollow: frozenset[str]) -> Iterator[tuple[int, int, Any]]:
    """``(array number, index, item)`` for every item of every hollow array, in document order;
    the numbers are :class:`Hollow`'s in :func:`skeleton` of the same file."""
    number = -1
    open_at: str | None = None
    item_prefix = ""
    index = 0
    builder: Any = None
    depth = 0
    for prefix, event, value in _events(path):
        if builder is not None:
            builder.event(event, value)
            depth += 1 if event in _OPEN else -1 if event in _CLOSE else 0
            if depth == 0:
                yield number, index, builder.value
                index += 1
                builder = None
        elif open_at is None:
            if event == "start_array" and prefix in hollow:
                number += 1
                open_at, item_prefix, index = prefix, f"{prefix}.item", 0
        elif event == "end_array" and prefix == open_at:
            open_at = None
        elif prefix == item_prefix:
            if event in _OPEN:
                builder = ijson.ObjectBuilder()
                builder.event(event, value)
                depth = 1
            else:
                yield number, index, value
                index += 1
