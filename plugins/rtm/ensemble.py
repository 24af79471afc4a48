"""Ensembles of random trees over one text: population-level variance of recall.

Only counts matter for the statistics, so no tree is materialised and nothing is summarised: all
trees advance one level at a time as flat arrays of (tree, span size) for the nodes that can
still split, and every split of that level is one vectorised draw
(:func:`~narrmem_plugins.rtm.partition.random_compositions`). Leaves (one clause) stop splitting
but keep counting as one unit at every deeper level, as in a traversal and in the theory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from narrmem_plugins.rtm.partition import random_compositions
from narrmem_plugins.rtm.theory import expected_recall_lengths
from narrmem_plugins.rtm.traverse import scale_check


@dataclass(frozen=True)
class Simulation:
    """Per tree (rows) and depth (columns, depth 1 first): recall lengths; per tree: node counts."""

    recall: np.ndarray  # (trees, D) int64
    total_nodes: np.ndarray  # (trees,)
    leaves: np.ndarray  # (trees,) leaves under the depth cap: the recall length at depth D

    @property
    def internal(self) -> np.ndarray:
        internal: np.ndarray = self.total_nodes - self.leaves
        return internal


def simulate(clauses: int, branching: int, max_depth: int, trees: int, seed: int) -> Simulation:
    """``trees`` random trees of ``clauses`` clauses; the same seed gives the same numbers."""
    rng = np.random.default_rng(seed)
    recall = np.zeros((trees, max_depth), dtype=np.int64)
    created = np.ones(trees, dtype=np.int64)  # the root
    leaves_above = np.zeros(trees, dtype=np.int64)  # one-clause nodes at this level or above
    if clauses >= 2:
        owner = np.arange(trees, dtype=np.int64)
        size = np.full(trees, clauses, dtype=np.int64)
    else:
        owner = np.zeros(0, dtype=np.int64)
        size = np.zeros(0, dtype=np.int64)
        leaves_above += 1
    for level in range(max_depth):
        recall[:, level] = np.bincount(owner, minlength=trees) + leaves_above
        if level == max_depth - 1 or not len(size):
            recall[:, level + 1 :] = recall[:, level : level + 1]
            break
        parts = random_compositions(rng, size, branching)
        kept = parts > 0
        created += np.bincount(owner, weights=kept.sum(axis=1), minlength=trees).astype(np.int64)
        child_owner = np.repeat(owner, kept.sum(axis=1))
        child_size = parts[kept]
        single = child_size == 1
        leaves_above += np.bincount(child_owner[single], minlength=trees)
        owner, size = child_owner[~single], child_size[~single]
    return Simulation(recall=recall, total_nodes=created, leaves=recall[:, -1].copy())


def summarize(sim: Simulation, clauses: int, branching: int, max_depth: int) -> dict[str, Any]:
    """Per depth: mean, std, standard error of recall length and compression (recall length /
    clauses), the theory and the z-score of the mean against it; node-count statistics; the scale
    check of the means."""
    trees = sim.recall.shape[0]
    theory = expected_recall_lengths(clauses, branching, max_depth)
    # Relative to the text's clauses (the leaves of an uncapped tree), so the theory is exact:
    # dividing by each tree's own leaf count (random under a depth cap) would bias it.
    compression = sim.recall / clauses
    ddof = 1 if trees > 1 else 0
    means = sim.recall.mean(axis=0)
    stds = sim.recall.std(axis=0, ddof=ddof)
    sems = stds / math.sqrt(trees)
    depths = []
    for d in range(max_depth):
        gap = float(means[d] - theory[d])
        if sems[d] > 0:
            z: float | None = gap / float(sems[d])
        else:
            # Every tree agrees (depth 1 always has one unit). A mean of N integers moves in steps
            # of 1/N, so a smaller gap to the theory is below what the sample can show: z = 0.
            z = 0.0 if abs(gap) < 1 / trees else None
        depths.append(
            {
                "depth": d + 1,
                "recallLengthMean": float(means[d]),
                "recallLengthStd": float(stds[d]),
                "recallLengthSem": float(sems[d]),
                "recallLengthMin": int(sim.recall[:, d].min()),
                "recallLengthMax": int(sim.recall[:, d].max()),
                "compressionRatioMean": float(compression[:, d].mean()),
                "compressionRatioStd": float(compression[:, d].std(ddof=ddof)),
                "theoryRecallLength": float(theory[d]),
                "theoryCompressionRatio": float(theory[d] / clauses),
                "zScore": z,
                "ratioToPrevious": float(means[d] / means[d - 1]) if d else None,
                "theoryRatio": float(theory[d] / theory[d - 1]) if d else None,
            }
        )
    internal = np.maximum(sim.internal, 1)
    branching_per_tree = np.where(sim.internal > 0, (sim.total_nodes - 1) / internal, 0.0)
    return {
        "depths": depths,
        "nodes": {
            "totalNodesMean": float(sim.total_nodes.mean()),
            "totalNodesStd": float(sim.total_nodes.std(ddof=ddof)),
            "leafCountMean": float(sim.leaves.mean()),
            "leafCountStd": float(sim.leaves.std(ddof=ddof)),
            "avgBranchingMean": float(branching_per_tree.mean()),
            "avgBranchingStd": float(branching_per_tree.std(ddof=ddof)),
        },
        "scale": scale_check(means.tolist(), theory, float(sim.leaves.mean())),
        "maxAbsZScore": max((abs(d["zScore"]) for d in depths if d["zScore"] is not None), default=0.0),
    }
