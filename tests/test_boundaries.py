"""Each kind of crash the fuzz harness found, pinned: bad input is a typed narrmem error naming its
field, key or file, and changes nothing. (The harness itself: tests/reliability/fuzz.py.)"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg, run_narrmem, store_count, write_export

from narrmem import ConfigError, InputError, Memory, Message, StoreError, UnknownToolError, load_settings
from narrmem.checks import MAX_JSON_DEPTH, SQLITE_MAX_INT, check_plain_json, loads_json
from narrmem.doors.chat_import import read_chat
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_jsonl, read_messages
from narrmem.models import MAX_META_BYTES, ImportanceChange, Scope
from narrmem.testing import open_memory

DEEP = 10_000


def deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def deep_json(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.fixture
async def mem(tmp_path: Path) -> Any:
    """A memory with one message in it."""
    async with open_memory(tmp_path / "store") as mem:
        await mem.ingest(msg("m1", "I keep bees on the roof of my building"))
        assert await store_count(mem) == 1
        yield mem


# --- 1. JSON nested 10,000 deep: RecursionError -------------------------------------------------


async def test_deep_tool_arguments_are_refused_before_parsing(mem: Memory) -> None:
    before = await store_count(mem)
    for arguments in ("[" * DEEP + "]" * DEEP, deep_json(DEEP), '{"user_id": ' + "[" * DEEP):
        with pytest.raises(InputError) as info:
            await mem.call_tool("persona_set", arguments)
        assert info.value.field == "arguments"
        assert "64 levels" in str(info.value)
    # The same depth handed in as a dict, inside a free-form field.
    with pytest.raises(InputError) as info:
        await mem.call_tool(
            "context_rewrite",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "summary": "none",
                "extra": deep_list(DEEP),
            },
        )
    assert info.value.field is not None and info.value.field.startswith("extra")
    assert await store_count(mem) == before


async def test_deep_message_meta_is_an_input_error(mem: Memory) -> None:
    before = await store_count(mem)
    with pytest.raises(InputError) as info:
        await mem.ingest(msg("m2", "hello there", meta={"a": deep_list(DEEP)}))
    assert info.value.field == "meta"
    assert "64 levels" in str(info.value)
    assert await store_count(mem) == before
    # 64 levels is the limit: within it, the message is kept.
    kept = await mem.ingest(msg("m3", "nested but fine", meta={"a": deep_list(MAX_JSON_DEPTH - 2)}))
    assert kept.stored


def test_deep_files_name_the_line(tmp_path: Path) -> None:
    jsonl = tmp_path / "messages.jsonl"
    good = json.dumps(msg("m1", "hi there"))
    jsonl.write_text(
        good + "\n" + json.dumps({**msg("m2", "x"), "meta": {}})[:-1] + ', "x": ' + deep_json(DEEP) + "}\n"
    )
    with pytest.raises(InputError) as info:
        read_messages(jsonl)
    assert info.value.line == 2
    export = tmp_path / "telegram.json"
    export.write_text('{"name": "x", "id": 1, "messages": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(InputError, match="64 levels"):
        read_chat(export, "telegram")


def test_depth_is_counted_without_recursion() -> None:
    # Brackets inside strings are not nesting; a text far past the limit is refused unparsed.
    assert loads_json('{"a": "' + "[" * 500 + '"}') == {"a": "[" * 500}
    with pytest.raises(ValueError, match="64 levels"):
        loads_json("[" * 1_000_000)
    with pytest.raises(ValueError, match="64 levels"):
        check_plain_json({"a": deep_list(DEEP)})


# --- 2. A config file that is not UTF-8 (UnicodeDecodeError) or nests too deep ------------------


def test_config_file_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "narrmem.toml"
    path.write_bytes(b"\xff\xfe[storage]\nbatch_size = 5\n")
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_settings(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    ["a = " + "[" * DEEP + "]" * DEEP + "\n", "[plugin.graph]\nx = " + "{ a = " * DEEP + "1" + " }" * DEEP],
    ids=["array", "inline table"],
)
def test_config_file_nested_too_deep_names_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "narrmem.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="deeper than 64") as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_config_path_that_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a file"):
        load_settings(tmp_path)


# --- 3. A bad NARRMEM_ variable: pydantic-settings' SettingsError, RecursionError ---------------


@pytest.mark.parametrize(
    ("name", "value", "named"),
    [
        ("NARRMEM_RECALL__WEIGHTS", "{", "NARRMEM_RECALL__WEIGHTS"),
        ("NARRMEM_PLUGINS__DISABLED", "x", "NARRMEM_PLUGINS__DISABLED"),
        ("NARRMEM_PLUGIN__GRAPH__AUTO_TASKS", deep_json(DEEP), "NARRMEM_PLUGIN__GRAPH__AUTO_TASKS"),
        ("NARRMEM_STORAGE__BATCH_SIZE", "abc", "storage.batch_size"),
        # Bytes that are not UTF-8 come in as lone surrogates; a validator quoting them crashed pydantic.
        ("NARRMEM_STORAGE__INDEX", "\udcff", "storage.index"),
    ],
)
def test_bad_environment_variable_is_a_config_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, named: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert named in str(info.value)


# --- 4. Scope arguments of the wrong type or empty: raw ValidationError, TypeError ---------------


async def test_forget_messages_with_an_empty_chat_is_an_input_error(mem: Memory) -> None:
    with pytest.raises(InputError) as info:
        await mem.forget_messages(chat_id="", message_ids=["m1"])
    assert info.value.field == "chat_id"
    for ids, field in (([1], "message_ids[0]"), ("m1", "message_ids"), ([{}], "message_ids[0]")):
        with pytest.raises(InputError) as info:
            await mem.forget_messages(chat_id="c1", message_ids=ids)  # type: ignore[arg-type]
        assert info.value.field == field
    assert await store_count(mem) == 1


async def test_wrong_python_types_name_the_argument(mem: Memory) -> None:
    calls: list[tuple[Any, str]] = [
        (lambda: mem.recall("cello", user_id={"a": 1}), "user_id"),  # type: ignore[arg-type]
        (lambda: mem.forget_messages(chat_id=b"c1", message_ids=["m1"]), "chat_id"),  # type: ignore[arg-type]
        (lambda: mem.summary(user_id=b"u1"), "user_id"),  # type: ignore[arg-type]
        (lambda: mem.forget(user_id=["u1"]), "user_id"),  # type: ignore[arg-type]
        (lambda: mem.turn_context(5, user_id="u1", chat_id="c1"), "text"),  # type: ignore[arg-type]
        (lambda: mem.summary(user_id="u1", depth="deep"), "depth"),  # type: ignore[arg-type]
        (lambda: mem.summary(user_id="u1", token_budget=0), "token_budget"),
        (lambda: mem.ingest_many(5), "messages"),  # type: ignore[arg-type]
        (lambda: mem.ingest_many("text"), "messages"),  # type: ignore[arg-type]
        (lambda: mem.decay(5), "now"),  # type: ignore[arg-type]
        (lambda: mem.decay("2026-05-04T00:00:00+00:00"), "now"),  # type: ignore[arg-type]
    ]
    for call, field in calls:
        with pytest.raises(InputError) as info:
            await call()
        assert info.value.field == field, field
    with pytest.raises(UnknownToolError) as info:
        await mem.call_tool(["persona_get"], {})  # type: ignore[arg-type]
    assert info.value.field == "name"
    assert await store_count(mem) == 1


async def test_a_message_object_changed_after_it_was_built_is_checked_again(
    mem: Memory,
) -> None:
    message = Message.model_validate(msg("m9", "I decided to move"))
    message.text = 5  # type: ignore[assignment]  # assignment is not validated
    with pytest.raises(InputError) as info:
        await mem.ingest(message)
    assert info.value.field == "text"
    message.text, message.meta = "fine now", {"a": {1, 2}}
    with pytest.raises(InputError) as info:
        await mem.ingest_many([msg("m10", "good"), message])
    assert info.value.field == "messages[1].meta"
    assert await store_count(mem) == 1


# --- 5. Integers past SQLite's range: OverflowError; a list as an id: ProgrammingError ----------


@pytest.mark.parametrize("memory_id", [10**18 * 10, 2**63, -(2**63) - 1, 0, [1], "1", 1.0, True, None])
async def test_history_of_a_bad_id(mem: Memory, memory_id: Any) -> None:
    with pytest.raises(InputError) as info:
        await mem.history(memory_id)
    assert info.value.field == "memory_id"


async def test_history_of_an_unknown_id_in_range(mem: Memory) -> None:
    with pytest.raises(InputError, match="no memory with id"):
        await mem.history(SQLITE_MAX_INT)


@pytest.mark.parametrize("scene_id", [2**63, 10**30])
async def test_tool_ids_stay_in_sqlite_range(mem: Memory, scene_id: int) -> None:
    with pytest.raises(InputError) as info:
        await mem.call_tool("soul_narrative", {"action": "get", "user_id": "u1", "id": scene_id})
    assert info.value.field == "id"


STORY = "Once upon a time a king ruled. A threat came. A knight rode out. She found a village."


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        ("persona_set", {"user_id": "u1", "description": "kind", "tone": "warm\x00ly"}, "tone"),
        ("persona_set", {"user_id": "u1", "description": "kind", "tone": "warm\nly"}, "tone"),
        ("persona_set", {"user_id": "u1", "description": "kind", "traits": ["ok", "bell\x07"]}, "traits.1"),
        ("rtm_create_narrative_tree", {"text": STORY, "title": "a\x00b"}, "title"),
        ("rtm_traverse_narrative", {"text": STORY, "title": "a\x00b", "traversalDepth": 1}, "title"),
        ("soul_narrative", {"action": "add", "user_id": "u1", "event": "   "}, "event"),
    ],
)
async def test_tool_text_a_store_or_a_prompt_cannot_take_names_its_field(
    mem: Memory, tool: str, arguments: dict[str, Any], field: str
) -> None:
    """A NUL reached the store, which refused it naming no field; a line break in a persona's tone
    or trait went into the graph and the prompt (memory_commit refuses it in a node name); a blank
    narrative fragment was stored as a scene."""
    before = await store_count(mem)
    with pytest.raises(InputError) as info:
        await mem.call_tool(tool, arguments)
    assert info.value.field == field, str(info.value)
    assert await store_count(mem) == before


# --- 6. Lone surrogates: UnicodeEncodeError when the store or a JSON file met them ------------


@pytest.mark.parametrize(
    "meta",
    [{"a": "\ud800"}, {"\udfff": 1}, {"list": ["ok", "a\ud83d"]}, {"nan": float("nan")}],
    ids=["value", "key", "in a list", "NaN"],
)
async def test_meta_that_cannot_be_stored_as_json(mem: Memory, meta: dict[str, Any]) -> None:
    with pytest.raises(InputError) as info:
        await mem.ingest(msg("m2", "hello there", meta=meta))
    assert info.value.field == "meta"
    assert await store_count(mem) == 1


async def test_lone_surrogates_elsewhere(mem: Memory, tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        await mem.ingest(msg("\ud800", "hello"))
    assert info.value.field == "message_id"
    with pytest.raises(InputError) as info:
        await mem.turn_context("about \udcff", user_id="u1", chat_id="c1")
    assert info.value.field == "text"
    with pytest.raises(InputError) as info:
        await mem.call_tool("persona_set", '{"user_id": "u1", "description": "\\ud800"}')
    assert info.value.field == "description"
    # Fields without a length or pattern: pydantic lets lone surrogates through those by itself.
    with pytest.raises(InputError) as info:
        await mem.recall("bees", user_id="u1", kinds=["\ud800"])
    assert info.value.field == "kinds.0"
    with pytest.raises(InputError) as info:
        await mem.forget_messages(chat_id="c1", message_ids=["m1", "\ud800"])
    assert info.value.field == "message_ids[1]"
    export = tmp_path / "result.json"
    chat = json.loads((Path(__file__).parent / "data/chat_exports/telegram_result.json").read_text())
    chat["name"] = "\ud800"
    export.write_text(json.dumps(chat))  # written as the escape \ud800, as a broken exporter would
    with pytest.raises(InputError, match="surrogate") as info:
        read_chat(export, "telegram")
    assert info.value.field == "name"
    assert await store_count(mem) == 1


# --- 7. Times next to datetime's limits: OverflowError in plugins' date arithmetic --------------


@pytest.mark.parametrize(
    "ts",
    [
        "0001-01-01T00:00:00+00:00",
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "1899-12-31T23:59:59+00:00",
        "3000-01-01T00:00:00+00:00",
    ],
)
async def test_message_time_out_of_range(mem: Memory, ts: str) -> None:
    with pytest.raises(InputError) as info:
        await mem.ingest(msg("m2", "I decided to move", ts=ts))
    assert info.value.field == "ts"
    assert await store_count(mem) == 1


@pytest.mark.parametrize(
    "now",
    [
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),
        datetime.min.replace(tzinfo=UTC),
        datetime(2026, 5, 4),
    ],
)
async def test_decay_now_out_of_range(mem: Memory, now: datetime) -> None:
    with pytest.raises(InputError) as info:
        await mem.decay(now)
    assert info.value.field == "now"


# --- 8. An import whose episode another episode holds: IntegrityError ---------------------------


async def test_import_of_a_conflicting_episode_names_its_line(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    export = tmp_path / "export.jsonl"
    async with open_memory(source) as mem:
        await mem.ingest(msg("m1", "I keep bees on the roof"))
        await export_jsonl(mem, export)
    async with open_memory(target) as mem:
        # The same chat message, stored here first under another id.
        await mem.ingest(msg("other", "a first message"))
        await mem.ingest(msg("m1", "I keep bees on the roof"))
        before = await store_count(mem)
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, export)
        assert info.value.field == "message_ids"
        assert info.value.line == 2
        assert await store_count(mem) == before
    # The same record twice in one file with different ids: the second line is named.
    lines = export.read_text().splitlines()
    record = json.loads(lines[1])
    duplicate = {**record, "id": record["id"] + 100}
    write_export(export, [*map(json.loads, lines), duplicate])
    async with open_memory(tmp_path / "third") as mem:
        with pytest.raises(InputError) as info:
            await import_jsonl(mem, export)
        where = next(
            n
            for n, line in enumerate(export.read_text().splitlines(), 1)
            if json.loads(line).get("id") == duplicate["id"]
        )
        assert (info.value.field, info.value.line) == ("message_ids", where)
        assert (await mem.stats())["memories"] == 0


# --- 9. A data folder the store cannot use: sqlite3 errors, FileExistsError ---------------------


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[dict[str, Path]]:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "narrmem.sqlite3").write_bytes(b"this is not a database " * 100)
    db_folder = tmp_path / "db-is-a-folder"
    (db_folder / "narrmem.sqlite3").mkdir(parents=True)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("the user's notes")
    yield {"garbage": garbage, "db-folder": db_folder, "file": a_file, "under-file": a_file / "sub"}
    assert a_file.read_text() == "the user's notes"
    assert (garbage / "narrmem.sqlite3").read_bytes() == b"this is not a database " * 100


NOT_A_DATABASE = pytest.mark.sqlite_only("the SQLite database file in the data folder is not one")


@pytest.mark.parametrize(
    "which",
    [
        pytest.param("garbage", marks=NOT_A_DATABASE),
        pytest.param("db-folder", marks=NOT_A_DATABASE),
        "file",
        "under-file",
    ],
)
async def test_a_folder_that_cannot_hold_a_store_is_a_store_error(
    folders: dict[str, Path], which: str
) -> None:
    with pytest.raises(StoreError) as info:
        async with open_memory(folders[which]):
            pass
    assert str(folders[which]) in str(info.value)


@NOT_A_DATABASE
def test_cli_reports_an_unopenable_store_in_one_line(folders: dict[str, Path], tmp_path: Path) -> None:
    """aiosqlite's worker thread used to report the failed connect after ``asyncio.run`` had closed
    the loop: "RuntimeError: Event loop is closed" and a traceback at exit, in most runs."""
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    forget = ["forget", "--user", "u1", "--data", str(folders["db-folder"])]
    for _ in range(3):
        done = run_narrmem(*forget, cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("narrmem: error:") and "narrmem.sqlite3" in line


# --- 10. Memory.open's own arguments: TypeError, AttributeError, ValueError (NUL byte) ------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"data_dir": 5}, "data_dir"),
        ({"data_dir": ""}, "data_dir"),
        ({"data_dir": "a\x00b"}, "data_dir"),
        ({"data_dir": b"folder"}, "data_dir"),
        ({"settings": "narrmem.toml"}, "settings"),
        ({"clock": 5}, "clock"),
        ({"plugins": 5}, "plugins"),
        ({"plugins": "narrmem_plugins.rtm"}, "plugins"),
    ],
)
async def test_open_arguments_of_the_wrong_kind(tmp_path: Path, options: dict[str, Any], field: str) -> None:
    options.setdefault("data_dir", tmp_path / "store")
    with pytest.raises(InputError) as info:
        async with Memory.open(warm=False, **options):
            pass
    assert info.value.field == field
    assert not os.listdir(tmp_path)  # nothing created anywhere


def test_config_file_argument_of_the_wrong_kind() -> None:
    with pytest.raises(ConfigError, match="must be a path, not int"):
        load_settings(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="data_dir"):
        load_settings(data_dir="a\x00b")


# --- 11. An edit refused after the old message was already forgotten -----------------------------


async def test_an_edit_whose_own_meta_leaves_no_room_for_the_earlier_text_is_taken(mem: Memory) -> None:
    """The earlier texts go into the new episode's meta: near the size limit there is no room for
    them, and the edit was refused (the memory left on its old text). It is taken, the earlier
    text left out as far as it does not fit, and meta stays within its limit."""
    big = {"a": "x" * (MAX_META_BYTES - len('{"a": ""}') - 10)}  # 10 bytes under the limit
    assert len(json.dumps(big).encode()) == MAX_META_BYTES - 10
    # Kept: the episode adds narrmem's own keys beside the message's meta, within its own limit.
    assert (await mem.ingest(msg("m2", "I keep bees", meta=big))).stored
    edited = await mem.edit(msg("m2", "I keep bees and wasps " * 100, meta=big))
    assert edited.stored
    [record] = [r for r in edited.records if "m2" in r.message_ids and r.kind == "episode"]
    assert "edits" not in record.meta and record.text.startswith("I keep bees and wasps")
    # A little more room: the earlier text's start, marked cut.
    roomier = {"a": "x" * (MAX_META_BYTES - len('{"a": ""}') - 200)}
    assert (await mem.ingest(msg("m3", "I keep bees " * 100, meta=roomier))).stored
    edited = await mem.edit(msg("m3", "I keep wasps", meta=roomier))
    [record] = [r for r in edited.records if "m3" in r.message_ids and r.kind == "episode"]
    [earlier] = record.meta["edits"]
    assert earlier["cut"] and "I keep bees".startswith(earlier["text"][:11]) and earlier["text"]
    # The message's meta with its earlier texts (the episode adds its own keys within its own limit).
    sent = {key: record.meta[key] for key in ("a", "edits")}
    assert MAX_META_BYTES - 200 < len(json.dumps(sent, ensure_ascii=False).encode()) <= MAX_META_BYTES


async def test_a_message_edited_every_day_keeps_taking_its_edits(mem: Memory) -> None:
    """A pinned status or a to-do list edited daily: every earlier text was kept, and a long one
    took meta past its limit at about its 33rd edit; every edit after that was refused and the
    memory stayed on an old text. The latest earlier texts are kept, within a bound."""
    from narrmem.editing import EDITS_BYTES, EDITS_KEPT

    line = "Список дел на сегодня: купить хлеб, позвонить маме, записаться к врачу. "
    await mem.ingest(msg("todo", f"day 0: {line * 25}"))
    for day in range(1, 61):
        result = await mem.edit(msg("todo", f"day {day}: {line * 25}"))
        assert result.stored, (day, result.reason)
    [record] = [r for r in await mem.store.recent(Scope(user_id="u1"), limit=10) if "todo" in r.message_ids]
    assert record.text.startswith("day 60:")
    earlier = [e["text"].split(":")[0] for e in record.meta["edits"]]
    # The latest, newest last, as many as fit in the bound: no more.
    assert earlier == [f"day {d}" for d in range(60 - len(earlier), 60)]
    assert 0 < len(earlier) <= EDITS_KEPT
    assert len(json.dumps(record.meta["edits"], ensure_ascii=False).encode()) <= EDITS_BYTES
    # A short text keeps the last EDITS_KEPT of its earlier texts.
    await mem.ingest(msg("mood", "mood: 0"))
    for n in range(1, 30):
        assert (await mem.edit(msg("mood", f"mood: {n}"))).stored
    [short] = [r for r in await mem.store.recent(Scope(user_id="u1"), limit=10) if "mood" in r.message_ids]
    assert [e["text"] for e in short.meta["edits"]] == [f"mood: {n}" for n in range(29 - EDITS_KEPT, 29)]


async def test_an_edit_of_a_message_whose_own_meta_says_edits(mem: Memory) -> None:
    await mem.ingest(msg("m2", "I keep bees", meta={"edits": 5}))
    result = await mem.edit(msg("m2", "I keep wasps"))
    assert result.stored
    [record] = result.records[:1]
    assert [e["text"] for e in record.meta["edits"]] == ["I keep bees"]


async def test_an_edit_that_keeps_the_text_changes_nothing(mem: Memory) -> None:
    """Platforms send updates that keep a message's text (a pin, a late link preview; discord.py
    cannot compare with the old text once the message left its cache). Taken as an edit it made
    the memory again: its reinforcement, importance history and id were gone."""
    first = await mem.ingest(msg("m3", "I decided to learn the cello"))
    episode_id = first.memory_ids[0]
    stored = (await mem.store.get([episode_id], None))[episode_id]
    at = stored.created_at + timedelta(days=3)
    change = ImportanceChange(
        memory_id=episode_id, importance=0.9, reinforced_at=at, old=stored.importance, who="bot", why="used"
    )
    assert await mem.store.set_importance([change], at) == [episode_id]
    reinforced = (await mem.store.get([episode_id], None))[episode_id]
    history = await mem.store.history(episode_id)
    assert reinforced.reinforced_at is not None and history
    again = await mem.edit(msg("m3", "I decided to learn the cello"))
    assert again.duplicate and not again.stored and episode_id in again.memory_ids
    after = (await mem.store.get([episode_id], None))[episode_id]
    assert (after.importance, after.reinforced_at) == (reinforced.importance, reinforced.reinforced_at)
    assert await mem.store.history(episode_id) == history and "edits" not in after.meta
    changed = await mem.edit(msg("m3", "I decided to learn the viola"))  # a real edit still is one
    assert changed.stored and changed.records[0].meta["edits"][0]["text"] == "I decided to learn the cello"


@pytest.mark.parametrize("data", ["", " "])
def test_a_blank_data_folder_on_the_command_line_is_refused(tmp_path: Path, data: str) -> None:
    """``--data ""`` meant the default folder and ``--data " "`` made a folder named " "."""
    done = run_narrmem(
        "stats", "--data", data, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 2, done.stderr
    assert "--data: " in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_two_messages_under_one_id_in_an_ingest_file_name_the_second_line(tmp_path: Path) -> None:
    """``narrmem ingest`` stored the first and took the second for a duplicate, exit code 0."""
    path = tmp_path / "two.jsonl"
    lines = [
        msg("m1", "I adopted a cat named Miso", ts="2026-01-01T10:00:00+00:00"),
        msg("m2", "the same id in another chat is another message", chat="c2"),
        msg("m1", "I moved to Porto last week", ts="2026-01-02T10:00:00+00:00"),
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(InputError) as caught:
        read_messages(path)
    assert (caught.value.field, caught.value.line) == ("message_id", 3)
    assert "different text and time (the first is line 1)" in str(caught.value)
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    done = run_narrmem("ingest", str(path), "--data", str(tmp_path / "d"), cwd=tmp_path, env=env)
    assert done.returncode == 2 and "line 3, field 'message_id'" in done.stderr, done.stderr
    assert not (tmp_path / "d").exists()
    # The same message twice is a duplicate, as on a second ingest.
    path.write_text("".join(json.dumps(line) + "\n" for line in [lines[0], lines[0]]), encoding="utf-8")
    assert len(read_messages(path)) == 2


@pytest.mark.parametrize(
    "command",
    [
        ["import", "{tmp}/missing.jsonl"],
        ["import", "{tmp}/garbage.jsonl"],
        ["rtm", "build", "{tmp}/empty.txt"],
        ["rtm", "build", "{tmp}/story.txt", "--k", "99"],
        ["forget", "--user", "a"],
        ["decay", "--now", "1800-01-01T00:00:00+00:00"],
    ],
)
def test_a_write_command_refused_leaves_no_new_store(tmp_path: Path, command: list[str]) -> None:
    """Each made an empty store in a folder that had none, then refused its input (exit 2)."""
    (tmp_path / "garbage.jsonl").write_text("garbage\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "story.txt").write_text("A king ruled. A knight rode out.", encoding="utf-8")
    args = [part.format(tmp=tmp_path) for part in command]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    done = run_narrmem(*args, "--data", str(tmp_path / "d"), cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("narrmem: error:"), done.stderr
    assert not (tmp_path / "d").exists()
