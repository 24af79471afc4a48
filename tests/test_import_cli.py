"""``narrmem import-chat`` end to end through the real CLI and the real model: an import of each
fixture format, then ``narrmem recall`` finds the right message; a second import stores nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXPORTS = Path(__file__).parent / "data" / "chat_exports"


def narrmem(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "narrmem.doors.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("fmt", "export", "tenant", "question", "user", "expected"),
    [
        ("telegram", "telegram_result.json", "default", "is anyone allergic to insects?", "carla", "105"),
        (
            "discord",
            "discord_export.json",
            "discord:905123456789012345",
            "what does she not eat?",
            "322222222222222222",
            "123000000000000009",
        ),
    ],
)
def test_import_then_recall(
    tmp_path: Path, fmt: str, export: str, tenant: str, question: str, user: str, expected: str
) -> None:
    data = str(tmp_path / "data")
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"user1003": "carla"}))
    mapped_import = ("import-chat", str(EXPORTS / export), "--format", fmt, "--user-map", str(users))
    first = narrmem(*mapped_import, "--json", "--data", data)
    assert first.returncode == 0, first.stderr
    counts = json.loads(first.stdout)
    assert counts["stored"] > 0 and counts["skipped_service"] >= 1
    # The summary names the scopes it used, so the recall below is typed from it.
    assert counts["tenants"] == [tenant] and user in counts["user_ids"]
    assert counts["skipped_bots"] == (2 if fmt == "discord" else 0)
    again = narrmem(*mapped_import, "--json", "--data", data)
    assert json.loads(again.stdout)["stored"] == 0
    text = narrmem("import-chat", str(EXPORTS / export), "--format", fmt, "--keep-bots", "--data", data)
    assert text.returncode == 0, text.stderr
    assert f"tenants: {tenant}\n" in text.stdout and "user_ids: " in text.stdout
    assert "skipped_bots 0" in text.stdout
    found = narrmem(
        "recall", question, "--user", user, "--tenant", tenant, "--k", "3", "--json", "--data", data
    )
    assert found.returncode == 0, found.stderr
    hits = json.loads(found.stdout)
    assert hits[0]["message_ids"] == [expected], hits


def test_a_malformed_export_names_the_message_and_field(tmp_path: Path) -> None:
    bad = json.loads((EXPORTS / "telegram_result.json").read_text(encoding="utf-8"))
    bad["messages"][3]["date_unixtime"] = "yesterday"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad, ensure_ascii=False), encoding="utf-8")
    done = narrmem("import-chat", str(path), "--format", "telegram", "--data", str(tmp_path / "d"))
    assert done.returncode == 2 and "messages[3].date_unixtime" in done.stderr
    assert not (tmp_path / "d").exists()


def test_a_message_dated_too_far_ahead_is_named_by_its_place_in_the_file(tmp_path: Path) -> None:
    """Ingest refuses it once the messages are sorted by time, and named that place
    (``messages[9].ts``), not the file's."""
    bad = json.loads((EXPORTS / "telegram_result.json").read_text(encoding="utf-8"))
    bad["messages"][0]["date_unixtime"] = "4102444800"  # 2100-01-01
    path = tmp_path / "ahead.json"
    path.write_text(json.dumps(bad, ensure_ascii=False), encoding="utf-8")
    data = str(tmp_path / "d")
    done = narrmem("import-chat", str(path), "--format", "telegram", "--data", data)
    assert done.returncode == 2, done.stderr
    assert "field 'messages[0].date_unixtime'" in done.stderr and "hours past" in done.stderr


def test_a_jsonl_message_dated_too_far_ahead_is_named_by_its_line(tmp_path: Path) -> None:
    """A JSONL file's errors name lines: the place in the list (counted from 0, the bots' messages
    left out) named another message."""
    rows = [
        {
            "text": "beep",
            "user_id": "b1",
            "chat_id": "c",
            "message_id": "1",
            "ts": "2025-01-01T00:00:00+00:00",
        },
        {
            "text": "hello there",
            "user_id": "ann",
            "chat_id": "c",
            "message_id": "2",
            "ts": "2025-01-01T00:01:00+00:00",
        },
        {
            "text": "from the future",
            "user_id": "ann",
            "chat_id": "c",
            "message_id": "3",
            "ts": "2099-01-01T00:00:00+00:00",
        },
    ]
    rows[0]["meta"] = {"bot": True}
    path = tmp_path / "ahead.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    done = narrmem("import-chat", str(path), "--format", "jsonl", "--data", str(tmp_path / "d"))
    assert done.returncode == 2, done.stderr
    assert "line 3, field 'ts'" in done.stderr and "hours past" in done.stderr


def test_a_bad_user_map_value_is_named_in_the_map(tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"user1001": "al\u0000ice"}), encoding="utf-8")
    done = narrmem(
        "import-chat",
        str(EXPORTS / "telegram_result.json"),
        "--format",
        "telegram",
        "--user-map",
        str(users),
        "--data",
        str(tmp_path / "d"),
    )
    assert done.returncode == 2, done.stderr
    assert """field 'user_map["user1001"]': must not hold a NUL""" in done.stderr
