"""Importance over a memory's life, as the public API asks for it: its value after decay now, the
bot's "I used these" reinforcement, the decay pass, and its recorded history. The arithmetic is a
plugin's (the hippocampus by default); this module validates the calls and merges the answers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from narrmem.checks import aware_time_argument, int_argument
from narrmem.errors import InputError, StoreError
from narrmem.models import MemoryRecord, Scope
from narrmem.view import MemoryView


async def importance_now(memory: MemoryView, records: Sequence[MemoryRecord]) -> dict[int, float]:
    answer = await memory.host.call_first(
        "narrmem_importance_now", memory=memory, records=list(records), now=memory.clock.now()
    )
    now_values = {int(k): float(v) for k, v in (answer or {}).items()}
    return {r.id: now_values.get(r.id, r.importance) for r in records if r.id is not None}


async def mark_used(memory: MemoryView, memory_ids: Sequence[int], scope: Scope) -> list[int]:
    ids = memory_id_list(memory_ids)
    if memory.read_only:
        raise StoreError(f"{memory.data_dir} is open read-only: nothing can be reinforced")
    records = list((await memory.store.get(ids, scope)).values())
    parts = await memory.host.call("narrmem_used", memory=memory, records=records)
    return sorted({memory_id for part in parts for memory_id in part})


async def decay(memory: MemoryView, now: datetime | None) -> dict[str, int]:
    when = memory.clock.now() if now is None else aware_time_argument(now, "now")
    if memory.read_only:
        # The pass writes each memory's importance after decay; read-only, the plugins skipped it
        # and the caller was answered {} as if it had run.
        raise StoreError(f"{memory.data_dir} is open read-only: a decay pass writes")
    counts: dict[str, int] = {}
    for part in await memory.host.call("narrmem_decay", memory=memory, now=when):
        counts.update(part)
    return counts


async def history(memory: MemoryView, memory_id: int) -> dict[str, Any]:
    memory_id = int_argument(memory_id, "memory_id")
    record = (await memory.store.get([memory_id], None)).get(memory_id)
    if record is None:
        raise InputError(f"no memory with id {memory_id}", field="memory_id")
    result: dict[str, Any] = {
        "memory": record.model_dump(mode="json", exclude={"embed_text", "context_text"}),
        "events": await memory.store.history(memory_id),
    }
    for part in await memory.host.call(
        "narrmem_history", memory=memory, record=record, now=memory.clock.now()
    ):
        result.update(part)
    return result


def memory_id_list(memory_ids: Sequence[int]) -> list[int]:
    if isinstance(memory_ids, str | bytes) or not isinstance(memory_ids, Sequence):
        raise InputError("must be a list of memory ids", field="memory_ids")
    for i, memory_id in enumerate(memory_ids):
        if isinstance(memory_id, bool) or not isinstance(memory_id, int) or not 0 < memory_id < 2**63:
            raise InputError("must be a positive integer", field=f"memory_ids[{i}]")
    return list(memory_ids)
