"""Importing an export file (``narrmem import``) of any size.

The whole file is checked before anything of it is written (every line's shape, ids given twice,
messages two episodes claim, conflicts with what is stored, the plugins' own dry run), and then
written, the memories in batches: a store of millions of memories is imported without the file,
or its memories, held in memory. The checking pass keeps only each line's place in the file and,
in a private temporary database, what later lines are checked against (memory ids, the messages
episodes hold); the writing passes read the lines again from their places. The plugins' own
sections are handed to them as sequences read from the file as they are read
(``narrmem_import_records``), which :mod:`narrmem.table_transfer` checks and writes in chunks.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sqlite3
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np
from pydantic import BaseModel, ValidationError

from narrmem.doors.transfer import (
    END,
    EXPORT_FORMAT,
    IMPORTANCE,
    MEMORIES,
    PERSON_FORMAT,
    PLUGIN_SECTION,
    READABLE_VERSIONS,
    STATE,
    EndLine,
    ExportHeader,
    ExportLine,
    HistoryEvent,
    ImportanceLine,
    StateLine,
    json_lines,
    parse_line,
)
from narrmem.errors import InputError
from narrmem.models import MemoryRecord
from narrmem.state_checks import check_state
from narrmem.store import IMPORT_UNDER_WAY, STORE_NOTES

if TYPE_CHECKING:
    from narrmem.memory import Memory

# Memories checked against the store, and written, per step: a few MB of records and vectors.
BATCH = 1000
V = TypeVar("V", bound=BaseModel)


def export_model(path: str | Path) -> str | None:
    """The model named in an export's header, read before a memory is opened to import it (so a
    new store holds the same vectors); ``None`` when it cannot be read, which the import reports."""
    try:
        with open(path, "rb") as file:
            header = parse_line(Path(path), 1, file.readline())
    except (OSError, InputError):
        return None
    model = header.get("model") if isinstance(header, dict) else None
    return model if isinstance(model, str) else None


async def import_jsonl(memory: Memory, path: str | Path) -> dict[str, int]:
    """Check a whole export file (the current format, or version 1's memories only), then write
    it: the memories (ids kept), their importance history, the plugins' state, and each plugin's
    sections (``narrmem_import_records``, checked on a dry run first). What is already stored as it
    is in the file is skipped; other content under the same id is an error, except plugin state,
    where the file's value replaces the stored one. Each part is compared with what is stored, not
    taken as done with its memory: an import stopped at any point (some batches of memories
    committed, part of the history written) and run again writes the rest, and ends as one whole
    import would.

    Returns ``imported`` and ``skipped`` memories, and the lines imported of every other section."""
    path = Path(path)
    with _Ledger() as ledger:
        scan = await _scan(memory, path, ledger)
    claimed = await _plugin_import(memory, scan, dry_run=True)
    for section, line in scan.first_line.items():
        if section not in claimed:
            raise InputError(
                f"no loaded plugin takes section {section!r} (is its plugin disabled?)",
                field="section",
                line=line,
            )
    # Noted until the plugins' sections are written: cut short between (killed, cancelled), the
    # store opened as if whole, a bot wrote in it, and the file's graph ids taken since made every
    # later run refused. An open now says so (see IMPORT_UNDER_WAY).
    await memory.store.state_put(
        STORE_NOTES, IMPORT_UNDER_WAY, {"file": str(path.resolve()), "began": memory.clock.now().isoformat()}
    )
    counts = {"imported": 0, "skipped": 0}
    for batch in _memory_batches(scan):
        for key, value in (await memory.store.import_records(batch)).items():
            counts[key] = counts.get(key, 0) + value
    importance, state = await _write_rest(memory, scan)
    if scan.importance_lines:
        counts[IMPORTANCE] = importance
    if scan.state_lines:
        counts[STATE] = state
    counts.update(await _plugin_import(memory, scan, dry_run=False))
    await memory.store.state_delete(STORE_NOTES, IMPORT_UNDER_WAY)
    return counts


def check_export_file(path: str | Path) -> None:
    """Check a whole export file as an import does, but for its model and the store (no memory is
    open yet): an import into a store not made yet checks the file first, so that a file it
    refuses leaves no new store behind."""
    with _Ledger() as ledger:
        for _ in _scan_lines(None, ledger, _Scan(Path(path))):
            pass


@dataclass
class _Scan:
    """What the checking pass keeps of a file: where each line of the memories, importance and
    state sections, and of every plugin section, is (to read it again)."""

    path: Path
    header: ExportHeader | None = None
    fingerprint: tuple[int, int] = (0, 0)  # the file's size and modification time when checked
    memories: _Places = field(default_factory=lambda: _Places())
    rest: _Places = field(default_factory=lambda: _Places())  # importance and state lines
    importance_lines: int = 0
    without_ids: int = 0  # memory lines that carry no id
    state_lines: int = 0
    sections: dict[str, _Places] = field(default_factory=dict)

    @property
    def first_line(self) -> dict[str, int]:
        """The first line of each plugin section."""
        return {section: places.numbers[0] for section, places in self.sections.items()}

    @property
    def dim(self) -> int:
        return self.header.dim if self.header is not None else 0


@dataclass
class _Places:
    """Lines of a file by byte offset and line number, 16 bytes each."""

    offsets: array[int] = field(default_factory=lambda: array("q"))
    numbers: array[int] = field(default_factory=lambda: array("q"))

    def add(self, offset: int, number: int) -> None:
        self.offsets.append(offset)
        self.numbers.append(number)

    def __len__(self) -> int:
        return len(self.offsets)

    def parts(self, size: int) -> Iterator[tuple[array[int], array[int]]]:
        for start in range(0, len(self.offsets), size):
            yield self.offsets[start : start + size], self.numbers[start : start + size]


class ReadWhenAsked(Sequence[dict[str, Any]]):
    """A plugin section handed to ``narrmem_import_records`` without being held: its records are
    read (:meth:`_read`, by index) when they are asked for, a batch at a time when iterated."""

    def __len__(self) -> int:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return list(self._read(range(len(self))[index]))
        return next(self._read([range(len(self))[index]]))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for start in range(0, len(self), BATCH):
            yield from self._read(range(start, min(start + BATCH, len(self))))

    def _read(self, indexes: Sequence[int]) -> Iterator[dict[str, Any]]:
        raise NotImplementedError


class FileRecords(ReadWhenAsked):
    """A plugin section of the file being imported, its records read from the file when they are
    asked for (each without its ``section`` key): a section of millions of rows is taken without
    holding it. Every line was checked as JSON already; a file changed since is refused."""

    def __init__(self, scan: _Scan, section: str) -> None:
        self.scan = scan
        self.places = scan.sections[section]

    def __len__(self) -> int:
        return len(self.places)

    def _read(self, indexes: Sequence[int]) -> Iterator[dict[str, Any]]:
        _unchanged(self.scan)
        offsets = [self.places.offsets[i] for i in indexes]
        numbers = [self.places.numbers[i] for i in indexes]
        for _, data in _read_at(self.scan.path, offsets, numbers):
            data.pop("section", None)
            yield data


class _Ledger:
    """What later lines of a file are checked against: the memory ids seen (and their lines), the
    messages episodes hold, and the memory ids importance lines name. In a private temporary
    SQLite database, which spills to a file past its cache and is gone when closed (or when the
    process ends): a file of millions of memories is checked in bounded memory."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None)

    def __enter__(self) -> _Ledger:
        self.db.executescript(
            """
            PRAGMA cache_size = -16384;
            CREATE TABLE ids (id INTEGER PRIMARY KEY, line INTEGER NOT NULL);
            CREATE TABLE held (
                tenant TEXT NOT NULL, chat_id TEXT NOT NULL, message_id TEXT NOT NULL,
                memory_id INTEGER, line INTEGER NOT NULL,
                PRIMARY KEY (tenant, chat_id, message_id)
            ) WITHOUT ROWID;
            CREATE TABLE named (memory_id INTEGER NOT NULL, line INTEGER NOT NULL);
            BEGIN;
            """
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def add_memory(self, record: MemoryRecord, number: int) -> None:
        if record.id is not None:
            first = self.db.execute("SELECT line FROM ids WHERE id = ?", (record.id,)).fetchone()
            if first is not None:
                raise InputError(
                    f"memory {record.id} is in the file twice (first at line {first[0]})",
                    field="id",
                    line=number,
                )
            self.db.execute("INSERT INTO ids VALUES (?, ?)", (record.id, number))
        if record.kind != "episode":
            return
        # One message of a chat is one episode: a message another episode of the file holds is refused.
        for mid in record.message_ids:
            key = (record.tenant, record.chat_id, mid)
            earlier = self.db.execute(
                "SELECT memory_id, line FROM held WHERE tenant = ? AND chat_id = ? AND message_id = ?", key
            ).fetchone()
            if earlier is not None and (record.id is None or earlier[0] != record.id):
                raise InputError(
                    f"message {mid!r} of chat {record.chat_id!r} has another episode on line {earlier[1]}",
                    field="message_ids",
                    line=number,
                )
            self.db.execute("INSERT OR REPLACE INTO held VALUES (?, ?, ?, ?, ?)", (*key, record.id, number))

    def holder(self, tenant: str, chat_id: str, message_id: str) -> tuple[int | None, int] | None:
        """The file's episode holding a message, as (memory id, line)."""
        found = self.db.execute(
            "SELECT memory_id, line FROM held WHERE tenant = ? AND chat_id = ? AND message_id = ?",
            (tenant, chat_id, message_id),
        ).fetchone()
        return None if found is None else (found[0], found[1])

    def name(self, memory_id: int, number: int) -> None:
        self.db.execute("INSERT INTO named VALUES (?, ?)", (memory_id, number))

    def first_unknown(self) -> tuple[int, int] | None:
        """The first importance line naming a memory the file lacks, as (memory id, line)."""
        found = self.db.execute(
            "SELECT n.memory_id, n.line FROM named n LEFT JOIN ids i ON i.id = n.memory_id "
            "WHERE i.id IS NULL ORDER BY n.line LIMIT 1"
        ).fetchone()
        return None if found is None else (found[0], found[1])


async def _scan(memory: Memory, path: Path, ledger: _Ledger) -> _Scan:
    """Check the whole file, against ``memory``'s model, store and plugins, writing nothing."""
    scan = _Scan(path)
    batch: list[tuple[MemoryRecord, int]] = []
    said_before_a_forget = await memory.forget_marks.records_read()
    forgotten = 0  # memories said and stored before a forget made since
    for number, line in _scan_lines(memory, ledger, scan):
        if isinstance(line, StateLine):
            try:
                await check_state(memory, line.namespace, line.key, line.value)
            except InputError as exc:
                raise InputError(exc.reason, field=exc.field, line=number) from exc
            continue
        if said_before_a_forget is not None and said_before_a_forget(line):
            forgotten += 1
        batch.append((line, number))
        if len(batch) >= BATCH:
            await _check_against_store(memory, batch, ledger)
            batch = []
    if batch:
        await _check_against_store(memory, batch, ledger)
    if forgotten:
        # Never named, nor their lines: who was forgotten is not for the error to say.
        raise InputError(
            f"{forgotten} memories of the file were said and stored before a forget made since "
            "(of their person, chat, person in the chat or message): the file was exported "
            "before it, and importing it would bring back what was forgotten, plugins' copies "
            "included; nothing of it was imported. Export the store again and import that",
            field="memories",
        )
    return scan


def _scan_lines(
    memory: Memory | None, ledger: _Ledger, scan: _Scan
) -> Iterator[tuple[int, MemoryRecord | StateLine]]:
    """Check every line of the file for itself and against the lines before it, noting in
    ``scan`` where each is; yields each memory and state line with its number, for the caller's
    checks against the store and plugins."""
    path = scan.path
    scan.fingerprint = _fingerprint(path)
    end: EndLine | None = None
    counts: dict[str, int] = {}
    number = 0
    for number, offset, data in json_lines(path):
        if scan.header is None:
            scan.header = _header(data, path, number, memory)
            continue
        if not isinstance(data, dict):
            raise InputError(f"{path}: a line must be a JSON object", line=number)
        if end is not None:
            raise InputError(f"{path}: a line after the end line", field="section", line=number)
        section = data.pop("section", MEMORIES) if scan.header.version > 1 else MEMORIES
        if section == END and scan.header.version >= 3:
            end = _validated(EndLine, data, number)
            _check_counts(path, end, counts, number)
            continue
        counts[section] = counts.get(section, 0) + 1
        if section == MEMORIES:
            record, _ = _memory_line(data, number, scan.dim)
            ledger.add_memory(record, number)
            scan.without_ids += record.id is None
            scan.memories.add(offset, number)
            yield number, record
        elif section == IMPORTANCE:
            ledger.name(_validated(ImportanceLine, data, number).memory_id, number)
            scan.importance_lines += 1
            scan.rest.add(offset, number)
        elif section == STATE:
            scan.state_lines += 1
            scan.rest.add(offset, number)
            yield number, _validated(StateLine, data, number)
        elif isinstance(section, str) and PLUGIN_SECTION.fullmatch(section):
            scan.sections.setdefault(section, _Places()).add(offset, number)
        else:
            raise InputError(f"unknown section {section!r}", field="section", line=number)
    if scan.header is None:
        raise InputError(f"{path} is empty: an export starts with a header line", line=1)
    if scan.header.version >= 3 and end is None:
        raise InputError(
            f"{path} stops at line {number} without its end line: the file was cut short "
            '(a whole export ends with {"section": "end", ...}); nothing of it was imported',
            field="section",
            line=number + 1,
        )
    unknown = ledger.first_unknown()
    if unknown is not None:
        raise InputError(f"memory {unknown[0]} is not in the file", field="memory_id", line=unknown[1])


async def _check_against_store(
    memory: Memory, batch: list[tuple[MemoryRecord, int]], ledger: _Ledger
) -> None:
    """An episode holding a message stored as another memory, or a memory whose id is stored with
    other content, is refused naming its line, before anything is written: the store meets the
    second only inside its write, where no line is known."""
    by_chat: dict[tuple[str, str], set[str]] = {}
    for record, _ in batch:
        if record.kind == "episode":
            by_chat.setdefault((record.tenant, record.chat_id), set()).update(record.message_ids)
    for (tenant, chat_id), mids in by_chat.items():
        holders = await memory.store.from_messages(tenant, chat_id, sorted(mids))
        for other in (await memory.store.get(holders, None)).values():
            if other.kind != "episode":
                continue
            for mid in other.message_ids:
                mine = ledger.holder(tenant, chat_id, mid)
                if mine is not None and mine[0] != other.id:
                    raise InputError(
                        f"message {mid!r} of chat {chat_id!r} is already stored as memory {other.id}",
                        field="message_ids",
                        line=mine[1],
                    )
    ids = [record.id for record, _ in batch if record.id is not None]
    stored = await memory.store.get(ids, None) if ids else {}
    for record, number in batch:
        held = stored.get(record.id) if record.id is not None else None
        if held is not None and held.model_dump() != record.model_dump():
            raise InputError(
                f"memory {record.id} is already stored with other content", field="id", line=number
            )


def _fingerprint(path: Path) -> tuple[int, int]:
    try:
        facts = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    return facts.st_size, facts.st_mtime_ns


def _unchanged(scan: _Scan) -> None:
    """The lines are read again from their places: a file changed since it was checked is not."""
    if _fingerprint(scan.path) != scan.fingerprint:
        raise InputError(
            f"{scan.path} changed while it was imported: import it again once nothing writes it "
            "(what was written of it is kept, and the next import writes the rest)",
            field="file",
        )


def _read_at(
    path: Path, offsets: Sequence[int], numbers: Sequence[int]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The lines at these places, as (line number, object). Each was checked as plain JSON when the
    file was (and the file is as it was then): read again with the standard parser alone, which is
    several times faster, as lines are read again several times (a plugin's checks, its dry run)."""
    with path.open("rb") as handle:
        for offset, number in zip(offsets, numbers, strict=True):
            handle.seek(offset)
            data = json.loads(handle.readline())
            if not isinstance(data, dict):
                raise InputError(f"{path}: a line must be a JSON object", line=number)
            yield number, data


def _memory_batches(scan: _Scan) -> Iterator[list[tuple[MemoryRecord, np.ndarray]]]:
    # A memory without its id cannot be told stored when an import stopped part way is run again
    # (written twice, or refused as holding its message): a file with one is written in one
    # transaction, whole or not at all, as every file was before.
    size = BATCH if not scan.without_ids else max(1, len(scan.memories))
    for offsets, numbers in scan.memories.parts(size):
        _unchanged(scan)
        batch = []
        for number, data in _read_at(scan.path, offsets, numbers):
            data.pop("section", None)
            batch.append(_memory_line(data, number, scan.dim))
        yield batch


async def _write_rest(memory: Memory, scan: _Scan) -> tuple[int, int]:
    """The importance and state lines, in the file's order: (history rows written, state entries
    written). A state entry stored with another value is replaced by the file's: plugin state is
    the plugins' latest word (when a trigger last fired), and a newer export restored over an
    older copy must bring it."""
    rows = entries = 0
    for offsets, numbers in scan.rest.parts(BATCH):
        _unchanged(scan)
        for number, data in _read_at(scan.path, offsets, numbers):
            if data.pop("section", None) == STATE:
                entry = _validated(StateLine, data, number)
                if await memory.store.state_get(entry.namespace, entry.key) != entry.value:
                    await memory.store.state_put(entry.namespace, entry.key, entry.value)
                    entries += 1
            else:
                rows += await _write_importance(memory, _validated(ImportanceLine, data, number))
    return rows, entries


def _check_counts(path: Path, end: EndLine, counts: dict[str, int], number: int) -> None:
    """The end line's count of each section against the lines read: a line lost from the middle
    of a file (an edit, a bad copy) is as much a loss as a file cut short."""
    for section in sorted(set(end.lines) | set(counts)):
        said, found = end.lines.get(section, 0), counts.get(section, 0)
        if said != found:
            raise InputError(
                f"{path}: the end line counts {said} line(s) of section {section!r}, the file holds "
                f"{found}: lines are missing or were added; nothing of it was imported",
                field=f"lines.{section}",
                line=number,
            )


def _validated(model: type[V], data: dict[str, Any], number: int) -> V:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, line=number) from exc


def _memory_line(data: dict[str, Any], number: int, dim: int) -> tuple[MemoryRecord, np.ndarray]:
    line = _validated(ExportLine, data, number)
    try:
        vector = np.frombuffer(base64.b64decode(line.vector, validate=True), dtype="<f4")
    except ValueError as exc:
        raise InputError("not valid base64", field="vector", line=number) from exc
    if vector.shape != (dim,):
        raise InputError(f"has {vector.size} dimensions, expected {dim}", field="vector", line=number)
    # A NaN scored every recall of its memory 0 and failed every open's sample check (the index
    # was rebuilt each time); vectors are unit length, as the model gives them.
    if not np.isfinite(vector).all() or not 0.98 <= float(np.linalg.norm(vector)) <= 1.02:
        raise InputError("must be a finite vector of length 1", field="vector", line=number)
    record = MemoryRecord.model_validate(line.model_dump(exclude={"vector"}))
    return record, vector.astype(np.float32)


async def _plugin_import(memory: Memory, parsed: _Scan, *, dry_run: bool) -> dict[str, int]:
    if not parsed.sections:
        return {}
    counts: dict[str, int] = {}
    try:
        parts = await memory.host.call(
            "narrmem_import_records",
            isolate=False,
            memory=memory,
            sections={name: FileRecords(parsed, name) for name in parsed.sections},
            dry_run=dry_run,
            # A file of another model's vectors is refused before (``_check_header``).
            vectors_of=memory.embedder.name,
        )
    except InputError as exc:
        line = _record_line(parsed, exc.field)
        if exc.line is not None or line is None:
            raise
        raise InputError(exc.reason, field=exc.field, line=line) from exc
    for part in parts:
        counts.update(part)
    return counts


_RECORD = re.compile(r"([^\[]+)\[(\d+)\]")


def _record_line(parsed: _Scan, place: str | None) -> int | None:
    """The file line of the record a plugin names (``graph.edges[3].status``: the fourth line of
    section ``graph.edges``): plugins know their records by index only."""
    found = _RECORD.match(place or "")
    places = parsed.sections.get(found.group(1)) if found else None
    numbers = places.numbers if places is not None else array("q")
    index = int(found.group(2)) if found else len(numbers)
    return numbers[index] if index < len(numbers) else None


async def _write_importance(memory: Memory, line: ImportanceLine) -> int:
    """A memory's history rows in their order (one write per run of rows of the same instant), and
    its importance after decay at the last pass; of each, only what the store lacks."""
    written = 0
    left, current = await _importance_left(memory, line)
    values = [] if current is None else [(line.memory_id, current)]
    for at, events in groupby(left, key=lambda event: event.at):
        rows = [(line.memory_id, e.who, e.why, e.old, e.new) for e in events]
        await memory.store.set_current_importance(values, rows, datetime.fromisoformat(at))
        written += len(rows)
        values = []
    if values:
        await memory.store.set_current_importance(values, [], memory.clock.now())
    return written


async def _importance_left(memory: Memory, line: ImportanceLine) -> tuple[list[HistoryEvent], float | None]:
    """What of a memory's importance line the store lacks: the history rows after those it holds,
    and the importance after decay, which goes with the first of them (or alone).

    Compared row by row, not skipped with its memory: the memories are committed before their
    history, so an import stopped between the two and run again found every memory stored and
    left the history out for good. The store keeps a memory's newest rows only
    (``history_kept_per_memory``): what it holds is then the last rows of what was written, a
    run of the file's ending where the import stopped. A history that holds the file's and more
    (a decay since), or another one, is the store's own and stays as it is."""
    stored = [_event_key(event) for event in await memory.store.history(line.memory_id)]
    wanted = [_event_key(event.model_dump()) for event in line.events]
    upto = _written_upto(stored, wanted)
    if upto is None:
        return [], None
    left = line.events[upto:]
    if left or line.current is None:
        return left, line.current
    if line.events:
        return [], None  # every row is stored, and the value was written with the first of them
    states = await memory.store.importance_states(line.memory_id - 1, 1)
    held = states[0][3] if states and states[0][0] == line.memory_id else None
    return [], line.current if held is None else None


def _written_upto(stored: list[tuple[Any, ...]], wanted: list[tuple[Any, ...]]) -> int | None:
    """How many of the file's rows ``wanted`` are written, the store holding ``stored`` (the last
    of them, or all); ``None`` when it holds rows of its own."""
    for upto in range(len(stored), len(wanted) + 1):
        if wanted[upto - len(stored) : upto] == stored:
            return upto
    return None


def _event_key(event: dict[str, Any]) -> tuple[Any, ...]:
    """A history row as compared: its instant, not how the time was written."""
    return (datetime.fromisoformat(str(event["at"])), event["who"], event["why"], event["old"], event["new"])


def _header(data: Any, path: Path, number: int, memory: Memory | None) -> ExportHeader:
    try:
        header = ExportHeader.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, line=number, prefix="header.") from exc
    if header.format == PERSON_FORMAT:
        raise InputError(
            f"{path} is one person's own export (what narrmem holds of them, for reading): it is "
            "not imported; a store is restored from its whole export or a tenant's",
            line=number,
            field="header.format",
        )
    if header.format == EXPORT_FORMAT and header.version > max(READABLE_VERSIONS):
        raise InputError(
            f"{path} was written by a newer narrmem (format version {header.version}; this one reads "
            f"{min(READABLE_VERSIONS)} to {max(READABLE_VERSIONS)})",
            field="version",
            line=number,
        )
    if header.format != EXPORT_FORMAT or header.version not in READABLE_VERSIONS:
        raise InputError(
            f"{path} is not a narrmem export (versions {', '.join(map(str, READABLE_VERSIONS))})",
            field="format",
            line=number,
        )
    if memory is not None and (header.model != memory.embedder.name or header.dim != memory.embedder.dim):
        raise InputError(
            f"vectors come from {header.model} ({header.dim} dims), this memory uses "
            f"{memory.embedder.name} ({memory.embedder.dim} dims)" + _model_hint(header.model),
            field="model",
            line=number,
        )
    return header


def _model_hint(model: str) -> str:
    # New stores default to the int7 weights; an export of an older store names the setting.
    if model == "all-MiniLM-L6-v2":
        return '; import it into a new store opened with [embedder] quantize = "none"'
    for quantize in ("int7", "int8"):
        if model == f"all-MiniLM-L6-v2-{quantize}":
            setting = f'[embedder] quantize = "{quantize}" (backend "onnx")'
            return f"; import it into a new store opened with {setting}"
    return ""
