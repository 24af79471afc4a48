"""The RTM tree: its shape (which node spans which clauses, at which depth), built level by level,
and its JSON form.

Conventions: the root is depth 1 and spans every clause. A node spanning one clause is a leaf.
Recursion stops at depth ``D``: a node there spanning more than one clause is a leaf-level node
holding its whole span. Nodes are stored in pre-order, so the nodes of any one level, and the
units of any traversal, come out in narrative order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from narrmem_plugins.rtm.partition import DEFAULT_BALANCE, random_compositions, semantic_parts

Partition = Literal["semantic", "random"]
# Part of every tree id: bump it when shapes, summaries or the JSON change, so trees stored by an
# older version are rebuilt rather than reused. 2: summaries quote the span's most central clauses
# chosen for coverage within the budget (1 quoted those nearest the centroid).
FORMAT_VERSION = 2


@dataclass
class Shape:
    """Columns of the node table, pre-order. ``parent`` is -1 for the root."""

    start: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    parent: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @property
    def children(self) -> np.ndarray:
        """Number of children of each node."""
        has_parent = self.parent >= 0
        return np.bincount(self.parent[has_parent], minlength=len(self))

    @property
    def is_leaf(self) -> np.ndarray:
        leaves: np.ndarray = self.children == 0
        return leaves


@dataclass
class Tree:
    clauses: list[str]
    language: str
    shape: Shape
    summaries: list[str]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def max_depth(self) -> int:
        return int(self.shape.depth.max())

    def to_json(self) -> dict[str, Any]:
        s = self.shape
        return {
            "version": FORMAT_VERSION,
            "language": self.language,
            "clauses": self.clauses,
            "nodes": {
                "start": s.start.tolist(),
                "end": s.end.tolist(),
                "depth": s.depth.tolist(),
                "parent": s.parent.tolist(),
                "summary": self.summaries,
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], params: dict[str, Any] | None = None) -> Tree:
        nodes = data["nodes"]
        shape = Shape(
            start=np.asarray(nodes["start"], dtype=np.int64),
            end=np.asarray(nodes["end"], dtype=np.int64),
            depth=np.asarray(nodes["depth"], dtype=np.int64),
            parent=np.asarray(nodes["parent"], dtype=np.int64),
        )
        return cls(
            clauses=list(data["clauses"]),
            language=str(data["language"]),
            shape=shape,
            summaries=list(nodes["summary"]),
            params=dict(params or {}),
        )


def build_shape(
    clause_count: int,
    branching: int,
    max_depth: int,
    partition: Partition,
    *,
    rng: np.random.Generator | None = None,
    prefix: np.ndarray | None = None,
    balance: float = DEFAULT_BALANCE,
) -> Shape:
    """Split level by level: every node of ``>= 2`` clauses above depth ``D`` gets at most ``K``
    children. ``random`` needs ``rng`` (draws happen level by level, left to right, so a seed
    fixes the tree); ``semantic`` needs ``prefix``, the cumulative sums of the clause vectors."""
    if clause_count < 1:
        raise ValueError("a tree needs at least one clause")
    if partition == "random" and rng is None:
        raise ValueError("the random partition needs a numpy Generator")
    if partition == "semantic" and prefix is None:
        raise ValueError("the semantic partition needs the clause vectors' prefix sums")
    starts = [np.array([0], dtype=np.int64)]
    ends = [np.array([clause_count], dtype=np.int64)]
    depths = [np.array([1], dtype=np.int64)]
    parents = [np.array([-1], dtype=np.int64)]
    frontier = np.array([0], dtype=np.int64) if clause_count >= 2 else np.zeros(0, dtype=np.int64)
    frontier_start, frontier_end = starts[0][: len(frontier)], ends[0][: len(frontier)]
    next_id = 1
    for depth in range(2, max_depth + 1):
        if not len(frontier):
            break
        sizes = frontier_end - frontier_start
        if partition == "random":
            assert rng is not None
            parts = random_compositions(rng, sizes, branching)
        else:
            assert prefix is not None
            parts = _semantic_matrix(prefix, frontier_start, frontier_end, branching, balance)
        offsets = np.cumsum(parts, axis=1) - parts
        keep = parts > 0
        child_start = (frontier_start[:, None] + offsets)[keep]
        child_size = parts[keep]
        child_parent = np.repeat(frontier, keep.sum(axis=1))
        ids = np.arange(next_id, next_id + len(child_start), dtype=np.int64)
        next_id += len(child_start)
        starts.append(child_start)
        ends.append(child_start + child_size)
        depths.append(np.full(len(child_start), depth, dtype=np.int64))
        parents.append(child_parent)
        split = child_size >= 2
        frontier, frontier_start = ids[split], child_start[split]
        frontier_end = frontier_start + child_size[split]
    start, end = np.concatenate(starts), np.concatenate(ends)
    depth_col, parent = np.concatenate(depths), np.concatenate(parents)
    # Pre-order is (start, depth) order: a node precedes its first child (same start, one level
    # deeper), and a whole subtree starts before the next sibling's span does.
    order = np.lexsort((depth_col, start))
    new_id = np.empty_like(order)
    new_id[order] = np.arange(len(order))
    reordered_parent = parent[order]
    reordered_parent = np.where(reordered_parent >= 0, new_id[np.maximum(reordered_parent, 0)], -1)
    return Shape(start=start[order], end=end[order], depth=depth_col[order], parent=reordered_parent)


def _semantic_matrix(
    prefix: np.ndarray, starts: np.ndarray, ends: np.ndarray, branching: int, balance: float
) -> np.ndarray:
    parts = np.zeros((len(starts), branching), dtype=np.int64)
    for row, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        sizes = semantic_parts(prefix, s, e, branching, balance)
        parts[row, : len(sizes)] = sizes
    return parts


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (float64); an all-zero row stays zero."""
    rows = np.asarray(vectors, dtype=np.float64)
    unit: np.ndarray = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    return unit


def prefix_sums(unit: np.ndarray) -> np.ndarray:
    """Row ``i`` is the sum of the first ``i`` rows of ``unit``: any span's sum is one subtraction."""
    prefix = np.zeros((len(unit) + 1, unit.shape[1]), dtype=np.float64)
    np.cumsum(unit, axis=0, out=prefix[1:])
    return prefix
