"""An export of any size is imported without holding it: checked whole, then written in batches
read again from the file. A store of millions of memories was read into memory whole (about
12 KB a memory), and its import ran out of memory where its export had not."""

from __future__ import annotations

import base64
import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import msg, store_count, write_export

from narrmem import InputError, Memory, table_transfer
from narrmem.doors import importing
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_store
from narrmem.testing import open_memory

SAID = [
    "I adopted a greyhound named Pixel",
    "my sister Lena lives in Porto",
    "I work night shifts at the hospital",
    "we are moving to Lisbon in May",
    "I started learning the cello",
    "my favourite bakery is called Crumb",
    "I run every morning before work",
    "our daughter starts school in September",
]


async def _source(folder: Path, path: Path) -> dict[str, int]:
    async with open_memory(folder) as memory:
        for n, text in enumerate(SAID):
            await memory.ingest(msg(f"m{n}", text, user=f"u{n % 3}", chat=f"c{n % 3}"))
        await memory.settle()
        return await export_store(memory, path)


def _counting_batches(memory: Memory, sizes: list[int], after: Any = None) -> None:
    original = memory.store.import_records

    async def import_records(items: Any) -> dict[str, int]:
        sizes.append(len(items))
        counts = await original(items)
        if after is not None:
            after()
        return counts

    memory.store.import_records = import_records  # type: ignore[method-assign]


async def test_memories_are_written_in_batches_and_the_import_is_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "export.jsonl"
    written = await _source(tmp_path / "source", path)
    monkeypatch.setattr(importing, "BATCH", 3)
    sizes: list[int] = []
    async with open_memory(tmp_path / "target") as memory:
        _counting_batches(memory, sizes)
        counts = await import_jsonl(memory, path)
        await export_store(memory, tmp_path / "again.jsonl")
    assert counts["imported"] == written["memories"] >= 7
    assert max(sizes) == 3 and sum(sizes) == written["memories"]
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()


async def test_checks_reach_across_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each batch is checked against every line before it, not only its own: an id given twice,
    a message two episodes claim, an importance line naming a memory the file lacks."""
    path = tmp_path / "export.jsonl"
    await _source(tmp_path / "source", path)
    monkeypatch.setattr(importing, "BATCH", 1)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    memories = [line for line in lines if line.get("section") == "memories"]
    first, last = memories[0], memories[-1]
    cases = {
        "id": {**last, "id": first["id"], "message_ids": ["x1"]},
        "message_ids": {**last, "id": 999, "chat_id": first["chat_id"], "tenant": first["tenant"]}
        | {"message_ids": first["message_ids"]},
    }
    for field, extra in cases.items():
        bad = write_export(tmp_path / f"{field}.jsonl", [*lines, extra])
        async with open_memory(tmp_path / f"target-{field}") as memory:
            with pytest.raises(InputError) as info:
                await import_jsonl(memory, bad)
            assert (info.value.field, info.value.line) == (field, len(lines))  # the added line
            assert await store_count(memory) == 0
    orphan = write_export(tmp_path / "orphan.jsonl", [*lines, {"section": "importance", "memory_id": 999}])
    async with open_memory(tmp_path / "target-orphan") as memory:
        with pytest.raises(InputError) as info:
            await import_jsonl(memory, orphan)
        assert info.value.field == "memory_id"
        assert await store_count(memory) == 0


async def test_a_file_changed_while_it_is_imported_stops_it_and_the_next_import_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lines are read again from where they were checked: another file there now is not
    read, and what was written of the first stays for the next import to finish."""
    path = tmp_path / "export.jsonl"
    written = await _source(tmp_path / "source", path)
    whole = path.read_bytes()
    monkeypatch.setattr(importing, "BATCH", 2)

    def rewrite() -> None:
        path.write_bytes(whole + b"\n")  # another file, and one whose lines still check

    sizes: list[int] = []
    async with open_memory(tmp_path / "target") as memory:
        _counting_batches(memory, sizes, after=rewrite)
        with pytest.raises(InputError) as info:
            await import_jsonl(memory, path)
        assert info.value.field == "file"
        assert await store_count(memory) == 2
    async with open_memory(tmp_path / "target") as memory:
        counts = await import_jsonl(memory, path)
        await export_store(memory, tmp_path / "again.jsonl")
    assert (counts["imported"], counts["skipped"]) == (written["memories"] - 2, 2)
    assert (tmp_path / "again.jsonl").read_bytes() == whole


@pytest.mark.sqlite_only("one store is enough to measure what the import itself holds")
async def test_an_import_holds_a_batch_not_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 memories (8 MB of file): the import held every line's record and vector at once,
    more than the file's size besides what the store keeps (its vector index); a batch now."""
    monkeypatch.setattr(importing, "BATCH", 100)
    path = tmp_path / "big.jsonl"
    rng = np.random.default_rng(7)
    async with open_memory(tmp_path / "target") as memory:
        header = {"format": "narrmem-export", "version": 3, "model": memory.embedder.name}
        lines: list[dict[str, Any]] = [{**header, "dim": memory.embedder.dim}]
        for n in range(1, 3001):
            vector = rng.standard_normal(memory.embedder.dim).astype("<f4")
            vector /= np.linalg.norm(vector)
            lines.append(
                {
                    "section": "memories",
                    "id": n,
                    "kind": "episode",
                    "tenant": "default",
                    "user_id": f"u{n % 40}",
                    "chat_id": f"c{n % 40}",
                    "text": f"message {n} about the garden, the cello and the move to Lisbon " * 4,
                    "importance": 0.3,
                    "created_at": "2026-03-02T10:00:00+00:00",
                    "message_ids": [f"m{n}"],
                    "meta": {"layer": "accumulate"},
                    "vector": base64.b64encode(vector.tobytes()).decode(),
                }
            )
        write_export(path, lines)
        del lines
        tracemalloc.start()
        try:
            counts = await import_jsonl(memory, path)
            kept, peak = tracemalloc.get_traced_memory()  # kept: the store's index, mostly
        finally:
            tracemalloc.stop()
        assert counts["imported"] == 3000
    size = path.stat().st_size
    assert size > 6_000_000
    held = peak - kept
    assert held < size * 0.25, f"the import held {held / 1e6:.1f} MB for a file of {size / 1e6:.1f} MB"


@pytest.mark.sqlite_only("one store is enough to measure what the import itself holds")
async def test_an_import_holds_a_chunk_of_a_plugins_records_not_the_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 facts (4,000 graph rows, chunks of 100): the plugins were handed every record of their
    sections at once, parsed (13.1 MB for the 2.4 MB of 3,000 facts in the file); they read them
    from the file a chunk at a time now."""
    from test_export_pages import _facts

    monkeypatch.setattr(importing, "BATCH", 100)
    monkeypatch.setattr(table_transfer, "IMPORT_CHUNK", 100)

    path = tmp_path / "export.jsonl"
    async with open_memory(tmp_path / "source") as memory:
        await _facts(memory, 0, 2000)
        await export_store(memory, path)
    graph_bytes = sum(len(line) for line in path.read_bytes().splitlines() if b'"section": "graph.' in line)
    async with open_memory(tmp_path / "target") as memory:
        tracemalloc.start()
        try:
            start, _ = tracemalloc.get_traced_memory()
            counts = await import_jsonl(memory, path)
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await export_store(memory, tmp_path / "again.jsonl")
    assert counts["graph.edges"] == 2000 and counts["graph.nodes"] == 2001
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
    held = peak - max(start, kept)
    assert held < graph_bytes * 0.75, (
        f"the import held {held / 1e6:.1f} MB for {graph_bytes / 1e6:.1f} MB of rows"
    )


async def test_a_file_of_memories_without_ids_is_written_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory line may leave its id out (a file made by hand, or by another system): stopped
    after its first batch and run again, such an import wrote the first batch twice."""
    path = tmp_path / "export.jsonl"
    await _source(tmp_path / "source", path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    kept = [line for line in lines if line.get("section") not in ("importance", "state")]
    for line in kept:
        if line.get("section") == "memories":
            del line["id"]
    bare = write_export(tmp_path / "bare.jsonl", kept)
    memories = sum(line.get("section") == "memories" for line in kept)
    monkeypatch.setattr(importing, "BATCH", 3)
    async with open_memory(tmp_path / "target") as memory:
        sizes: list[int] = []
        original = memory.store.import_records

        async def stopped(items: Any) -> dict[str, int]:
            sizes.append(len(items))
            raise KeyboardInterrupt  # the process stopped in the middle of the write

        memory.store.import_records = stopped  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            await import_jsonl(memory, bare)
        assert sizes == [memories] and await store_count(memory) == 0
        memory.store.import_records = original  # type: ignore[method-assign]
        counts = await import_jsonl(memory, bare)
        assert counts["imported"] == memories == await store_count(memory)


@pytest.mark.parametrize("chunk", [1000, 2])
async def test_a_key_twice_in_a_section_is_refused_whichever_chunks_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Records are checked a chunk at a time: a second record of a key in a later chunk found the
    first one written by the dry run, and was taken for it stored already (the section's count
    then told one record less than its lines)."""
    monkeypatch.setattr(table_transfer, "IMPORT_CHUNK", chunk)
    spec = [table_transfer.TableSpec(section="x.t", table="x_t")]
    records = [{"id": n, "v": f"r{n}"} for n in range(5)] + [{"id": 1, "v": "r1"}]
    async with open_memory(tmp_path / "m") as memory:
        async with memory.store.sql(write=True) as db:
            await db.execute("CREATE TABLE x_t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        for dry_run in (True, False):
            with pytest.raises(InputError) as info:
                await table_transfer.import_tables(memory.store, spec, {"x.t": records}, dry_run=dry_run)
            assert info.value.field == "x.t[5]" and "x.t[1]" in info.value.reason
        async with memory.store.sql() as db:
            assert await db.fetchall("SELECT COUNT(*) FROM x_t") == [(0,)]


async def test_an_import_stopped_in_a_long_history_writes_the_rest_when_run_again(tmp_path: Path) -> None:
    """The store keeps a memory's newest history rows only: an import stopped after more rows than
    it keeps held their last ones, not the file's first, and run again it took them for the
    store's own and wrote none of the rest (the newest, the ones kept)."""
    from datetime import UTC, datetime, timedelta

    from narrmem.store import ImportanceChange

    start = datetime(2026, 5, 1, tzinfo=UTC)
    async with open_memory(tmp_path / "a", storage={"history_kept_per_memory": 0}) as source:
        [stored] = await source.ingest_many([msg("m1", "I adopted a greyhound named Pixel")])
        [memory_id] = stored.memory_ids[:1]
        value = (await source.store.get([memory_id], None))[memory_id].importance
        for day in range(1, 7):
            at = start + timedelta(days=day)
            change = ImportanceChange(
                memory_id=memory_id,
                importance=value / 2,
                reinforced_at=at,
                old=value,
                who="test",
                why=f"d{day}",
            )
            assert await source.store.set_importance([change], at) == [memory_id]
            value /= 2
        await export_store(source, tmp_path / "whole.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "whole.jsonl").read_text().splitlines()]
    [history] = [
        line for line in lines if line.get("section") == "importance" and line["memory_id"] == memory_id
    ]
    stopped = [
        {**line, "events": line["events"][:4]} if line is history else line
        for line in lines
        if line.get("section") != "end"
    ]
    write_export(tmp_path / "stopped.jsonl", stopped)
    async with open_memory(tmp_path / "b", storage={"history_kept_per_memory": 3}) as target:
        await import_jsonl(target, tmp_path / "stopped.jsonl")  # as far as the stop
        assert [h["why"] for h in await target.store.history(memory_id)] == ["d2", "d3", "d4"]
        await import_jsonl(target, tmp_path / "whole.jsonl")
        assert [h["why"] for h in await target.store.history(memory_id)] == ["d4", "d5", "d6"]
