"""Reading a tree: the recall sequence at a depth, its length at every depth, tree statistics, the
depth that best matches a target length or a token budget, and the scale check.

The recall sequence at depth ``d`` is every node at level ``d`` plus every leaf above level
``d``, in narrative order: together they cover each clause exactly once. Its length is the
number of units.

The compression ratio has one definition, everywhere (the tools, the user summary, the ensemble):
``compressionRatio = recall length / clauses in the story`` (clauses recalled per clause told) and
``tokenCompressionRatio = tokens of the retelling / tokens of the story`` (estimated tokens); see
:func:`compression`. Depth 1 gives ``1 / clauses``; at the deepest level the token ratio is 1.0 and
the clause ratio is 1.0 unless the depth cap left leaves holding several clauses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from narrmem_plugins.rtm.segment import joiner
from narrmem_plugins.rtm.tree import Shape, Tree

from narrmem.text import estimate_tokens

# Two adjacent-depth ratios count as settled when they differ by at most this share; a level that
# branches less than (1 - this) of what evenly spread clauses allow is flagged as uneven.
SCALE_TOLERANCE = 0.25


def recall_units(shape: Shape, depth: int) -> np.ndarray:
    """Node indices (pre-order, hence narrative order) of the recall sequence at ``depth``."""
    mask = (shape.depth == depth) | (shape.is_leaf & (shape.depth < depth))
    return np.flatnonzero(mask)


def recall_lengths(shape: Shape, max_depth: int | None = None) -> list[int]:
    """Recall length at depths ``1..max_depth`` (default: the tree's depth)."""
    top = int(shape.depth.max()) if max_depth is None else max_depth
    at = np.bincount(shape.depth, minlength=top + 2)
    leaves = np.cumsum(np.bincount(shape.depth[shape.is_leaf], minlength=top + 2))
    # Beyond the deepest level every unit is a leaf: the count stays at the leaf count.
    return [int(at[d] + leaves[d - 1]) if d < len(at) else int(leaves[-1]) for d in range(1, top + 1)]


def compression(tree: Tree, depth: int) -> dict[str, float]:
    """``compressionRatio`` (recall length / clauses in the story) and ``tokenCompressionRatio``
    (tokens of the retelling at ``depth`` / tokens of the story) of ``tree`` at ``depth``."""
    units = len(recall_units(tree.shape, depth))
    story = estimate_tokens(joiner(tree.language).join(tree.clauses))
    return {
        "compressionRatio": round(units / len(tree.clauses), 6),
        "tokenCompressionRatio": round(estimate_tokens(retelling(tree, depth)) / max(story, 1), 6),
    }


def recall_sequence(tree: Tree, depth: int) -> list[str]:
    return [tree.summaries[i] for i in recall_units(tree.shape, depth).tolist()]


def retelling(tree: Tree, depth: int) -> str:
    return str(joiner(tree.language).join(recall_sequence(tree, depth)))


def tree_stats(tree: Tree, reference: Sequence[float] | None = None) -> dict[str, Any]:
    """Node counts, branching, and recall length and compression at every depth.

    ``reference`` is the recall length per depth the partition model expects for evenly spread
    clauses (for the scale check); it defaults to an evenly split K-ary tree of the same clauses.
    """
    shape = tree.shape
    children = shape.children
    internal = children[children > 0]
    leaf_count = int((children == 0).sum())
    lengths = recall_lengths(shape)
    branching = int(tree.params.get("maxBranchingFactor", max(2, int(children.max(initial=2)))))
    if reference is None:
        reference = balanced_recall_lengths(len(tree.clauses), branching, len(lengths))
    distribution = np.bincount(internal, minlength=1)
    return {
        "totalNodes": len(shape),
        "leafCount": leaf_count,
        "clauseCount": len(tree.clauses),
        "depth": len(lengths),
        "avgBranching": round(float(internal.mean()), 4) if len(internal) else 0.0,
        "branching": {str(k): int(v) for k, v in enumerate(distribution) if v},
        "recallLength": {f"depth{d}": n for d, n in enumerate(lengths, start=1)},
        "compressionRatio": {
            f"depth{d}": round(n / len(tree.clauses), 6) for d, n in enumerate(lengths, start=1)
        },
        "scale": scale_check(lengths, reference, leaf_count),
    }


def balanced_recall_lengths(clauses: int, branching: int, max_depth: int) -> list[int]:
    """Recall lengths of the evenly split K-ary tree of ``clauses``: what uniform density gives."""
    sizes = np.array([clauses], dtype=np.int64)
    lengths = []
    for _ in range(max_depth):
        lengths.append(len(sizes))
        parts = np.minimum(sizes, branching)
        base = np.repeat(sizes // parts, parts)
        extra = np.repeat(sizes % parts, parts)
        rank = np.arange(len(base)) - np.repeat(np.cumsum(parts) - parts, parts)
        sizes = base + (rank < extra)
    return lengths


def scale_check(lengths: Sequence[float], reference: Sequence[float], leaf_count: float) -> dict[str, Any]:
    """Do recall lengths grow by a steady factor per level, as K-ary chunking predicts?

    Only levels whose length is at most half the leaf count are judged: below that the supply of
    clauses, not the branching, limits growth. ``settled``: the last two judged ratios agree
    within the tolerance. ``unevenDensity``: some judged level grows clearly less than the
    reference (evenly spread clauses) does, i.e. some parts of the text ran out of clauses while
    others are still dense; re-segmenting or a larger D helps.
    """
    ratios = [lengths[i] / lengths[i - 1] for i in range(1, len(lengths))]
    expected = [reference[i] / reference[i - 1] for i in range(1, min(len(reference), len(lengths)))]
    judged = [i for i in range(1, len(lengths)) if lengths[i] <= leaf_count / 2]
    settled: bool | None = None
    if len(judged) >= 2:
        last, previous = ratios[judged[-1] - 1], ratios[judged[-2] - 1]
        settled = abs(last - previous) <= SCALE_TOLERANCE * previous
    uneven = [
        i + 1
        for i in judged
        if i - 1 < len(expected) and ratios[i - 1] < (1 - SCALE_TOLERANCE) * expected[i - 1]
    ]
    if uneven:
        note = f"uneven clause density: depth(s) {uneven} branch less than evenly spread clauses would"
    elif settled is None:
        note = "too few levels below saturation to judge"
    elif settled:
        note = "adjacent-depth ratios are steady"
    else:
        note = "adjacent-depth ratios still change (short text or small K)"
    return {
        "ratios": [round(r, 4) for r in ratios],
        "expectedRatios": [round(r, 4) for r in expected],
        "settled": settled,
        "unevenDensity": bool(uneven),
        "unevenDepths": uneven,
        "note": note,
    }


def find_optimal_depth(lengths: Sequence[int], branching: int, target: int) -> dict[str, Any]:
    """The depth whose recall length is closest to ``target`` (ties: the shallower one).

    Start from the geometric estimate: depth 2 holds the root's ``b`` children and each level
    below multiplies by about ``K``, so ``target ≈ b·K^(d-2)``, i.e. ``d ≈ 2 + log_K(target/b)``
    (the +2 is the root-is-depth-1 convention plus the root's own level). Then step to adjacent
    depths until the target is bracketed; recall length never shrinks with depth, so the closer
    side of the bracket is the best depth overall.
    """
    top = len(lengths)
    root_branches = lengths[1] if top >= 2 else 1
    if target <= 1 or top == 1:
        estimate = 1
    else:
        estimate = 2 + round(math.log(target / root_branches) / math.log(branching))
    depth = min(top, max(1, estimate))
    searched = [depth]
    if lengths[depth - 1] < target:
        while depth < top and lengths[depth - 1] < target:
            depth += 1
            searched.append(depth)
    else:
        while depth > 1 and lengths[depth - 2] >= target:
            depth -= 1
            searched.append(depth)
    # ``depth`` is now the shallowest with length >= target (or the deepest); its neighbour above
    # is the deepest with length < target.
    if depth > 1 and lengths[depth - 1] >= target:
        above = depth - 1
        if above not in searched:
            searched.append(above)
        if abs(lengths[above - 1] - target) <= abs(lengths[depth - 1] - target):
            depth = above
    actual = lengths[depth - 1]
    return {
        "optimalDepth": depth,
        "actualRecallLength": actual,
        "accuracy": round(max(0.0, 1 - abs(actual - target) / target), 6),
        "estimatedDepth": min(top, max(1, estimate)),
        "searched": [{"depth": d, "recallLength": lengths[d - 1]} for d in searched],
    }


def depth_for_budget(tree: Tree, token_budget: int) -> int:
    """The deepest depth whose retelling fits ``token_budget`` estimated tokens; 1 if none does
    (the caller cuts the root's summary then)."""
    for depth in range(tree.max_depth, 0, -1):
        if estimate_tokens(retelling(tree, depth)) <= token_budget:
            return depth
    return 1
