"""Which fused candidates answer the question: a logistic model over a few signals read without a
model, the second stage of the hybrid recall ranking.

Rank fusion alone knows only where each source put a memory. Which memories *answer* is also
written in the memory itself and in its neighbours:

* **how strongly the words and the meaning match**: the keyword score against the best keyword
  score of this query, the cosine similarity against the best one (fusion sees only ranks, so a
  clear winner and a near tie look the same);
* **how much it says**: a long message carries facts, "haha same!" carries none;
* **whether it asks**: a question is rarely its own answer ("What did you paint?" is not what
  was painted);
* **whether it names things**: capitalised words inside a sentence are places, people, titles;
* **another source's word**: a memory that a source other than the vector and keyword ones
  proposes (the graph's facts that hold now, a third-party source) is one that source vouches
  for. LoCoMo hardly exercises them (11 candidates in 32,860), so this weight is not fitted: it is
  the keyword weight, a source's first choice counting as much as the best keyword match;
* **its conversation**: memories from the same conversation window (``window_minutes``) as
  other strong candidates, because an answer told over several turns lifts each of them.

The score is ``sigmoid(bias + Σ weight × signal) ** exponent``: an estimate in (0, 1) that the
memory answers, flattened (``exponent`` 0.25) so that importance and the question's intent
(``narrmem_weigh`` factors, which multiply it) still move a memory a few places: an estimate taken
as it is spans orders of magnitude, and a factor of 0.7 would change nothing.
The weights were fitted by logistic regression on the LoCoMo tuning conversations (which turns
are evidence for which question) and kept because they raised recall on the validation
conversations too; ``bench/fit_ranker.py`` refits them on any LoCoMo-format data and prints both
parts. The README's Benchmarks section has the figures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from narrmem.models import Candidate, MemoryRecord
from narrmem.text import estimate_tokens, short_text_cache

# A capitalised word that follows a lower-case word or a comma: a name, not a sentence's start.
_NAME = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+")
NAMES_COUNTED = 3

# Memory texts up to this long are kept in the signals' cache (8,192 of them).
CACHED_CHARS = 2_000


class AnswerWeights(BaseModel):
    """The model's weights (``[plugin.recall_hybrid.answer]``); all zero but ``fused`` ranks as
    fusion alone does."""

    model_config = ConfigDict(extra="forbid")
    bias: float = Field(default=-10.95, ge=-1000, le=1000)
    fused: float = Field(default=0.99, ge=-1000, le=1000, description="the normalized fused score")
    vector: float = Field(
        default=1.78, ge=-1000, le=1000, description="(rrf_k + 1) / (rrf_k + 1 + vector rank); 0 if not found"
    )
    similarity: float = Field(
        default=2.63, ge=-1000, le=1000, description="cosine to the query minus the best one's (≤ 0)"
    )
    keyword: float = Field(
        default=3.79, ge=-1000, le=1000, description="keyword score / this query's best; 0 if not found"
    )
    other_sources: float = Field(
        default=3.79,
        ge=-1000,
        le=1000,
        description="source weight × (rrf_k + 1) / (rrf_k + 1 + rank) in any other source; not fitted",
    )
    window: float = Field(
        default=0.11, ge=-1000, le=1000, description="fused scores of the other candidates in its window"
    )
    length: float = Field(default=1.07, ge=-1000, le=1000, description="log(1 + estimated tokens)")
    question: float = Field(default=-0.77, ge=-1000, le=1000, description="1 if it asks something")
    names: float = Field(
        default=0.33, ge=-1000, le=1000, description="capitalised words inside sentences, ≤ 3"
    )
    window_minutes: float = Field(default=60.0, gt=0, le=10_080, description="one conversation window")
    exponent: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="the estimate is raised to this power: the factors that multiply it keep their weight",
    )


SIGNALS = (
    "fused",
    "vector",
    "similarity",
    "keyword",
    "other_sources",
    "window",
    "length",
    "question",
    "names",
)


def answer_signals(
    fused: Iterable[tuple[int, float]],
    candidates: Iterable[Candidate],
    records: Mapping[int, MemoryRecord],
    *,
    rrf_k: float,
    window_minutes: float,
    source_weights: Mapping[str, float] | None = None,
) -> dict[int, tuple[float, ...]]:
    """Each fused memory's signals, in the order of ``SIGNALS`` (what ``bench/fit_ranker.py``
    fits the weights on)."""
    fused = [(mid, score) for mid, score in fused if mid in records]
    vector_rank: dict[int, int] = {}
    similarity: dict[int, float] = {}
    keyword_score: dict[int, float] = {}
    other: dict[int, float] = {}
    for c in candidates:
        if c.source == "vector":
            vector_rank[c.memory_id] = min(c.rank, vector_rank.get(c.memory_id, c.rank))
            similarity[c.memory_id] = float(c.score)
        elif c.source == "keyword":
            keyword_score[c.memory_id] = max(float(c.score), keyword_score.get(c.memory_id, float(c.score)))
        else:
            # A source's fusion weight ([recall] weights) scales its word here too: 0 silences it.
            weight = 1.0 if source_weights is None else source_weights.get(c.source, 1.0)
            other[c.memory_id] = max(other.get(c.memory_id, 0.0), weight * (rrf_k + 1) / (rrf_k + 1 + c.rank))
    best_keyword = max((s for s in keyword_score.values() if s > 0), default=1.0)
    # A memory the vector source did not return is at most as similar as its last one.
    best_similarity = max(similarity.values(), default=0.0)
    least_similarity = min(similarity.values(), default=0.0)
    window = _window_sums(fused, {mid: records[mid].created_at for mid, _ in fused}, window_minutes)
    signals: dict[int, tuple[float, ...]] = {}
    for mid, score in fused:
        signals[mid] = (
            score,
            (rrf_k + 1) / (rrf_k + 1 + vector_rank[mid]) if mid in vector_rank else 0.0,
            similarity.get(mid, least_similarity) - best_similarity,
            max(0.0, keyword_score.get(mid, 0.0)) / best_keyword,
            other.get(mid, 0.0),
            window[mid],
            *text_signals(records[mid].text),
        )
    return signals


# A heavy user's recalls keep meeting the same memories: what their text says is read once.
@short_text_cache(max_chars=CACHED_CHARS, maxsize=8192)
def text_signals(text: str) -> tuple[float, float, float]:
    """The signals a memory's text alone gives: log(1 + tokens), whether it asks, its names (≤ 3).
    Cached (a recall reads the same memories again)."""
    return (
        math.log1p(estimate_tokens(text)),
        1.0 if "?" in text or "？" in text else 0.0,
        float(min(NAMES_COUNTED, len(_NAME.findall(text)))),
    )


def forget_cached_texts() -> None:
    """Drop every cached memory text: a forgotten memory's words must not stay in this process."""
    text_signals.cache_clear()


def answer_scores(
    fused: Iterable[tuple[int, float]],
    candidates: Iterable[Candidate],
    records: Mapping[int, MemoryRecord],
    weights: AnswerWeights,
    rrf_k: float,
    source_weights: Mapping[str, float] | None = None,
) -> list[tuple[int, float]]:
    """``fused`` re-scored by the model, best first (ties by id, as fusion breaks them).
    ``source_weights`` are the fusion's weights by source name (a source not named weighs 1)."""
    signals = answer_signals(
        fused,
        candidates,
        records,
        rrf_k=rrf_k,
        window_minutes=weights.window_minutes,
        source_weights=source_weights,
    )
    if not signals:
        return []
    # One matrix product for all candidates: the per-candidate sums in Python were a tenth of a
    # recall's own work.
    coefficients = np.array([getattr(weights, name) for name in SIGNALS], dtype=np.float64)
    z = weights.bias + np.array(list(signals.values()), dtype=np.float64) @ coefficients
    estimates = np.exp(-np.logaddexp(0.0, -z)) ** weights.exponent  # sigmoid, without overflow
    scored = zip(signals, estimates.tolist(), strict=True)
    return sorted(scored, key=lambda item: (-item[1], item[0]))


def _window_sums(
    fused: list[tuple[int, float]], times: Mapping[int, datetime], minutes: float
) -> dict[int, float]:
    """For each memory, the fused scores of the other candidates at most ``minutes`` away in time
    (a sliding window over the candidates sorted by time: linear after the sort)."""
    order = sorted(fused, key=lambda item: (times[item[0]], item[0]))
    stamps = [times[mid].timestamp() for mid, _ in order]
    prefix = [0.0]
    for _, score in order:
        prefix.append(prefix[-1] + score)
    span = minutes * 60.0
    sums: dict[int, float] = {}
    low = high = 0
    for i, (mid, score) in enumerate(order):
        while stamps[i] - stamps[low] > span:
            low += 1
        high = max(high, i)
        while high + 1 < len(order) and stamps[high + 1] - stamps[i] <= span:
            high += 1
        sums[mid] = max(0.0, prefix[high + 1] - prefix[low] - score)
    return sums
