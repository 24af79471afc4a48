"""Small helpers shared by the test modules (not a test module itself)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

DB_NAME = "narrmem.sqlite3"
INDEX_NAME = "vectors.faiss"


def msg(
    message_id: str,
    text: str,
    *,
    user: str = "u1",
    chat: str = "c1",
    tenant: str = "default",
    ts: str = "2026-05-04T09:12:00+01:00",
    **extra: Any,
) -> dict[str, Any]:
    """A valid message as a plain dict (the JSON shape a bot would hand in)."""
    data: dict[str, Any] = {
        "text": text,
        "user_id": user,
        "chat_id": chat,
        "ts": ts,
        "message_id": message_id,
        "tenant": tenant,
    }
    data.update(extra)
    return data


def sql(folder: Path, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run a query straight against the store's SQLite file (not through narrmem)."""
    con = sqlite3.connect(folder / DB_NAME)
    try:
        return list(con.execute(query, tuple(params)).fetchall())
    finally:
        con.close()


def count_rows(folder: Path, table: str = "memories") -> int:
    [(n,)] = sql(folder, f"SELECT COUNT(*) FROM {table}")
    return int(n)


def index_file_ids(folder: Path) -> list[int]:
    """The ids stored in the persisted FAISS file, read with FAISS directly."""
    index = faiss.read_index(str(folder / INDEX_NAME))
    return sorted(int(i) for i in faiss.vector_to_array(index.id_map).astype(np.int64))


def hit_keys(hits: Sequence[Any]) -> list[tuple[int, tuple[str, ...]]]:
    """What identifies a recall result: ids and provenance, in order."""
    return [(h.id, tuple(h.message_ids)) for h in hits]
