"""Rank fusion shared by the host's fallback and the hybrid recall plugin."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from narrmem.models import Candidate


def reciprocal_rank_fusion(
    candidates: Iterable[Candidate],
    *,
    k: float = 60.0,
    weights: Mapping[str, float] | None = None,
    normalize: bool = False,
) -> list[tuple[int, float]]:
    """Score each memory by Σ weight(source) / (k + rank + 1) over the sources that proposed it.

    RRF needs no score calibration between sources (cosine and BM25 live on different scales),
    which is why it is the default way to merge vector and keyword results. ``normalize`` divides
    by the best score possible (first in every source that proposed anything), so that scores lie
    in [0, 1] and 1 means every source put this memory first.
    """
    scores: dict[int, float] = {}
    seen: set[str] = set()
    for c in candidates:
        weight = 1.0 if weights is None else weights.get(c.source, 1.0)
        scores[c.memory_id] = scores.get(c.memory_id, 0.0) + weight / (k + c.rank + 1)
        seen.add(c.source)
    if normalize and scores:
        # In a fixed order: a set's order follows the hash seed, and the float sum its last digit.
        best = sum((1.0 if weights is None else weights.get(s, 1.0)) / (k + 1) for s in sorted(seen))
        if best > 0:
            scores = {mid: score / best for mid, score in scores.items()}
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
