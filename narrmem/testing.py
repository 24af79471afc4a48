"""Helpers for testing narrmem and plugins written for it.

In a ``conftest.py``: ``pytest_plugins = ["narrmem.testing"]``. That gives the fixtures
``memory`` (an open ``Memory`` in a temporary folder with the fast :class:`HashEmbedder`) and
``memory_factory`` (open more, with any plugins, settings, clock or the real model). Fixtures
need pytest-asyncio.

The hash embedder is for fast tests of pure logic only: it matches words, not meaning.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest_asyncio

from narrmem.clock import Clock
from narrmem.config import Settings, load_settings
from narrmem.host import hookimpl
from narrmem.memory import Memory
from narrmem.text import keyword_terms

HASH_EMBEDDER = "hash"


class HashEmbedder:
    """Deterministic bag-of-words vectors: each word hashed into one of ``dim`` buckets."""

    name = "hash-test"
    dim = 384
    batch_size = 64

    async def start(self) -> None:
        return None

    def vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self.dim, dtype=np.float32)
        for term in keyword_terms(text) or [""]:
            bucket = int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "little")
            vector[bucket % self.dim] += 1.0
        return vector / np.linalg.norm(vector)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.vstack([self.vector(t) for t in texts])

    async def close(self) -> None:
        return None


class TestingPlugin:
    """Registers the ``hash`` embedder."""

    narrmem_name = "narrmem_testing"

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register(HASH_EMBEDDER, lambda settings: HashEmbedder())


def open_memory(
    folder: str | Path,
    *,
    real_model: bool = False,
    clock: Clock | None = None,
    plugins: Iterable[object] = (),
    config_file: str | Path | None = None,
    read_only: bool = False,
    **overrides: Any,
) -> Any:
    """``Memory.open`` for tests: third-party entry points off, the hash embedder unless ``real_model``.

    ``plugins`` takes plugin objects; a dict is taken as the ``[plugins]`` settings table instead.
    """
    if isinstance(plugins, dict):
        overrides["plugins"] = plugins
        plugins = ()
    if not real_model:
        overrides.setdefault("embedder", {"backend": HASH_EMBEDDER})
    settings = load_settings(config_file, data_dir=str(folder), **overrides)
    return Memory.open(
        settings=settings,
        clock=clock,
        plugins=[TestingPlugin(), *plugins],
        load_entrypoints=False,
        read_only=read_only,
    )


@pytest_asyncio.fixture
async def memory(tmp_path: Path) -> AsyncIterator[Memory]:
    async with open_memory(tmp_path / "memory") as mem:
        yield mem


@pytest_asyncio.fixture
async def memory_factory(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Memory] = []
    counter = iter(range(1_000_000))

    async def factory(folder: str | Path | None = None, **kwargs: Any) -> Memory:
        mem: Memory = await open_memory(folder or tmp_path / f"memory-{next(counter)}", **kwargs)
        opened.append(mem)
        return mem

    yield factory
    for mem in opened:
        await mem.close()
