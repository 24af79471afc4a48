"""The ``narrmem`` command, run as a subprocess against a real data folder and the real model.

Only ``ingest`` and ``recall`` load the model (once each); ``stats``, ``forget``, ``export`` and
``import`` open the store without it, and bad input is rejected before anything is opened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _corpus import MESSAGES
from _helpers import count_rows, msg, run_narrmem, sql

pytestmark = [
    pytest.mark.slow,
    # Child processes without NARRMEM_* variables, so always on SQLite: data folders copied as
    # files, their database read directly.
    pytest.mark.sqlite_only("the CLI on --data folders of the SQLite store, copied and read as files"),
]

KEPT = [m for m in MESSAGES if m["text"] != "ok"]
# Triage writes a scene beside the episode for the one decision in the corpus.
SCENES = [m for m in MESSAGES if m["text"].startswith("I decided")]
RECORDS = len(KEPT) + len(SCENES)
ENV = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")} | {"HF_HUB_OFFLINE": "1"}


def narrmem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_narrmem(*args, cwd=cwd, env=ENV, timeout=600)


def _jsonl(path: Path, items: list[Any]) -> Path:
    path.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
    return path


@dataclass
class CliStore:
    work: Path
    data: Path
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CliStore:
    work = tmp_path_factory.mktemp("cli")
    data = work / "data"
    messages = _jsonl(work / "messages.jsonl", MESSAGES)
    done = narrmem("ingest", str(messages), "--data", str(data), "--json", cwd=work)  # model load 1
    assert done.returncode == 0, done.stderr
    return CliStore(work, data, json.loads(done.stdout))


def _stats(store: CliStore, data: Path | None = None) -> dict[str, Any]:
    done = narrmem("stats", "--json", "--data", str(data or store.data), cwd=store.work)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_ingest_summary(store: CliStore) -> None:
    assert store.summary == {
        "messages": len(MESSAGES),
        "stored": len(KEPT),
        "ignored": 1,
        "duplicates": 0,
        "said_before_a_forget": 0,
    }
    assert count_rows(store.data) == RECORDS
    assert not (store.work / "narrmem-data").exists()  # --data was honoured


def test_recall_json_top_hit(store: CliStore) -> None:
    done = narrmem(
        "recall",
        "What pet does she have?",
        "--user",
        "alice",
        "--json",
        "--k",
        "3",
        "--data",
        str(store.data),
        cwd=store.work,
    )  # model load 2
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)
    assert isinstance(hits, list) and 1 <= len(hits) <= 3  # only what clears the relevance floor
    assert hits[0]["text"] == "My cat Miso knocked over the plant again this morning."
    assert hits[0]["message_ids"] == ["a3"]
    assert all(h["user_id"] == "alice" for h in hits)
    assert {"id", "score", "created_at", "sources", "tenant", "chat_id"} <= set(hits[0])


def test_stats_json(store: CliStore) -> None:
    stats = _stats(store)
    assert stats["memories"] == RECORDS
    assert stats["by_kind"] == {"episode": len(KEPT), "scene": len(SCENES)}
    assert (stats["users"], stats["chats"], stats["tenants"]) == (3, 4, 1)
    assert stats["vectors_indexed"] == RECORDS
    assert stats["embedder"]["model"] == "all-MiniLM-L6-v2-int7"
    assert {
        "storage_sqlite",
        "embedder_sentence_transformers",
        "triage",
        "recall_hybrid",
        "core_tools",
    } <= set(stats["plugins"])


@pytest.mark.parametrize(
    "args",
    [
        ["recall", "cats"],
        ["forget"],
        ["forget", "--tenant", "t2"],
        ["nonsense"],
        [],
        ["recall", "cats", "--user", "alice", "--k", "many"],
    ],
    ids=[
        "recall-no-scope",
        "forget-no-scope",
        "forget-tenant-only",
        "unknown-command",
        "no-command",
        "bad-k",
    ],
)
def test_bad_usage_exits_2(store: CliStore, args: list[str]) -> None:
    done = narrmem(*args, "--data", str(store.data), cwd=store.work) if args else narrmem(cwd=store.work)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "usage" in done.stderr or "error" in done.stderr
    if args[:1] in (["recall"], ["forget"]) and "--k" not in args:
        assert "--user or --chat" in done.stderr


BAD_LINES: list[tuple[str, str, int, str]] = [
    ("bad json", '{"text": "unterminated', 2, "JSON"),
    (
        "missing field",
        json.dumps({k: v for k, v in msg("x", "no user id").items() if k != "user_id"}),
        2,
        "user_id",
    ),
    ("naive ts", json.dumps(msg("x", "naive", ts="2026-05-04T09:12:00")), 2, "ts"),
    ("not an object", "[1, 2, 3]", 2, "JSON object"),
    ("oversized text", json.dumps(msg("x", "y" * 16_001)), 2, "text"),
]


@pytest.mark.parametrize(("case", "line", "number", "named"), BAD_LINES, ids=[c for c, _, _, _ in BAD_LINES])
def test_malformed_jsonl_exits_2_and_changes_nothing(
    store: CliStore, case: str, line: str, number: int, named: str
) -> None:
    before = sql(store.data, "SELECT id, text FROM memories ORDER BY id")
    path = store.work / f"bad-{case.replace(' ', '-')}.jsonl"
    good_new = json.dumps(msg("new-1", "this good line must not be stored either", user="carol"))
    path.write_text(f"{good_new}\n{line}\n{good_new.replace('new-1', 'new-2')}\n", encoding="utf-8")
    done = narrmem("ingest", str(path), "--data", str(store.data), "--json", cwd=store.work)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"line {number}" in done.stderr
    assert named in done.stderr
    assert done.stdout == ""
    assert sql(store.data, "SELECT id, text FROM memories ORDER BY id") == before


def test_malformed_jsonl_leaves_stats_unchanged(store: CliStore) -> None:
    before = _stats(store)
    path = _jsonl(
        store.work / "partly-bad.jsonl", [msg("n1", "fine line", user="dave"), {"text": "only text"}]
    )
    done = narrmem("ingest", str(path), "--data", str(store.data), cwd=store.work)
    assert done.returncode == 2
    assert "line 2" in done.stderr and "user_id" in done.stderr
    after = _stats(store)
    assert after["memories"] == before["memories"] == RECORDS
    assert after["users"] == before["users"]


def test_non_utf8_input_is_bad_input_not_an_internal_error(store: CliStore) -> None:
    path = store.work / "latin1.jsonl"
    path.write_bytes(
        json.dumps(msg("n1", "fine")).encode() + b"\n" + '{"text": "caf\xe9"}'.encode("latin-1") + b"\n"
    )
    done = narrmem("ingest", str(path), "--data", str(store.data), cwd=store.work)
    assert done.returncode == 2, done.stderr
    assert "line 2" in done.stderr
    assert count_rows(store.data) == RECORDS


def test_bad_config_exits_2_naming_the_key(store: CliStore) -> None:
    config = store.work / "bad.toml"
    config.write_text("[storage]\nbatchsize = 3\n", encoding="utf-8")
    done = narrmem("stats", "--config", str(config), "--data", str(store.data), cwd=store.work)
    assert done.returncode == 2
    assert "storage.batchsize" in done.stderr


def test_an_error_quoting_a_line_break_from_the_config_is_one_line(store: CliStore) -> None:
    config = store.work / "multiline.toml"
    config.write_text('[storage]\nbackend = "multi\\nline"\n', encoding="utf-8")
    done = narrmem("stats", "--config", str(config), "--data", str(store.data), cwd=store.work)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no backend named 'multi\\nline'" in done.stderr


def test_forget_json(store: CliStore, tmp_path: Path) -> None:
    data = tmp_path / "copy"
    shutil.copytree(store.data, data)
    bob = [r[0] for r in sql(data, "SELECT id FROM memories WHERE user_id = 'bob'")]
    assert len(bob) == 6
    done = narrmem("forget", "--user", "bob", "--json", "--data", str(data), cwd=store.work)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"memories": 6, "keyword_rows": 6, "vectors": 6, "episode": 6}
    assert sql(data, "SELECT COUNT(*) FROM memories WHERE user_id = 'bob'") == [(0,)]
    marks = ",".join("?" * len(bob))
    assert sql(data, f"SELECT COUNT(*) FROM memories_fts WHERE rowid IN ({marks})", bob) == [(0,)]
    stats = _stats(store, data)
    assert stats["memories"] == RECORDS - 6
    assert stats["vectors_indexed"] == RECORDS - 6
    assert stats["users"] == 2
    # Plain output too.
    again = narrmem("forget", "--user", "bob", "--data", str(data), cwd=store.work)
    assert again.returncode == 0 and again.stdout.startswith("memories 0")


def test_export_into_a_folder_it_cannot_write_in_is_exit_2_naming_the_file(store: CliStore) -> None:
    """/proc takes no new file, whoever asks (root included): before, the temporary file's
    creation failed as an internal error, exit 1."""
    done = narrmem("export", "/proc/narrmem-export.jsonl", "--data", str(store.data), cwd=store.work)
    assert done.returncode == 2, done.stderr
    assert "file" in done.stderr and "cannot write in /proc" in done.stderr
    assert "internal error" not in done.stderr


def test_export_import_round_trip(store: CliStore, tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    second = tmp_path / "second.jsonl"
    target = tmp_path / "target"
    done = narrmem("export", str(first), "--json", "--data", str(store.data), cwd=store.work)
    assert done.returncode == 0, done.stderr
    exported = json.loads(done.stdout)
    assert (exported["exported"], exported["file"]) == (RECORDS, str(first))
    assert exported["graph.nodes"] > 0  # the facts' graph is exported too
    done = narrmem("import", str(first), "--json", "--data", str(target), cwd=store.work)
    assert done.returncode == 0, done.stderr
    imported = json.loads(done.stdout)
    assert (imported["imported"], imported["skipped"]) == (RECORDS, 0)
    assert imported["graph.nodes"] == exported["graph.nodes"]
    done = narrmem("export", str(second), "--data", str(target), cwd=store.work)
    assert done.returncode == 0, done.stderr
    assert second.read_bytes() == first.read_bytes()
    done = narrmem("import", str(first), "--json", "--data", str(target), cwd=store.work)
    assert json.loads(done.stdout) == {**{k: 0 for k in imported}, "skipped": RECORDS}
    # A corrupted export is rejected (exit 2) naming the line, and nothing is written.
    lines = first.read_text(encoding="utf-8").splitlines()
    record = json.loads(lines[3])
    record["vector"] = "###"
    lines[3] = json.dumps(record)
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fresh = tmp_path / "fresh"
    done = narrmem("import", str(broken), "--data", str(fresh), cwd=store.work)
    assert done.returncode == 2
    assert "line 4" in done.stderr and "vector" in done.stderr
    assert not fresh.exists()  # checked before a store was made for it
    # Refused once the store is made (a plugin section no plugin takes: the graph off): what the
    # command made goes, and what was in the folder stays; it left an empty store tied to the
    # refused settings, and the import tried again with the right ones was refused for it.
    fresh.mkdir()
    (fresh / "mine.txt").write_text("mine")
    done = run_narrmem(
        "import", str(first), "--data", str(fresh), cwd=store.work,
        env={**ENV, "NARRMEM_PLUGINS__DISABLED": '["graph"]'}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert sorted(p.name for p in fresh.iterdir()) == ["mine.txt", "narrmem.sqlite3.lock"]
    done = narrmem("import", str(first), "--json", "--data", str(fresh), cwd=store.work)
    assert done.returncode == 0, done.stderr


def test_export_to_standard_output(store: CliStore, tmp_path: Path) -> None:
    """`narrmem export -` writes the export itself to standard output (a pipe to gzip or ssh) and
    its report to standard error; before, it wrote a file named "-" in the working folder."""
    for person in ([], ["--user", "alice"]):
        on_file = tmp_path / f"export{len(person)}.jsonl"
        done = narrmem("export", str(on_file), *person, "--data", str(store.data), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        # UTF-8 whatever the console's encoding (cp1252 failed on the first name it could not write).
        done = run_narrmem(
            "export", "-", *person, "--json", "--data", str(store.data),
            cwd=tmp_path, env={**ENV, "PYTHONIOENCODING": "cp1252"}, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        exported = subprocess.run(
            [sys.executable, "-m", "narrmem.doors.cli", "export", "-", *person, "--data", str(store.data)],
            capture_output=True, env={**ENV, "PYTHONIOENCODING": "cp1252"}, cwd=tmp_path,
            timeout=600, check=False,
        )  # fmt: skip
        assert exported.stdout == on_file.read_bytes()
        report = json.loads(done.stderr)
        assert report["file"] == "-" and 0 < report["exported"] <= RECORDS
    assert not (tmp_path / "-").exists()
    # An import reads its file twice (checked whole first): standard input is refused, by name.
    done = subprocess.run(
        [sys.executable, "-m", "narrmem.doors.cli", "import", "-", "--data", str(tmp_path / "target")],
        input=(tmp_path / "export0.jsonl").read_text(encoding="utf-8"),
        capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "file" in done.stderr and "standard input" in done.stderr
    assert not (tmp_path / "target").exists()


async def test_a_refused_import_leaves_a_store_another_process_opened_meanwhile(tmp_path: Path) -> None:
    """The import looks at a new folder, then a bot opens a store in it and the import is refused
    (the folder is in use): what the import would remove is the bot's, and it stays."""
    from narrmem.config import load_settings
    from narrmem.doors.cli import _NewStore
    from narrmem.testing import open_memory

    data = tmp_path / "data"
    made = _NewStore(load_settings(None, data_dir=str(data)))
    async with open_memory(data) as bot:
        await bot.ingest(msg("b1", "I adopted a greyhound named Pixel", user="carol"))
        made.remove()
        assert (data / "narrmem.sqlite3").is_file() and (data / "vectors").is_dir()
        assert len(await bot.recall("greyhound", user_id="carol")) == 1


def test_output_to_a_reader_that_stops_early_is_no_error(store: CliStore) -> None:
    """`narrmem tools --format mcp | head -c 1` (127 kB, more than a pipe holds): the reader went
    away, and narrmem said "internal error: BrokenPipeError" and exited 1."""
    for _ in range(3):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", '"$PY" -m narrmem.doors.cli tools --format mcp | head -c 1'],
            capture_output=True,
            text=True,
            env={**ENV, "PY": sys.executable},
            cwd=store.work,
            timeout=120,
            check=False,
        )
        assert done.stderr == "" and done.returncode in (0, 141), (done.returncode, done.stderr)


def test_recall_names_the_tenants_a_person_has_memories_in(store: CliStore) -> None:
    """The bot libraries keep a person under a tenant of their own ("telegram", a server's id):
    asked in "default", a person with memories was answered "nothing remembered" and no more."""
    lines = [msg("t1", "I adopted a greyhound named Pixel", user="tina", tenant="telegram")]
    folder = store.work / "tenants"
    done = narrmem(
        "ingest", str(_jsonl(store.work / "tina.jsonl", lines)), "--data", str(folder), cwd=store.work
    )
    assert done.returncode == 0, done.stderr
    done = narrmem("recall", "my dog", "--user", "tina", "--data", str(folder), cwd=store.work)
    assert done.returncode == 0 and "nothing remembered" in done.stdout
    assert "tina has memories in tenant 'telegram': ask with --tenant" in done.stdout
