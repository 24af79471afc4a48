"""Chat exports in: Telegram Desktop and DiscordChatExporter JSON parsed into messages, malformed
files named by message index and field, and imports that are idempotent and recallable.

The fixtures in ``data/chat_exports`` are small hand-made exports in the platforms' shapes:
a Telegram group (the exporting machine was at UTC+8, so ``date`` is 8 hours ahead of
``date_unixtime``), a Telegram full export with a left chat, and a Discord guild channel.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg

from narrmem import InputError, Message
from narrmem.doors.chat_import import (
    FORMATS,
    ImportBatch,
    check_user_map,
    read_chat,
    read_discord,
    read_jsonl,
    read_telegram,
    read_user_map,
)
from narrmem.testing import open_memory

DATA = Path(__file__).parent / "data" / "chat_exports"
TELEGRAM = DATA / "telegram_result.json"
TELEGRAM_FULL = DATA / "telegram_full_export.json"
DISCORD = DATA / "discord_export.json"

TG_CHAT = "telegram:1765432109"
DC_TENANT = "discord:905123456789012345"
DC_CHAT = "discord:905123456789012399"
TOMAS = "322222222222222222"


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def _by_id(messages: list[Message]) -> dict[str, Message]:
    return {m.message_id: m for m in messages}


# --- Telegram -----------------------------------------------------------------------------------


def test_telegram_single_chat() -> None:
    batch = read_chat(TELEGRAM, "telegram")
    assert batch.format == "telegram"
    assert batch.skipped_service == 1  # Carla joining by link
    ids = [m.message_id for m in batch.messages]
    assert ids == [str(i) for i in range(100, 116) if i != 101]
    assert {m.chat_id for m in batch.messages} == {TG_CHAT}
    assert {m.tenant for m in batch.messages} == {"default"}
    assert {m.speaker: m.user_id for m in batch.messages} == {
        "Ann Lee": "user1001",
        "陈博": "user1002",
        "Carla Díaz": "user1003",
    }
    raw = {str(m["id"]): m for m in _load(TELEGRAM)["messages"]}
    for message in batch.messages:
        assert message.ts == datetime.fromtimestamp(int(raw[message.message_id]["date_unixtime"]), UTC)
        # The naive local "date" was not taken for UTC: the export machine was 8 hours ahead, and
        # the time keeps that offset (the writers' local time, which scene times are read in).
        local = datetime.fromisoformat(raw[message.message_id]["date"])
        assert message.ts.utcoffset() == timedelta(hours=8) and message.ts.replace(tzinfo=None) == local
        assert message.meta["source"] == "telegram" and message.meta["chat"] == "Hiking Club 徒步群"


def test_telegram_text_entities_replies_edits_and_media() -> None:
    messages = _by_id(read_telegram(TELEGRAM))
    assert messages["104"].text == (
        "Route for Saturday: Longjing to Nine Creeks, 12 km. Map: https://example.com/routes/longjing-nine-creeks"
    )
    assert messages["115"].text == "@carla_hikes 她可以坐我的车，我的车还有两个空位。"
    assert messages["110"].text == "我的膝盖去年受过伤，所以下坡要慢一点。"
    assert messages["105"].meta["reply_to"] == "104"
    assert messages["114"].meta["reply_to"] == "113"
    assert messages["106"].meta["edited"] == "2024-03-09T10:16:20+00:00"
    assert "edited" not in messages["105"].meta and "reply_to" not in messages["106"].meta
    assert (messages["107"].text, messages["107"].meta["media"]) == ("[photo]", "photo")
    assert (messages["109"].text, messages["109"].meta["media"]) == ("[sticker 😍]", "sticker")
    for message in messages.values():
        json.dumps(message.meta, allow_nan=False)  # plain JSON only


def test_telegram_full_export_reads_every_chat_oldest_first() -> None:
    batch = read_chat(TELEGRAM_FULL, "telegram", tenant="ann")
    assert batch.skipped_service == 1  # the group's creation
    assert [(m.chat_id, m.message_id) for m in batch.messages] == [
        ("telegram:1600000077", "31"),  # a left chat, and the oldest message
        ("telegram:4400012", "7002"),
        ("telegram:4400012", "7003"),
        ("telegram:1002", "5001"),
        ("telegram:1002", "5002"),
        ("telegram:1002", "5003"),
    ]
    assert {m.tenant for m in batch.messages} == {"ann"}
    voice = batch.messages[-1]
    assert (voice.text, voice.meta["media"], voice.speaker) == ("[voice message]", "voice_message", "陈博")
    assert batch.messages[1].meta["chat"] == "Lee family"


def test_telegram_media_placeholders_and_captions(tmp_path: Path) -> None:
    base = {"type": "message", "date_unixtime": "1709978405", "from": "Ann", "from_id": "user1"}
    items: list[dict[str, Any]] = [
        {"photo": "photos/p.jpg", "text": "our campsite"},
        {"file": "files/lease_contract.pdf", "text": ""},
        {"file": "(File not included. Change data exporting settings to download.)", "text": ""},
        {
            "file": "files/x.pdf",
            "file_name": "Plan B.pdf",
            "text": ["see ", {"type": "bold", "text": "this"}],
        },
        {"media_type": "animation", "file": "video_files/a.mp4", "text": ""},
        {"poll": {"question": "Saturday or Sunday?", "answers": []}, "text": ""},
        {"location_information": {"latitude": 30.2, "longitude": 120.1}, "text": ""},
        {"text": ""},  # nothing known: kept with empty text, which triage ignores
    ]
    messages = [{"id": i, **base, **item} for i, item in enumerate(items)]
    chat = {"name": "x", "type": "personal_chat", "id": 7, "messages": messages}
    texts = [m.text for m in read_telegram(_write(tmp_path / "result.json", chat))]
    assert texts == [
        "[photo] our campsite",
        "[file: lease_contract.pdf]",
        "[file]",
        "[file: Plan B.pdf] see this",
        "[GIF]",
        "[poll: Saturday or Sunday?]",
        "[location]",
        "",
    ]


# --- Discord ------------------------------------------------------------------------------------


def test_discord_channel() -> None:
    batch = read_chat(DISCORD, "discord", keep_bots=True)
    assert (batch.format, batch.skipped_service, len(batch.messages)) == ("discord", 2, 12)  # join, pin
    assert {m.tenant for m in batch.messages} == {DC_TENANT}
    assert {m.chat_id for m in batch.messages} == {DC_CHAT}
    raw = {m["id"]: m for m in _load(DISCORD)["messages"]}
    assert all(raw[m.message_id]["type"] in ("Default", "Reply") for m in batch.messages)
    for message in batch.messages:
        exported = datetime.fromisoformat(raw[message.message_id]["timestamp"])
        # The exporter's offset is kept (it was turned into UTC, and a Monday 7am in Shanghai
        # became "Sunday 11pm" in its scene).
        assert message.ts == exported and message.ts.utcoffset() == exported.utcoffset()
    assert {m.ts.utcoffset() for m in batch.messages} - {timedelta(0)}  # the file has +08:00 times
    assert batch.messages == sorted(batch.messages, key=lambda m: m.ts)

    messages = _by_id(batch.messages)
    jun_zh = messages["123000000000000007"]  # written with a +08:00 offset
    assert jun_zh.ts == datetime(2024, 4, 10, 19, 10, 9, tzinfo=UTC)
    assert jun_zh.speaker == "Jun 俊伟" and jun_zh.text == "我可以带一盒自己包的饺子过来。"
    assert messages["123000000000000003"].speaker == "tomas.r"  # no nickname: the user name
    assert messages["123000000000000005"].text == (
        "Here's the house rules sheet for Wingspan [attachment: wingspan-house-rules.pdf]"
    )
    assert messages["123000000000000012"].text == "[attachment: IMG_2041.jpg]"
    assert messages["123000000000000004"].meta["reply_to"] == "123000000000000001"
    assert messages["123000000000000009"].meta["edited"] == "2024-04-11T08:31:12.400000+00:00"
    bot = messages["123000000000000006"]
    assert bot.meta["bot"] is True and bot.user_id == "944444444444444444"
    assert [m.message_id for m in batch.messages if m.meta.get("bot")] == [
        "123000000000000006",
        "123000000000000013",
    ]
    assert messages["123000000000000013"].text == ""  # an embed-only bot card: embeds are left out
    assert messages["123000000000000014"].text.endswith(" [sticker: Meeple Wave]")
    assert messages["123000000000000001"].meta == {
        "source": "discord",
        "guild": "Board Game Night",
        "channel": "general",
    }


def test_bots_are_skipped_by_default_and_kept_on_request(tmp_path: Path) -> None:
    """Live integrations skip bots, and so does an import unless asked; JSONL's ``meta.bot`` too."""
    batch = read_chat(DISCORD, "discord")
    assert batch.skipped_bots == 2 and len(batch.messages) == 10
    assert not [m for m in batch.messages if m.meta.get("bot")]
    assert "944444444444444444" not in batch.scopes()["user_ids"]
    kept = read_chat(DISCORD, "discord", keep_bots=True)
    assert kept.skipped_bots == 0 and len(kept.messages) == 12
    assert read_discord(DISCORD) == batch.messages

    path = tmp_path / "messages.jsonl"
    lines = [msg("1", "I adopted a greyhound"), {**msg("2", "Noted!"), "meta": {"bot": True}}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert [m.message_id for m in read_chat(path, "jsonl").messages] == ["1"]
    assert [m.message_id for m in read_chat(path, "jsonl", keep_bots=True).messages] == ["1", "2"]


def test_the_batch_names_the_scopes_it_used() -> None:
    batch = read_chat(DISCORD, "discord", tenant="games", user_map={TOMAS: "tomas"})
    scopes = batch.scopes()
    assert scopes["tenants"] == ["games"] and scopes["chat_ids"] == [DC_CHAT]
    assert "tomas" in scopes["user_ids"] and scopes["user_ids"] == sorted(scopes["user_ids"])


def test_discord_tenant_and_user_map() -> None:
    messages = read_discord(DISCORD, tenant="games", user_map={TOMAS: "tomas"})
    assert {m.tenant for m in messages} == {"games"}
    assert {m.user_id for m in messages if m.speaker == "tomas.r"} == {"tomas"}
    assert {m.user_id for m in messages if m.speaker == "Mira"} == {"311111111111111111"}


# --- user maps and options ----------------------------------------------------------------------


def test_user_map_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "users.json", {"user1003": "carla", "user9999": "nobody"})
    users = read_user_map(path)
    assert users == {"user1003": "carla", "user9999": "nobody"}
    messages = read_telegram(TELEGRAM, user_map=users)
    assert {m.user_id for m in messages if m.speaker == "Carla Díaz"} == {"carla"}
    assert {m.user_id for m in messages if m.speaker == "Ann Lee"} == {"user1001"}  # unmapped: as is


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (["user1"], "user_map", "must be a JSON object"),
        ({"user1": 5}, 'user_map["user1"]', "must be a string"),
        ({"user1": "ok", "user2": ""}, 'user_map["user2"]', "1 to 200"),
        ({"陈博": "x" * 201}, 'user_map["陈博"]', "1 to 200"),
    ],
)
def test_user_map_errors_name_the_key(tmp_path: Path, data: Any, field: str, words: str) -> None:
    with pytest.raises(InputError, match=words) as caught:
        read_user_map(_write(tmp_path / "users.json", data))
    assert caught.value.field == field
    with pytest.raises(InputError) as again:  # a map handed in as a dict is checked the same way
        read_chat(TELEGRAM, "telegram", user_map=data)
    assert again.value.field == field


def test_user_map_not_json(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text('{"user1": "a",\n  oops}', encoding="utf-8")
    with pytest.raises(InputError, match="not valid JSON") as caught:
        read_user_map(path)
    assert caught.value.line == 2


def test_options_checked(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        read_chat(TELEGRAM, "whatsapp")
    assert caught.value.field == "format" and "telegram, discord, jsonl" in str(caught.value)
    assert FORMATS == ("telegram", "discord", "jsonl")
    with pytest.raises(InputError) as caught:
        read_chat(TELEGRAM, "telegram", tenant="")
    assert caught.value.field == "tenant"
    assert check_user_map({}) == {}


def test_jsonl_format(tmp_path: Path) -> None:
    lines = [
        msg("1", "I adopted a greyhound named Pixel", speaker="Ana"),
        msg("2", "她喜欢摇滚乐", user="u2"),
    ]
    path = tmp_path / "messages.jsonl"
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    batch = read_chat(path, "jsonl")
    assert batch == ImportBatch(read_jsonl(path), skipped_service=0, format="jsonl", time_lines=[1, 2])
    assert [m.message_id for m in batch.messages] == ["1", "2"]
    # A JSONL line names its own tenant and user: the options would silently change them.
    with pytest.raises(InputError) as caught:
        read_chat(path, "jsonl", tenant="t")
    assert caught.value.field == "tenant"
    with pytest.raises(InputError) as caught:
        read_chat(path, "jsonl", user_map={"u1": "x"})
    assert caught.value.field == "user_map"
    path.write_text(json.dumps(lines[0]) + "\n" + json.dumps({**lines[1], "ts": "yesterday"}) + "\n")
    with pytest.raises(InputError) as caught:
        read_chat(path, "jsonl")
    assert (caught.value.line, caught.value.field) == (2, "ts")


# --- malformed exports --------------------------------------------------------------------------

DELETE = object()


def _edit(path: Path, *changes: tuple[str, Any]) -> Callable[[Path], Path]:
    """A malformed copy of fixture ``path``; each change is (dotted path, new value or DELETE)."""

    def make(tmp: Path) -> Path:
        data = copy.deepcopy(_load(path))
        for where, value in changes:
            keys: list[str | int] = []
            for part in where.replace("[", ".").replace("]", "").split("."):
                keys.append(int(part) if part.isdigit() else part)
            target = data
            for key in keys[:-1]:
                target = target[key]
            if value is DELETE:
                del target[keys[-1]]
            else:
                target[keys[-1]] = value
        return _write(tmp / path.name, data)

    return make


MALFORMED: list[tuple[str, Callable[[Path], Path], str, str]] = [
    ("telegram", _edit(TELEGRAM, ("messages.2.id", DELETE)), "messages[2].id", "missing"),
    ("telegram", _edit(TELEGRAM, ("messages.2.id", True)), "messages[2].id", "integer or a non-empty string"),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.2.date_unixtime", DELETE)),
        "messages[2].date_unixtime",
        "timezone",
    ),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.2.date_unixtime", DELETE), ("messages.2.date", DELETE)),
        "messages[2].date_unixtime",
        "missing",
    ),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.12.date_unixtime", "yesterday")),
        "messages[12].date_unixtime",
        "not a number",
    ),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.3.date_unixtime", "9" * 20)),
        "messages[3].date_unixtime",
        "out of range",
    ),
    ("telegram", _edit(TELEGRAM, ("messages.2.text", 42)), "messages[2].text", "a string or a list"),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.4.text.1", {"type": "bold"})),
        "messages[4].text[1]",
        "entity object",
    ),
    ("telegram", _edit(TELEGRAM, ("messages.2.text", "x" * 16_001)), "messages[2].text", "16001 characters"),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.7.photo", "p.jpg"), ("messages.7.text", "x" * 15_995)),
        "messages[7].text",
        "16003",
    ),
    ("telegram", _edit(TELEGRAM, ("messages.2.type", "poll")), "messages[2].type", "unknown type 'poll'"),
    ("telegram", _edit(TELEGRAM, ("messages.2.from_id", DELETE)), "messages[2].from_id", "missing"),
    ("telegram", _edit(TELEGRAM, ("messages.2.from", 5)), "messages[2].from", "string or null"),
    ("telegram", _edit(TELEGRAM, ("messages.2.from", "x" * 201)), "messages[2].from", "at most 200"),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.5.reply_to_message_id", [104])),
        "messages[5].reply_to_message_id",
        "integer",
    ),
    (
        "telegram",
        _edit(TELEGRAM, ("messages.6.edited_unixtime", "later")),
        "messages[6].edited_unixtime",
        "not a number",
    ),
    ("telegram", _edit(TELEGRAM, ("messages.5", "hello")), "messages[5]", "must be a JSON object"),
    ("telegram", _edit(TELEGRAM, ("messages", {})), "messages", "must be a JSON array"),
    ("telegram", _edit(TELEGRAM, ("id", DELETE)), "id", "missing"),
    (
        "telegram",
        _edit(TELEGRAM_FULL, ("chats.list.1.messages.1.date_unixtime", "soon")),
        "chats.list[1].messages[1].date_unixtime",
        "not a number",
    ),
    ("telegram", _edit(TELEGRAM_FULL, ("chats", [])), "chats", "must be a JSON object"),
    ("telegram", _edit(TELEGRAM_FULL, ("left_chats.list.0.id", DELETE)), "left_chats.list[0].id", "missing"),
    (
        "discord",
        _edit(DISCORD, ("messages.0.timestamp", "2024-04-10T18:03:11")),
        "messages[0].timestamp",
        "no timezone",
    ),
    (
        "discord",
        _edit(DISCORD, ("messages.0.timestamp", "last friday")),
        "messages[0].timestamp",
        "not an ISO-8601",
    ),
    ("discord", _edit(DISCORD, ("messages.0.timestamp", DELETE)), "messages[0].timestamp", "missing"),
    # The chat's and the server's ids are the export's own fields, named as such (a message's
    # field, messages[0].tenant, before).
    ("discord", _edit(DISCORD, ("guild.id", "12\x003")), "guild.id", "NUL"),
    ("discord", _edit(DISCORD, ("channel.id", "7\x008")), "channel.id", "NUL"),
    ("telegram", _edit(TELEGRAM, ("id", "4\x005")), "id", "NUL"),
    # Two messages under one id with different texts: the second was dropped as a duplicate.
    ("discord", _edit(DISCORD, ("messages.2.id", "dup"), ("messages.3.id", "dup")), "message_id", "twice"),
    ("telegram", _edit(TELEGRAM, ("messages.3.id", 103), ("messages.4.id", 103)), "message_id", "twice"),
    # The same text under one id from two authors, or at two times, is two messages too.
    (
        "discord",
        _edit(
            DISCORD,
            ("messages.2.id", "dup"),
            ("messages.3.id", "dup"),
            ("messages.3.content", "Hi! New here. I mostly play heavy euro games like Brass and Ark Nova."),
        ),
        "message_id",
        "different author and time",
    ),
    # The last and first days datetime holds, in a timezone that takes them past it (an internal
    # error, exit 1, before).
    (
        "discord",
        _edit(DISCORD, ("messages.0.timestamp", "9999-12-31T23:59:59-05:00")),
        "messages[0].timestamp",
        "out of range",
    ),
    (
        "discord",
        _edit(DISCORD, ("messages.0.timestamp", "0001-01-01T00:00:00+05:00")),
        "messages[0].timestamp",
        "out of range",
    ),
    ("discord", _edit(DISCORD, ("messages.2.author", DELETE)), "messages[2].author", "missing"),
    ("discord", _edit(DISCORD, ("messages.2.author.id", None)), "messages[2].author.id", "missing"),
    ("discord", _edit(DISCORD, ("messages.2.id", DELETE)), "messages[2].id", "missing"),
    ("discord", _edit(DISCORD, ("messages.2.content", ["hi"])), "messages[2].content", "must be a string"),
    (
        "discord",
        _edit(DISCORD, ("messages.3.content", "x" * 16_001)),
        "messages[3].content",
        "16001 characters",
    ),
    (
        "discord",
        _edit(DISCORD, ("messages.4.attachments.0.fileName", DELETE)),
        "messages[4].attachments[0].fileName",
        "missing",
    ),
    (
        "discord",
        _edit(DISCORD, ("messages.8.timestampEdited", "soon")),
        "messages[8].timestampEdited",
        "ISO-8601",
    ),
    ("discord", _edit(DISCORD, ("messages.1.type", 7)), "messages[1].type", "non-empty string"),
    ("discord", _edit(DISCORD, ("guild", DELETE)), "guild", "missing"),
    ("discord", _edit(DISCORD, ("channel.id", "")), "channel.id", "non-empty string"),
]


@pytest.mark.parametrize(
    ("fmt", "make", "field", "words"), MALFORMED, ids=[f"{c[0]}-{c[2]}-{c[3]}" for c in MALFORMED]
)
def test_malformed_export_names_index_and_field(
    tmp_path: Path, fmt: str, make: Callable[[Path], Path], field: str, words: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(InputError) as caught:
        read_chat(path, fmt)
    assert caught.value.field == field
    assert words in str(caught.value)
    assert str(caught.value).startswith(f"field '{field}': ")


@pytest.mark.parametrize(
    ("fmt", "content", "words"),
    [
        ("telegram", b'{"name": "x",\n "messages": [\n', "not valid JSON"),
        ("telegram", b'{"name": "x", "id": ' + b"1" * 5000 + b"}", "not valid JSON"),
        (
            "jsonl",
            b'{"text": "a", "user_id": "u", "chat_id": "c", "n": ' + b"1" * 5000 + b"}\n",
            "not valid JSON",
        ),
        ("discord", b"\xff\xfe{}", "not UTF-8"),
        ("telegram", b"[1, 2]", "a Telegram export is a JSON object, not an array"),
        ("telegram", b'{"about": "hi"}', "not a Telegram Desktop export"),
        ("discord", b'"just a string"', "a DiscordChatExporter file is a JSON object"),
        ("telegram", DISCORD.read_bytes(), "this is a DiscordChatExporter file (use the discord format)"),
        ("discord", TELEGRAM.read_bytes(), "this is a Telegram export (use the telegram format)"),
        ("discord", TELEGRAM_FULL.read_bytes(), "this is a Telegram export (use the telegram format)"),
    ],
)
def test_malformed_file(tmp_path: Path, fmt: str, content: bytes, words: str) -> None:
    path = tmp_path / "export.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
        read_chat(path, fmt)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_chat(tmp_path / "missing.json", "telegram")
    path = tmp_path / "export.json"
    path.write_text("{}\n{}\n", encoding="utf-8")  # JSONL handed in as JSON
    with pytest.raises(InputError, match="not valid JSON") as caught:
        read_chat(path, "discord")
    assert caught.value.line == 2


def test_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_bytes(b"\xef\xbb\xbf" + TELEGRAM.read_bytes())
    assert len(read_telegram(path)) == 15


# --- end to end, in process ---------------------------------------------------------------------


def _summary(results: list[Any]) -> dict[str, int]:
    return {
        "messages": len(results),
        "stored": sum(r.stored for r in results),
        "ignored": sum(r.layer == "ignore" for r in results),
        "duplicates": sum(r.duplicate for r in results),
    }


@pytest.mark.parametrize(
    ("path", "fmt", "query", "scope", "expected"),
    [
        (TELEGRAM, "telegram", "allergic bee stings EpiPen", {"user_id": "carla"}, "105"),
        (TELEGRAM, "telegram", "膝盖受过伤", {"chat_id": TG_CHAT}, "110"),
        (TELEGRAM_FULL, "telegram", "lemon cake grandma", {"chat_id": "telegram:4400012"}, "7003"),
        (
            DISCORD,
            "discord",
            "vegetarian meat snacks",
            {"user_id": TOMAS, "tenant": DC_TENANT},
            "123000000000000009",
        ),
    ],
)
async def test_import_is_idempotent_and_recallable(
    tmp_path: Path, path: Path, fmt: str, query: str, scope: dict[str, str], expected: str
) -> None:
    batch = read_chat(path, fmt, user_map={"user1003": "carla"})
    async with open_memory(tmp_path / "m") as mem:
        first = _summary(await mem.ingest_many(batch.messages))
        assert first["messages"] == len(batch.messages)
        assert first["duplicates"] == 0 and first["stored"] > 0
        assert first["stored"] + first["ignored"] == first["messages"]
        count = (await mem.stats())["memories"]

        again = _summary(await mem.ingest_many(read_chat(path, fmt, user_map={"user1003": "carla"}).messages))
        assert again == {**first, "stored": 0, "duplicates": first["stored"]}
        assert (await mem.stats())["memories"] == count  # nothing new stored

        hits = await mem.recall(query, k=3, **scope)
        assert hits and hits[0].message_ids == [expected]
        assert hits[0].text == _by_id(batch.messages)[expected].text


async def test_ignored_messages_are_counted(tmp_path: Path) -> None:
    messages = _by_id(read_telegram(TELEGRAM))
    async with open_memory(tmp_path / "m") as mem:
        results = {r.message_id: r for r in await mem.ingest_many(list(messages.values()))}
    assert results["111"].layer == "ignore"  # "ok"
    assert results["104"].stored  # the entity text
    # A photo without a caption says nothing a person wrote: layer 1, counted as ignored.
    assert (results["107"].layer, results["107"].reason) == ("ignore", "media without words")


@pytest.mark.slow
async def test_real_model_recalls_a_paraphrase(tmp_path: Path) -> None:
    batch = read_chat(TELEGRAM, "telegram")
    async with open_memory(tmp_path / "m", real_model=True) as mem:  # the one real-model open here
        await mem.ingest_many(batch.messages)
        hits = await mem.recall(
            "Does anyone in the group need medicine for an allergy?", chat_id=TG_CHAT, k=3
        )
        assert hits[0].message_ids == ["105"], [(h.message_ids, h.text) for h in hits]
        hits = await mem.recall("Where did Carla live before?", chat_id=TG_CHAT, k=3)
        assert hits[0].message_ids == ["102"], [(h.message_ids, h.text) for h in hits]  # "moved from Madrid"


def test_telegram_forwards_are_left_out_unless_asked_and_unsupported_messages_are_counted(
    tmp_path: Path,
) -> None:
    """A forward was stored as the forwarder's words (Alice's diagnosis became Bob's "decision"
    scene, out of reach of Alice's forget); Telegram Desktop writes ``"forwarded_from": null``
    when it does not know the name, which dropped even the marker. A message Telegram Desktop
    could not export (``"type": "unsupported"``) failed the whole import."""
    data = _load(TELEGRAM)
    base = data["messages"][-1]
    data["messages"] += [
        {
            **base,
            "id": 9001,
            "text": "I was diagnosed with diabetes, I decided to quit sugar",
            "forwarded_from": "Alice",
        },
        {**base, "id": 9002, "text": "a forward whose author's name is unknown", "forwarded_from": None},
        {"id": 9003, "type": "unsupported"},
    ]
    path = _write(tmp_path / "result.json", data)
    batch = read_chat(path, "telegram")
    ids = {m.message_id for m in batch.messages}
    assert not ids & {"9001", "9002", "9003"}
    assert (batch.skipped_forwards, batch.skipped_unsupported) == (2, 1)
    kept = _by_id(read_chat(path, "telegram", keep_forwards=True).messages)
    assert kept["9001"].meta["forwarded_from"] == "Alice" and kept["9002"].meta["forwarded"] is True
    assert "forwarded_from" not in kept["9002"].meta


def test_as_bot_imports_under_the_ids_the_bot_integrations_use(tmp_path: Path) -> None:
    """An export imported under its own ids (``telegram:<id>``, ``user1001``) was never recalled
    by the live bot, whose chat is ``-100<id>`` and whose people are their bare Bot API ids."""
    batch = read_chat(TELEGRAM, "telegram", tenant="telegram", as_bot=True)
    assert {m.chat_id for m in batch.messages} == {"-1001765432109"}
    assert {m.user_id for m in batch.messages} == {"1001", "1002", "1003"}
    mapped = read_chat(TELEGRAM, "telegram", as_bot=True, user_map={"user1003": "carla"})
    assert {m.user_id for m in mapped.messages} == {"1001", "1002", "carla"}
    data = _load(TELEGRAM)
    for kind, chat_id in [("private_group", "-1765432109"), ("public_channel", "-1001765432109")]:
        data["type"] = kind
        assert (
            read_chat(_write(tmp_path / f"{kind}.json", data), "telegram", as_bot=True).messages[0].chat_id
            == chat_id
        )
    data["type"] = "a_future_kind"
    with pytest.raises(InputError) as caught:
        read_chat(_write(tmp_path / "odd.json", data), "telegram", as_bot=True)
    assert caught.value.field == "type"
    discord = read_chat(DISCORD, "discord", as_bot=True)
    assert {(m.tenant, m.chat_id) for m in discord.messages} == {("905123456789012345", "905123456789012399")}
