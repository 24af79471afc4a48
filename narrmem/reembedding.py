"""What a stored memory's vector is made of, for making it again with another model
(``narrmem migrate --reembed``): the text ingest embedded when the memory was written, so that
a moved memory is found as a new one written with that model would be.

An episode's vector is of its message attributed to its speaker ("Ann said, "…""), or of the
message's gist when triage gave one (``narrmem_episode_gist``); any other record's, and an
episode whose ``embed_text`` a plugin rewrote, is of its ``index_text``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from narrmem.embed import weights_digest
from narrmem.ingest import attributed
from narrmem.models import MemoryRecord
from narrmem.view import MemoryView


async def vector_text(memory: MemoryView, record: MemoryRecord) -> str:
    """The text ``record``'s vector is made of, as ``memory``'s plugins would write it now."""
    # An episode written before episodes were attributed (no embed_text) is embedded as a new one.
    written_as_new = record.embed_text is None or record.embed_text == attributed(record)
    if record.kind == "episode" and len(record.message_ids) == 1 and written_as_new:
        gist = await memory.host.call_first("narrmem_episode_gist", memory=memory, text=record.text)
        return attributed(record, gist if isinstance(gist, str) and gist.strip() else None)
    return record.index_text


async def vectors(memory: MemoryView, records: Sequence[MemoryRecord]) -> np.ndarray:
    """``records``' vectors made with ``memory``'s embedder, a row each in their order."""
    texts = [await vector_text(memory, record) for record in records]
    return await memory.embedder.embed(texts)


async def model_identity(embedder: Any) -> str:
    """What tells a model's vectors from another's: its name (a model folder's last name), and
    for a folder of its own the digest of its weights (two folders of one name are two models)."""
    path = getattr(embedder, "model_path", None)
    digest = await asyncio.to_thread(weights_digest, path) if isinstance(path, str) else None
    name = str(embedder.name)
    return name if digest is None else f"{name}@{digest}"
