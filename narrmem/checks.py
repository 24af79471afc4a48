"""Checks of input from outside that pydantic fields do not cover: JSON of any shape (meta, tool
arguments, files), and the plain arguments of public methods. Each failure names its field.

JSON is walked without recursion and nested at most :data:`MAX_JSON_DEPTH` levels: a deeper
document would exhaust Python's stack in ``json``, in pydantic or in whatever reads it back. Text
may not hold lone surrogates (``"\\ud800"``): they cannot be encoded as UTF-8, so SQLite, the keyword
index and every JSON file would refuse them later, after part of a write.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

from narrmem.errors import InputError

MAX_JSON_DEPTH = 64
SQLITE_MAX_INT = 2**63 - 1
# Plugins count back from a message's time and decay forward from a pass's ``now`` by days to
# years; near datetime's own limits (years 1 and 9999) that arithmetic overflows.
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)

_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JsonShapeError(ValueError):
    """JSON that is not plain, bounded JSON; ``path`` locates the culprit (``a.b[3]``)."""

    def __init__(self, message: str, path: str = "") -> None:
        self.reason = message
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


def has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def check_plain_json(value: Any, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise :class:`JsonShapeError` unless ``value`` is JSON that can be stored and read back:
    objects with string keys, arrays, strings without lone surrogates, finite numbers, booleans
    and null, nested at most ``max_depth`` levels."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict | list | tuple):
            if depth >= max_depth:
                raise JsonShapeError(f"nested deeper than {max_depth} levels", path)
            if isinstance(node, dict):
                for key, child in node.items():
                    if not isinstance(key, str):
                        raise JsonShapeError(f"keys must be strings, not {type(key).__name__}", path)
                    if has_surrogate(key):
                        raise JsonShapeError("a key holds a lone surrogate (not valid Unicode)", path)
                    stack.append((child, depth + 1, f"{path}.{key}" if path else key))
            else:
                stack.extend((child, depth + 1, f"{path}[{i}]") for i, child in enumerate(node))
        elif isinstance(node, str):
            if has_surrogate(node):
                raise JsonShapeError("holds a lone surrogate (not valid Unicode)", path)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise JsonShapeError(f"{node} is not a JSON number", path)
        elif node is not None and not isinstance(node, int):
            raise JsonShapeError(f"{type(node).__name__} is not a JSON type", path)


def json_text_too_deep(text: str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the arrays and objects of a JSON text nest deeper than ``max_depth``, found without
    parsing it (so that a hostile document is refused before a recursive parser sees it)."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > max_depth


def loads_json(text: str | bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` for text from outside: too deep, NaN/Infinity and lone surrogates are
    :class:`JsonShapeError`; bad syntax stays ``json.JSONDecodeError`` (both are ``ValueError``)."""
    if isinstance(text, bytes | bytearray):
        text = text.decode("utf-8")
    if json_text_too_deep(text, max_depth):
        raise JsonShapeError(f"nested deeper than {max_depth} levels")
    value = json.loads(text, parse_constant=_no_constant)
    check_plain_json(value, max_depth=max_depth)
    return value


def _no_constant(name: str) -> Any:
    raise JsonShapeError(f"{name} is not a JSON number")


# --- plain arguments of public methods ------------------------------------------------------------


def text_argument(value: Any, field: str, *, max_chars: int) -> str:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {type(value).__name__}", field=field)
    if len(value) > max_chars:
        raise InputError(f"must be at most {max_chars} characters", field=field)
    if has_surrogate(value):
        raise InputError("holds a lone surrogate (not valid Unicode)", field=field)
    return value


def int_argument(value: Any, field: str, *, low: int = 1, high: int = SQLITE_MAX_INT) -> int:
    """An integer (not a bool) in ``low..high``; the default range is SQLite's row ids."""
    if isinstance(value, bool):
        raise InputError("must be an integer, not a boolean", field=field)
    try:
        number = operator.index(value)
    except TypeError:
        raise InputError(f"must be an integer, not {type(value).__name__}", field=field) from None
    if not low <= number <= high:
        raise InputError(f"must be between {low} and {high}", field=field)
    return number


def optional_int_argument(value: Any, field: str, *, low: int = 1, high: int = SQLITE_MAX_INT) -> int | None:
    return None if value is None else int_argument(value, field, low=low, high=high)


def check_time_range(value: datetime) -> datetime:
    """``value`` (aware) if it lies from :data:`EARLIEST` up to :data:`LATEST`; ``ValueError`` if not."""
    try:
        in_utc = value.astimezone(UTC)
    except OverflowError:
        in_utc = None
    if in_utc is None or not EARLIEST <= in_utc < LATEST:
        raise ValueError(f"must lie from {EARLIEST:%Y-%m-%d} up to {LATEST:%Y-%m-%d} (UTC)")
    return value


def aware_time_argument(value: Any, field: str) -> datetime:
    """A datetime with a timezone, inside the range narrmem computes with."""
    if not isinstance(value, datetime):
        raise InputError(f"must be a datetime, not {type(value).__name__}", field=field)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InputError("must carry a timezone", field=field)
    try:
        return check_time_range(value)
    except ValueError as exc:
        raise InputError(str(exc), field=field) from None


def folder_argument(value: Any, field: str) -> str:
    """A folder given as ``str`` or a path object: not blank, no NUL byte (which no file system
    takes)."""
    if not isinstance(value, str | os.PathLike):
        raise InputError(f"must be a path, not {type(value).__name__}", field=field)
    path = os.fspath(value)
    if not isinstance(path, str):
        raise InputError("must be a text path, not bytes", field=field)
    problem = folder_problem(path)
    if problem is not None:
        raise InputError(problem, field=field)
    return path


def folder_problem(path: str) -> str | None:
    """What is wrong with ``path`` as a folder's name, or ``None``: a blank name would put a folder
    named with spaces in the working directory, and no file system takes a NUL byte."""
    if not path.strip():
        return "must name a folder, not be empty"
    if "\x00" in path:
        return "holds a NUL byte"
    return None


def sequence_argument(value: Any, field: str) -> Sequence[Any]:
    """A list (or tuple) of items: a string, a dict or a lone item is refused, not iterated."""
    if isinstance(value, str | bytes | bytearray | dict) or not isinstance(value, Sequence):
        raise InputError(f"must be a list, not {type(value).__name__}", field=field)
    return value
