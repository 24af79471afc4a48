"""The rows of a chat whose JSON text names some messages, found by the database rather than by
reading every row of the chat into Python.

A deleted message's forget knows its chat, and in a group chat the graph holds the facts of
everyone in it: read whole, 20,000 people's facts cost a deletion about half a second, every
deletion, inside the graph's write transaction. The database searches the JSON text (a triplet's
provenance, a task's props, a purge record's triplets) for each message id as JSON writes it,
``"<id>"``, and only those rows come back to be read and checked.

An id JSON can write in more than one way (a letter outside ASCII, a quote, a backslash, a slash,
``<``, ``>`` or ``&``, which some writers escape, a control character) could be missed by that
search in text written by another JSON writer (an imported file): for such ids,
:func:`searchable` says no and the caller reads the chat whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Sequence

# Characters JSON writers leave as they are inside a string: some escape more than JSON asks
# (a slash; Go's <, > and &; anything outside ASCII), so only these are taken as written one way.
_WRITTEN_ONE_WAY = re.compile(r"[A-Za-z0-9 _.,:;@#$%*+=~!?()\[\]{}|^-]*")
TEXTS_A_QUERY = 100  # search texts in one statement (two bound values each with the chat's)


def searchable(message_ids: Collection[str]) -> bool:
    """Whether each id has one JSON spelling, so that searching text for it misses nothing."""
    return all(_written_one_way(mid) for mid in message_ids)


def _written_one_way(mid: str) -> bool:
    return _WRITTEN_ONE_WAY.fullmatch(mid) is not None


def quoted(message_ids: Collection[str]) -> list[str]:
    """Each id as it stands in JSON text: ``"<id>"``."""
    return [json.dumps(mid) for mid in sorted(message_ids)]


def any_text(column: str, texts: Sequence[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """``(instr(column, ?) > 0 OR ...)`` clauses, with their values, that between them find every
    row whose ``column`` holds one of ``texts``, a bounded number of texts to a clause."""
    for start in range(0, len(texts), TEXTS_A_QUERY):
        part = tuple(texts[start : start + TEXTS_A_QUERY])
        yield "(" + " OR ".join(f"instr({column}, ?) > 0" for _ in part) + ")", part
