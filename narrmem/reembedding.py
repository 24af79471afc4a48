"""What a stored memory's vector is made of, for making it again with another model
(``narrmem migrate --reembed``): the text ingest embedded when the memory was written, so that
a moved memory is found as a new one written with that model would be.

An episode's vector is of its message attributed to its speaker ("Ann said, "…""), or of the
message's gist when triage gave one (``narrmem_episode_gist``); any other record's, and an
episode whose ``embed_text`` a plugin rewrote, is of its ``index_text``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from narrmem.ingest import attributed
from narrmem.models import MemoryRecord
from narrmem.view import MemoryView


async def vector_text(memory: MemoryView, record: MemoryRecord) -> str:
    """The text ``record``'s vector is made of, as ``memory``'s plugins would write it now."""
    if record.kind == "episode" and record.embed_text is not None and record.embed_text == attributed(record):
        gist = await memory.host.call_first("narrmem_episode_gist", memory=memory, text=record.text)
        if isinstance(gist, str) and gist.strip():
            return attributed(record, gist)
    return record.index_text


async def vectors(memory: MemoryView, records: Sequence[MemoryRecord]) -> np.ndarray:
    """``records``' vectors made with ``memory``'s embedder, a row each in their order."""
    texts = [await vector_text(memory, record) for record in records]
    return await memory.embedder.embed(texts)
