"""JSONL in and out: messages to ingest, and a lossless export/import of a whole store.

Files are read and validated whole before anything is written, so a bad line is an error that
names the line and field, and nothing from that file is half-written.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narrmem.checks import SQLITE_MAX_INT, JsonShapeError, check_time_range, loads_json
from narrmem.errors import InputError
from narrmem.models import MemoryRecord, Message

if TYPE_CHECKING:
    from narrmem.memory import Memory

EXPORT_FORMAT = "narrmem-export"
EXPORT_VERSION = 1


class ExportHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    version: int
    model: str
    dim: int


class ExportLine(MemoryRecord):
    id: int | None = Field(default=None, ge=1, le=SQLITE_MAX_INT)  # kept as the row id
    vector: str  # base64 of little-endian float32: exact, unlike decimal floats

    @field_validator("created_at", "stored_at", "reinforced_at")
    @classmethod
    def _in_range(cls, when: datetime | None) -> datetime | None:
        return None if when is None else check_time_range(when)


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    with handle:
        for number, data in enumerate(handle, start=1):
            try:
                raw = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}: not UTF-8 ({exc.reason})", line=number) from exc
            if not raw.strip():
                continue
            try:
                value = loads_json(raw)
            except JsonShapeError as exc:
                raise InputError(
                    f"{path}: not plain JSON ({exc.reason})", field=exc.path or None, line=number
                ) from exc
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: not valid JSON ({exc.msg})", line=number) from exc
            yield number, value


def read_messages(path: str | Path) -> list[Message]:
    """Every message of a JSONL file, validated; the first bad line raises naming line and field."""
    path = Path(path)
    messages = []
    for number, data in _lines(path):
        if not isinstance(data, dict):
            raise InputError(f"{path}: a line must be a JSON object", line=number)
        try:
            messages.append(Message.model_validate(data))
        except ValidationError as exc:
            raise InputError.from_pydantic(exc, line=number) from exc
    return messages


def read_dry_run_messages(path: str | Path | None, *, text: str | None = None) -> list[Message]:
    """Messages for a triage dry run: only ``text`` is required; each is a new user's first message.

    Keys that are not message fields (labels of an evaluation set, say) are left out: a dry run
    stores nothing, so they cannot do harm."""
    from datetime import UTC, datetime

    rows: list[tuple[int, Any]] = [(1, {"text": text})] if path is None else list(_lines(Path(path)))
    now = datetime.now(UTC)
    messages = []
    for index, (number, data) in enumerate(rows):
        if not isinstance(data, dict):
            raise InputError("a line must be a JSON object", line=number)
        filled = {
            "user_id": f"dry-run-user-{index}",
            "chat_id": f"dry-run-chat-{index}",
            "ts": now,
            "message_id": f"dry-run-{index}",
            **{key: value for key, value in data.items() if key in Message.model_fields},
        }
        try:
            messages.append(Message.model_validate(filled))
        except ValidationError as exc:
            raise InputError.from_pydantic(exc, line=number if path is not None else None) from exc
    return messages


async def export_jsonl(memory: Memory, path: str | Path) -> int:
    """Write every record with its vector; returns how many. The file appears only when complete,
    and only a file that is itself a narrmem export is ever replaced."""
    path = Path(path)
    _check_replaceable(path)
    header = ExportHeader(
        format=EXPORT_FORMAT, version=EXPORT_VERSION, model=memory.embedder.name, dim=memory.embedder.dim
    )
    count = 0
    # A fresh name of our own beside the target (never an existing file's), renamed over it at the end.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(header.model_dump_json() + "\n")
            async for record, vector in memory.store.export():
                line = record.model_dump(mode="json")
                line["vector"] = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
                out.write(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n")
                count += 1
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)  # ours: made by mkstemp above
        raise
    return count


def _check_replaceable(path: Path) -> None:
    if not path.exists():
        if not path.parent.is_dir():
            raise InputError(f"folder {path.parent} does not exist", field="file")
        return
    if not path.is_file():
        raise InputError(f"{path} exists and is not a file", field="file")
    with path.open("rb") as fh:
        first = fh.readline(4096)
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != EXPORT_FORMAT:
        raise InputError(
            f"{path} exists and is not a narrmem export: narrmem replaces only files it wrote", field="file"
        )


async def import_jsonl(memory: Memory, path: str | Path) -> dict[str, int]:
    """Validate a whole export file, then write it in one transaction (ids kept)."""
    path = Path(path)
    items: list[tuple[MemoryRecord, np.ndarray]] = []
    numbers: list[int] = []
    header: ExportHeader | None = None
    for number, data in _lines(path):
        if header is None:
            header = _header(data, path, number, memory)
            continue
        try:
            line = ExportLine.model_validate(data)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc, line=number) from exc
        try:
            vector = np.frombuffer(base64.b64decode(line.vector, validate=True), dtype="<f4")
        except ValueError as exc:
            raise InputError("not valid base64", field="vector", line=number) from exc
        if vector.shape != (header.dim,):
            raise InputError(
                f"has {vector.size} dimensions, expected {header.dim}", field="vector", line=number
            )
        record = MemoryRecord.model_validate(line.model_dump(exclude={"vector"}))
        items.append((record, vector.astype(np.float32)))
        numbers.append(number)
    if header is None:
        raise InputError(f"{path} is empty: an export starts with a header line", line=1)
    await _check_episode_sources(memory, [record for record, _ in items], numbers)
    return await memory.store.import_records(items)


async def _check_episode_sources(memory: Memory, records: list[MemoryRecord], numbers: list[int]) -> None:
    """One message of a chat is one episode: an episode whose message another episode already
    holds (earlier in the file, or stored under another id) is refused, naming its line."""
    owners: dict[tuple[str, str, str], tuple[int | None, int]] = {}  # -> (record id, line)
    for record, number in zip(records, numbers, strict=True):
        if record.kind != "episode":
            continue
        for mid in record.message_ids:
            key = (record.tenant, record.chat_id, mid)
            earlier = owners.get(key)
            if earlier is not None and (record.id is None or earlier[0] != record.id):
                raise InputError(
                    f"message {mid!r} of chat {record.chat_id!r} has another episode on line {earlier[1]}",
                    field="message_ids",
                    line=number,
                )
            owners[key] = (record.id, number)
    by_chat: dict[tuple[str, str], list[str]] = {}
    for tenant, chat_id, mid in owners:
        by_chat.setdefault((tenant, chat_id), []).append(mid)
    for (tenant, chat_id), mids in by_chat.items():
        stored = await memory.store.from_messages(tenant, chat_id, mids)
        for other in (await memory.store.get(stored, None)).values():
            if other.kind != "episode":
                continue
            for mid in other.message_ids:
                mine = owners.get((tenant, chat_id, mid))
                if mine is not None and mine[0] != other.id:
                    raise InputError(
                        f"message {mid!r} of chat {chat_id!r} is already stored as memory {other.id}",
                        field="message_ids",
                        line=mine[1],
                    )


def _header(data: Any, path: Path, number: int, memory: Memory) -> ExportHeader:
    try:
        header = ExportHeader.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, line=number, prefix="header.") from exc
    if header.format != EXPORT_FORMAT or header.version != EXPORT_VERSION:
        raise InputError(
            f"{path} is not a narrmem export (version {EXPORT_VERSION})", field="format", line=number
        )
    if header.model != memory.embedder.name or header.dim != memory.embedder.dim:
        raise InputError(
            f"vectors come from {header.model} ({header.dim} dims), this memory uses "
            f"{memory.embedder.name} ({memory.embedder.dim} dims)",
            field="model",
            line=number,
        )
    return header
