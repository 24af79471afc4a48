"""Node embeddings for seeding a recall by meaning: each node's label is embedded once with the
memory's embedder and cached in ``graph_nodes.vector`` (re-embedded when its label changes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager

import numpy as np
from narrmem_plugins.graph.backend import GraphSQL
from narrmem_plugins.graph.nodes import Node
from narrmem_plugins.graph.vocabulary import label

from narrmem.view import MemoryView


async def node_vectors(
    memory: MemoryView,
    transaction: Callable[[], AbstractAsyncContextManager[GraphSQL]],
    nodes: Sequence[Node],
) -> np.ndarray:
    """One normalized row per node, embedding (and caching) the ones not cached yet."""
    dim = int(memory.embedder.dim)
    matrix = np.zeros((len(nodes), dim), dtype=np.float32)
    missing: list[int] = []
    for i, node in enumerate(nodes):
        text = label(node.name, node.props)
        if node.vector is not None and node.vector_text == text and len(node.vector) == dim * 4:
            matrix[i] = np.frombuffer(node.vector, dtype=np.float32)
        else:
            missing.append(i)
    if missing:
        texts = [label(nodes[i].name, nodes[i].props) for i in missing]
        fresh = np.asarray(await memory.embedder.embed(texts), dtype=np.float32)
        async with transaction() as db:
            for row, i, text in zip(fresh, missing, texts, strict=True):
                matrix[i] = row
                await db.execute(
                    "UPDATE graph_nodes SET vector = ?, vector_text = ? WHERE id = ?",
                    (row.tobytes(), text, nodes[i].id),
                )
                nodes[i].vector, nodes[i].vector_text = row.tobytes(), text
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)
