"""Chat exports in: Telegram Desktop's ``result.json``, DiscordChatExporter's JSON, narrmem's JSONL.

They read one file and give validated :class:`~narrmem.models.Message` objects, and touch no
store. A file is read through and checked before any message is given (:class:`ChatImport`), so a
bad message is an :class:`~narrmem.errors.InputError` whose ``field`` names it in the export (for
example ``messages[12].date_unixtime``) and nothing from that file is half-imported; it is then
read again, part by part, and never held whole (:mod:`narrmem.doors.json_stream`).

Choices, so that an import is predictable:

* Re-importing is idempotent: ``message_id`` is the platform's id and ``chat_id`` is
  ``telegram:<chat id>`` / ``discord:<channel id>``, and ``Memory.ingest_many`` skips a
  ``(tenant, chat_id, message_id)`` it already holds. The same file imported under another tenant
  is another copy. Edits made after the first import are not applied by a re-import (use
  ``Memory.edit``).
* Service / system messages (joins, pins, group renames, calls) are skipped and counted in
  :attr:`ImportBatch.skipped_service`: they say nothing a person said.
* A Telegram message with no text but media becomes a placeholder (``[photo]``, ``[sticker 😍]``,
  ``[file: plan.pdf]``) put before any caption, with the kind in ``meta["media"]``: the message
  keeps its id, so replies to it keep their provenance. A message with neither text nor known
  media keeps empty text, and triage then ignores it (counted as ignored, not lost silently).
* Discord attachments and stickers are noted after the text (``[attachment: rules.pdf]``); embeds
  (link previews, bot cards) are left out: they are not what the author wrote.
* Bots are skipped, as the live integrations skip them: what a bot said is not what a person said,
  and it would be remembered as the bot user's own story. They are counted in
  :attr:`ImportBatch.skipped_bots`. ``keep_bots=True`` keeps them, marked ``meta["bot"] = True``.
  A bot is a Discord author with ``isBot``, or a JSONL line with ``meta.bot`` true; Telegram
  exports do not mark bots. Only ``Default`` and ``Reply`` messages are Discord messages; every
  other Discord type is a system message.
* Text longer than ``MAX_TEXT_CHARS`` is an error, not truncated: a cut message would be stored
  as if it had been said that way. Neither platform allows messages that long.
* Timestamps keep the exporter's offset, the writers' local time, which scene times and weekly
  habits are read in: Discord's carry it; Telegram's ``date`` has no timezone (it is the exporting
  machine's local time), so the instant is ``date_unixtime`` (required; an export without it is an
  error) and the offset the difference between the two (UTC when they do not make one).
* Messages are returned oldest first (a stable sort by time), so triage sees each user's history
  in the order it happened, also across the chats of a full export.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import pickle
import re
import sqlite3
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypedDict, Unpack, get_args

import numpy as np
from pydantic import ValidationError

from narrmem.checks import JsonShapeError, has_surrogate, loads_json
from narrmem.doors.json_stream import Hollow, NotStreamable, Source, items, skeleton
from narrmem.doors.transfer import messages_and_lines, read_messages
from narrmem.errors import InputError
from narrmem.ingest import check_not_ahead
from narrmem.models import MAX_ID_CHARS, MAX_TEXT_CHARS, Message

ChatFormat = Literal["telegram", "discord", "jsonl"]
FORMATS: tuple[ChatFormat, ...] = get_args(ChatFormat)

# DiscordChatExporter names message types after Discord's enum; only these two are people talking.
DISCORD_MESSAGE_TYPES = frozenset({"Default", "Reply"})
# The messages read ahead of their turn held in memory at most (a few MB of Message objects); the
# rest wait on disk, and are read back so many at a time.
HELD_IN_RAM = 20_000
HELD_READ_BACK = 5_000

# Telegram's media_type values, as the placeholder names them.
_TELEGRAM_MEDIA = {
    "animation": "GIF",
    "video_file": "video",
    "video_message": "video message",
    "voice_message": "voice message",
    "audio_file": "audio",
}

Json = dict[str, Any]


@dataclass(frozen=True)
class ImportBatch:
    """What one export file holds, ready for ``Memory.ingest_many(batch.messages)``."""

    messages: list[Message]
    skipped_service: int
    format: ChatFormat
    skipped_bots: int = 0
    # Forwarded messages (someone else's words) and what Telegram Desktop could not export.
    skipped_forwards: int = 0
    skipped_unsupported: int = 0
    # Where each message's time is in the file (``messages[3].date_unixtime``), for errors found
    # once the messages are sorted by time (empty for JSONL, whose lines keep their order).
    time_fields: list[str] = field(default_factory=list)
    # Each message's line, for a JSONL file (whose errors name lines, not fields).
    time_lines: list[int] = field(default_factory=list)

    def check_not_ahead(self, now: datetime, limit_s: float) -> None:
        """Refuse a message dated past ``now`` by more than ``limit_s`` (what ingest refuses),
        naming its time's place in the file: ingest named its place in the sorted batch."""
        try:
            check_not_ahead(self.messages, now, limit_s)
        except InputError as exc:
            found = re.fullmatch(r"messages\[(\d+)\]\.ts", exc.field or "")
            index = int(found.group(1)) if found else 0 if exc.field == "ts" else None
            if index is not None and index < len(self.time_lines):
                raise InputError(exc.reason, field="ts", line=self.time_lines[index]) from exc
            if index is None or index >= len(self.time_fields):
                raise
            raise InputError(exc.reason, field=self.time_fields[index]) from exc

    def scopes(self) -> dict[str, list[str]]:
        """The tenants, chat ids and user ids the messages were imported under (sorted), so that
        the next ``recall`` can name them without guessing."""
        return {
            "tenants": sorted({m.tenant for m in self.messages}),
            "chat_ids": sorted({m.chat_id for m in self.messages}),
            "user_ids": sorted({m.user_id for m in self.messages}),
        }


class ChatOptions(TypedDict, total=False):
    """:class:`ChatImport`'s keyword options (their meaning there)."""

    tenant: str | None
    user_map: Mapping[str, str] | None
    keep_bots: bool
    keep_forwards: bool
    as_bot: bool


def read_chat(path: str | Path, format: str, **options: Unpack[ChatOptions]) -> ImportBatch:
    """Read a chat export of ``format`` (one of :data:`FORMATS`) whole: :class:`ChatImport`'s
    messages, all of them, in the order an import stores them (``narrmem import-chat`` takes them
    part by part instead, never holding the file whole)."""
    chat = ChatImport(path, format, **options)
    chat.check()
    placed = [pair for part in chat.parts(5000) for pair in part]
    return ImportBatch(
        [message for message, _ in placed],
        skipped_service=chat.skipped["service"],
        format=chat.format,
        skipped_bots=chat.skipped["bots"],
        skipped_forwards=chat.skipped["forwards"],
        skipped_unsupported=chat.skipped["unsupported"],
        time_fields=[] if chat.format == "jsonl" else [chat.time_field(read) for _, read in placed],
        time_lines=[read.line for _, read in placed if read.line is not None],
    )


class ChatImport:
    """A chat export of ``format`` (one of :data:`FORMATS`), read twice and never held whole.

    :meth:`check` reads it through: every message is validated (an error names its place in the
    file, as ``messages[12].date_unixtime`` or a JSONL line, before anything is stored), two
    different messages under one id of a chat are refused, what is left out is counted, and each
    kept message's time and its chat's place are noted (12 bytes; each message's ids', words' and
    whole digests, 32). :meth:`parts` reads it again and gives the kept messages in the order an
    import stores them, a part at a time: oldest first (a stable sort by time), so triage sees
    each person's history in the order it happened, across the chats of a full export too; a
    JSONL file in its own order. A message waits only for the older ones after it in the file: an
    export in time order (one chat's, as Telegram Desktop and DiscordChatExporter write them)
    holds one part at a time; a full Telegram export's chats overlap in time, and what waits for
    an older chat's messages is held :data:`HELD_IN_RAM` at most in memory, the rest in a private
    temporary database deleted once the parts are given (:class:`_Held`).

    ``as_bot``: under the ids the bot integrations give the same chats and people, so that the
    live bot recalls the history and a person's ``forgetme`` reaches it: on Telegram the Bot
    API's chat id (``-100<id>`` for a supergroup or channel, ``-<id>`` for a basic group) and user
    id (``user123`` is ``123``); on Discord the server as the tenant (discord.py's
    ``guild_as="tenant"``) and the channel's id as the chat.

    Bots' messages are left out (counted in ``skipped["bots"]``) unless ``keep_bots``; forwarded
    messages (``skipped["forwards"]``: someone else's words, stored as the forwarder's they were
    theirs, and out of reach of their author's forget) unless ``keep_forwards``, as the live bot
    integrations leave them out; a Telegram message Telegram Desktop could not export
    (``"type": "unsupported"``) is counted in ``skipped["unsupported"]``, service messages in
    ``skipped["service"]``.

    ``tenant`` defaults to ``"default"`` for Telegram and ``"discord:<guild id>"`` for Discord.
    ``user_map`` maps platform user ids (Telegram ``from_id`` such as ``"user123"``, Discord author
    ids) to narrmem user ids; unmapped authors keep their platform id. A JSONL file names its own
    tenant and user ids, so neither option is accepted with it.
    """

    def __init__(
        self,
        path: str | Path,
        format: str,
        *,
        tenant: str | None = None,
        user_map: Mapping[str, str] | None = None,
        keep_bots: bool = False,
        keep_forwards: bool = False,
        as_bot: bool = False,
    ) -> None:
        if format not in FORMATS:
            raise InputError(
                f"unknown format {format!r} (expected one of: {', '.join(FORMATS)})", field="format"
            )
        if format == "jsonl":
            # Refused rather than ignored: silently dropping an option would import under the
            # wrong ids.
            if tenant is not None:
                raise InputError("a JSONL file names its own tenant on each line", field="tenant")
            if user_map is not None:
                raise InputError("a JSONL file names its own user ids on each line", field="user_map")
            keep_forwards = True
        self.path = Path(path)
        self.format: ChatFormat = format
        self._users = check_user_map(user_map) if user_map is not None else {}
        if tenant is not None:
            _check_id(tenant, "tenant")
        self._source = _readable_twice(self.path)
        self._tenant = tenant
        self._keep_bots = keep_bots
        self._keep_forwards = keep_forwards
        self._as_bot = as_bot
        self.skipped = dict.fromkeys(("service", "unsupported", "bots", "forwards"), 0)
        self._times = array("q")  # each kept message's time, microseconds since the epoch
        self._chats = array("I")  # and its chat's place among the export's chats
        self._ids = bytearray()  # each message's (tenant, chat, id) digest, left-out ones too
        self._said = bytearray()  # its (text, author, time) digest, for one message per id
        self._whole = bytearray()  # and its whole digest, left out or not: a file changed is found
        self._newest: Message | None = None
        self._scopes: dict[str, set[str]] = {"tenants": set(), "chat_ids": set(), "user_ids": set()}
        self._checked = False
        self.most_held = 0  # the most messages :meth:`parts` held in memory ahead of their turn

    @property
    def messages(self) -> int:
        """How many messages an import of the file stores or counts (left-out ones not)."""
        return len(self._times)

    def check(self) -> None:
        """Read the file through, validating and noting every message (see the class)."""
        if self._checked:
            raise RuntimeError("the file is checked once")
        for read in self._read():
            if read.message is None:
                assert read.skipped is not None
                self.skipped[read.skipped] += 1
                continue
            message = read.message
            left_out = self._left_out(message)
            self._ids += _id_digest(message)
            self._said += _said_digest(message)
            self._whole += _whole_digest(message, left_out)
            if left_out is not None:
                self.skipped[left_out] += 1
                continue
            self._times.append(_microseconds(message.ts))
            self._chats.append(read.chat)
            if self._newest is None or message.ts > self._newest.ts:
                self._newest = message
            self._scopes["tenants"].add(message.tenant)
            self._scopes["chat_ids"].add(message.chat_id)
            self._scopes["user_ids"].add(message.user_id)
        self._one_message_per_id()
        self._checked = True

    def scopes(self) -> dict[str, list[str]]:
        """The tenants, chat ids and user ids the messages are imported under (sorted), so that
        the next ``recall`` can name them without guessing."""
        return {name: sorted(values) for name, values in self._scopes.items()}

    def check_not_ahead(self, now: datetime, limit_s: float) -> None:
        """Refuse the file if a message is dated past ``now`` by more than ``limit_s`` (what
        ingest refuses), naming the first such message an import would store by its place in the
        file (a JSONL file's first in the file, an export's oldest)."""
        if self._newest is None:
            return
        try:
            check_not_ahead([self._newest], now, limit_s)
        except InputError:
            pass
        else:
            return
        # Read again to name the first of them: only a refused file pays for it.
        first: tuple[tuple[int, int], Message, _Read] | None = None
        for n, read in enumerate(self._read()):
            message = read.message
            if message is None or self._left_out(message) is not None:
                continue
            if (message.ts - now).total_seconds() <= limit_s:
                continue
            rank = (0, n) if self.format == "jsonl" else (_microseconds(message.ts), read.chat)
            if first is None or rank < first[0]:
                first = (rank, message, read)
        if first is None:
            raise InputError(f"{self.path}: changed while it was imported (a message's time)")
        _, message, read = first
        try:
            check_not_ahead([message], now, limit_s)
        except InputError as exc:
            if read.line is not None:
                raise InputError(exc.reason, field="ts", line=read.line) from exc
            raise InputError(exc.reason, field=self.time_field(read)) from exc

    def time_field(self, read: _Read) -> str:
        """Where a message's time is in the file (``messages[3].date_unixtime``)."""
        fields = _TELEGRAM_FIELDS if self.format == "telegram" else _DISCORD_FIELDS
        return f"{read.where}.{fields['ts']}"

    def parts(self, size: int) -> Iterator[list[tuple[Message, _Read]]]:
        """The kept messages, each with its place in the file, in the order an import stores
        them, ``size`` at a time (see the class). Raises :class:`InputError` if the file is not
        what :meth:`check` read (changed since), after the parts given before."""
        if not self._checked:
            raise RuntimeError("check() reads the file first")
        if size < 1:
            raise ValueError("a part holds one message at least")
        times = np.frombuffer(self._times, dtype=np.int64) if self._times else np.zeros(0, np.int64)
        chats = np.frombuffer(self._chats, dtype=np.uint32) if self._chats else np.zeros(0, np.uint32)
        # By time, then the chat's place (a full export's chats before its left chats), then the
        # file's order.
        order = np.arange(len(times)) if self.format == "jsonl" else np.lexsort((chats, times))
        in_file_order = bool(np.all(order == np.arange(len(order))))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        with _Held() as waiting:
            yield from self._in_order(size, rank, in_file_order, waiting)
            self.most_held = waiting.most

    def _in_order(
        self, size: int, rank: np.ndarray, in_file_order: bool, waiting: _Held
    ) -> Iterator[list[tuple[Message, _Read]]]:
        part: list[tuple[Message, _Read]] = []
        next_rank = seen = kept = 0
        for read in self._read():
            if read.message is None:
                continue
            message = read.message
            index, seen = seen, seen + 1
            left_out = self._left_out(message)
            if self._whole[index * 8 : index * 8 + 8] != _whole_digest(message, left_out):
                raise InputError(f"{self.path}: changed while it was imported ({read.where})")
            if left_out is not None:
                continue
            position, kept = kept, kept + 1
            if in_file_order:
                part.append((message, read))
            else:
                waiting.put(int(rank[position]), read)
                while (ready := waiting.take(next_rank)) is not None:
                    assert ready.message is not None
                    part.append((ready.message, ready))
                    next_rank += 1
            while len(part) >= size:
                yield part[:size]
                part = part[size:]
        if seen * 8 != len(self._whole) or waiting:
            raise InputError(f"{self.path}: changed while it was imported (messages missing)")
        if part:
            yield part

    def _read(self) -> Iterator[_Read]:
        if self.format == "jsonl":
            data = self._source if isinstance(self._source, bytes) else None
            for message, line in messages_and_lines(self.path, data):
                yield _Read(message, f"line {line}", line=line)
        elif self.format == "telegram":
            tenant = self._tenant or "default"
            yield from _telegram(self.path, self._source, tenant, self._users, self._as_bot)
        else:
            yield from _discord(self.path, self._source, self._tenant, self._users, self._as_bot)

    def _left_out(self, message: Message) -> Literal["bots", "forwards"] | None:
        if not self._keep_bots and message.meta.get("bot") is True:
            return "bots"
        if not self._keep_forwards and message.meta.get("forwarded") is True:
            return "forwards"
        return None

    def _one_message_per_id(self) -> None:
        """Two messages of one chat under one id that differ (text, author or time): the store
        keeps one message per id, so the second was dropped as a duplicate without a word.
        Refused instead (the same message twice is a duplicate, as on a second import)."""
        if not self._ids:
            return
        ids = np.frombuffer(self._ids, dtype=np.uint64).reshape(-1, 2)
        words = np.frombuffer(self._said, dtype=np.uint64)
        # Stable: within one id, the messages in file order, the first one first.
        order = np.lexsort((ids[:, 1], ids[:, 0]))
        sorted_ids = ids[order]
        starts = np.ones(len(order), dtype=bool)
        starts[1:] = np.any(sorted_ids[1:] != sorted_ids[:-1], axis=1)
        first = order[np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))]
        differ = words[order] != words[first]
        if not differ.any():
            return
        # The earliest in the file of the messages that differ from their id's first.
        at = int(np.argmin(np.where(differ, order, len(order))))
        self._refuse_twice(int(first[at]), int(order[at]))

    def _refuse_twice(self, first_at: int, second_at: int) -> None:
        found: dict[int, _Read] = {}
        index = 0
        for read in self._read():
            if read.message is not None:
                if index in (first_at, second_at):
                    found[index] = read
                index += 1
            if len(found) == 2:
                break
        if len(found) != 2:
            raise InputError(f"{self.path}: changed while it was imported (messages missing)")
        first, second = found[first_at], found[second_at]
        assert first.message is not None and second.message is not None
        differ = [
            name
            for name, a, b in (
                ("text", first.message.text, second.message.text),
                ("author", first.message.user_id, second.message.user_id),
                ("time", first.message.ts, second.message.ts),
            )
            if a != b
        ]
        where = (
            f"the first is {first.where}"
            if first.line is not None
            else (f"the first is {first.where}, the second {second.where}")
        )
        raise InputError(
            f"message {second.message.message_id!r} of chat {second.message.chat_id!r} appears twice "
            f"with different {' and '.join(differ)} ({where})",
            field="message_id",
            line=second.line,
        )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _microseconds(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(microseconds=1)


def _id_digest(message: Message) -> bytes:
    said = "\0".join((message.tenant, message.chat_id, message.message_id))
    return hashlib.blake2b(said.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _said_digest(message: Message) -> bytes:
    said = "\0".join((message.text, message.user_id, str(_microseconds(message.ts))))
    return hashlib.blake2b(said.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _whole_digest(message: Message, left_out: str | None) -> bytes:
    whole = f"{left_out}\0{message.model_dump_json()}"
    return hashlib.blake2b(whole.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _readable_twice(path: Path) -> Source:
    """The file by its path, or its bytes when it cannot be read twice (a pipe, a device: a
    command's output, ``<(zcat export.json.gz)``), read once and held as reading it whole did."""
    try:
        if path.is_file() or not path.exists():
            return path  # a missing file is named by the first reading
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc


def read_telegram(
    path: str | Path,
    *,
    tenant: str = "default",
    user_map: Mapping[str, str] | None = None,
    keep_bots: bool = False,
) -> list[Message]:
    """Messages of a Telegram Desktop JSON export: one chat, or a full export (every chat in
    ``chats.list`` and ``left_chats.list``)."""
    return read_chat(path, "telegram", tenant=tenant, user_map=user_map, keep_bots=keep_bots).messages


def read_discord(
    path: str | Path,
    *,
    tenant: str | None = None,
    user_map: Mapping[str, str] | None = None,
    keep_bots: bool = False,
) -> list[Message]:
    """Messages of one DiscordChatExporter JSON file (one channel)."""
    return read_chat(path, "discord", tenant=tenant, user_map=user_map, keep_bots=keep_bots).messages


def read_jsonl(path: str | Path) -> list[Message]:
    """narrmem's own JSONL message format (what ``narrmem ingest`` reads)."""
    return read_messages(path)


def read_user_map(path: str | Path) -> dict[str, str]:
    """A user map file: a JSON object of platform user id -> narrmem user id."""
    return check_user_map(_load_json(Path(path)), source=str(path))


def check_user_map(data: object, *, source: str = "user map") -> dict[str, str]:
    """``data`` as a user map, or an :class:`InputError` naming the bad key."""
    if not isinstance(data, Mapping):
        raise InputError(
            f"{source}: must be a JSON object of platform user id -> user id, not {_kind(data)}",
            field="user_map",
        )
    checked: dict[str, str] = {}
    for key, value in data.items():
        field = f"user_map[{json.dumps(key, ensure_ascii=False)}]"
        if not isinstance(key, str):
            raise InputError(f"keys must be strings, not {_kind(key)}", field=field)
        _check_id(value, field)
        checked[key] = value
    return checked


# --- Telegram ------------------------------------------------------------------------------------


_TELEGRAM_HOLLOW = frozenset({"messages", "chats.list.item.messages", "left_chats.list.item.messages"})


def _telegram(
    path: Path, source: Source, tenant: str, users: Mapping[str, str], as_bot: bool
) -> Iterator[_Read]:
    data, streamed = _document(path, source, _TELEGRAM_HOLLOW)
    # Every chat's place is checked before any message is read.
    chats = [
        replace(_telegram_source(chat, prefix, tenant, users, as_bot), rank=rank)
        for rank, (prefix, chat) in enumerate(_telegram_chats(data, path))
    ]
    for chat, i, raw in _items_of(path, source, _TELEGRAM_HOLLOW, chats, streamed):
        yield _telegram_item(raw, _join(chat.prefix, f"messages[{i}]"), chat)


def _telegram_chats(data: Any, path: Path) -> list[tuple[str, Json]]:
    """Each chat with the field prefix that locates it in the file."""
    if not isinstance(data, dict):
        raise InputError(f"{path}: a Telegram export is a JSON object, not {_kind(data)}")
    if "messages" in data:
        if "guild" in data and "channel" in data:
            raise InputError(f"{path}: this is a DiscordChatExporter file (use the discord format)")
        return [("", data)]
    if "chats" in data or "left_chats" in data:
        chats: list[tuple[str, Json]] = []
        for section in ("chats", "left_chats"):
            if section not in data:
                continue
            listing = _object(data[section], section)
            for j, chat in enumerate(_array(listing, "list", section)):
                chats.append((f"{section}.list[{j}]", _object(chat, f"{section}.list[{j}]")))
        return chats
    raise InputError(
        f"{path}: not a Telegram Desktop export: expected one chat {{'messages': [...]}} "
        "or a full export {'chats': {'list': [...]}}"
    )


def _telegram_source(
    chat: Json, prefix: str, tenant: str, users: Mapping[str, str], as_bot: bool = False
) -> _Source:
    """Where a chat's messages go, and the array that holds them."""
    exported_id = _scalar_id(_required(chat, "id", prefix), _join(prefix, "id"))
    if as_bot:
        chat_id = _bot_api_chat_id(exported_id, chat.get("type"), _join(prefix, "type"))
        users = _BotApiUsers(users)
    else:
        chat_id = f"telegram:{exported_id}"
    into = _Chat(tenant, chat_id, users, _TELEGRAM_FIELDS, {"chat_id": _join(prefix, "id")})
    name = chat.get("name") if isinstance(chat.get("name"), str) else None
    context: Json = {"source": "telegram", **({"chat": name} if name else {})}
    return _Source(prefix, into, context, _array(chat, "messages", prefix))


def _telegram_item(item: Any, where: str, source: _Source) -> _Read:
    """A message, or a service message (joins, pins, renames) or one Telegram Desktop could not
    export (``"type": "unsupported"``: a media kind it does not know, written as the id alone)."""
    raw = _object(item, where)
    kind = _string(raw, "type", where)
    if kind == "service":
        return _Read(None, where, skipped="service", chat=source.rank)
    if kind == "unsupported":
        return _Read(None, where, skipped="unsupported", chat=source.rank)
    if kind != "message":
        raise InputError(
            f"unknown type {kind!r} (expected 'message', 'service' or 'unsupported')",
            field=f"{where}.type",
        )
    return _Read(_telegram_message(raw, where, source.into, source.context), where, chat=source.rank)


def _telegram_message(raw: Json, where: str, into: _Chat, context: Json) -> Message:
    message_id = _scalar_id(_required(raw, "id", where), f"{where}.id")
    if "date_unixtime" not in raw:
        hint = " ('date' is local time without a timezone)" if "date" in raw else ""
        raise InputError(
            f"missing{hint}; export again with a current Telegram Desktop", field=f"{where}.date_unixtime"
        )
    ts = _local(_unix(raw["date_unixtime"], f"{where}.date_unixtime"), raw.get("date"))
    from_id = _string(raw, "from_id", where)
    speaker = raw.get("from")
    if speaker is not None and not isinstance(speaker, str):
        raise InputError(f"must be a string or null, not {_kind(speaker)}", field=f"{where}.from")
    speaker = speaker or None

    text = _telegram_text(_required(raw, "text", where), f"{where}.text")
    media, placeholder = _telegram_media(raw)
    if placeholder:
        text = f"{placeholder} {text}" if text else placeholder
    _check_length(text, f"{where}.text")

    meta: Json = dict(context)
    if media:
        meta["media"] = media
    if raw.get("reply_to_message_id") is not None:
        meta["reply_to"] = _scalar_id(raw["reply_to_message_id"], f"{where}.reply_to_message_id")
    if raw.get("edited_unixtime") is not None:
        meta["edited"] = _unix(raw["edited_unixtime"], f"{where}.edited_unixtime").isoformat()
    if "forwarded_from" in raw:
        # The author of a forward is someone else: "Ann said ..." would misattribute it. Telegram
        # Desktop writes null when it does not know the name: a forward all the same.
        meta["forwarded"] = True
        if isinstance(raw["forwarded_from"], str):
            meta["forwarded_from"] = raw["forwarded_from"]
    return into.message(where, from_id, text=text, ts=ts, message_id=message_id, speaker=speaker, meta=meta)


# Telegram Desktop's chat types, and how the Bot API writes such a chat's id from the export's.
# A chat of the exporting account with one person (or a bot, or itself) is not the bot's with them.
_BOT_API_PREFIX = {
    "private_group": "-",
    "private_supergroup": "-100",
    "public_supergroup": "-100",
    "private_channel": "-100",
    "public_channel": "-100",
}


def _bot_api_chat_id(exported: str, kind: object, field: str) -> str:
    if not isinstance(kind, str) or kind not in _BOT_API_PREFIX:
        raise InputError(
            f"a chat of type {kind!r} has no Bot API id narrmem knows (expected one of: "
            f"{', '.join(_BOT_API_PREFIX)}); import it without --as-bot",
            field=field,
        )
    return _BOT_API_PREFIX[kind] + exported


class _BotApiUsers(dict[str, str]):
    """The user map, and past it a Telegram Desktop author id as the Bot API writes it: ``user123``
    is ``123``, ``channel123`` (a channel or an anonymous admin writing as the chat) ``-100123``."""

    def __init__(self, users: Mapping[str, str]) -> None:
        super().__init__(users)

    def get(self, key: str, default: str | None = None) -> str:  # type: ignore[override]
        if key in self:
            return self[key]
        for prefix, bot_api in (("user", ""), ("channel", "-100")):
            number = key.removeprefix(prefix)
            if number != key and number.isdigit():
                return bot_api + number
        return key if default is None else default


_TELEGRAM_FIELDS = {"user_id": "from_id", "speaker": "from", "message_id": "id", "ts": "date_unixtime"}


def _telegram_text(value: Any, field: str) -> str:
    """Telegram writes plain text as a string, formatted text as a list of strings and entity
    objects (``{"type": "bold", "text": "..."}``); the text is their concatenation."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InputError(f"must be a string or a list of text parts, not {_kind(value)}", field=field)
    parts: list[str] = []
    for j, part in enumerate(value):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            raise InputError(
                "must be a string or an entity object with a 'text' string", field=f"{field}[{j}]"
            )
    return "".join(parts)


def _telegram_media(raw: Json) -> tuple[str | None, str | None]:
    """(kind, placeholder) of a message's media, or (None, None). These fields only decorate the
    text, so odd values make a vaguer placeholder rather than an error."""
    if "photo" in raw:
        return "photo", "[photo]"
    kind = raw.get("media_type")
    if kind == "sticker":
        emoji = raw.get("sticker_emoji")
        return "sticker", f"[sticker {emoji}]" if isinstance(emoji, str) and emoji else "[sticker]"
    if isinstance(kind, str) and kind:
        return kind, f"[{_TELEGRAM_MEDIA.get(kind, kind.replace('_', ' '))}]"
    if "file" in raw:
        name = raw.get("file_name")
        if not isinstance(name, str) or not name:
            file = raw.get("file")
            # "(File not included. ...)" is what Telegram writes when media was not downloaded.
            name = PurePosixPath(file).name if isinstance(file, str) and not file.startswith("(") else None
        return "file", f"[file: {name}]" if name else "[file]"
    poll = raw.get("poll")
    if isinstance(poll, dict):
        question = poll.get("question")
        return "poll", f"[poll: {question}]" if isinstance(question, str) and question else "[poll]"
    if "location_information" in raw:
        return "location", "[location]"
    if "contact_information" in raw:
        return "contact", "[contact]"
    return None, None


# --- Discord -------------------------------------------------------------------------------------


_DISCORD_HOLLOW = frozenset({"messages"})


def _discord(
    path: Path, source: Source, tenant: str | None, users: Mapping[str, str], as_bot: bool
) -> Iterator[_Read]:
    data, streamed = _document(path, source, _DISCORD_HOLLOW)
    if not isinstance(data, dict):
        raise InputError(f"{path}: a DiscordChatExporter file is a JSON object, not {_kind(data)}")
    # A Telegram chat has "id" and "type" at the top; a Discord export never does.
    if "guild" not in data and ("chats" in data or {"id", "type", "messages"} <= data.keys()):
        raise InputError(f"{path}: this is a Telegram export (use the telegram format)")
    guild = _object(_required(data, "guild", ""), "guild")
    channel = _object(_required(data, "channel", ""), "channel")
    guild_id = _scalar_id(_required(guild, "id", "guild"), "guild.id")
    channel_id = _scalar_id(_required(channel, "id", "channel"), "channel.id")
    context: Json = {"source": "discord"}
    for key, part in (("guild", guild), ("channel", channel)):
        if isinstance(part.get("name"), str):
            context[key] = part["name"]

    places = {"chat_id": "channel.id", "tenant": "tenant" if tenant else "guild.id"}
    # As the bot writes them (discord.py's guild_as="tenant"): the server, the channel, by their ids.
    server, channel_chat = (
        (guild_id, channel_id) if as_bot else (f"discord:{guild_id}", f"discord:{channel_id}")
    )
    into = _Chat(tenant or server, channel_chat, users, _DISCORD_FIELDS, places)
    channel_messages = _Source("", into, context, _array(data, "messages", ""))
    for _, i, item in _items_of(path, source, _DISCORD_HOLLOW, [channel_messages], streamed):
        where = f"messages[{i}]"
        raw = _object(item, where)
        if _string(raw, "type", where) not in DISCORD_MESSAGE_TYPES:
            yield _Read(None, where, skipped="service")
        else:
            yield _Read(_discord_message(raw, where, into, context), where)


def _discord_message(raw: Json, where: str, into: _Chat, context: Json) -> Message:
    message_id = _scalar_id(_required(raw, "id", where), f"{where}.id")
    ts = _iso(_required(raw, "timestamp", where), f"{where}.timestamp")
    author = _object(_required(raw, "author", where), f"{where}.author")
    author_id = _scalar_id(_required(author, "id", f"{where}.author"), f"{where}.author.id")
    speaker = next(
        (v for v in (author.get("nickname"), author.get("name")) if isinstance(v, str) and v), None
    )

    content = raw.get("content", "")
    if not isinstance(content, str):
        raise InputError(f"must be a string, not {_kind(content)}", field=f"{where}.content")
    notes = []
    for j, attachment in enumerate(_array(raw, "attachments", where, optional=True)):
        ref = f"{where}.attachments[{j}]"
        notes.append(f"[attachment: {_string(_object(attachment, ref), 'fileName', ref)}]")
    for sticker in _array(raw, "stickers", where, optional=True):
        name = sticker.get("name") if isinstance(sticker, dict) else None
        notes.append(f"[sticker: {name}]" if isinstance(name, str) and name else "[sticker]")
    text = " ".join([content, *notes]) if content else " ".join(notes)
    _check_length(text, f"{where}.content")

    meta: Json = dict(context)
    if author.get("isBot") is True:
        meta["bot"] = True
    reference = raw.get("reference")
    if isinstance(reference, dict) and reference.get("messageId") is not None:
        meta["reply_to"] = _scalar_id(reference["messageId"], f"{where}.reference.messageId")
    if raw.get("timestampEdited") is not None:
        meta["edited"] = _iso(raw["timestampEdited"], f"{where}.timestampEdited").isoformat()
    return into.message(where, author_id, text=text, ts=ts, message_id=message_id, speaker=speaker, meta=meta)


_DISCORD_FIELDS = {
    "user_id": "author.id",
    "speaker": "author.nickname",
    "message_id": "id",
    "ts": "timestamp",
}


# --- shared helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    """One item of an export's message arrays, as read: its message, or the kind of item it was
    skipped as, with its place in the file (``messages[3]``; ``line`` for JSONL)."""

    message: Message | None
    where: str
    skipped: Literal["service", "unsupported"] | None = None
    line: int | None = None
    # The chat's place among the export's chats (a full export's "chats" before its
    # "left_chats"): messages of one time are stored in that order, wherever the file puts them.
    chat: int = 0


class _Held:
    """The messages read ahead of their turn, by rank: :data:`HELD_IN_RAM` at most in memory (the
    soonest due: past the bound, the latest due goes), the rest pickled into SQLite's private
    temporary database (a file the library removes from the folder as it makes it, gone with the
    connection, or with the process however it ends), written and read back
    :data:`HELD_READ_BACK` at a time. A full Telegram export of three chats of 100,000 messages
    each, overlapping in time, held most of the first two in memory: 483 MB."""

    def __init__(self) -> None:
        self._ram: dict[int, _Read] = {}
        self._latest: list[int] = []  # the ranks in memory, negated: a heap of the latest due
        self._db: sqlite3.Connection | None = None
        self._on_disk = 0
        self._to_disk: list[tuple[int, bytes]] = []  # written a batch at a time
        self._disk_first: int | None = None  # the lowest rank on disk (or to be written)
        self.most = 0  # the most held in memory at once

    def __enter__(self) -> _Held:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._db is not None:
            self._db.close()

    def __len__(self) -> int:
        return len(self._ram) + self._on_disk

    def put(self, rank: int, read: _Read) -> None:
        self._ram[rank] = read
        heapq.heappush(self._latest, -rank)
        self._bound()

    def take(self, rank: int) -> _Read | None:
        """The message of ``rank``, no longer held; ``None`` if it is not read yet."""
        # Most messages read find the next rank not read yet: the disk is asked only when it may
        # hold that rank.
        if rank not in self._ram and self._disk_first is not None and rank >= self._disk_first:
            self._write()
            db = self._disk()
            last = rank + HELD_READ_BACK
            rows = db.execute(
                "SELECT rank, read FROM held WHERE rank >= ? AND rank < ?", (rank, last)
            ).fetchall()
            if rows:
                db.execute("DELETE FROM held WHERE rank >= ? AND rank < ?", (rank, last))
                self._on_disk -= len(rows)
                for number, data in rows:
                    # Ours, written by this process a moment ago: unpickling reads nothing else.
                    self._ram[int(number)] = pickle.loads(data)
                    heapq.heappush(self._latest, -int(number))
            (self._disk_first,) = db.execute("SELECT MIN(rank) FROM held").fetchone()
            self._bound()
        return self._ram.pop(rank, None)

    def _bound(self) -> None:
        while len(self._ram) > HELD_IN_RAM:
            latest = -heapq.heappop(self._latest)
            read = self._ram.pop(latest, None)
            if read is None:
                continue  # taken since it was pushed
            self._to_disk.append((latest, pickle.dumps(read)))
            self._on_disk += 1
            self._disk_first = latest if self._disk_first is None else min(self._disk_first, latest)
            if len(self._to_disk) >= HELD_READ_BACK:
                self._write()
        self.most = max(self.most, len(self._ram))
        if len(self._latest) > 2 * len(self._ram) + HELD_READ_BACK:
            # The ranks taken since they were pushed: dropped, so the heap stays as small as memory.
            self._latest = [-r for r in self._ram]
            heapq.heapify(self._latest)

    def _write(self) -> None:
        if self._to_disk:
            with self._disk() as db:  # one transaction
                db.executemany("INSERT INTO held VALUES (?, ?)", self._to_disk)
            self._to_disk = []

    def _disk(self) -> sqlite3.Connection:
        if self._db is None:
            # "": a private temporary database, which no other connection or process opens.
            self._db = sqlite3.connect("", check_same_thread=False)
            self._db.execute("CREATE TABLE held (rank INTEGER PRIMARY KEY, read BLOB NOT NULL)")
        return self._db


@dataclass(frozen=True)
class _Source:
    """One chat of an export: where its messages go, the meta every one of them carries, and the
    array that holds them (a :class:`~narrmem.doors.json_stream.Hollow` when streamed)."""

    prefix: str
    into: _Chat
    context: Json
    messages: list[Any]
    rank: int = 0


def _document(path: Path, source: Source, hollow: frozenset[str]) -> tuple[Any, bool]:
    """The export's document, its message arrays hollow when it can be streamed (``True``), else
    the whole of it, read as before (which names a fault in it exactly)."""
    try:
        data = skeleton(source, hollow)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    if data is not None:
        return data, True
    return _load_json(path, source), False


def _items_of(
    path: Path, source: Source, hollow: frozenset[str], sources: Sequence[_Source], streamed: bool
) -> Iterator[tuple[_Source, int, Any]]:
    """Each source's items, in file order, each with its index in its array."""
    if not streamed:
        for chat in sources:
            for i, item in enumerate(chat.messages):
                yield chat, i, item
        return
    # A chat whose key came twice keeps the later array, as json.loads keeps it.
    by_number = {s.messages.number: s for s in sources if isinstance(s.messages, Hollow)}
    try:
        for number, i, item in items(source, hollow):
            found = by_number.get(number)
            if found is not None:
                yield found, i, item
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    except NotStreamable as exc:  # a file changed since its first reading
        raise InputError(f"{path}: changed while it was read ({exc})") from exc


def _load_json(path: Path, source: Source | None = None) -> Any:
    try:
        raw = source if isinstance(source, bytes) else path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8-sig")  # a BOM is harmless; Windows editors add one
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 ({exc.reason})") from exc
    try:
        return loads_json(text)
    except JsonShapeError as exc:
        raise InputError(f"{path}: not plain JSON ({exc.reason})", field=exc.path or None) from exc
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON ({exc.msg}, column {exc.colno})", line=exc.lineno) from exc
    except ValueError as exc:  # a number past the interpreter's digit limit
        raise InputError(f"{path}: not valid JSON ({exc})") from exc


@dataclass(frozen=True)
class _Chat:
    """Where an export's messages go (``tenant``, ``chat_id``), whose ids ``users`` maps, and the
    export's name of each field, for errors."""

    tenant: str
    chat_id: str
    users: Mapping[str, str]
    source_fields: Mapping[str, str]
    # Where the tenant and the chat id come from: the export's own fields, outside any message.
    place_fields: Mapping[str, str] = field(default_factory=dict)

    def message(self, where: str, author_id: str, **values: Any) -> Message:
        """The Message, or an error that names the export's field rather than narrmem's."""
        user_id = self.users.get(author_id, author_id)
        try:
            return Message.model_validate(
                {**values, "user_id": user_id, "chat_id": self.chat_id, "tenant": self.tenant}
            )
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            name = str(error["loc"][0]) if error["loc"] else "message"
            if name in self.place_fields:
                raise InputError(error["msg"], field=self.place_fields[name]) from exc
            raise InputError(error["msg"], field=f"{where}.{self.source_fields.get(name, name)}") from exc


def _unix(value: Any, field: str) -> datetime:
    """Seconds since the epoch (Telegram writes them as a string) as an aware UTC datetime."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(f"not a number ({_kind(value)})", field=field)
    try:
        seconds = int(value)
    except ValueError:
        raise InputError(f"not a number: {value!r}", field=field) from None
    try:
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise InputError(f"out of range: {value!r}", field=field) from None


def _local(instant: datetime, local_date: object) -> datetime:
    """``instant`` in the offset that makes it the export's naive local ``date``; as it is when
    there is no such offset (no date, a date that is not one, a difference no zone has)."""
    if not isinstance(local_date, str):
        return instant
    try:
        local = datetime.fromisoformat(local_date)
    except ValueError:
        return instant
    if local.tzinfo is not None:
        return instant
    offset = local - instant.replace(tzinfo=None)
    if abs(offset) > timedelta(hours=14) or offset % timedelta(minutes=15):
        return instant
    return instant.astimezone(timezone(offset))


def _iso(value: Any, field: str) -> datetime:
    if not isinstance(value, str):
        raise InputError(f"must be an ISO-8601 string, not {_kind(value)}", field=field)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InputError(f"not an ISO-8601 time: {value!r}", field=field) from None
    if parsed.tzinfo is None:
        raise InputError(f"has no timezone: {value!r}", field=field)
    try:
        parsed.astimezone(UTC)
    except OverflowError:  # the first or last day datetime can hold, in another timezone
        raise InputError(f"out of range: {value!r}", field=field) from None
    # Kept in the exporter's offset, the writer's local time: a scene's time and a weekly habit's
    # day are read in it (in UTC a Monday 7am in Shanghai was "Sunday 11pm").
    return parsed


def _check_length(text: str, field: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise InputError(f"has {len(text)} characters, at most {MAX_TEXT_CHARS} are allowed", field=field)


def _check_id(value: object, field: str) -> None:
    if not isinstance(value, str):
        raise InputError(f"must be a string, not {_kind(value)}", field=field)
    if not value or len(value) > MAX_ID_CHARS:
        raise InputError(f"must be 1 to {MAX_ID_CHARS} characters", field=field)
    # As a message's id is held (else the error named the export's message, not the option).
    if "\x00" in value:
        raise InputError("must not hold a NUL character", field=field)
    if has_surrogate(value):
        raise InputError("must not hold a lone surrogate", field=field)


def _scalar_id(value: Any, field: str) -> str:
    """Platform ids are integers (Telegram) or digit strings (Discord snowflakes); both become str."""
    if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
        raise InputError(f"must be an integer or a non-empty string, not {_kind(value)}", field=field)
    return str(value)


def _required(obj: Json, key: str, where: str) -> Any:
    if obj.get(key) is None:
        raise InputError("missing", field=_join(where, key))
    return obj[key]


def _string(obj: Json, key: str, where: str) -> str:
    value = _required(obj, key, where)
    if not isinstance(value, str) or not value:
        raise InputError(f"must be a non-empty string, not {_kind(value)}", field=_join(where, key))
    return value


def _object(value: Any, field: str) -> Json:
    if not isinstance(value, dict):
        raise InputError(f"must be a JSON object, not {_kind(value)}", field=field or None)
    return value


def _array(obj: Json, key: str, where: str, *, optional: bool = False) -> list[Any]:
    value = obj.get(key)
    if value is None and optional:
        return []
    if value is None:
        raise InputError("missing", field=_join(where, key))
    if not isinstance(value, list):
        raise InputError(f"must be a JSON array, not {_kind(value)}", field=_join(where, key))
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _kind(value: object) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
