"""``memory_purge``: delete, erase or supersede triplets chosen by filters.

* Filters are exact (``subject``, ``relation``, ``object``; names compare case-insensitively) unless
  the caller asks for a substring with ``*_contains``. Every given filter must hold (AND), so a filter
  that matches nothing makes the purge match nothing: it can never widen it. No filter at all is refused.
* ``soft`` marks active triplets ``deleted`` (kept with ``valid_to``); ``supersede`` marks them
  ``superseded`` by ``new_triplet``, written in the call's chat; ``hard`` erases matching triplets in
  any status, and the nodes left without any triplet.
* A purge never leaves a task without its state: when the filters reach a task's active
  ``HAS_STATE`` triplet, it is refused (``filters``), unless ``whole_tasks`` asks to purge those
  tasks whole (state, info and chain links; the chain is joined around them). A dry run reports the
  tasks and, instead of raising, the refusal.
* ``dry_run`` returns what would be affected and changes nothing. A purge matching more than
  ``max_affected`` triplets is refused. Every purge that changes something is recorded in
  ``graph_purges``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from narrmem_plugins.graph import history
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import (
    Edge,
    EdgeQuery,
    close_edges,
    delete_edges,
    select_edges,
    set_superseded_by,
)
from narrmem_plugins.graph.nodes import delete_orphans, spelled_alike
from narrmem_plugins.graph.schema import marks
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import FUNCTIONAL, HAS_STATE, NEXT_TASK, canonical_name
from narrmem_plugins.graph.writer import TripletDraft, WriteOutcome, write_triplet

from narrmem.errors import InputError


@dataclass
class PurgeResult:
    matched: list[Edge]
    written: WriteOutcome | None
    purge_id: int | None
    tasks: list[str] = field(default_factory=list)  # tasks whose state the filters reach
    refused: str | None = None  # a dry run's answer where the purge itself would be refused


def filter_query(
    scope: GraphScope, filters: dict[str, Any], mode: str, alike: dict[str, list[str]] | None = None
) -> EdgeQuery:
    """The edges ``filters`` name. ``alike``: for a subject or object filter, the stored names it
    matches written otherwise (:func:`purge` finds them): a node written "Маша" is the filter
    "маша", as it is when a fact is written."""
    if not filters:
        raise InputError("give at least one filter; a purge without filters is refused", field="filters")
    q = EdgeQuery()
    if mode != "hard":
        q.where("e.status = 'active'")
    for key, column in (("subject", "s.name"), ("object", "o.name")):
        if key in filters:
            name = canonical_name(filters[key], scope.user_id)
            q.node_names_in(column, [name, *(alike or {}).get(key, ())])
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
    db: GraphSQL,
    scope: GraphScope,
    filters: dict[str, Any],
    *,
    mode: str,
    new_triplet: TripletDraft | None,
    dry_run: bool,
    max_affected: int,
    at: datetime,
    whole_tasks: bool = False,
    functional: Collection[str] = FUNCTIONAL,
) -> PurgeResult:
    """Run one purge inside the caller's transaction (or read-only for a dry run)."""
    if mode == "supersede" and new_triplet is None:
        raise InputError(
            "mode 'supersede' needs the triplet that replaces the matched ones", field="new_triplet"
        )
    if mode != "supersede" and new_triplet is not None:
        raise InputError(f"is only used by mode 'supersede', not '{mode}'", field="new_triplet")
    alike = {
        key: await spelled_alike(db, scope.tenant, scope.user_id, canonical_name(filters[key], scope.user_id))
        for key in ("subject", "object")
        if isinstance(filters.get(key), str) and not filters[key].isascii()
    }
    query = filter_query(scope, filters, mode, alike)
    matched = await select_edges(db, scope, query, order="e.id", limit=max_affected + 1)
    tasks = {e.subject_id: e.subject for e in matched if e.relation == HAS_STATE and e.status == "active"}
    refused = None
    if tasks and whole_tasks:
        matched = await _with_whole_tasks(db, scope, matched, list(tasks), mode, max_affected)
    elif tasks:
        refused = (
            f"the filters reach the state of task(s) {', '.join(sorted(tasks.values()))}; a task without "
            "a state is broken: set its state with task_set_state, or purge it whole with whole_tasks"
        )
    if len(matched) > max_affected:
        raise InputError(
            f"the filters match more than {max_affected} triplets; narrow them or raise max_affected",
            field="max_affected",
        )
    if dry_run or not matched:
        # Nothing matched means nothing happens: in particular supersede writes no new triplet.
        return PurgeResult(matched, None, None, sorted(tasks.values()), refused)
    if refused is not None:
        raise InputError(refused, field="filters")
    ids = [e.id for e in matched]
    written: WriteOutcome | None = None
    chain = [e for e in matched if e.relation == NEXT_TASK and e.status == "active"]
    if mode == "soft":
        await close_edges(db, ids, "deleted", at)
    elif mode == "hard":
        await delete_edges(db, ids)
        await delete_orphans(db, scope)
        await history.forget_triplets(db, scope.tenant, scope.user_id, ids)
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
            functional=functional,
        )
        await set_superseded_by(db, ids, written.edge.id)
    await _relink(db, scope, chain, set(tasks), at)
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
    return PurgeResult(matched, written, purge_id, sorted(tasks.values()))


async def _with_whole_tasks(
    db: GraphSQL, scope: GraphScope, matched: list[Edge], task_ids: list[int], mode: str, limit: int
) -> list[Edge]:
    """``matched`` plus every other triplet of these tasks (state, info, chain links): in any status
    for a hard purge, else the active ones."""
    q = EdgeQuery().where(
        f"e.subject_id IN ({marks(task_ids)}) OR e.object_id IN ({marks(task_ids)})", *task_ids, *task_ids
    )
    if mode != "hard":
        q.where("e.status = 'active'")
    extra = await select_edges(db, scope, q, order="e.id", limit=limit + 1)
    seen = {e.id for e in matched}
    return sorted([*matched, *(e for e in extra if e.id not in seen)], key=lambda e: e.id)


async def _relink(
    db: GraphSQL, scope: GraphScope, links: list[Edge], removed: set[int], at: datetime
) -> None:
    """Join the chain around tasks purged whole: A → B → C without B becomes A → C."""
    into = {e.object_id: e for e in links if e.object_id in removed}
    out_of = {e.subject_id: e for e in links if e.subject_id in removed}
    for first in removed:
        prev = into.get(first)
        if prev is None or prev.subject_id in removed:
            continue  # not the first task of a purged run, or nothing before it
        nxt = out_of.get(first)
        while nxt is not None and nxt.object_id in removed:
            nxt = out_of.get(nxt.object_id)
        if nxt is not None:
            link = TripletDraft(prev.subject, NEXT_TASK, nxt.object, "TaskNode", "TaskNode")
            chat = GraphScope(scope.tenant, scope.user_id, prev.chat_id)
            await write_triplet(
                db, chat, link, source="tool", provenance=["tool"], at=at, actor="memory_purge"
            )
