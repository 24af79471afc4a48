"""Texts as PostgreSQL can hold them: its text type cannot store NUL."""

from __future__ import annotations

import re

_ESCAPED = re.compile(r"\\(\\|0)")


def esc(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL, which narrmem's texts and state keys may (proactive's keys
    join their parts with it): NUL is stored as ``\\0`` and a backslash as ``\\\\``. The mapping
    keeps prefixes, so a key-prefix match still works on the stored form."""
    if text is None or ("\x00" not in text and "\\" not in text):
        return text
    return text.replace("\\", "\\\\").replace("\x00", "\\0")


def unesc(text: str | None) -> str | None:
    if text is None or "\\" not in text:
        return text
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "0" else "\\", text)
