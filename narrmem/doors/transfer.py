"""JSONL in and out: messages to ingest, and a lossless export of a whole store (memories,
importance history, plugin state, and every plugin's own sections), with the lines of its format;
:mod:`narrmem.doors.importing` imports it.

Files are validated whole before anything is written, so a bad line is an error that names the
line and field, and nothing from that file is half-written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import time
from array import array
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from narrmem import logs
from narrmem.checks import SQLITE_MAX_INT, JsonShapeError, check_time_range, has_surrogate, loads_json
from narrmem.doors import export_files
from narrmem.errors import InputError, PluginError, StoreError
from narrmem.models import MAX_ID_CHARS, ForgetJob, MemoryRecord, Message, no_nul
from narrmem.state_checks import NOT_IMPORTED
from narrmem.store import CountsForgets, ReadsHistories, Store

if TYPE_CHECKING:
    from narrmem.memory import Memory

EXPORT_FORMAT = "narrmem-export"
# One person's own export (narrmem.doors.person_export): for reading, never imported.
PERSON_FORMAT = "narrmem-person"
# 1: memories with their vectors. 2: every line names its section: memories, their importance
# history, the plugins' state, and each plugin's own sections (graph, RTM trees). 3: a last line
# counts the lines of each section, so a file cut short at a line's end is known to be.
EXPORT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
MEMORIES, IMPORTANCE, STATE, END = "memories", "importance", "state", "end"
FORGETS_WAIT_S = 10.0  # how long an export waits for a forget under way to end, see _forgets_under_way
FORGETS_POLL_S = 0.05
PLUGIN_SECTION = re.compile(r"[A-Za-z0-9_]+\.[A-Za-z0-9_.]+")  # "<plugin>.<name>"
log = logs.logger("narrmem.transfer")
V = TypeVar("V", bound=BaseModel)


class ExportHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    version: int
    model: str
    dim: int
    # A tenant's export: that tenant's memories and their importance history, and none of what
    # the plugins keep (the graph, RTM trees, plugin state), which this says, so that the file is
    # not taken for a whole store's. Left out of a whole store's header.
    tenant: str | None = None
    left_out: list[str] | None = None
    # A person's own export (narrmem.doors.person_export): what narrmem holds of them.
    user_id: str | None = None


class EndLine(BaseModel):
    """An export's last line: how many lines of each section come before it."""

    model_config = ConfigDict(extra="forbid")
    lines: dict[str, int]


class ExportLine(MemoryRecord):
    id: int | None = Field(default=None, ge=1, le=SQLITE_MAX_INT)  # kept as the row id
    vector: str  # base64 of little-endian float32: exact, unlike decimal floats

    @field_validator("created_at", "stored_at", "reinforced_at")
    @classmethod
    def _in_range(cls, when: datetime | None) -> datetime | None:
        return None if when is None else check_time_range(when)

    # The ids a message could carry, no more: one with a NUL, a lone surrogate or past the length
    # limit was imported, and then no forget could name it (forget refuses such ids).
    @field_validator("tenant", "user_id", "chat_id", "speaker")
    @classmethod
    def _an_id(cls, value: str | None) -> str | None:
        return None if value is None else _id(value)

    @field_validator("message_ids")
    @classmethod
    def _message_ids(cls, ids: list[str]) -> list[str]:
        for n, mid in enumerate(ids):
            if not 0 < len(mid) <= MAX_ID_CHARS:
                raise ValueError(f"message_ids[{n}] must be 1 to {MAX_ID_CHARS} characters")
            _id(mid)
        return ids


def _id(value: str) -> str:
    no_nul(value)
    if has_surrogate(value):
        raise ValueError("holds a lone surrogate (not valid Unicode)")
    return value


class HistoryEvent(BaseModel):
    """One row of a memory's importance history, as ``Store.history`` gives it."""

    model_config = ConfigDict(extra="forbid")
    at: str
    who: str = Field(max_length=200)
    why: str = Field(max_length=2000)
    # Importance lies in [0, 1] everywhere; a row past it imported and was shown as it was.
    old: float | None = Field(default=None, ge=0.0, le=1.0)
    new: float = Field(ge=0.0, le=1.0)

    @field_validator("at")
    @classmethod
    def _a_time(cls, at: str) -> str:
        try:
            when = datetime.fromisoformat(at)
        except ValueError as exc:
            raise ValueError("not an ISO-8601 time") from exc
        if when.tzinfo is None:
            raise ValueError("needs a timezone")
        check_time_range(when)
        return at


class ImportanceLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_id: int = Field(ge=1, le=SQLITE_MAX_INT)
    current: float | None = Field(default=None, ge=0.0, le=1.0)
    events: list[HistoryEvent] = Field(default_factory=list)


class StateLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    namespace: str = Field(min_length=1, max_length=200)
    key: str = Field(min_length=1, max_length=4000)
    value: dict[str, Any]


def json_lines(path: Path, data: bytes | None = None) -> Iterator[tuple[int, int, Any]]:
    """Each line of a JSONL file that is not blank, as (line number, byte offset, value); of
    ``data`` when given (the file's bytes, read once from a pipe), named ``path``."""
    try:
        handle: BinaryIO = path.open("rb") if data is None else io.BytesIO(data)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    with handle:
        offset = 0
        for number, data in enumerate(handle, start=1):
            value = parse_line(path, number, data)
            if value is not BLANK:
                yield number, offset, value
            offset += len(data)


BLANK = object()  # what parse_line gives for a line of whitespace


def parse_line(path: Path, number: int, data: bytes) -> Any:
    """One line's JSON value (``BLANK`` for a blank line); an error names the line."""
    try:
        raw = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 ({exc.reason})", line=number) from exc
    if not raw.strip():
        return BLANK
    try:
        return loads_json(raw)
    except JsonShapeError as exc:
        raise InputError(
            f"{path}: not plain JSON ({exc.reason})", field=exc.path or None, line=number
        ) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg})", line=number) from exc
    except ValueError as exc:  # a number past the interpreter's digit limit
        raise InputError(f"{path}: not valid JSON ({exc})", line=number) from exc


def read_messages(path: str | Path) -> list[Message]:
    """Every message of a JSONL file, validated; the first bad line raises naming line and field."""
    return read_messages_and_lines(path)[0]


def read_messages_and_lines(path: str | Path) -> tuple[list[Message], list[int]]:
    """:func:`read_messages`, and each message's line in the file (for errors found later)."""
    messages = []
    numbers = []
    for message, number in messages_and_lines(path):
        messages.append(message)
        numbers.append(number)
    # Two different messages under one id: ingest stored the first and took the second for a
    # duplicate, with exit code 0.
    one_message_per_id(messages, numbers)
    return messages, numbers


def messages_and_lines(path: str | Path, data: bytes | None = None) -> Iterator[tuple[Message, int]]:
    """Each message of a JSONL file (or of its ``data``), validated, with its line, read as they
    come."""
    path = Path(path)
    for number, _, value in json_lines(path, data):
        if not isinstance(value, dict):
            raise InputError(f"{path}: a line must be a JSON object", line=number)
        try:
            yield Message.model_validate(value), number
        except ValidationError as exc:
            raise InputError.from_pydantic(exc, line=number) from exc


def one_message_per_id(messages: Sequence[Message], lines: Sequence[int] | None = None) -> None:
    """Two messages of one chat under one id that differ (text, author or time): the store keeps
    one message per id, so the second was dropped as a duplicate without a word. Refused instead
    (the same message twice is a duplicate, as on a second import). ``lines``: each message's
    line in its file, named in the error."""
    seen: dict[tuple[str, str, str], tuple[str, str, datetime]] = {}
    firsts: dict[tuple[str, str, str], int] = {}
    for n, message in enumerate(messages):
        key = (message.tenant, message.chat_id, message.message_id)
        said = (message.text, message.user_id, message.ts)
        first = seen.setdefault(key, said)
        firsts.setdefault(key, n)
        if first != said:
            differ = [
                name for name, a, b in zip(("text", "author", "time"), first, said, strict=True) if a != b
            ]
            where = (
                f"the first is line {lines[firsts[key]]}"
                if lines
                else f"the second is message {n + 1} of the file, oldest first"
            )
            raise InputError(
                f"message {message.message_id!r} of chat {message.chat_id!r} appears twice with "
                f"different {' and '.join(differ)} ({where})",
                field="message_id",
                line=lines[n] if lines else None,
            )


def read_dry_run_messages(path: str | Path | None, *, text: str | None = None) -> list[Message]:
    """Messages for a triage dry run: only ``text`` is required; each is a new user's first message.

    Keys that are not message fields (labels of an evaluation set, say) are left out: a dry run
    stores nothing, so they cannot do harm."""
    from datetime import UTC, datetime

    rows: list[tuple[int, Any]] = (
        [(1, {"text": text})] if path is None else [(n, v) for n, _, v in json_lines(Path(path))]
    )
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
    """Write a full export of the store (see :func:`export_store`); returns how many memories."""
    return (await export_store(memory, path))["memories"]


async def export_store(memory: Memory, path: str | Path | TextIO) -> dict[str, int]:
    """Everything the memory keeps, as JSONL: a header, then each memory with its vector, each
    memory's importance history, the plugins' small state, and every plugin's own sections (the
    graph, RTM trees; ``narrmem_export_records``). Returns the lines written per section.

    Reading only. The file appears only when complete, and only a file that is itself a narrmem
    export is ever replaced. Exporting, importing into a fresh store and exporting again gives the
    same bytes. ``path`` may be an open text stream instead (standard output), written as it is read."""
    return {
        MEMORIES: 0,
        **await write_export(export_target(path), EXPORT_FORMAT, export_header(memory), export_text(memory)),
    }


def export_target(path: str | Path | TextIO) -> Path | TextIO:
    """A file's name as a :class:`Path`; an open stream as it is."""
    return Path(path) if isinstance(path, str) else path


async def write_export(
    target: Path | TextIO, export_format: str, header: str, texts: AsyncIterator[tuple[str, str]]
) -> dict[str, int]:
    """Write an export of ``export_format`` (its header, then ``texts``) to ``target``: a file,
    replacing only a file of that format, or an open text stream; returns the lines written per
    section."""
    if not isinstance(target, Path):
        return await _write_lines(target, header, texts)
    check_replaceable(target, export_format)
    # A fresh name of our own beside the target (never an existing file's), renamed over it at the end.
    export_files.delete_stale_partials(target, export_format)
    with export_files.partial_file(target) as out:
        return await _write_lines(out, header, texts)


async def _write_lines(out: TextIO, header: str, texts: AsyncIterator[tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    out.write(header)
    async for section, text in texts:
        out.write(text)
        if section != END:
            counts[section] = counts.get(section, 0) + 1
    out.flush()
    return counts


# What a tenant's export leaves out: what the plugins keep is not read by tenant.
LEFT_OUT_OF_A_TENANTS = [STATE, "plugins' sections (graph, RTM trees)"]


def export_header(memory: Memory, *, tenant: str | None = None) -> str:
    """An export's first line: its format and version, the model its vectors come from, and for a
    tenant's export, the tenant and what the file leaves out."""
    header = ExportHeader(
        format=EXPORT_FORMAT,
        version=EXPORT_VERSION,
        model=memory.embedder.name,
        dim=memory.embedder.dim,
        tenant=tenant,
        left_out=None if tenant is None else LEFT_OUT_OF_A_TENANTS,
    )
    return header.model_dump_json(exclude_none=True) + "\n"


async def export_text(memory: Memory, *, tenant: str | None = None) -> AsyncIterator[tuple[str, str]]:
    """Every line of an export after the header, as (section, JSON text with its newline). With
    ``tenant``, only that tenant's memories and their importance history, read by tenant: a
    partial export (plugin state, the graph and RTM trees are left out, as its header says), for
    a caller that may see one tenant only."""
    exported: array[int] = array("q")
    lines = _export_lines(memory) if tenant is None else _tenant_lines(memory, tenant, exported)
    async for section, text in counted_text(memory, lines, tenant, exported):
        yield section, text


async def counted_text(
    memory: Memory,
    lines: AsyncIterator[tuple[str, dict[str, Any]]],
    tenant: str | None,
    exported: array[int],
    *,
    still_whole: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[tuple[str, str]]:
    """``lines`` as an export's text, then the end line counting them. Refused while a forget (of
    ``tenant``, when given) is unfinished; a forget that began while they were read stops it,
    unless ``tenant`` is given, every memory ``exported`` is still stored, and ``still_whole()``
    (when given: what else the lines hold is still kept, a person's plugin records, say)."""
    # What this process acknowledged is in it, with what its hooks made (on receipt or once written).
    await memory.settle()
    await no_forget_pending(memory, tenant=tenant)
    forgets = await _forget_mark(memory)
    counts: dict[str, int] = {}
    async for section, line in lines:
        counts[section] = counts.get(section, 0) + 1
        yield section, _line_text(section, line)
    # Pages are read one after another while the memory goes on working: a forget that began
    # meanwhile may have deleted what an earlier page holds, and an import would bring it back.
    # Raised before the end line, so that the file is deleted and a stream ends cut short.
    if await _forget_mark(memory) != forgets and not (
        tenant is not None
        and await _all_still_stored(memory, tenant, exported)
        and (still_whole is None or await still_whole())
    ):
        raise StoreError(
            "a forget ran while the export was read, which may hold what it deleted: the export "
            "was not finished; export again"
        )
    # Last, so that a file or stream cut short at a line's end is known to be when it is read.
    yield END, _line_text(END, EndLine(lines=counts).model_dump())


def _line_text(section: str, line: dict[str, Any]) -> str:
    return json.dumps({"section": section, **line}, ensure_ascii=False, sort_keys=True) + "\n"


async def no_forget_pending(memory: Memory, *, tenant: str | None = None) -> None:
    """Refuse to export while a forget is recorded and not finished (a process stopped in the
    middle of it, or a plugin failed to scrub): the export holds no record of it, so an import
    brought back what it deletes, the store's rows or, once those are gone, the plugins' copies
    (a person's graph). A process that writes the folder finishes it when it opens.

    With ``tenant`` (a tenant's export), only that tenant's forgets count: another tenant's deletes
    nothing the export holds, and its scope is not this caller's to read."""
    pending = await _forgets_under_way(memory, tenant)
    if pending:
        scopes = "; ".join(
            f"job {job.id}: tenant {job.tenant!r}"
            + (f", user {job.user_id!r}" if job.user_id else "")
            + (f", chat {job.chat_id!r}" if job.chat_id else "")
            for job in pending[:5]
        )
        raise StoreError(
            f"{len(pending)} forget(s) not finished ({scopes}): an export now would keep what they "
            "delete. Open the folder once with a process that writes (the bot, `narrmem serve`, "
            "`narrmem decay`) to finish them, then export"
        )


async def _forgets_under_way(memory: Memory, tenant: str | None) -> list[ForgetJob]:
    """The forgets (of ``tenant``, when given) not finished after waiting up to
    :data:`FORGETS_WAIT_S` for them to end: one under way (another person's, a second or two)
    failed a person's export at random, begun or ending while it ran; one left by a stopped
    process or a plugin that failed is still there after the wait."""
    deadline = time.monotonic() + FORGETS_WAIT_S
    while True:
        jobs = await memory.store.pending_forgets()
        pending = [job for job in jobs if tenant is None or job.tenant == tenant]
        if not pending or time.monotonic() >= deadline:
            return pending
        await asyncio.sleep(FORGETS_POLL_S)


async def _all_still_stored(memory: Memory, tenant: str, ids: array[int]) -> bool:
    """Whether a tenant's export is whole though forgets began while it was read: none of the
    tenant's is unfinished (once those under way have ended), and every memory exported is still
    stored (a forget deleted none of them). Forgets of other tenants delete nothing such an export
    holds: one failed it (a tenant's backup failed whenever another tenant's user was forgotten
    meanwhile), and told it so."""
    if await _forgets_under_way(memory, tenant):
        return False
    for start in range(0, len(ids), 1000):
        part = ids[start : start + 1000].tolist()
        found = await memory.store.get(part, None)
        if len(part) != sum(record.tenant == tenant for record in found.values()):
            return False
    return True


async def _forget_mark(memory: Memory) -> tuple[int, ...]:
    """What changes when a forget begins: the last forget job id given out, or, on a store that
    cannot tell it, the jobs not finished (a forget begun and finished between two reads of
    those goes unseen)."""
    store = memory.store
    if isinstance(store, CountsForgets):
        return (await store.forgets_begun(),)
    return tuple(job.id for job in await store.pending_forgets())


async def _memory_lines(
    memory: Memory, tenant: str | None, exported: array[int] | None = None
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The memories section; the id of each memory written is appended to ``exported``."""
    async for record, vector in _records(memory.store, tenant):
        if tenant is None or record.tenant == tenant:
            line = record.model_dump(mode="json")
            line["vector"] = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
            if exported is not None and record.id is not None:
                exported.append(record.id)
            yield MEMORIES, line


def _records(store: Store, tenant: str | None) -> AsyncIterator[tuple[MemoryRecord, np.ndarray]]:
    """The store's records, of ``tenant`` only if given (chosen by the store's query)."""
    if tenant is None:
        return store.export()
    try:
        return store.export(tenant)
    except TypeError:  # a store from before export took a tenant: the caller filters
        return store.export()


async def _tenant_lines(
    memory: Memory, tenant: str, exported: array[int]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The tenant's memories (each id appended to ``exported``), then their importance history."""
    async for section, line in _memory_lines(memory, tenant, exported):
        yield section, line
    async for section, line in _importance_lines(memory, exported, tenant):
        yield section, line


async def _export_lines(memory: Memory) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    # The ids, 8 bytes each, not a set of ints: a store of millions is exported.
    exported: array[int] = array("q")
    async for section, line in _memory_lines(memory, None, exported):
        yield section, line
    async for section, line in _importance_lines(memory, exported):
        yield section, line
    for namespace, key, value in await _plugin_state(memory):
        if namespace not in NOT_IMPORTED:
            yield STATE, {"namespace": namespace, "key": key, "value": value}
    for section, records in (await plugin_sections(memory)).items():
        # Closed at once if the export stops: a section being read holds a connection of its own.
        async with contextlib.aclosing(each_record(records)) as rows:
            async for row in rows:
                yield section, row


async def _importance_lines(
    memory: Memory, exported: array[int], tenant: str | None = None
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The importance section of the memories ``exported`` (of ``tenant``, read by the store's
    queries, when given: no other tenant's importance or history is read).

    The store is read a page at a time while the memory goes on working: this pass meets
    memories written after the memories section was read. Their lines are left out, so every
    line names only memories of the file (an import refuses any other, and with it the whole
    file)."""
    in_file = np.sort(np.frombuffer(exported, dtype=np.int64))
    last = 0
    store = memory.store
    only = {"tenant": tenant} if tenant is not None else {}
    while states := await _states(store, last, only):
        ids = np.fromiter((state[0] for state in states), dtype=np.int64, count=len(states))
        # The page's histories in one read where the store can (a round trip per memory was
        # hours a night for a store of tens of millions).
        page = await _histories(store, states[0][0], states[-1][0], only)
        for (memory_id, _, _, current), held in zip(states, _held(in_file, ids), strict=True):
            if not held:
                continue
            events = page.get(memory_id, []) if page is not None else await store.history(memory_id)
            if events or current is not None:
                yield IMPORTANCE, {"memory_id": memory_id, "current": current, "events": events}
        last = states[-1][0]


async def _states(
    store: Store, after: int, only: dict[str, str]
) -> list[tuple[int, float, datetime, float | None]]:
    try:
        return await store.importance_states(after, 1000, **only)
    except TypeError:
        if not only:
            raise
        # A store from before the tenant argument: every tenant's, the caller keeps the file's.
        return await store.importance_states(after, 1000)


async def _histories(
    store: Store, first: int, last: int, only: dict[str, str]
) -> dict[int, list[dict[str, Any]]] | None:
    if not isinstance(store, ReadsHistories):
        return None
    try:
        return await store.histories(first, last, **only)
    except TypeError:
        if "user_id" in only:
            # A store from before the user argument: read by tenant (the caller takes its ids).
            return await _histories(store, first, last, {"tenant": only["tenant"]})
        if not only:
            raise
        return await store.histories(first, last)  # a store from before the tenant argument


def _held(in_file: np.ndarray, ids: np.ndarray) -> list[bool]:
    """Whether each of ``ids`` is in ``in_file`` (sorted)."""
    if not len(in_file):
        return [False] * len(ids)
    places = np.minimum(np.searchsorted(in_file, ids), len(in_file) - 1)
    return [bool(found) for found in in_file[places] == ids]


Records = list[dict[str, Any]] | AsyncIterable[dict[str, Any]]


async def each_record(records: Records) -> AsyncGenerator[dict[str, Any], None]:
    """A section's records, given whole or read as they come."""
    if isinstance(records, list):
        for record in records:
            yield record
    else:
        async for record in records:
            yield record


async def _read_checked(
    plugin: str, section: str, records: AsyncIterable[dict[str, Any]]
) -> AsyncIterator[dict[str, Any]]:
    """A section a plugin reads as it is written, its failures and its records that are not
    objects a :class:`PluginError` naming it, as the host names a hook's (the host checks only
    what the hook returns, and these records come after)."""
    try:
        async for record in records:
            if not isinstance(record, dict):
                raise PluginError(
                    f"plugin '{plugin}' gave a record of section {section!r} that is not an object "
                    f"({type(record).__name__})"
                )
            yield record
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin '{plugin}' failed while its section {section!r} was read: {exc!r}"
        ) from exc


async def plugin_sections(memory: Memory) -> dict[str, Records]:
    """Every plugin's own sections (``narrmem_export_records``), by plugin name and then in the
    order each plugin gives them (the order they are to be read in), not read yet.

    A section's name is the exporting plugin's name, a dot and more (``graph.edges``), and only
    one plugin exports it: an import hands each section to the plugins that take it, so two
    plugins' records under one name were one plugin's (merged, the other's were dropped without
    a word). Either is a :class:`PluginError` naming the plugins, before a line is written."""
    sections: dict[str, Records] = {}
    owners: dict[str, str] = {}
    # Each answer with the name of the plugin that gave it; a hook that raises, or answers other
    # than it declares, is a PluginError naming it (the host's checks).
    answers = await memory.host.call_named("narrmem_export_records", isolate=False, memory=memory)
    for plugin, answer in sorted(answers, key=lambda named: named[0]):
        if answer is None:
            continue
        for section, records in answer.items():
            if not section.startswith(f"{plugin}.") or not PLUGIN_SECTION.fullmatch(section):
                raise PluginError(
                    f"plugin '{plugin}' exports section {section!r}: a plugin's section names start "
                    f"with its own name and a dot ('{plugin}.<name>', letters, digits, _ and .)"
                )
            if section in owners:
                raise PluginError(
                    f"plugins '{owners[section]}' and '{plugin}' both export section {section!r}"
                )
            owners[section] = plugin
            sections[section] = (
                records if isinstance(records, list) else _read_checked(plugin, section, records)
            )
    return sections


def _state_key(row: dict[str, Any]) -> tuple[str, str]:
    return str(row["namespace"]), str(row["key"])


async def _plugin_state(memory: Memory) -> list[tuple[str, str, dict[str, Any]]]:
    """The plugins' small state (``Store.state_put``), by namespace and key. The store protocol has
    no listing of it, so it is read with the store's ``dump_rows`` (both built-in stores have it,
    ``narrmem migrate`` reads it the same way), which gives the keys as they were put (the
    PostgreSQL store keeps them escaped in its table); a store without it is left out, with a
    warning."""
    dump = getattr(memory.store, "dump_rows", None)
    if not callable(dump):
        log.warning("plugin state not exported: store %s cannot list it", type(memory.store).__name__)
        return []
    # Paged by the last key seen, not by an offset: the inbox's and the settling's rows come and
    # go with every message while the memory works, and each one gone before the page's place
    # made the next page skip a row (a trigger's or a summary's state left out of a backup).
    rows: list[dict[str, Any]] = await dump("plugin_state", 0, 1000)
    try:
        while rows and (page := await dump("plugin_state", 0, 1000, after_key=_state_key(rows[-1]))):
            rows.extend(page)
    except TypeError:  # a store whose dump_rows pages by offset only
        while page := await dump("plugin_state", len(rows), 1000):
            rows.extend(page)
    return [
        (
            str(r["namespace"]),
            str(r["key"]),
            r["value"] if isinstance(r["value"], dict) else json.loads(r["value"]),
        )
        for r in rows
    ]


def check_replaceable(path: Path, export_format: str) -> None:
    """Refuse ``path`` unless it may be written: no symbolic link, a folder that exists, and no
    file there other than one narrmem wrote in ``export_format``."""
    if path.is_symlink():
        # The export is renamed over its target: over a link that replaced the link with a file
        # and left the export it pointed to as it was. Naming the file itself says which one.
        raise InputError(
            f"{path} is a symbolic link: name the file it points to ({path.resolve()}) instead",
            field="file",
        )
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
    if not isinstance(header, dict) or header.get("format") != export_format:
        raise InputError(
            f"{path} exists and is not a narrmem export: narrmem replaces only files it wrote", field="file"
        )
