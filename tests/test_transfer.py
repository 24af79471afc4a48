"""Lossless JSONL export/import, idempotent imports, and bad export lines named precisely."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _helpers import hit_keys, index_file_ids, msg, on_sqlite, store_count, store_sql, write_export

import narrmem
from narrmem import InputError
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_jsonl, read_messages
from narrmem.testing import open_memory

MESSAGES = [
    msg("1", "I adopted a greyhound named Pixel", user="u1", chat="c1", speaker="Ana", meta={"k": [1, 2.5]}),
    msg("2", "我喜欢摇滚乐，尤其是九十年代的乐队。", user="u2", chat="c2", ts="2026-05-05T19:30:00+08:00"),
    msg("3", "emoji 🎸 and accents: café, naïve, Ελληνικά", user="u1", chat="c2", tenant="t2"),
    msg("4", 'quotes "inside" and a backslash \\ and a tab\tand newline\nend', user="u3", chat="c1"),
    msg("5", "ok", user="u3", chat="c1"),  # ignored by triage, never exported
]


@pytest.fixture
async def exported(tmp_path: Path) -> tuple[Path, Path]:
    """A source store and its export file."""
    source = tmp_path / "source"
    path = tmp_path / "export.jsonl"
    async with open_memory(source) as mem:
        await mem.ingest_many(MESSAGES)
        assert await export_jsonl(mem, path) == 4
    return source, path


def _memories(counts: dict[str, int]) -> tuple[int, int]:
    return counts["imported"], counts["skipped"]


async def _stored(folder: Path) -> tuple[list[tuple[Any, ...]], dict[int, bytes]]:
    """The memories' rows and their stored vectors, read through the store (either backend)."""
    async with open_memory(folder) as mem:
        rows = await store_sql(
            mem, "SELECT id, text, message_ids, meta, tenant, user_id FROM memories ORDER BY id"
        )
        vectors: dict[int, bytes] = {}
        for memory_id, *_, tenant, user_id in rows:
            found = await mem.store.vectors([memory_id], narrmem.Scope(tenant=tenant, user_id=user_id))
            vectors.update({i: v.tobytes() for i, v in found.items()})
    return rows, vectors


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def test_export_import_export_is_byte_identical(exported: Any, tmp_path: Path) -> None:
    source, path = exported
    target = tmp_path / "target"
    again = tmp_path / "again.jsonl"
    async with open_memory(target) as mem:
        assert _memories(await import_jsonl(mem, path)) == (4, 0)
        assert await export_jsonl(mem, again) == 4
        imported_hits = hit_keys(await mem.recall("greyhound Pixel", user_id="u1"))
    assert again.read_bytes() == path.read_bytes()
    assert not (tmp_path / "again.jsonl.partial").exists()

    # Same ids, same texts, same vectors, and (SQLite's FAISS files) the derived index agrees.
    assert await _stored(target) == await _stored(source)
    async with open_memory(source) as mem:
        assert hit_keys(await mem.recall("greyhound Pixel", user_id="u1")) == imported_hits
    async with open_memory(target) as mem:
        if on_sqlite(mem):
            assert index_file_ids(target) == index_file_ids(source)
            assert mem.store.index.rebuilt_reason is None
        hits = await mem.recall("摇滚", user_id="u2")
        assert hits[0].message_ids == ["2"] and "keyword" in hits[0].sources  # keyword index rebuilt too
        # Provenance survives: the imported episode still makes its message id a duplicate.
        dup = await mem.ingest(MESSAGES[0])
        assert dup.duplicate and not dup.stored


async def test_export_format(exported: Any) -> None:
    _, path = exported
    header, *lines = _lines(path)
    assert header == {"format": "narrmem-export", "version": 3, "model": "hash-test", "dim": 384}
    *lines, end = lines
    sections = [line["section"] for line in lines]
    assert end == {"section": "end", "lines": {s: sections.count(s) for s in set(sections)}}
    records = [line for line in lines if line.pop("section") == "memories"]
    assert lines[: len(records)] == records  # memories first, then the other sections
    assert [r["message_ids"] for r in records] == [["1"], ["2"], ["3"], ["4"]]
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)
    first = records[0]
    # Beside the message's own meta: message 4, the next turn of its chat, is in its keyword context.
    meta = {"k": [1, 2.5], "layer": "accumulate", "context_message_ids": ["4"]}
    assert first["speaker"] == "Ana" and first["meta"] == meta
    assert "backslash" in first["context_text"]
    vector = np.frombuffer(base64.b64decode(first["vector"]), dtype="<f4")
    assert vector.shape == (384,) and float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    assert records[1]["created_at"] == "2026-05-05T19:30:00+08:00"  # the original offset is kept
    assert records[3]["text"] == MESSAGES[3]["text"]


async def test_importing_twice_is_idempotent(exported: Any, tmp_path: Path) -> None:
    source, path = exported
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        first = await import_jsonl(mem, path)
        assert _memories(first) == (4, 0) and first["graph.nodes"] > 0  # the facts' graph came too
        again = await import_jsonl(mem, path)
        assert again == {**{k: 0 for k in first}, "skipped": 4}
        stats = await mem.stats()
        assert stats["memories"] == 4 and stats["vectors_indexed"] == 4
        assert await store_count(mem, "memory_sources") == 4
        if on_sqlite(mem):  # PostgreSQL's keyword index is in the row itself
            assert await store_count(mem, "memories_fts") == 4
    # Importing a store's own export into itself changes nothing either.
    async with open_memory(source) as mem:
        assert _memories(await import_jsonl(mem, path)) == (0, 4)
        assert await store_count(mem) == 4


async def test_conflicting_import_writes_nothing(exported: Any, tmp_path: Path) -> None:
    _, path = exported
    header, *records = _lines(path)
    records[2]["text"] = "the same id with other content"
    changed = write_export(tmp_path / "changed.jsonl", [header, *records])
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        await import_jsonl(mem, write_export(tmp_path / "first.jsonl", [header, records[0], _lines(path)[3]]))
        before = await store_count(mem)
        # Named by its line before anything is written (the store's own check knows no lines).
        with pytest.raises(InputError, match=str(records[2]["id"])) as caught:
            await import_jsonl(mem, changed)
        assert (caught.value.field, caught.value.line) == ("id", 4)
        assert (await mem.stats())["vectors_indexed"] == before
        assert await store_count(mem) == before == 2


def _corrupt(records: list[dict[str, Any]], how: str) -> tuple[int, str]:
    """Spoil the third record (file line 4); return the line number and the field to be named."""
    bad = records[2]
    if how == "bad base64":
        bad["vector"] = "!!!not base64!!!"
        return 4, "vector"
    if how == "wrong dim":
        bad["vector"] = base64.b64encode(np.zeros(10, dtype="<f4").tobytes()).decode()
        return 4, "vector"
    if how == "odd byte count":
        bad["vector"] = base64.b64encode(b"\x00" * 7).decode()
        return 4, "vector"
    if how == "missing field":
        del bad["user_id"]
        return 4, "user_id"
    if how == "wrong type":
        bad["importance"] = "high"
        return 4, "importance"
    if how == "extra field":
        bad["colour"] = "red"
        return 4, "colour"
    if how == "naive created_at":
        bad["created_at"] = "2026-05-05T19:30:00"
        return 4, "created_at"
    if how == "NaN in the vector":
        bad["vector"] = base64.b64encode(np.full(384, np.nan, dtype="<f4").tobytes()).decode()
        return 4, "vector"
    if how == "vector not of length 1":
        bad["vector"] = base64.b64encode(np.full(384, 3e38, dtype="<f4").tobytes()).decode()
        return 4, "vector"
    if how == "NUL in user_id":
        bad["user_id"] = "ann\x00"
        return 4, "user_id"
    if how == "empty message id":
        bad["message_ids"] = [""]
        return 4, "message_ids"
    if how == "message id too long":
        bad["message_ids"] = ["m" * 100_000]
        return 4, "message_ids"
    raise AssertionError(how)


CORRUPTIONS = [
    "bad base64",
    "wrong dim",
    "odd byte count",
    "missing field",
    "wrong type",
    "extra field",
    "naive created_at",
    "NaN in the vector",
    "vector not of length 1",
    "NUL in user_id",
    "empty message id",
    "message id too long",
]


@pytest.mark.parametrize("how", CORRUPTIONS)
async def test_corrupted_export_line_names_line_and_field_and_writes_nothing(
    exported: Any, tmp_path: Path, how: str
) -> None:
    _, path = exported
    header, *records = _lines(path)
    line, field = _corrupt(records, how)
    bad = write_export(tmp_path / "bad.jsonl", [header, *records])
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, bad)
        assert info.value.line == line
        assert info.value.field == field
        assert f"line {line}" in str(info.value) and field in str(info.value)
        stats = await mem.stats()
        assert stats["memories"] == 0 and stats["vectors_indexed"] == 0


async def test_bad_json_line_and_bad_header(exported: Any, tmp_path: Path) -> None:
    _, path = exported
    text = path.read_text(encoding="utf-8").splitlines()
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        broken = tmp_path / "broken.jsonl"
        broken.write_text("\n".join([*text[:3], "{not json", *text[3:]]) + "\n", encoding="utf-8")
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, broken)
        assert info.value.line == 4

        header = json.loads(text[0])
        other_model = write_export(
            tmp_path / "model.jsonl", [{**header, "model": "other-model"}, *_lines(path)[1:]]
        )
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, other_model)
        assert (info.value.line, info.value.field) == (1, "model")

        not_export = write_export(tmp_path / "fmt.jsonl", [{**header, "format": "something-else"}])
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, not_export)
        assert (info.value.line, info.value.field) == (1, "format")

        headerless = write_export(tmp_path / "headerless.jsonl", _lines(path)[1:])
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, headerless)
        assert info.value.line == 1 and (info.value.field or "").startswith("header.")

        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n\n", encoding="utf-8")
        with pytest.raises(InputError, match="empty"):
            await import_jsonl(mem, empty)

        with pytest.raises(InputError, match="cannot read"):
            await import_jsonl(mem, tmp_path / "missing.jsonl")
        assert (await mem.stats())["memories"] == 0


def test_read_messages_names_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    good = json.dumps(msg("1", "hello there"))
    path.write_text(f"{good}\n\n{json.dumps(msg('2', 'x', ts='2026-01-01T00:00:00'))}\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_messages(path)
    assert (info.value.line, info.value.field) == (3, "ts")
    path.write_text(f"{good}\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        read_messages(path)
    assert info.value.line == 2
    path.write_bytes(good.encode() + b"\n" + b'{"text": "\xff\xfe"}\n')
    with pytest.raises(InputError) as info:
        read_messages(path)
    assert info.value.line == 2
    path.write_text(f"{good}\n", encoding="utf-8")
    [message] = read_messages(path)
    assert isinstance(message, narrmem.Message) and message.text == "hello there"


async def test_export_replaces_only_a_file_narrmem_wrote(tmp_path: Path) -> None:
    target = tmp_path / "notes.jsonl"
    target.write_text("the user's own notes\n")
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest(msg("m1", "I decided to learn the cello"))
        with pytest.raises(InputError, match="not a narrmem export") as info:
            await export_jsonl(mem, target)
        assert info.value.field == "file"
        assert target.read_text() == "the user's own notes\n"
        fresh = tmp_path / "export.jsonl"
        assert await export_jsonl(mem, fresh) >= 1
        first = fresh.read_bytes()
        assert await export_jsonl(mem, fresh) >= 1  # its own export: replaced
        assert fresh.read_bytes() == first
    assert sorted(os.listdir(tmp_path)) == ["export.jsonl", "notes.jsonl", "store"]


async def test_an_export_cut_short_at_a_line_end_is_refused_whole(exported: Any, tmp_path: Path) -> None:
    """A copy that stopped early (a full disk, a killed transfer, a stream cut off) ends at a line's
    end and every line in it is valid: without the end line it imported as a smaller memory."""
    _, path = exported
    header, *body = _lines(path)
    assert body[-1]["section"] == "end"
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        for keep in (len(body) - 1, 3, 0):  # without the end line; cut among the memories; header only
            cut = write_export(tmp_path / f"cut{keep}.jsonl", [header, *body[:keep]], end=False)
            with pytest.raises(InputError, match="cut short") as info:
                await import_jsonl(mem, cut)
            assert (info.value.field, info.value.line) == ("section", keep + 2)
        assert (await mem.stats())["memories"] == 0


async def test_an_end_line_that_does_not_match_the_file_names_the_section(
    exported: Any, tmp_path: Path
) -> None:
    _, path = exported
    header, *body = _lines(path)
    *lines, end = body
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        missing = write_export(tmp_path / "missing.jsonl", [header, *lines[:1], *lines[2:], end], end=False)
        with pytest.raises(InputError, match="lines are missing") as info:
            await import_jsonl(mem, missing)
        assert (info.value.field, info.value.line) == ("lines.memories", len(body))
        after = write_export(tmp_path / "after.jsonl", [header, *lines, end, lines[0]], end=False)
        with pytest.raises(InputError, match="after the end line") as info:
            await import_jsonl(mem, after)
        assert info.value.line == len(body) + 2
        assert (await mem.stats())["memories"] == 0


async def test_one_memory_id_twice_in_a_file_names_both_lines(exported: Any, tmp_path: Path) -> None:
    _, path = exported
    header, *body = _lines(path)
    twice = dict(body[0], text="the same id, other words")
    target = tmp_path / "target"
    async with open_memory(target) as mem:
        with pytest.raises(InputError, match="twice \\(first at line 2\\)") as info:
            await import_jsonl(
                mem, write_export(tmp_path / "twice.jsonl", [header, body[0], twice, *body[1:]])
            )
        assert (info.value.field, info.value.line) == ("id", 3)
        assert (await mem.stats())["memories"] == 0


async def test_a_version_2_export_without_an_end_line_still_imports(exported: Any, tmp_path: Path) -> None:
    _, path = exported
    header, *body = _lines(path)
    older = write_export(tmp_path / "v2.jsonl", [{**header, "version": 2}, *body[:-1]], end=False)
    async with open_memory(tmp_path / "target") as mem:
        assert _memories(await import_jsonl(mem, older)) == (4, 0)
