"""Node embeddings for seeding a recall by meaning: each node's label embedded with the memory's
embedder. A recall reads, so it writes nothing: the vectors it makes are kept in this process
(:class:`LabelVectors`), never in ``graph_nodes``. That column holds the vectors stores written
before 2026-12-05 cached there; they are still read while their label is the node's."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from narrmem_plugins.graph.vocabulary import label

from narrmem.view import MemoryView

if TYPE_CHECKING:  # nodes are read through the backend, which keeps these vectors
    from narrmem_plugins.graph.nodes import Node

LABELS_KEPT = 4096


class LabelVectors:
    """Label embeddings made by recalls, the ``capacity`` used most recently. A label is a
    person's words: a forget in this process drops them all, and a recall that was embedding
    while it ran keeps none of what it made (``generation``). Another worker's forget clears
    it when this process is told (``narrmem_forgotten_elsewhere``)."""

    def __init__(self, capacity: int = LABELS_KEPT) -> None:
        self.capacity = capacity
        self.generation = 0
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, text: str) -> np.ndarray | None:
        row = self._rows.get(text)
        if row is not None:
            self._rows.move_to_end(text)
        return row

    def put(self, text: str, row: np.ndarray, generation: int) -> None:
        """Keep ``row`` (a copy: a view would hold the whole matrix it came from) unless a forget
        came after ``generation`` was read."""
        if generation != self.generation:
            return
        self._rows[text] = row.copy()
        self._rows.move_to_end(text)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)

    def clear(self) -> None:
        self.generation += 1
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)


async def node_vectors(memory: MemoryView, kept: LabelVectors, nodes: Sequence[Node]) -> np.ndarray:
    """One normalized row per node, embedding the labels neither stored nor ``kept`` yet."""
    dim = int(memory.embedder.dim)
    matrix = np.zeros((len(nodes), dim), dtype=np.float32)
    missing: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        text = label(node.name, node.props)
        cached = kept.get(text)
        if node.vector is not None and node.vector_text == text and len(node.vector) == dim * 4:
            matrix[i] = np.frombuffer(node.vector, dtype=np.float32)
        elif cached is not None and len(cached) == dim:
            matrix[i] = cached
        else:
            missing.setdefault(text, []).append(i)
    if missing:
        texts = list(missing)
        generation = kept.generation
        fresh = np.asarray(await memory.embedder.embed(texts), dtype=np.float32)
        for text, row in zip(texts, fresh, strict=True):
            kept.put(text, row, generation)
            for i in missing[text]:
                matrix[i] = row
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)
