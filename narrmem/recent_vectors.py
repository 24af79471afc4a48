"""The vectors of the texts a model embedded last, by text.

A message with a scene signal is embedded twice over on its way in: triage embeds its candidate
sentence to compare it with the scene prototypes, and the scene written from it is embedded as
that same sentence. An import met such a text again for 6 % of everything it embedded. The model
embeds one text per run by default, so a text's vector does not depend on the texts beside it and
a kept one is the vector the model would give again.

Only a bounded number is kept, in the process's memory, each under a digest of its text rather
than the text (a message may hold 16,000 characters), and a forget empties it
(:class:`ForgetsRecentTexts`).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

KEPT_TEXTS = 2048  # about 3 MB of 384-dimension vectors


@runtime_checkable
class ForgetsRecentTexts(Protocol):
    """An embedder that keeps recent texts' vectors; a forget calls :meth:`forget_recent_texts`."""

    def forget_recent_texts(self) -> None: ...


class RecentVectors:
    """An LRU of text → unit vector in front of a model (see the module's docstring)."""

    def __init__(self, size: int = KEPT_TEXTS) -> None:
        self.size = size
        self._vectors: OrderedDict[bytes, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self._vectors)

    def __contains__(self, text: object) -> bool:
        """Whether ``text``'s vector is kept (its place in the LRU does not move)."""
        return isinstance(text, str) and _digest(text) in self._vectors

    async def embed(
        self, texts: Sequence[str], dim: int, model: Callable[[list[str]], Awaitable[np.ndarray]]
    ) -> np.ndarray:
        """``texts``' vectors: the kept ones from here, the others from ``model`` (each text once)."""
        out = np.empty((len(texts), dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        for row, text in enumerate(texts):
            key = _digest(text)
            kept = self._vectors.get(key)
            if kept is None:
                missing.setdefault(text, []).append(row)
            else:
                self._vectors.move_to_end(key)
                out[row] = kept
        if missing:
            new = list(missing)
            vectors = await model(new)
            for text, vector in zip(new, vectors, strict=True):
                out[missing[text]] = vector
                self._keep(text, vector)
        return out

    def _keep(self, text: str, vector: np.ndarray) -> None:
        stored = np.array(vector, dtype=np.float32)  # a copy: the caller may change its array
        stored.setflags(write=False)
        key = _digest(text)
        self._vectors[key] = stored
        self._vectors.move_to_end(key)
        while len(self._vectors) > self.size:
            self._vectors.popitem(last=False)

    def clear(self) -> None:
        self._vectors.clear()


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
