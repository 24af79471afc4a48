"""Writing one triplet: the single path every write takes (tools, extracted facts, tasks, persona).

* The same triplet in the same chat is never stored twice: stating it again confirms it (count + 1,
  last seen now, said plainly it stops being speculation).
* A plainly stated triplet supersedes the active triplets it contradicts (``likes`` ↔ ``dislikes``
  between the same nodes, another object of a functional relation such as ``lives_in``): anywhere in
  the user's graph when the subject is ``user``, in the same chat otherwise. A speculative triplet only
  supersedes speculation; confirmed plainly later, it supersedes what it contradicts then. The old
  rows stay, marked ``superseded`` with ``valid_to`` and ``superseded_by``, and the supersession is in
  the purge history.
* A fact from a message said *before* what already contradicts it (an old log ingested late) is
  stored as history: superseded by the newer fact from the start.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from narrmem_plugins.graph import history
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.edges import (
    Edge,
    EdgeQuery,
    active_between,
    close_edges,
    confirm_edge,
    insert_edge,
    select_edges,
)
from narrmem_plugins.graph.nodes import ensure_node
from narrmem_plugins.graph.scope import GraphScope
from narrmem_plugins.graph.vocabulary import FUNCTIONAL, OPPOSITES, USER, canonical_name

EXPLICIT_CONFIDENCE = 1.0
SPECULATIVE_CONFIDENCE = 0.5


@dataclass
class TripletDraft:
    subject: str
    relation: str
    object: str
    subject_type: str | None = None
    object_type: str | None = None
    confidence: float | None = None
    speculative: bool = False
    # When the message said it held, when not at the message's own time ("I moved to Berlin 10
    # years ago"): written as of then, it replaces nothing said since.
    said_at: datetime | None = None


@dataclass
class WriteOutcome:
    edge: Edge
    created: bool
    superseded: list[Edge] = field(default_factory=list)


async def write_triplet(
    db: GraphSQL,
    scope: GraphScope,
    draft: TripletDraft,
    *,
    source: str,
    provenance: Sequence[str],
    at: datetime,
    actor: str,
    field_prefix: str = "",
    functional: Collection[str] = FUNCTIONAL,
) -> WriteOutcome:
    """Write ``draft`` into the write chat of ``scope``; the caller holds the transaction.
    ``functional`` are the relations that hold one object at a time (the vocabulary's and the
    ``[plugin.graph] functional_relations``)."""
    subject_name = canonical_name(draft.subject, scope.user_id)
    object_name = canonical_name(draft.object, scope.user_id)
    subject = await ensure_node(
        db, scope, subject_name, draft.subject_type, at, field_name=f"{field_prefix}subject_type"
    )
    obj = await ensure_node(
        db, scope, object_name, draft.object_type, at, field_name=f"{field_prefix}object_type"
    )
    confidence = draft.confidence
    if confidence is None:
        confidence = SPECULATIVE_CONFIDENCE if draft.speculative else EXPLICIT_CONFIDENCE
    existing = await active_between(db, scope, subject, draft.relation, obj)
    if existing is not None:
        was_speculation = existing.speculative
        await confirm_edge(
            db, existing, confidence=confidence, speculative=draft.speculative, provenance=provenance, at=at
        )
        if not (was_speculation and not draft.speculative):
            return WriteOutcome(existing, created=False)
        # A guess the user now states plainly is a statement: it retires what it contradicts, as a
        # statement written fresh would (only what was said before this confirmation).
        rivals = await _contradicted(
            db, scope, subject.name, draft.relation, obj.name, False, functional, exclude=existing.id
        )
        rivals = [r for r in rivals if not _said_later(r, source, at)]
        await _retire(db, scope, subject.name, draft.relation, obj.name, rivals, existing.id, at, actor)
        return WriteOutcome(existing, created=False, superseded=rivals)
    rivals = await _contradicted(
        db, scope, subject.name, draft.relation, obj.name, draft.speculative, functional
    )
    # Only message times compare: a tool writes "now" by the server's clock, a message carries the time
    # it was said, and the two clocks need not agree.
    newer = [r for r in rivals if _said_later(r, source, at)]
    new = await insert_edge(
        db,
        scope,
        subject,
        draft.relation,
        obj,
        confidence=confidence,
        speculative=draft.speculative,
        source=source,
        provenance=provenance,
        at=at,
    )
    if newer:
        # Superseded by the first contradicting statement after it: the rival's first statement if that
        # came later, else its latest confirmation (the only later time a row keeps).
        def said_after(rival: Edge) -> tuple[float, str]:
            if rival.valid_from_ts > at.timestamp():
                return rival.valid_from_ts, rival.valid_from
            return rival.last_seen_ts, rival.last_seen

        winner = min(newer, key=lambda r: (said_after(r), r.id))
        end_ts, end = said_after(winner)
        await db.execute(
            "UPDATE graph_edges SET status = 'superseded', valid_to = ?, valid_to_ts = ?, superseded_by = ? "
            "WHERE id = ?",
            (end, end_ts, winner.id, new.id),
        )
        new.status, new.valid_to, new.superseded_by = "superseded", end, winner.id
        return WriteOutcome(new, created=True)
    await _retire(db, scope, subject.name, draft.relation, obj.name, rivals, new.id, at, actor)
    return WriteOutcome(new, created=True, superseded=rivals)


def _said_later(rival: Edge, source: str, at: datetime) -> bool:
    """Whether ``rival`` was said after a message stated at ``at`` (only message times compare)."""
    return source == "message" and rival.source == "message" and rival.last_seen_ts > at.timestamp()


async def _retire(
    db: GraphSQL,
    scope: GraphScope,
    subject: str,
    relation: str,
    obj: str,
    rivals: Sequence[Edge],
    by: int,
    at: datetime,
    actor: str,
) -> None:
    """Mark ``rivals`` superseded by edge ``by`` as of ``at``, and say so in the purge history."""
    if not rivals:
        return
    await close_edges(db, [r.id for r in rivals], "superseded", at, superseded_by=by)
    await history.record(
        db,
        scope.user_wide() if subject == USER else scope.writing(),
        mode="supersede",
        actor=actor,
        filters={"contradicted_by": [subject, relation, obj]},
        edges=rivals,
        at=at,
        new_edge_id=by,
    )


async def _contradicted(
    db: GraphSQL,
    scope: GraphScope,
    subject: str,
    relation: str,
    obj: str,
    speculative: bool,
    functional: Collection[str],
    *,
    exclude: int | None = None,
) -> list[Edge]:
    """Active triplets that ``subject relation obj`` contradicts: in all of the user's chats when the
    subject is the user, in the write chat otherwise."""
    opposite = OPPOSITES.get(relation)
    if opposite is None and relation not in functional:
        return []
    q = EdgeQuery().where("e.status = 'active'").where("nocase(s.name) = nocase(?)", subject)
    if exclude is not None:
        q.where("e.id <> ?", exclude)
    # What the user says about themselves holds in every chat; anything else is a name local to its chat.
    where = scope.user_wide() if subject == USER else scope.writing()
    alternatives = []
    values: list[Any] = []
    if opposite is not None:
        alternatives.append("(e.relation = ? AND nocase(o.name) = nocase(?))")
        values.extend([opposite, obj])
    if relation in functional:
        alternatives.append("(e.relation = ? AND nocase(o.name) <> nocase(?))")
        values.extend([relation, obj])
    q.where(" OR ".join(alternatives), *values)
    if speculative:
        q.where("e.speculative = 1")  # a guess never overrides what the user said
    return list(await select_edges(db, where, q))
