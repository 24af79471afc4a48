"""The recall pipeline: sources → fusion → importance → relevance floor → reinforcement → snippets.

Every source proposes candidates inside the request's scope (the store filters in its queries);
``narrmem_rank`` fuses them into one ranking with scores in [0, 1]; ``narrmem_weigh`` multiplies in
importance after decay; then each hit is explained (``Hit.why``) and must clear the relevance
floor: a cosine similarity to the query of at least ``[recall] min_similarity``, or a memory that
contains at least ``[recall] min_keyword_share`` of the query's content words. Fewer than ``k``
hits is a fine answer; a query about something never said gets none. ``narrmem_after_recall``
then sees only relevant hits (the hippocampus reinforces a few of them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from numbers import Real
from typing import TYPE_CHECKING

import numpy as np

from narrmem.errors import PluginError, StoreError
from narrmem.models import Candidate, Hit, MemoryRecord, RecallRequest, SceneDraft, Why
from narrmem.ranking import reciprocal_rank_fusion
from narrmem.snippets import snippet
from narrmem.store import ReadsWithVectors
from narrmem.text import content_terms, keyword_terms

if TYPE_CHECKING:
    from narrmem.memory import Memory

# How many ranked candidates are explained (and may need their vector read) per hit asked for:
# the floor drops some, and a scene and its episode collapse into one.
EXPLAINED_PER_HIT = 4


async def run(memory: Memory, request: RecallRequest) -> list[Hit]:
    # What this process acknowledged in the scope before it was written is recalled too; the
    # message being answered is left out of the hits, so its write is not waited for.
    await memory.written(**request.scope.model_dump(), exclude_message_ids=request.exclude_message_ids)
    # Two chains run side by side: the query's embedding and then the sources that need its
    # vector, and the early sources (keywords) and then the rows and vectors of what they found.
    # On a large store either may be the longer one; neither waits for the other to start.
    failures: list[str] = []  # the sources of candidates that failed
    with_vector = asyncio.ensure_future(_vector_candidates(memory, request, failures))
    try:
        # One turn of the loop hands the query to the model's thread before the early sources'
        # synchronous work (query parsing, the first statement) holds the loop.
        await asyncio.sleep(0)
        early = await memory.host.call(
            "narrmem_recall_prefetch", memory=memory, request=request, errors=failures
        )
        early_ids = sorted({c.memory_id for b in early for c in b})
        # The similarity of a memory found by keywords alone needs its stored vector.
        records, early_vectors = await _records_and_vectors(memory, early_ids, request)
        query_vector, proposals = await with_vector
    finally:
        if not with_vector.done():
            with_vector.cancel()
        elif not with_vector.cancelled():
            # Its error, when the early chain failed first (both find the store unreachable),
            # would be logged as never retrieved; the one raised here says the same.
            with_vector.exception()
    candidates: list[Candidate] = [c for batch in (*proposals, *early) for c in batch]
    _known_empty(failures, candidates)
    missing = sorted({c.memory_id for c in candidates} - records.keys())
    if missing:
        records.update(await memory.store.get(missing, request.scope))
    candidates = [c for c in candidates if c.memory_id in records]
    answer = await memory.host.call_first_named(
        "narrmem_rank", memory=memory, request=request, candidates=candidates, records=records
    )
    ranking = None if answer is None else await _among_candidates(memory, answer, records)
    if ranking is None:
        weights = memory.settings.recall.weights
        ranking = reciprocal_rank_fusion(candidates, weights=weights or None, normalize=True)
    factors, boosts = await _importance_factors(memory, request, records)
    weighted = sorted(
        ((mid, min(1.0, max(0.0, score)) * factors.get(mid, 1.0)) for mid, score in ranking),
        key=lambda item: (-item[1], item[0]),
    )
    fused = dict(ranking)
    top = [mid for mid, _ in weighted[: request.k * EXPLAINED_PER_HIT] if mid in records]
    dense = await _similarities(memory, request, query_vector, candidates, top, early_vectors)
    now_values = await memory.importance_now([records[mid] for mid in top])
    explain = _Explainer(memory, request, candidates, memory.clock.now())
    excluded = set(request.exclude_message_ids)
    hits: list[Hit] = []
    covered: list[set[str]] = []
    for mid, score in weighted:
        if len(hits) == request.k or mid not in dense:
            break
        record = records[mid]
        origin = set(record.message_ids)
        if origin and origin <= excluded:
            continue  # the message being answered is not context for itself (nor reinforced by it)
        # A scene and the episode it came from say the same thing: return the better ranked.
        if origin and any(origin <= seen for seen in covered):
            continue
        why = explain(
            record, dense[mid], fused[mid], now_values.get(mid, record.importance), factors.get(mid, 1.0)
        )
        why.boosts = boosts.get(mid, {})
        if not why.relevant:
            continue
        covered.append(origin)
        hits.append(_hit(record, score, why, now_values.get(mid, record.importance), request))
    await memory.host.call("narrmem_after_recall", memory=memory, request=request, hits=hits, records=records)
    return hits


async def _among_candidates(
    memory: Memory, answer: tuple[str, list[tuple[int, float]]], records: Mapping[int, MemoryRecord]
) -> list[tuple[int, float]]:
    """A ranker's answer without the ids it was not given: one it made up (or one outside the
    scope) would end the hits where it stands, so one such id emptied the recall without a word.
    The ranker is reported, and the ids it ranked that are candidates keep their places."""
    ranker, ranking = answer
    kept = [(mid, score) for mid, score in ranking if mid in records]
    if len(kept) < len(ranking):
        strays = [mid for mid, _ in ranking if mid not in records]
        shown = ", ".join(str(mid) for mid in strays[:5]) + (", ..." if len(strays) > 5 else "")
        await memory.host.report(
            ranker,
            "narrmem_rank",
            PluginError(
                f"plugin {ranker!r} ranked {len(strays)} id(s) that are not among the candidates "
                f"({shown}); they were skipped"
            ),
        )
    return kept


async def _vector_candidates(
    memory: Memory, request: RecallRequest, failures: list[str]
) -> tuple[np.ndarray, list[list[Candidate]]]:
    """The query's vector and what the sources that need it propose."""
    [query_vector] = await memory.embedder.embed([request.query])
    proposals = await memory.host.call(
        "narrmem_recall_candidates",
        memory=memory,
        request=request,
        query_vector=query_vector,
        errors=failures,
    )
    return query_vector, proposals


def _known_empty(failures: list[str], candidates: list[Candidate]) -> None:
    """A source of candidates that fails is left out, and the others answer; but when sources
    failed and none proposed anything (the store is unreachable: a PostgreSQL gone away), the
    answer is an error, not an empty recall, which a bot could not tell from "nothing is
    remembered of this person"."""
    if failures and not candidates:
        raise StoreError(
            f"recall could not read its sources ({len(failures)} failed, the first: "
            f"{failures[0].split(':', 1)[0]}) and found nothing: nothing is known of what is stored"
        )


async def _records_and_vectors(
    memory: Memory, ids: Sequence[int], request: RecallRequest
) -> tuple[dict[int, MemoryRecord], Mapping[int, np.ndarray]]:
    """The memories ``ids`` and their stored vectors, in one trip on a store that can."""
    if not ids:
        return {}, {}
    store = memory.store
    if isinstance(store, ReadsWithVectors):
        return await store.get_with_vectors(ids, request.scope)
    return await store.get(ids, request.scope), await store.vectors(ids, request.scope)


async def _importance_factors(
    memory: Memory, request: RecallRequest, records: dict[int, MemoryRecord]
) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
    """Each memory's weight (the product of every plugin's, at most 1), and each plugin's own by
    its name (``Why.boosts``). A weight outside [0, 1] (or not a number) breaks the hook's
    contract: it is reported as the plugin's error and left out (clamped, a weight of 2 cancelled
    another plugin's decay unseen)."""
    tables = await memory.host.call_named("narrmem_weigh", memory=memory, request=request, records=records)
    factors: dict[int, float] = {}
    boosts: dict[int, dict[str, float]] = {}
    for plugin, table in tables:
        refused = []
        for memory_id, weight in (table or {}).items():
            if memory_id not in records:
                continue
            if isinstance(weight, bool) or not (isinstance(weight, Real) and 0.0 <= float(weight) <= 1.0):
                refused.append(f"{weight!r} for memory {memory_id}")
                continue
            factors[memory_id] = factors.get(memory_id, 1.0) * float(weight)
            boosts.setdefault(memory_id, {})[plugin] = round(float(weight), 4)
        if refused:
            error = PluginError(
                f"plugin '{plugin}' gave weights outside [0, 1], left out: {', '.join(refused[:3])}"
            )
            await memory.host.report(plugin, "narrmem_weigh", error)
    return {memory_id: min(1.0, factor) for memory_id, factor in factors.items()}, boosts


async def _similarities(
    memory: Memory,
    request: RecallRequest,
    query_vector: np.ndarray,
    candidates: Sequence[Candidate],
    ids: Sequence[int],
    read: Mapping[int, np.ndarray],
) -> dict[int, float]:
    """Cosine similarity of the query to each memory: the vector source already measured most of
    them; the rest (found by other sources alone) have their stored vector taken from ``read``
    (read while the query was embedded) or read now."""
    known = {c.memory_id: float(c.score) for c in candidates if c.source == "vector"}
    missing = [mid for mid in ids if mid not in known and mid not in read]
    vectors = {mid: read[mid] for mid in ids if mid not in known and mid in read}
    if missing:
        vectors.update(await memory.store.vectors(missing, request.scope))
    for mid, vector in vectors.items():
        known[mid] = float(np.dot(np.asarray(vector, dtype=np.float32), query_vector))
    return {mid: known[mid] for mid in ids if mid in known}


class _Explainer:
    def __init__(
        self, memory: Memory, request: RecallRequest, candidates: Sequence[Candidate], now: datetime
    ) -> None:
        self.settings = memory.settings.recall
        self.query_terms = content_terms(request.query)
        self.now = now
        self.sources: dict[int, dict[str, int]] = {}
        self.keyword: dict[int, float] = {}
        for c in candidates:
            self.sources.setdefault(c.memory_id, {})[c.source] = c.rank
            if c.source == "keyword":
                self.keyword[c.memory_id] = float(c.score)

    def __call__(
        self, record: MemoryRecord, dense: float, fused: float, importance_now: float, factor: float
    ) -> Why:
        assert record.id is not None
        own = set(keyword_terms(record.index_text))
        matched = [t for t in self.query_terms if t in own]
        share = len(matched) / len(self.query_terms) if self.query_terms else 0.0
        rescued = self.settings.min_keyword_share > 0 and share >= self.settings.min_keyword_share
        return Why(
            dense=round(dense, 4),
            keyword=round(self.keyword[record.id], 4) if record.id in self.keyword else None,
            matched=matched,
            sources=self.sources.get(record.id, {}),
            fused=round(min(1.0, max(0.0, fused)), 4),
            importance_now=round(importance_now, 4),
            importance_factor=round(factor, 4),
            age_days=round(max(0.0, (self.now - record.created_at).total_seconds() / 86_400), 2),
            relevant=dense >= self.settings.min_similarity or rescued,
        )


def _hit(record: MemoryRecord, score: float, why: Why, importance_now: float, request: RecallRequest) -> Hit:
    core = scene_core(record)
    hit = Hit.from_record(
        record,
        text=core or record.text,
        detail=record.text if core else None,
        score=round(min(1.0, max(0.0, score)), 6),
        importance=round(importance_now, 6),
        base_importance=record.importance,
        sources=why.sources,
        why=why,
    )
    if request.snippet_tokens is not None:
        short = snippet(hit.text, request.query, request.snippet_tokens)
        if short != hit.text:
            hit.detail, hit.text = hit.detail or hit.text, short
    return hit


def scene_core(record: MemoryRecord) -> str | None:
    """A scene's Core (the user's own words), which is what a prompt needs of it."""
    draft = SceneDraft.of(record)
    return draft.core if draft is not None and draft.core else None
