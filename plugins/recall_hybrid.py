"""Hybrid recall: vector candidates (FAISS) and keyword candidates (FTS5 BM25), both filtered by
scope inside the store's queries, fused with weighted reciprocal rank fusion."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import Settings, plugin_options
from narrmem.models import Candidate, MemoryRecord, RecallRequest
from narrmem.ranking import reciprocal_rank_fusion

NAME = "recall_hybrid"


class HybridOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    candidates: int = Field(default=50, ge=1, le=10_000, description="candidates taken from each source")
    rrf_k: float = Field(default=60.0, gt=0, le=10_000, description="RRF damping constant")
    vector_weight: float = Field(default=1.0, ge=0, le=100)
    keyword_weight: float = Field(default=1.0, ge=0, le=100)


class HybridRecall:
    def __init__(self) -> None:
        self.options = HybridOptions()

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = plugin_options(settings, NAME, HybridOptions)

    @hookimpl
    async def narrmem_recall_candidates(
        self, memory: object, request: RecallRequest, query_vector: np.ndarray
    ) -> list[Candidate]:
        store = memory.store  # type: ignore[attr-defined]
        n = max(self.options.candidates, request.k)
        found: list[Candidate] = []
        vector_hits = await store.search_vectors(request.scope, query_vector, n)
        keyword_hits = await store.search_keywords(request.scope, request.query, n)
        for source, hits in (("vector", vector_hits), ("keyword", keyword_hits)):
            found.extend(
                Candidate(memory_id=mid, source=source, rank=rank, score=score)
                for rank, (mid, score) in enumerate(hits)
            )
        return found

    @hookimpl
    def narrmem_rank(
        self, candidates: list[Candidate], records: dict[int, MemoryRecord]
    ) -> list[tuple[int, float]]:
        weights = {"vector": self.options.vector_weight, "keyword": self.options.keyword_weight}
        return reciprocal_rank_fusion(candidates, k=self.options.rrf_k, weights=weights)
