"""What a hook's implementation must return, checked as it returns it.

Each hook in :mod:`narrmem.hookspecs` declares its return type. A plugin that returned another
(a ``dict`` where a list of candidates is due, a string for an importance) failed later, far from
it: ``recall`` raised an ``AttributeError`` naming no plugin, for every user, until the plugin was
removed. The host now checks each value against the declared type, cheaply (the container, and
the class of its first and last items where the type names one), and treats a mismatch as the
plugin failing: logged with its name, reported to ``narrmem_plugin_error``, and skipped.
"""

from __future__ import annotations

import types
import typing
from collections.abc import AsyncIterable, Callable, Sequence
from datetime import datetime
from typing import Any

from narrmem import hookspecs, logs, models

log = logs.logger("narrmem.host")

Check = Callable[[Any], bool]


def declared_check(hook_name: str) -> tuple[Check, str] | None:
    """The check of ``hook_name``'s declared return type (``None``, the hook's "no answer", is not
    checked), and the type as written; ``None`` when the hook returns nothing or anything."""
    spec = getattr(hookspecs, hook_name, None)
    written = getattr(spec, "__annotations__", {}).get("return")
    if spec is None or written is None:
        return None
    namespace = {**vars(models), "Any": Any, "datetime": datetime, "AsyncIterable": AsyncIterable}
    try:
        # Only the return annotation: the parameters name types that exist only for type checkers.
        # The text is narrmem's own hookspecs module's, never a plugin's.
        declared = eval(written, namespace) if isinstance(written, str) else written
    except Exception:  # a type this module cannot name: left unchecked
        log.debug("the return type of %s (%s) is not checked", hook_name, written)
        return None
    check = _check(declared)
    return None if check is None else (check, str(written).replace(" | None", ""))


def _check(declared: Any) -> Check | None:
    if declared is Any or declared is None or declared is type(None):
        return None
    origin = typing.get_origin(declared)
    args = typing.get_args(declared)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]
        checks = [_check(a) for a in parts]
        if not parts or any(c is None for c in checks):
            return None
        return lambda value: any(c(value) for c in checks if c is not None)
    if origin is AsyncIterable:
        # Its items are read as they come; only that it can be read is checked here.
        return lambda value: hasattr(value, "__aiter__")
    if origin is list:
        item = _check(args[0]) if args else None
        if item is None:
            return lambda value: isinstance(value, list)
        return lambda value: isinstance(value, list) and all(item(v) for v in _ends(value))
    if origin is tuple:
        parts_checks = [_check(a) for a in args] if args and Ellipsis not in args else []
        return lambda value: (
            isinstance(value, tuple | list)
            and (not parts_checks or len(value) == len(parts_checks))
            and all(c is None or c(v) for c, v in zip(parts_checks, value, strict=False))
        )
    if origin is dict:
        value_check = _check(args[1]) if len(args) == 2 else None
        if value_check is None:
            return lambda value: isinstance(value, dict)
        return lambda value: isinstance(value, dict) and all(value_check(v) for v in _ends(value.values()))
    if declared is float:
        return lambda value: isinstance(value, int | float) and not isinstance(value, bool)
    if declared is int:
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if isinstance(declared, type):
        return lambda value: isinstance(value, declared)
    return None


def _ends(items: Any) -> tuple[Any, ...]:
    """A collection's first and last items: what a plugin returns of the wrong type is wrong
    throughout (dicts for candidates, strings for weights), and checking every item of every
    recall's candidates and weights cost about 200 µs of a 6 ms recall."""
    if not items:
        return ()
    if isinstance(items, Sequence):
        return (items[0], items[-1])
    return (next(iter(items)), next(reversed(items)))  # a dict's values keep their order both ways
