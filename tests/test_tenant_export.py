"""A tenant's export: the tenant's memories chosen by the store's query (not every tenant's read
and filtered), with their importance history, and a header that names the tenant and what the
file leaves out, so it is not taken for a whole store's. It imports as it is. Runs on either
store (``TESTS_STORE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _helpers import msg

from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import LEFT_OUT_OF_A_TENANTS, export_header, export_text
from narrmem.testing import open_memory

TEXTS = ["I decided to quit my job at the bakery", "My sister Ona moved to Lisbon last spring"]


async def _tenant_file(mem: Any, tenant: str) -> str:
    text = export_header(mem, tenant=tenant)
    async for _, line in export_text(mem, tenant=tenant):
        text += line
    return text


async def test_a_tenants_export_is_read_by_tenant_and_says_what_it_leaves_out(tmp_path: Path) -> None:
    # Used memories get history (the tests' default turns reinforcement off).
    async with open_memory(tmp_path / "store", plugin={"hippocampus": {"reinforce": True}}) as mem:
        for n, text in enumerate(TEXTS):
            await mem.ingest(msg(f"a{n}", text, user="ann", tenant="acme"))
            await mem.ingest(msg(f"b{n}", text, user="bob", tenant="globex"))
        await mem.settle()
        hits = await mem.recall("where does Ona live", user_id="ann", tenant="acme", reinforce=False)
        hit = next(h for h in hits if "Lisbon" in h.text and h.kind == "episode")
        assert await mem.mark_used(user_id="ann", tenant="acme", memory_ids=[hit.id]) == [hit.id]
        read: list[str] = []
        async for record, _ in mem.store.export("acme"):
            read.append(record.tenant)
        acme = set((await mem.store.get(list(range(1, 100)), None)).keys())
        acme = {i for i in acme if (await mem.store.get([i], None))[i].tenant == "acme"}
        states = await mem.store.importance_states(0, 100, tenant="acme")
        histories = await mem.store.histories(0, 100, tenant="acme")
        asked: list[dict[str, Any]] = []
        for name in ("importance_states", "histories"):
            original = getattr(mem.store, name)

            async def spied(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                asked.append(kwargs)
                return await _original(*args, **kwargs)

            setattr(mem.store, name, spied)
        text = await _tenant_file(mem, "acme")
    (tmp_path / "acme.jsonl").write_text(text, encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    assert read and set(read) == {"acme"}  # the store's query, not a filter after it
    assert {memory_id for memory_id, *_ in states} == acme and set(histories) == {hit.id}
    assert asked and all(kwargs == {"tenant": "acme"} for kwargs in asked)
    header, *body, end = lines
    assert header["tenant"] == "acme" and header["left_out"] == LEFT_OUT_OF_A_TENANTS
    memories = [line for line in body if line["section"] == "memories"]
    assert {line["tenant"] for line in memories} == {"acme"}
    [history] = [line for line in body if line["section"] == "importance"]
    assert history["memory_id"] == hit.id and [e["who"] for e in history["events"]] == ["bot"]
    assert end["lines"] == {"memories": len(memories), "importance": 1}

    async with open_memory(tmp_path / "restored") as restored:
        counts = await import_jsonl(restored, tmp_path / "acme.jsonl")
        assert counts["imported"] == len(memories) and counts["importance"] == 1
        events = await restored.store.history(hit.id)
    assert [e["who"] for e in events] == ["bot"]


async def test_a_whole_stores_header_names_no_tenant(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "store") as mem:
        header = json.loads(export_header(mem))
    assert set(header) == {"format", "version", "model", "dim"}
