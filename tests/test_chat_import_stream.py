"""A chat export of any size is imported without holding it whole: read through and checked, then
read again and stored part by part, in the same order and with the same messages as reading it
whole gives. A 300,000-message Telegram export (66 MB) took 800 MB to read before a message was
stored."""

from __future__ import annotations

import asyncio
import copy
import json
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from narrmem import InputError, Memory
from narrmem.doors import chat_import, json_stream
from narrmem.doors.chat_import import ChatImport, read_chat
from narrmem.testing import open_memory

DATA = Path(__file__).parent / "data" / "chat_exports"
BASE = 1_704_103_200  # 2024-01-01T10:00:00Z


def _write(path: Path, data: Any, *, prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + json.dumps(data, ensure_ascii=False).encode("utf-8"))
    return path


def _telegram_message(n: int, seconds: int, text: str, user: int = 1) -> dict[str, Any]:
    return {
        "id": n,
        "type": "message",
        "date": "2024-01-01T10:00:00",
        "date_unixtime": str(BASE + seconds),
        "from": f"Person {user}",
        "from_id": f"user{user}",
        "text": text,
    }


def _chat(chat_id: int, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "name": f"Chat {chat_id}",
        "type": "private_supergroup",
        "id": chat_id,
        "messages": messages,
        **fields,
    }


def _read_whole(monkeypatch: pytest.MonkeyPatch, *args: Any, **kwargs: Any) -> chat_import.ImportBatch:
    """``read_chat`` as it read every file before: the document parsed whole."""
    with monkeypatch.context() as patched:
        patched.setattr(chat_import, "skeleton", lambda path, hollow: None)
        return read_chat(*args, **kwargs)


def _same(streamed: chat_import.ImportBatch, whole: chat_import.ImportBatch) -> None:
    assert [m.model_dump() for m in streamed.messages] == [m.model_dump() for m in whole.messages]
    assert streamed.time_fields == whole.time_fields and streamed.time_lines == whole.time_lines
    assert (streamed.skipped_service, streamed.skipped_bots, streamed.skipped_forwards) == (
        whole.skipped_service,
        whole.skipped_bots,
        whole.skipped_forwards,
    )
    assert streamed.skipped_unsupported == whole.skipped_unsupported


# --- the same messages, in the same order, as the whole document gives ----------------------------


@pytest.mark.parametrize(
    ("name", "format", "options"),
    [
        ("telegram_result.json", "telegram", {}),
        ("telegram_full_export.json", "telegram", {"tenant": "ann", "keep_forwards": True}),
        ("telegram_nori_dm.json", "telegram", {}),
        ("discord_export.json", "discord", {}),
        ("discord_export.json", "discord", {"keep_bots": True, "as_bot": True}),
        ("discord_campaign.json", "discord", {}),
    ],
)
def test_every_export_reads_the_same_streamed_as_whole(
    name: str, format: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    streamed = read_chat(DATA / name, format, **options)
    assert streamed.messages
    _same(streamed, _read_whole(monkeypatch, DATA / name, format, **options))


def test_a_full_export_whose_chats_overlap_in_time_is_stored_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three chats, each in time order, interleaved across chats; a tie kept in file order.
    chats = [
        _chat(
            10 + c, [_telegram_message(i, 60 * (3 * i + (2 - c)), f"chat {c} message {i}") for i in range(40)]
        )
        for c in range(3)
    ]
    chats[1]["messages"][5]["date_unixtime"] = chats[0]["messages"][5]["date_unixtime"]
    full = {"about": "...", "chats": {"about": "...", "list": chats[:2]}, "left_chats": {"list": chats[2:]}}
    path = _write(tmp_path / "full.json", full)
    streamed = read_chat(path, "telegram")
    times = [m.ts for m in streamed.messages]
    assert len(times) == 120 and times == sorted(times)
    _same(streamed, _read_whole(monkeypatch, path, "telegram"))
    # Parts of 7: each in order, the same messages as the whole list.
    chat = ChatImport(path, "telegram")
    chat.check()
    parts = [[m.message_id for m, _ in part] for part in chat.parts(7)]
    assert max(map(len, parts)) == 7 and [m for part in parts for m in part] == [
        m.message_id for m in streamed.messages
    ]


def test_what_only_the_whole_reader_judges_is_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(5)]
    # A byte order mark, an integer past 64 bits outside any message, an emoji written as an
    # escaped pair: read as json.loads reads them.
    chat = _chat(77, messages, extra=123456789012345678901234567890)
    chat["messages"][1]["text"] = "ok \ud83d\ude00"
    path = tmp_path / "odd.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(chat).encode("ascii"))
    assert json_stream.skeleton(path, frozenset({"messages"})) is None
    batch = read_chat(path, "telegram")
    assert batch.messages[1].text == "ok \U0001f600"
    _same(batch, _read_whole(monkeypatch, path, "telegram"))
    # A lone surrogate escape, which yajl reads as "?": refused, naming where it is.
    chat["messages"][3]["text"] = "broken \ud800 text"
    path.write_bytes(json.dumps(chat).encode("ascii"))
    with pytest.raises(InputError) as caught:
        read_chat(path, "telegram")
    assert "surrogate" in str(caught.value) and caught.value.field == "messages[3].text"
    # Nested deeper than 64 levels inside a message: refused as before.
    deep: Any = "x"
    for _ in range(70):
        deep = [deep]
    chat["messages"][3] = {**messages[3], "extra": deep}
    path.write_bytes(json.dumps(chat).encode("ascii"))
    with pytest.raises(InputError, match="deeper than 64"):
        read_chat(path, "telegram")


def test_a_file_cut_short_is_refused_before_any_message_is_judged(tmp_path: Path) -> None:
    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(5)]
    messages[0]["date_unixtime"] = "not a number"  # would be the first error read
    text = json.dumps(_chat(5, messages))
    path = tmp_path / "cut.json"
    path.write_text(text[:-40], encoding="utf-8")
    with pytest.raises(InputError, match="not valid JSON"):
        read_chat(path, "telegram")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read_chat(path, "telegram")
    assert caught.value.field == "messages[0].date_unixtime"


def test_two_messages_under_one_id_are_named_by_their_places(tmp_path: Path) -> None:
    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(8)]
    messages[6]["id"] = 2  # another text, another time, one id
    with pytest.raises(InputError) as caught:
        read_chat(_write(tmp_path / "twice.json", _chat(9, messages)), "telegram")
    assert caught.value.field == "message_id"
    assert "different text and time (the first is messages[2], the second messages[6])" in str(caught.value)
    # The same message twice is a duplicate (stored once), not an error.
    messages[6] = copy.deepcopy(messages[2])
    assert len(read_chat(_write(tmp_path / "same.json", _chat(9, messages)), "telegram").messages) == 8


def test_a_file_changed_between_its_readings_stops_the_import(tmp_path: Path) -> None:
    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(20)]
    path = _write(tmp_path / "export.json", _chat(3, messages))
    chat = ChatImport(path, "telegram")
    chat.check()
    messages[12]["text"] = "something else"
    _write(path, _chat(3, messages))
    parts = chat.parts(5)
    assert len(next(parts)) == 5 and len(next(parts)) == 5
    with pytest.raises(InputError, match=r"changed while it was imported \(messages\[12\]\)"):
        next(parts)
    # Cut short after the check: the messages missing are named as missing.
    chat = ChatImport(_write(path, _chat(3, messages)), "telegram")
    chat.check()
    _write(path, _chat(3, messages[:15]))
    with pytest.raises(InputError, match="changed while it was imported"):
        [part for part in chat.parts(5)]


# --- never held whole ---------------------------------------------------------------------------


def _peak(work: Any) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_export_is_read_in_parts_without_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    words = "my sister moved to berlin last week and I start the new job at the bakery on monday".split()
    messages = [
        _telegram_message(i, 30 * i, " ".join(words[i % 7 :] + words[: i % 7]), user=i % 50)
        for i in range(20_000)
    ]
    path = _write(tmp_path / "big.json", _chat(42, messages))
    del messages

    def stream() -> None:
        chat = ChatImport(path, "telegram")
        chat.check()
        assert sum(len(part) for part in chat.parts(500)) == 20_000

    def whole() -> None:
        with monkeypatch.context() as patched:
            patched.setattr(chat_import, "skeleton", lambda path, hollow: None)
            stream()

    streamed, held = _peak(stream), _peak(whole)
    # The document and every message at once, against one part and the notes kept per message.
    # (3.6 MB against 28.7 MB measured; the whole grows with the file, the part does not.)
    assert streamed * 4 < held, (streamed, held)


def test_the_cli_imports_a_full_export_part_by_part_in_time_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from narrmem.doors import cli

    monkeypatch.setattr(cli, "IMPORT_PART", 4)
    chats = [
        _chat(
            20 + c,
            [
                _telegram_message(
                    i, 3600 * (2 * i + c), f"chat {c}: on day {i} I told you about my dog Rex {i}", c
                )
                for i in range(6)
            ],
        )
        for c in range(2)
    ]
    path = _write(tmp_path / "full.json", {"chats": {"list": chats}})
    data = tmp_path / "data"
    calls: list[list[Any]] = []
    ingest_many = Memory.ingest_many

    async def recorded(self: Memory, messages: Any, **options: Any) -> Any:
        calls.append([(m.chat_id, m.ts) for m in messages])
        return await ingest_many(self, messages, **options)

    monkeypatch.setattr(Memory, "ingest_many", recorded)
    assert cli.main(["import-chat", str(path), "--format", "telegram", "--data", str(data), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["messages"] == 12 and summary["chat_ids"] == ["telegram:20", "telegram:21"]
    # Parts of 4, oldest first across the two chats, which take turns.
    assert [len(call) for call in calls] == [4, 4, 4]
    said = [pair for call in calls for pair in call]
    assert [ts for _, ts in said] == sorted(ts for _, ts in said)
    assert [chat for chat, _ in said[:4]] == ["telegram:20", "telegram:21"] * 2

    async def stored() -> int:
        async with open_memory(data, real_model=True, read_only=True) as memory:
            return int((await memory.store.stats())["memories"])

    assert asyncio.run(stored()) > 0


# --- bytes, pipes, changes and ties between the two readings -----------------------------------


def test_bytes_and_spaces_only_yajl_takes_are_refused_as_before(tmp_path: Path) -> None:
    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(3)]
    text = json.dumps(_chat(8, messages)).encode("ascii")
    # An encoded surrogate (CESU-8): yajl takes it for UTF-8, Python does not.
    path = tmp_path / "cesu.json"
    path.write_bytes(text.replace(b"text 1", b"text \xed\xa0\x80"))
    with pytest.raises(InputError, match="not UTF-8"):
        read_chat(path, "telegram")
    # A vertical tab between two tokens: whitespace to yajl, not to JSON.
    path.write_bytes(text.replace(b', "type"', b',\x0b"type"', 1))
    with pytest.raises(InputError, match="not valid JSON"):
        read_chat(path, "telegram")
    # A byte order mark alone is streamed.
    path.write_bytes(b"\xef\xbb\xbf" + text)
    assert json_stream.skeleton(path, frozenset({"messages"})) is not None
    assert len(read_chat(path, "telegram").messages) == 3


def test_a_pipe_is_read_once_and_imported(tmp_path: Path) -> None:
    import os
    import threading

    messages = [_telegram_message(i, 60 * i, f"text {i}") for i in range(4)]
    fifo = tmp_path / "export.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(json.dumps(_chat(9, messages)).encode()))
    writer.start()
    try:
        batch = read_chat(fifo, "telegram")
    finally:
        writer.join(timeout=10)
    assert [m.text for m in batch.messages] == [f"text {i}" for i in range(4)]


def test_messages_of_one_time_keep_the_chats_before_the_left_chats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left = _chat(30, [_telegram_message(1, 0, "said in a chat since left")])
    kept = _chat(31, [_telegram_message(1, 0, "said in a chat still there")])
    # The file writes its left chats first; a full export's chats still come first.
    path = _write(tmp_path / "full.json", {"left_chats": {"list": [left]}, "chats": {"list": [kept]}})
    streamed = read_chat(path, "telegram")
    assert [m.text for m in streamed.messages] == ["said in a chat still there", "said in a chat since left"]
    _same(streamed, _read_whole(monkeypatch, path, "telegram"))


def test_a_message_left_out_then_kept_between_the_readings_is_a_change(tmp_path: Path) -> None:
    messages = [_telegram_message(i, 60 * (5 - i), f"text {i}") for i in range(5)]
    messages[1]["forwarded_from"] = "Someone"
    path = _write(tmp_path / "export.json", _chat(4, messages))
    chat = ChatImport(path, "telegram")
    chat.check()
    assert chat.skipped["forwards"] == 1 and chat.messages == 4
    del messages[1]["forwarded_from"]
    _write(path, _chat(4, messages))
    with pytest.raises(InputError, match=r"changed while it was imported \(messages\[1\]\)"):
        [part for part in chat.parts(2)]


def test_a_message_too_far_ahead_is_named_as_an_import_meets_it(tmp_path: Path) -> None:
    now = datetime.fromtimestamp(BASE + 3600, UTC)
    year = 365 * 86400
    messages = [_telegram_message(i, s, f"text {i}") for i, s in enumerate([0, 10 * year, 60, 2 * year])]
    chat = ChatImport(_write(tmp_path / "ahead.json", _chat(5, messages)), "telegram")
    chat.check()
    with pytest.raises(InputError) as caught:
        chat.check_not_ahead(now, 86400)
    # The oldest of those ahead, which an import stores first; not the newest.
    assert caught.value.field == "messages[3].date_unixtime"
    lines = tmp_path / "ahead.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"user_id": "u", "chat_id": "c", "message_id": str(i), "text": "hi", "ts": ts}) + "\n"
            for i, ts in enumerate(["2025-01-01T00:00:00Z", "2034-01-01T00:00:00Z", "2030-01-01T00:00:00Z"])
        ),
        encoding="utf-8",
    )
    jsonl = ChatImport(lines, "jsonl")
    jsonl.check()
    with pytest.raises(InputError) as caught:
        jsonl.check_not_ahead(datetime(2026, 1, 1, tzinfo=UTC), 86400)
    assert (caught.value.field, caught.value.line) == ("ts", 2)  # the first in the file


def test_a_full_exports_chats_overlapping_in_time_wait_on_disk_beyond_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full Telegram export's chats each run from its first day to its last: what waits for an
    older message of a later chat was held in memory, most of the export for a big account
    (483 MB for three chats of 100,000 messages). Past a bound, the latest due wait in SQLite's
    private temporary database."""
    chats = [
        _chat(
            30 + c,
            [
                _telegram_message(i, 60 * (3 * i + c), f"chat {c}: message {i} about my garden", c)
                for i in range(120)
            ],
        )
        for c in range(3)
    ]
    path = _write(tmp_path / "full.json", {"chats": {"list": chats}})
    whole = ChatImport(path, "telegram")
    whole.check()
    expected = [[(m.chat_id, m.message_id) for m, _ in part] for part in whole.parts(25)]
    assert whole.most_held > 200  # the first chat's waiting for the next two
    monkeypatch.setattr(chat_import, "HELD_IN_RAM", 40)
    monkeypatch.setattr(chat_import, "HELD_READ_BACK", 15)
    written: list[int] = []
    write = chat_import._Held._write

    def counted(held: Any) -> None:
        written.append(len(held._to_disk))
        write(held)

    monkeypatch.setattr(chat_import._Held, "_write", counted)
    bounded = ChatImport(path, "telegram")
    bounded.check()
    parts = bounded.parts(25)
    first = next(parts)
    assert [(m.chat_id, m.message_id) for m, _ in first] == expected[0]
    assert [[(m.chat_id, m.message_id) for m, _ in part] for part in parts] == expected[1:]
    assert 0 < bounded.most_held <= 40
    # What waited went to disk in batches: the latest due, not each message as it came.
    assert sum(written) > 100 and max(written) == 15
    stopped = bounded.parts(25)
    next(stopped)
    stopped.close()  # a reader that stops (an import failing midway)
