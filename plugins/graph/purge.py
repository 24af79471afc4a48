"""``memory_purge``: delete, erase or supersede triplets chosen by filters.

* Filters are exact (``subject``, ``relation``, ``object``; names compare case-insensitively) unless
  the caller asks for a substring with ``*_contains``. Every given filter must hold (AND), so a filter
  that matches nothing makes the purge match nothing: it can never widen it. No filter at all is refused.
* ``soft`` marks active triplets ``deleted`` (kept with ``valid_to``); ``supersede`` marks them
  ``superseded`` by ``new_triplet``, written in the call's chat; ``hard`` erases matching triplets in
  any status, and the nodes left without any triplet.
* ``dry_run`` returns what would be affected and changes nothing. A purge matching more than
  ``max_affected`` triplets is refused. Every purge that changes something is recorded in
  ``graph_purges``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from narrmem_plugins.graph import history
from narrmem_plugins.graph.edges import (
    Edge,
    EdgeQuery,
    close_edges,
    delete_edges,
    select_edges,
    set_superseded_by,
)
from narrmem_plugins.graph.nodes import delete_orphans
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import canonical_name
from narrmem_plugins.graph.writer import TripletDraft, WriteOutcome, write_triplet

from narrmem.errors import InputError


@dataclass
class PurgeResult:
    matched: list[Edge]
    written: WriteOutcome | None
    purge_id: int | None


def filter_query(scope: GraphScope, filters: dict[str, Any], mode: str) -> EdgeQuery:
    if not filters:
        raise InputError("give at least one filter; a purge without filters is refused", field="filters")
    q = EdgeQuery()
    if mode != "hard":
        q.where("e.status = 'active'")
    for key, column in (("subject", "s.name"), ("object", "o.name")):
        if key in filters:
            q.where(f"{column} = ?", canonical_name(filters[key], scope.user_id))
    if "relation" in filters:
        q.where("e.relation = ?", filters["relation"])
    for key, column in (
        ("subject_contains", "s.name"),
        ("object_contains", "o.name"),
        ("relation_contains", "e.relation"),
    ):
        if key in filters:
            q.where(f"instr(lower({column}), lower(?)) > 0", filters[key])
    if "speculative" in filters:
        q.where("e.speculative = ?", int(filters["speculative"]))
    return q


async def purge(
    db: Any,
    scope: GraphScope,
    filters: dict[str, Any],
    *,
    mode: str,
    new_triplet: TripletDraft | None,
    dry_run: bool,
    max_affected: int,
    at: datetime,
) -> PurgeResult:
    """Run one purge inside the caller's transaction (or read-only for a dry run)."""
    if mode == "supersede" and new_triplet is None:
        raise InputError(
            "mode 'supersede' needs the triplet that replaces the matched ones", field="new_triplet"
        )
    if mode != "supersede" and new_triplet is not None:
        raise InputError(f"is only used by mode 'supersede', not '{mode}'", field="new_triplet")
    query = filter_query(scope, filters, mode)
    matched = await select_edges(db, scope, query, order="e.id", limit=max_affected + 1)
    if len(matched) > max_affected:
        raise InputError(
            f"the filters match more than {max_affected} triplets; narrow them or raise max_affected",
            field="max_affected",
        )
    if dry_run or not matched:
        # Nothing matched means nothing happens: in particular supersede writes no new triplet.
        return PurgeResult(matched, None, None)
    ids = [e.id for e in matched]
    written: WriteOutcome | None = None
    if mode == "soft":
        await close_edges(db, ids, "deleted", at)
    elif mode == "hard":
        await delete_edges(db, ids)
        await delete_orphans(db, scope)
    else:
        assert new_triplet is not None
        await close_edges(db, ids, "superseded", at)
        written = await write_triplet(
            db,
            scope,
            new_triplet,
            source="tool",
            provenance=["tool"],
            at=at,
            actor="memory_purge",
            field_prefix="new_triplet.",
        )
        await set_superseded_by(db, ids, written.edge.id)
    purge_id = await history.record(
        db,
        scope,
        mode=mode,
        actor="memory_purge",
        filters=filters,
        edges=matched,
        at=at,
        new_edge_id=written.edge.id if written else None,
    )
    return PurgeResult(matched, written, purge_id)
