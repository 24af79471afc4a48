"""Rank fusion shared by the host's fallback and the hybrid recall plugin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from narrmem.models import Candidate


def reciprocal_rank_fusion(
    candidates: Iterable[Candidate], *, k: float = 60.0, weights: Mapping[str, float] | None = None
) -> list[tuple[int, float]]:
    """Score each memory by Σ weight(source) / (k + rank + 1) over the sources that proposed it.

    RRF needs no score calibration between sources (cosine and BM25 live on different scales),
    which is why it is the default way to merge vector and keyword results.
    """
    scores: dict[int, float] = {}
    for c in candidates:
        weight = 1.0 if weights is None else weights.get(c.source, 1.0)
        scores[c.memory_id] = scores.get(c.memory_id, 0.0) + weight / (k + c.rank + 1)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
