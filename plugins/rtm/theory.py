"""What the random tree model predicts, computed exactly, and a starting choice of K and D.

The random model splits a node spanning ``n >= 2`` clauses by a weak composition of ``n`` into
``K`` parts drawn uniformly among the ``C(n+K-1, K-1)`` of them; empty parts make no child. By
symmetry one given part has size ``m`` with probability ``C(n-m+K-2, K-2) / C(n+K-1, K-1)``,
so the expected number of units ``d`` levels below a node of ``n`` clauses is::

    N(0, n) = 1
    N(d, n) = K · Σ_{m=1..n} C(n-m+K-2, K-2) / C(n+K-1, K-1) · N(d-1, m)

For ``n = 1`` the only composition puts the clause in one part (probability 1/K per part, K
parts), so ``N(d, 1) = 1``: a one-clause leaf is counted once at every deeper level, which is
exactly how a traversal counts a leaf above the level it reads. With the root at depth 1, the
expected recall length at depth ``d`` of ``L`` clauses is ``N(d-1, L)`` (K=4, L=100: 1, 3.88,
12.63, 29.98, ...; it tends to ``K**(d-1)`` as ``L`` grows).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

MIN_BRANCHING, MAX_BRANCHING = 2, 10
MIN_DEPTH, MAX_DEPTH = 1, 12


def expected_recall_lengths(clauses: int, branching: int, max_depth: int) -> list[float]:
    """``[N(0, L), N(1, L), ..., N(D-1, L)]``: the expected recall length at depths 1..D.

    Float64, one convolution per level: the numerator depends on ``n - m`` only, so the sum over
    ``m`` for every ``n`` at once is a convolution (``O(D·L²)`` multiply-adds in numpy's C loop,
    about 50 ms per level at L = 10,000). :func:`expected_recall_lengths_exact` is the same
    recursion in rational arithmetic, for checking.
    """
    _check(clauses, branching, max_depth)
    k = branching
    n = np.arange(1, clauses + 1, dtype=np.float64)
    # c[j] = C(j+K-2, K-2) for j = n - m = 0..L-1, built as a running product to stay in floats.
    j = np.arange(clauses, dtype=np.float64)
    c = np.ones(clauses, dtype=np.float64)
    for i in range(1, k - 1):
        c *= (j + i) / i
    # total[n] = C(n+K-1, K-1) for n = 1..L.
    total = np.ones(clauses, dtype=np.float64)
    for i in range(1, k):
        total *= (n + i) / i
    # Normalise c by total row-wise later; large binomials (1e27 at L=10,000, K=10) fit a float64.
    level = np.ones(clauses, dtype=np.float64)  # N(0, m) for m = 1..L
    out = [1.0]
    for _ in range(1, max_depth):
        conv = np.convolve(c, level)[:clauses]  # conv[n-1] = Σ_m c[n-m] · N(d-1, m)
        level = k * conv / total
        out.append(float(level[-1]))
    return out


def expected_recall_lengths_exact(clauses: int, branching: int, max_depth: int) -> list[Fraction]:
    """The same recursion with Fractions (``O(D·L²)`` big-integer steps: keep ``L`` in the hundreds)."""
    _check(clauses, branching, max_depth)
    k = branching
    level = [Fraction(1)] * (clauses + 1)
    out = [Fraction(1)]
    for _ in range(1, max_depth):
        nxt = [Fraction(0)] * (clauses + 1)
        for n in range(1, clauses + 1):
            total = math.comb(n + k - 1, k - 1)
            acc = sum(math.comb(n - m + k - 2, k - 2) * level[m] for m in range(1, n + 1))
            nxt[n] = Fraction(k) * acc / total
        level = nxt
        out.append(level[clauses])
    return out


def suggest_parameters(clause_count: int, compression: float = 0.25) -> tuple[int, int]:
    """``(K, D)`` for a text of ``clause_count`` clauses.

    ``compression`` is the share of units each level keeps of the level below it: a reader who
    chunks four clauses into one idea keeps 0.25, so ``K = round(1 / compression)`` (2..10). ``D``
    is the smallest depth at which an evenly split K-ary tree reaches single clauses
    (``K**(D-1) >= L``), so the deepest traversal is the whole text; clamped to 1..12.
    """
    if clause_count < 1:
        raise ValueError("clause_count must be at least 1")
    if not 0 < compression < 1:
        raise ValueError("compression must lie strictly between 0 and 1")
    k = min(MAX_BRANCHING, max(MIN_BRANCHING, round(1 / compression)))
    if clause_count == 1:
        return k, MIN_DEPTH
    # The epsilon keeps exact powers (64 clauses, K = 4) from rounding up a level.
    levels = math.ceil(math.log(clause_count) / math.log(k) - 1e-9)
    return k, min(MAX_DEPTH, max(MIN_DEPTH, 1 + levels))


def _check(clauses: int, branching: int, max_depth: int) -> None:
    if clauses < 1:
        raise ValueError("clauses must be at least 1")
    if not MIN_BRANCHING <= branching <= MAX_BRANCHING:
        raise ValueError(f"branching must be {MIN_BRANCHING}..{MAX_BRANCHING}")
    if not MIN_DEPTH <= max_depth <= MAX_DEPTH:
        raise ValueError(f"max_depth must be {MIN_DEPTH}..{MAX_DEPTH}")
