"""The two ways a node's clause span is cut into at most K contiguous children.

``random`` (the paper's model): a uniform weak composition of ``n`` into ``K`` parts, drawn by
stars and bars: ``K-1`` bar positions chosen uniformly among ``n+K-1`` slots. Empty parts make no
child. Vectorised over many nodes at once, which is what makes ensembles cheap.

``semantic``: cut where the topic shifts most, i.e. where the mean embedding of the clauses just
before a gap is least similar to the mean of the clauses just after it.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np

# Weight of the pull towards even parts in the semantic model. Without it, lone odd clauses at the
# edges of a span are the deepest valleys, and the tree peels them off one per level while the
# bulk of the story stays unsplit until the depth runs out.
DEFAULT_BALANCE = 0.1
MAX_WINDOW = 8


def random_compositions(rng: np.random.Generator, sizes: np.ndarray, branching: int) -> np.ndarray:
    """One uniform weak composition per size: an ``(len(sizes), K)`` int64 array of part sizes.

    Bars come from Floyd's algorithm, vectorised: for ``j = n, ..., n+K-2`` draw ``t`` uniform
    in ``0..j`` and take ``j`` instead when ``t`` was already taken. That yields a uniform
    ``(K-1)``-subset of ``0..n+K-2`` in ``K-1`` array operations, whatever the sizes.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    count, bars = len(sizes), branching - 1
    chosen = np.empty((count, bars), dtype=np.int64)
    for i in range(bars):
        j = sizes + i
        t = rng.integers(0, j + 1)
        taken = (chosen[:, :i] == t[:, None]).any(axis=1)
        chosen[:, i] = np.where(taken, j, t)
    chosen.sort(axis=1)
    slots = sizes + branching - 1
    edges = np.concatenate([np.full((count, 1), -1), chosen, slots[:, None]], axis=1)
    return np.diff(edges, axis=1) - 1


def semantic_parts(
    prefix: np.ndarray, start: int, end: int, branching: int, balance: float = DEFAULT_BALANCE
) -> list[int]:
    """Part sizes for the span ``[start, end)`` cut at its ``K-1`` sharpest topic shifts.

    ``prefix`` holds cumulative sums of the unit clause vectors (row ``i`` = sum of rows ``< i``),
    so every window mean costs one subtraction. The score of the gap before clause ``b`` is the
    cosine between the windows ``[b-w, b)`` and ``[b, b+w)`` plus ``balance`` times its distance
    from the nearest interior even cut (in part lengths, 0..1); the lowest scores win, the earliest
    on ties. Gaps closer than a third of an even part to a chosen one are passed over while others
    remain, so one shift is not cut twice.
    """
    n = end - start
    if n <= branching:
        return [1] * n
    window = min(MAX_WINDOW, max(1, n // (2 * branching)))
    # Only gaps with a full window on both sides compete: a window cut short by the span's edge
    # averages fewer clauses, looks less similar to its neighbour, and would win for that alone.
    gaps = np.arange(start + window, end - window + 1)
    lo = np.maximum(start, gaps - window)
    hi = np.minimum(end, gaps + window)
    left = prefix[gaps] - prefix[lo]
    right = prefix[hi] - prefix[gaps]
    norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
    cosine = np.einsum("ij,ij->i", left, right) / np.maximum(norms, 1e-12)
    part = n / branching
    offset = (gaps - start) / part
    # Distance to the nearest interior even cut (1..K-1 parts in), up to 1 next to the edges.
    distance = np.abs(offset - np.clip(np.round(offset), 1, branching - 1))
    score = cosine + balance * np.minimum(distance, 1.0)
    order = np.argsort(score, kind="stable")
    radius = int(part // 3)
    picked: list[int] = []
    for g in order:
        if len(picked) == branching - 1:
            break
        if all(abs(int(g) - p) > radius for p in picked):
            picked.append(int(g))
    for g in order:  # short of cuts after spacing them out: take the best remaining
        if len(picked) == branching - 1:
            break
        if int(g) not in picked:
            picked.append(int(g))
    cuts = sorted(int(gaps[p]) for p in picked)
    bounds = [start, *cuts, end]
    return [b - a for a, b in pairwise(bounds)]
