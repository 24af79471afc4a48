"""Reading the JSON narrmem stores (a memory's meta and message ids) on every recall.

orjson parses these short texts several times faster than the standard library, and a recall reads
a hundred rows; the standard library still reads what orjson refuses (NaN, which ``json.dumps``
writes by default, or a lone surrogate), so nothing stored becomes unreadable."""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(text: str | bytes) -> Any:
    """``text`` parsed as JSON, exactly as :func:`json.loads` would."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
