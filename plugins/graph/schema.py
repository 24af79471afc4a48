"""The graph's tables, in the store's database beside the memories (SQLite or PostgreSQL).

* ``graph_nodes``: one row per node name in a (tenant, user, chat); names compare case-insensitively
  (ASCII letters, as SQLite's ``NOCASE``), so "Rock" and "rock" are one node. ``type`` is checked by
  the database itself. ``vector`` caches the embedding of the node's label (``vector_text`` says of
  which text, so an edited label is re-embedded); ``topic_vector`` is the running topic of an
  automatic task.
* ``graph_edges``: the triplets, with scope, provenance, confidence, the speculative flag (0 or 1),
  status, validity interval, ``superseded_by``, and how often and when last the triplet was stated. At
  most one *active* row per (scope, subject, relation, object): stating it again confirms it.
* ``graph_purges``: every purge and supersession, who asked, with which filters, and what it touched.
* ``graph_task_messages``: the messages an automatic task followed, in order, a row each (kept in
  the task's props until 2026-12-07, the whole list written again at each message).

Both backends hold the same columns in the same order. What SQLite says in the table itself,
PostgreSQL says otherwise (:data:`DIALECT`): the names' uniqueness is an index on the folded name,
and references to rows are checked when the transaction commits, so an import may write an edge
before the edge that superseded it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, TypeVar

from narrmem_plugins.graph.vocabulary import NODE_TYPES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

_TYPES = ", ".join(f"'{t}'" for t in NODE_TYPES)

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS graph_nodes (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        name TEXT NOT NULL{nocase},
        type TEXT NOT NULL CHECK (type IN ({types})),
        props TEXT NOT NULL DEFAULT '{{}}',
        created_at TEXT NOT NULL,
        created_ts REAL NOT NULL,
        vector BLOB,
        vector_text TEXT,
        topic_vector BLOB{unique_name}
    )""",
    "CREATE INDEX IF NOT EXISTS graph_nodes_by_type "
    "ON graph_nodes (tenant, user_id, chat_id, type, created_ts)",
    # A deleted message's forget knows its chat, not its author: without these it read the
    # whole tenant's graph, every user's, at each deletion.
    "CREATE INDEX IF NOT EXISTS graph_nodes_by_chat ON graph_nodes (tenant, chat_id, type)",
    """CREATE TABLE IF NOT EXISTS graph_edges (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        subject_id INTEGER NOT NULL REFERENCES graph_nodes (id) ON DELETE CASCADE{checked},
        relation TEXT NOT NULL,
        object_id INTEGER NOT NULL REFERENCES graph_nodes (id) ON DELETE CASCADE{checked},
        confidence REAL NOT NULL CHECK (confidence >= 0 AND confidence <= 1),
        speculative INTEGER NOT NULL CHECK (speculative IN (0, 1)),
        status TEXT NOT NULL CHECK (status IN ('active', 'deleted', 'superseded')),
        source TEXT NOT NULL CHECK (source IN ('message', 'tool', 'auto')),
        provenance TEXT NOT NULL,
        valid_from TEXT NOT NULL,
        valid_from_ts REAL NOT NULL,
        valid_to TEXT,
        valid_to_ts REAL,
        superseded_by INTEGER REFERENCES graph_edges (id) ON DELETE SET NULL{checked},
        count INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1),
        last_seen TEXT NOT NULL,
        last_seen_ts REAL NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS graph_edges_one_active ON graph_edges "
    "(tenant, user_id, chat_id, subject_id, relation, object_id) WHERE status = 'active'",
    "CREATE INDEX IF NOT EXISTS graph_edges_by_subject ON graph_edges (subject_id, status)",
    "CREATE INDEX IF NOT EXISTS graph_edges_by_object ON graph_edges (object_id, status)",
    "CREATE INDEX IF NOT EXISTS graph_edges_by_scope ON graph_edges (tenant, user_id, chat_id, status)",
    "CREATE INDEX IF NOT EXISTS graph_edges_by_chat ON graph_edges (tenant, chat_id)",
    # Deleting an edge sets superseded_by to NULL in the rows it superseded: found by this index,
    # not by reading every edge of every user.
    "CREATE INDEX IF NOT EXISTS graph_edges_by_successor ON graph_edges (superseded_by) "
    "WHERE superseded_by IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS graph_purges (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT,
        mode TEXT NOT NULL CHECK (mode IN ('soft', 'hard', 'supersede')),
        actor TEXT NOT NULL,
        filters TEXT NOT NULL,
        edges TEXT NOT NULL,
        new_edge_id INTEGER,
        at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS graph_purges_by_scope ON graph_purges (tenant, user_id, chat_id, at)",
    "CREATE INDEX IF NOT EXISTS graph_purges_by_chat ON graph_purges (tenant, chat_id)",
    """CREATE TABLE IF NOT EXISTS graph_task_messages (
        id INTEGER PRIMARY KEY,
        tenant TEXT NOT NULL,
        user_id TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        task_id INTEGER NOT NULL REFERENCES graph_nodes (id) ON DELETE CASCADE{checked},
        message_id TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS graph_task_messages_by_task ON graph_task_messages (task_id, id)",
    "CREATE INDEX IF NOT EXISTS graph_task_messages_by_message "
    "ON graph_task_messages (tenant, chat_id, message_id)",
]
# What each backend puts in the statements above, and the statements it adds.
DIALECT: dict[str, tuple[dict[str, str], list[str]]] = {
    "sqlite": (
        {
            "nocase": " COLLATE NOCASE",
            "unique_name": ",\n        UNIQUE (tenant, user_id, chat_id, name)",
            "checked": "",
        },
        [],
    ),
    "postgres": (
        {"nocase": "", "unique_name": "", "checked": " DEFERRABLE INITIALLY DEFERRED"},
        [
            "CREATE UNIQUE INDEX IF NOT EXISTS graph_nodes_one_name "
            "ON graph_nodes (tenant, user_id, chat_id, nocase(name))"
        ],
    ),
}
TABLES = re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", "\n".join(_SCHEMA))  # in creation order


def schema_for(dialect: str) -> list[str]:
    """The statements that set the graph's tables up on ``dialect`` (in the graph's SQL, see
    :func:`narrmem_plugins.graph.backend.dialect_sql`)."""
    parts, extra = DIALECT.get(dialect, DIALECT["postgres"])
    return [statement.format(types=_TYPES, **parts) for statement in _SCHEMA] + extra


CHUNK = 400  # stays under SQLite's bound-parameter limit with the scope parameters beside it


def marks(items: Sequence[Any]) -> str:
    return ", ".join("?" for _ in items)


def name_marks(items: Sequence[Any]) -> str:
    """Placeholders for node names in ``nocase(column) IN (...)``."""
    return ", ".join("nocase(?)" for _ in items)


def chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]


def from_row(cls: type[D], row: Sequence[Any], convert: Mapping[str, Callable[[Any], Any]]) -> D:
    """``row`` as a ``cls``, a dataclass whose fields are the row's columns in order; a value whose
    field ``convert`` names goes through that converter, the others are taken as the database gave them."""
    named = zip((f.name for f in fields(cls)), row, strict=True)
    return cls(**{name: convert[name](value) if name in convert else value for name, value in named})
