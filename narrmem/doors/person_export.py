"""What narrmem holds of one person, as a file they may be given: their memories in every chat of
the tenant (text, kind, times, importance, the messages they came from), the importance history
of each, the plugins' state kept under their id, and each plugin's own records of them (graph
facts, persona and tasks; RTM trees of their words; the scenes' quotes of them), read by queries
on the person alone.

It is the other half of forgetting: what ``Memory.forget(user_id=...)`` deletes of a person is
what this file holds (``tests/test_person_export.py`` compares the two, row by row). Reading
only: nothing is reinforced, and the memory may be open read-only. The file is a JSONL export
whose header names the person (``format`` ``narrmem-person``); it is for reading, and
``narrmem import`` refuses it (a whole store's or a tenant's export is what restores a store).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

from narrmem.chat_moves import MOVED as CHATS_MOVED
from narrmem.doors.integrations.backlog import THREADS_NAMESPACE
from narrmem.doors.transfer import (
    IMPORTANCE,
    MEMORIES,
    PERSON_FORMAT,
    PLUGIN_SECTION,
    STATE,
    ExportHeader,
    Records,
    _histories,
    _read_checked,
    _state_key,
    counted_text,
    each_record,
    export_target,
    write_export,
)
from narrmem.edit_marks import NAMESPACE as EDIT_MARKS
from narrmem.errors import PluginError
from narrmem.inbox import NAMESPACE as INBOX
from narrmem.memory import Memory
from narrmem.models import Scope
from narrmem.settling import NAMESPACE as SETTLING
from narrmem.store import ReadsStateByPrefix, scope_pages

PERSON_VERSION = 1
# Importance history is read for this many of the person's memories at a time.
HISTORY_CHUNK = 500
# Of a memory: the words said around it in its chat, by others too, kept beside it for keyword
# search (a group's other members' words are theirs, not this person's to be given); its vector is
# made from its text, which the file holds.
LEFT_OUT = {"context_text"}
LEFT_OUT_OF_META = {"context_message_ids"}
LEFT_OUT_NOTE = [
    "memories' context_text and meta.context_message_ids (what others said around them)",
    "memories' vectors",
]
# Memories are read this many at a time, newest first.
PAGE = 1000
# State kept by chat, whose key may begin as a person's does (a chat's id equal to a user's): the
# chats moved, and the built-in triage plugin's quotes (which it gives of the person itself).
CHAT_KEYED = {CHATS_MOVED, "triage.impacts", THREADS_NAMESPACE}
# Messages received and not yet written, edits under way and hooks still owed for a written
# message: kept by message, each naming its person (a process stopped before their end).
WAITING = (INBOX, EDIT_MARKS, SETTLING)
# What names a plugin's record of the person, the first of these fields it has; the sections kept
# by others' memories (their turns' keyword context holding the person's words, by id).
IDENTITY = ("id", "tree_id", "key")
# What is not asked again when a forget ran while the export was read: what comes and goes of
# itself with the person's scenes (triage's quotes of a scene, the newest three of it), and what
# others' memories keep (their turns' keyword context, gone with them); the scenes and memories
# they name are asked, which a forget of the person or their chat takes. Those plugins give no
# other section: they are not called then. (The RTM trees a tenant's newest evict are asked: an
# eviction beside a forget fails the export, which is made again.)
UNCHECKED_SECTIONS = frozenset({"recall_hybrid.context", "triage.impacts"})
UNCHECKED_PLUGINS = frozenset(section.partition(".")[0] for section in UNCHECKED_SECTIONS)
STABLE = frozenset(
    {"tenant", "user_id", "chat_id", "created_at", "created_ts", "name", "subject_id", "object_id"}
    | {"relation", "title", "text_sha", "message_id", "memory_id"}
)


def person_header(memory: Memory, tenant: str, user_id: str) -> str:
    header = ExportHeader(
        format=PERSON_FORMAT,
        version=PERSON_VERSION,
        model=memory.embedder.name,
        dim=memory.embedder.dim,
        tenant=tenant,
        user_id=user_id,
        left_out=LEFT_OUT_NOTE,
    )
    return header.model_dump_json(exclude_none=True) + "\n"


async def person_text(memory: Memory, tenant: str, user_id: str) -> AsyncIterator[tuple[str, str]]:
    """Every line of a person's export after its header, as (section, JSON text with its newline),
    the last one counting the others. Refused while a forget of the tenant is unfinished, and
    stopped (:class:`StoreError`, before the last line) if a forget that began while it was read
    deleted any of what it holds (another person's, or another tenant's, does not)."""
    exported: array[int] = array("q")
    kept: set[bytes] = set()  # digests of the lines other than memories and their history
    waiting: dict[
        bytes, tuple[str, str, str, str | None]
    ] = {}  # of those, the messages waiting to be written
    scope = Scope(tenant=tenant, user_id=user_id)
    lines = _person_lines(memory, scope, exported, kept, waiting)

    async def still_whole() -> bool:
        # A forget began meanwhile: what the file holds besides memories is still kept (of a
        # person known by what the tools wrote alone, no memory goes; a chat's forget takes
        # facts of theirs there); what was added meanwhile, or changed, is no forget, and a
        # message that waited is gone from the queue once written.
        now = {
            _digest(section, line) async for section, line in _held_of(memory, scope, skip=UNCHECKED_PLUGINS)
        }
        for digest in kept - now:
            message = waiting.get(digest)
            if message is None:
                return False
            # Written, with the words the file holds (an edit of it meanwhile is a forget of them);
            # an entry that holds no words (hooks owed for a written message) only written.
            tenant_of, chat_id, message_id, text = message
            if text is None:
                if not await memory.store.stored_message_ids(tenant_of, chat_id, [message_id]):
                    return False
                continue
            ids = await memory.store.from_messages(tenant_of, chat_id, [message_id])
            if not any(text in record.text for record in (await memory.store.get(ids, None)).values()):
                return False
        return True

    async for section, text in counted_text(memory, lines, tenant, exported, still_whole=still_whole):
        yield section, text


async def export_person(
    memory: Memory, path: str | Path | TextIO, *, tenant: str, user_id: str
) -> dict[str, int]:
    """Write what narrmem holds of the person to ``path`` (a new file of its own, renamed over
    ``path`` once whole: only a person's export written before is ever replaced), or to an open
    text stream; returns the lines of each section."""
    header = person_header(memory, tenant, user_id)
    texts = person_text(memory, tenant, user_id)
    return await write_export(export_target(path), PERSON_FORMAT, header, texts)


async def _person_lines(
    memory: Memory,
    scope: Scope,
    exported: array[int],
    kept: set[bytes],
    waiting: dict[bytes, tuple[str, str, str, str | None]],
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    assert scope.user_id is not None
    async for page in scope_pages(memory.store, scope, page=PAGE):
        for record in page:
            if record.id is not None:
                exported.append(record.id)
            line = record.model_dump(mode="json", exclude=LEFT_OUT)
            # Others' message ids, as their words: the turns around it in its chat.
            line["meta"] = {k: v for k, v in line["meta"].items() if k not in LEFT_OUT_OF_META}
            yield MEMORIES, line
    async for line in _history_lines(memory, scope, sorted(exported)):
        yield IMPORTANCE, line
    async for section, line in _held_of(memory, scope):
        digest = _digest(section, line)
        if digest is not None:
            kept.add(digest)
            message = _waiting_message(line) if section == STATE else None
            if message is not None:
                waiting[digest] = message
        yield section, line


async def _held_of(
    memory: Memory, scope: Scope, *, skip: frozenset[str] = frozenset()
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """What is kept of the person besides their memories: the state under their key, their
    messages waiting to be written, each plugin's records of them (but of the plugins ``skip``)."""
    assert scope.user_id is not None
    prefix = f"{scope.tenant}\0{scope.user_id}\0"
    async for namespace, key, value in _person_state(memory, prefix, scope):
        yield STATE, {"namespace": namespace, "key": key, "value": value}
    sections = await _plugin_sections(memory, scope.tenant, scope.user_id, skip=skip)
    for section, records_of in sections.items():
        async with contextlib.aclosing(each_record(records_of)) as rows:
            async for row in rows:
                yield section, row


def _digest(section: str, line: dict[str, Any]) -> bytes | None:
    """What names a line of the person's that a forget of them, or of a chat of theirs, deletes:
    its section, its key or id, and the fields a record never changes (an id may be given again
    to another row once its own is deleted); its other content may change meanwhile (a fact
    stated again counts one more). ``None`` for what is kept by another's memory (their turn's
    keyword context, gone with them)."""
    if section == STATE:
        name: Any = [line.get("namespace"), line.get("key")]
    elif section in UNCHECKED_SECTIONS:
        return None
    elif any(field in line for field in IDENTITY):
        name = {field: value for field, value in line.items() if field in IDENTITY or field in STABLE}
    else:
        name = line
    text = json.dumps([section, name], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _waiting_message(line: dict[str, Any]) -> tuple[str, str, str, str | None] | None:
    """The (tenant, chat, message id, text) of a message waiting to be written, from its line
    (``None`` for the text of an entry that holds none: hooks owed for a written message)."""
    if line.get("namespace") not in WAITING or not isinstance(line.get("value"), dict):
        return None
    value = line["value"]
    named = value.get("message") if isinstance(value.get("message"), dict) else value
    chat, message_id, text = named.get("chat_id"), named.get("message_id"), named.get("text")
    if not isinstance(chat, str) or not isinstance(message_id, str):
        return None
    return str(named.get("tenant", "default")), chat, message_id, text if isinstance(text, str) else None


async def _history_lines(memory: Memory, scope: Scope, ids: list[int]) -> AsyncIterator[dict[str, Any]]:
    """Each memory's importance history: by id ranges where the person's ids lie close together
    (one read for many, of the person's rows: the query picks them), one memory at a time where
    they are spread among others'."""
    store = memory.store
    only = {"tenant": scope.tenant, "user_id": str(scope.user_id)}
    for start in range(0, len(ids), HISTORY_CHUNK):
        chunk = ids[start : start + HISTORY_CHUNK]
        close = chunk[-1] - chunk[0] < 4 * len(chunk)
        page = await _histories(store, chunk[0], chunk[-1], only) if close else None
        for memory_id in chunk:
            events = page.get(memory_id) if page is not None else await store.history(memory_id)
            if events:
                yield {"memory_id": memory_id, "events": events}


async def _person_state(
    memory: Memory, prefix: str, scope: Scope
) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    """The state kept under the person's key (``f"{tenant}\\0{user_id}\\0"``, as the hooks'
    contract asks per-user state to be keyed) in every namespace, read by the key where the store
    can; and their messages received and not yet written (their edits under way, the hooks still
    owed for a message of theirs), kept by message."""
    store = memory.store
    if isinstance(store, ReadsStateByPrefix):
        entries = await store.state_by_prefix(prefix)
    else:
        entries = [entry async for entry in _state_scan(memory, prefix)]
    for namespace, key, value in entries:
        if namespace not in CHAT_KEYED:
            yield namespace, key, value
    for namespace in WAITING:
        for key, value in await store.state_items(namespace):
            message = value.get("message")
            named = message if isinstance(message, dict) else value
            if named.get("tenant", "default") == scope.tenant and named.get("user_id") == scope.user_id:
                yield namespace, key, value


async def _state_scan(memory: Memory, prefix: str) -> AsyncIterator[tuple[str, str, dict[str, Any]]]:
    dump = getattr(memory.store, "dump_rows", None)
    if not callable(dump):
        return
    rows: list[dict[str, Any]] = await dump("plugin_state", 0, 1000)
    while rows:
        for row in rows:
            if str(row["key"]).startswith(prefix):
                value = row["value"] if isinstance(row["value"], dict) else json.loads(row["value"])
                yield str(row["namespace"]), str(row["key"]), value
        rows = await dump("plugin_state", 0, 1000, after_key=_state_key(rows[-1]))


async def _plugin_sections(
    memory: Memory, tenant: str, user_id: str, *, skip: frozenset[str] = frozenset()
) -> dict[str, Records]:
    """Every plugin's records of the person (``narrmem_person_records``), by plugin name (but
    the plugins ``skip``, not called)."""
    sections: dict[str, Records] = {}
    among = [name for name in memory.host.implementers("narrmem_person_records") if name not in skip]
    answers = await memory.host.call_named(
        "narrmem_person_records", isolate=False, among=among, memory=memory, tenant=tenant, user_id=user_id
    )
    for plugin, answer in sorted(answers, key=lambda named: named[0]):
        if answer is None:
            continue
        for section, records in answer.items():
            if (
                not section.startswith(f"{plugin}.")
                or not PLUGIN_SECTION.fullmatch(section)
                or section in sections
            ):
                raise PluginError(
                    f"plugin '{plugin}' gives a person's section {section!r}: its names start with "
                    f"the plugin's own name and a dot, and are its own"
                )
            sections[section] = (
                records if isinstance(records, list) else _read_checked(plugin, section, records)
            )
    return sections
