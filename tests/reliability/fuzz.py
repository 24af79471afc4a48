"""A seeded fuzzer of every door into narrmem: the Python API, the tools, the CLI (in-process and a
few real subprocesses), config files and ``NARRMEM_`` variables, chat exports and export files.

``run_fuzz(count, seed, workdir)`` runs exactly ``count`` inputs, most of them bad, and returns
figures. Every input must end one of two ways: accepted (it was valid after all) or refused with a
:class:`~narrmem.errors.NarrmemError`. Anything else is an untyped failure, listed by kind with one
example. A refused input must leave the store's rows as they were; the CLI must exit 0 or 2 and
never print a traceback; and no input may touch the user's files that sit in the work folder, in
a data folder, or in a folder a config file points at.

The same seed gives the same inputs in the same order, so a failure is reproducible by its seed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import random
import reprlib
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

from narrmem.clock import ManualClock
from narrmem.config import load_settings
from narrmem.doors import cli
from narrmem.doors.chat_import import check_user_map, read_chat, read_user_map
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_jsonl, read_dry_run_messages, read_messages
from narrmem.errors import NarrmemError
from narrmem.memory import Memory
from narrmem.models import Message
from narrmem.testing import HASH_EMBEDDER, TestingPlugin, open_memory

from .common import figures_dict, tallies

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "chat_exports"
DEEP = 10_000  # nesting depth of the deep inputs: far past Python's recursion limit
DB_NAME = "narrmem.sqlite3"
START = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
# No decay pass on a timer (it would change rows between two fingerprints) and no reinforcement
# by recall (an accepted recall would then change rows, which is fine, but noisy).
QUIET = {"hippocampus": {"interval_minutes": 0, "reinforce": False}}

# Share of the inputs each door gets; the CLI subprocesses are counted apart (they are slow).
WEIGHTS = {"api": 0.41, "tool": 0.33, "import": 0.10, "cli": 0.06, "config": 0.10}

_short = reprlib.Repr()
_short.maxlevel = 3
_short.maxstring = 48
_short.maxother = 48
_short.maxlist = 4
_short.maxdict = 4


def describe(value: Any) -> str:
    """A short repr that never recurses past three levels (deep inputs would blow ``repr``)."""
    return _short.repr(value)


# --- figures -------------------------------------------------------------------------------------


@dataclass
class Report:
    counts: Counter[str] = field(
        default_factory=tallies(
            "inputs accepted refused untyped cli_tracebacks cli_messages_not_one_line "
            "rows_changed_by_refused foreign_files_touched logged_errors"
        )
    )
    untyped_kinds: dict[str, str] = field(default_factory=dict)
    cli_traceback_examples: list[str] = field(default_factory=list)
    cli_message_examples: list[str] = field(default_factory=list)
    rows_changed_examples: list[str] = field(default_factory=list)
    foreign_files: list[str] = field(default_factory=list)
    logged_error_kinds: dict[str, str] = field(default_factory=dict)
    by_door: dict[str, Counter[str]] = field(default_factory=dict)
    seconds: Counter[str] = field(default_factory=Counter)
    _last: float = field(default_factory=time.perf_counter)

    def _spent(self, door: str) -> None:
        """Time since the last input ended goes to this one's door (fingerprints included)."""
        now = time.perf_counter()
        self.seconds[door] += now - self._last
        self._last = now

    def record(self, door: str, label: str, error: BaseException | None) -> str:
        """Count one input's outcome; returns ``accepted``, ``refused`` or ``untyped``."""
        self._spent(door)
        self.counts["inputs"] += 1
        if error is None:
            outcome = "accepted"
            self.counts["accepted"] += 1
        elif isinstance(error, NarrmemError):
            outcome = "refused"
            self.counts["refused"] += 1
        else:
            outcome = "untyped"
            self.counts["untyped"] += 1
            kind = f"{type(error).__name__} in {door} at {_origin(error)}"
            self.untyped_kinds.setdefault(kind, f"{label}: {str(error)[:300]}")
        self.by_door.setdefault(door, Counter())[outcome] += 1
        return outcome

    def untyped_exit(self, door: str, label: str, kind: str, message: str) -> None:
        """A CLI run that exited 1 (an internal error) or raised: an untyped failure."""
        self._spent(door)
        self.counts["inputs"] += 1
        self.counts["untyped"] += 1
        self.untyped_kinds.setdefault(f"{kind} in {door}", f"{label}: {message[:300]}")
        self.by_door.setdefault(door, Counter())["untyped"] += 1

    def as_dict(self) -> dict[str, Any]:
        out = figures_dict(
            self, by_door={door: dict(counts) for door, counts in sorted(self.by_door.items())}
        )
        del out["seconds"]  # time by door, rounded, under its own name
        out["seconds_by_door"] = {door: round(spent, 1) for door, spent in sorted(self.seconds.items())}
        return out


def _origin(error: BaseException) -> str:
    """Where in narrmem's own code the error surfaced (file and function): what makes a kind."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if "site-packages" not in f.filename and "/tests/" not in f.filename]
    frame = (own or frames or [None])[-1]
    if frame is None:
        return "?"
    parts = Path(frame.filename).parts
    return f"{'/'.join(parts[-2:])}:{frame.name}"


class _ThreadErrors:
    """Exceptions that end a thread (aiosqlite's worker, say) are printed as a traceback by
    Python itself, outside any try: count them as untyped, and as CLI tracebacks in the CLI."""

    def __init__(self, report: Report, log: _LoggedErrors) -> None:
        self.report = report
        self.log = log
        self.door = "api"

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        error = args.exc_value
        if error is None:
            return
        self.report.counts["untyped"] += 1
        kind = f"{type(error).__name__} in a thread ({self.door}) at {_origin(error)}"
        self.report.untyped_kinds.setdefault(kind, f"{self.log.label}: {str(error)[:300]}")
        if self.door == "cli":
            self.report.counts["cli_tracebacks"] += 1
            if len(self.report.cli_traceback_examples) < 10:
                self.report.cli_traceback_examples.append(f"{self.log.label}: thread died: {error!r}")


class _LoggedErrors(logging.Handler):
    """Errors narrmem logs with a traceback (a plugin that failed and was isolated, say): each is
    an exception some bad input provoked and nobody typed."""

    def __init__(self, report: Report) -> None:
        super().__init__(logging.ERROR)
        self.report = report
        self.label = ""

    def emit(self, record: logging.LogRecord) -> None:
        if not record.exc_info or record.exc_info[1] is None:
            return
        error = record.exc_info[1]
        if isinstance(error, NarrmemError):
            return
        self.report.counts["logged_errors"] += 1
        kind = f"{type(error).__name__} logged by {record.name} at {_origin(error)}"
        self.report.logged_error_kinds.setdefault(kind, f"{self.label}: {str(error)[:300]}")


# --- the store's rows and the user's files -------------------------------------------------------


def fingerprint(con: sqlite3.Connection) -> str:
    """A hash of every row of every table (FTS virtual tables are read through their shadow tables)."""
    digest = hashlib.blake2b(digest_size=16)
    tables = [
        name
        for (name, sql) in con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        if not (sql or "").upper().startswith("CREATE VIRTUAL")
    ]
    for name in sorted(tables):
        digest.update(name.encode())
        rows = con.execute(f'SELECT * FROM "{name}"').fetchall()
        for line in sorted(repr(row) for row in rows):
            digest.update(line.encode("utf-8", "backslashreplace"))
    return digest.hexdigest()


class StoreRows:
    """Tells whether a store's rows changed since it last looked, through a connection of its own.
    ``PRAGMA data_version`` moves whenever another connection commits: only then are the rows
    read and hashed, so an input that wrote nothing costs one pragma."""

    def __init__(self, database: Path) -> None:
        self._con = sqlite3.connect(database, timeout=30)
        self._version = self._data_version()
        self._print = fingerprint(self._con)

    def _data_version(self) -> int:
        return int(self._con.execute("PRAGMA data_version").fetchone()[0])

    def changed(self) -> bool:
        version = self._data_version()
        if version == self._version:
            return False
        self._version = version
        now = fingerprint(self._con)
        changed, self._print = now != self._print, now
        return changed

    def close(self) -> None:
        self._con.close()


class UserFiles:
    """Files that belong to the user, not to narrmem: their bytes and times must never change."""

    def __init__(self) -> None:
        self.files: dict[Path, tuple[bytes, int]] = {}
        self.folders: dict[Path, set[str]] = {}

    def plant(self, path: Path, content: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        self.files[path] = (content, path.stat().st_mtime_ns)

    def watch_folder(self, folder: Path) -> None:
        """A folder of the user's only: narrmem may not add anything to it either."""
        self.folders[folder] = {p.name for p in folder.iterdir()}

    def touched(self) -> list[str]:
        changed = []
        for path, (content, mtime) in self.files.items():
            if not path.is_file():
                changed.append(f"{path} deleted")
            elif path.read_bytes() != content or path.stat().st_mtime_ns != mtime:
                changed.append(f"{path} overwritten")
        for folder, names in self.folders.items():
            now = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
            changed.extend(f"{folder / name} created" for name in sorted(now - names))
        return changed


# --- hostile values ------------------------------------------------------------------------------


# Built once: a structure 10,000 levels deep costs milliseconds, and no door may change it.
@functools.cache
def deep_list(depth: int = DEEP) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


@functools.cache
def deep_dict(depth: int = DEEP) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


@functools.cache
def deep_json(depth: int = DEEP) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


class Opaque:
    """An object no JSON, SQL or pydantic field knows."""

    def __repr__(self) -> str:
        return "<Opaque>"


SURROGATES = ["\ud800", "a\udfffb", "\udcff", "ok\ud83d"]
HUGE_INTS = [2**63, -(2**63) - 1, 10**18, 10**30, 2**64, -(10**30)]


def _bad_scalars() -> list[Any]:
    return [
        None,
        True,
        False,
        0,
        -1,
        *HUGE_INTS,
        1.5,
        -0.0,
        float("nan"),
        float("inf"),
        float("-inf"),
        1e308,
        "",
        " ",
        "\x00",
        "\u202e\u200b",
        "x" * 201,
        "x" * 16_001,
        *SURROGATES,
        "'; DROP TABLE memories; --",
        "%s%n{0}",
        "../../etc/passwd",
        "🙂" * 50,
        [],
        [1, "two", None],
        {},
        {"a": 1},
    ]


def _python_only() -> list[Any]:
    return [
        Opaque(),
        b"\xff\xfe",
        {1, 2},
        (1, 2),
        complex(1, 2),
        datetime(2026, 5, 4, 9, 0),
        datetime(2026, 5, 4, 9, 0, tzinfo=UTC),
        Path("/tmp"),
        bytearray(b"x"),
    ]


def _deep_values() -> list[Any]:
    return [deep_list(), deep_dict(), deep_list(65), deep_dict(65)]


def bad_value(rng: random.Random, *, python: bool = True, deep: bool = True) -> Any:
    pool = _bad_scalars()
    if python:
        pool += _python_only()
    if deep and rng.random() < 0.12:
        return rng.choice(_deep_values())
    if rng.random() < 0.02:
        return "y" * 1_000_001
    return rng.choice(pool)


def bad_id(rng: random.Random) -> Any:
    return rng.choice(
        [
            "",
            " ",
            "x" * 201,
            *SURROGATES,
            "\x00",
            "u1\x00",
            "%",
            "_",
            "*",
            "'",
            "UPPER",
            None,
            5,
            -1,
            2**63,
            True,
            [],
            ["u1"],
            {"a": 1},
            1.5,
            float("nan"),
            b"u1",
            Opaque(),
        ]
    )


def bad_text(rng: random.Random) -> Any:
    return rng.choice(
        [
            "",
            " ",
            "\x00",
            "a\x00b",
            *SURROGATES,
            "x" * 16_001,
            "x" * 4_001,
            "🙂" * 8_000,
            "\r\n" * 300,
            "\u202eevil",
            "I decided " + "\ud800",
            None,
            5,
            ["hello"],
            {"text": "hi"},
            b"bytes",
            float("nan"),
            Opaque(),
            deep_list(),
            "z" * 1_000_001,
        ]
    )


def bad_int(rng: random.Random) -> Any:
    return rng.choice(
        [
            0,
            -1,
            -(2**31),
            2**31,
            *HUGE_INTS,
            1.5,
            float("nan"),
            float("inf"),
            "5",
            "five",
            True,
            None,
            [],
            [1],
            {},
            b"1",
            Opaque(),
            201,
            100_001,
        ]
    )


def bad_time(rng: random.Random) -> Any:
    return rng.choice(
        [
            5,
            0,
            -1,
            10**20,
            1.5,
            float("nan"),
            "yesterday",
            "",
            "2026-05-04T09:12:00",
            "2026-05-04",
            "2026-02-30T00:00:00Z",
            "0001-01-01T00:00:00+00:00",
            "0001-01-01T00:00:00+14:00",
            "9999-12-31T23:59:59+00:00",
            "9999-12-31T23:59:59-14:00",
            datetime(2026, 5, 4, 9, 0),
            datetime.min.replace(tzinfo=timezone(timedelta(hours=14))),
            datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),
            datetime.max.replace(tzinfo=UTC),
            datetime.min.replace(tzinfo=UTC),
            None,
            True,
            [],
            {},
            Opaque(),
            "\ud800",
        ]
    )


def bad_meta(rng: random.Random) -> Any:
    return rng.choice(
        [
            deep_dict(),
            {"a": deep_list()},
            {"a": deep_list(70)},
            {"\ud800": 1},
            {"a": "\udfff"},
            {"a": ["ok", "\ud800"]},
            {"a": float("nan")},
            {"a": float("inf")},
            {"a": Opaque()},
            {"a": {1, 2}},
            {1: "int key"},
            {"a": "x" * 70_000},
            {"a": "x" * 63_985},  # just under the limit: the episode's own keys and edits go beyond
            {"a": b"bytes"},
            {"a": [1] * 20_000},
            {"a": 2**70},
            {"edits": 5},
            {"edits": "not a list"},
            {"edits": [5, None]},
            {"fields": {"core": 5}},
            {"fields": "core"},
            {"layer": ["x"]},
            {"source": None},
            "not an object",
            ["a"],
            5,
            None,
            {"nested": {"ok": True}},
        ]
    )


# --- messages ------------------------------------------------------------------------------------

TEXTS = [
    "I decided to quit my job at the bank.",
    "so tired today",
    "my friend decided to move to Berlin",
    "我决定辞职了",
    "ok",
    "remember this: my sister's birthday is in June",
    "I like rock music",
    "I'm working on the garden project",
]
MESSAGE_FIELDS = ["text", "user_id", "chat_id", "ts", "message_id", "tenant", "speaker", "meta"]
REQUIRED_MESSAGE_FIELDS = ["text", "user_id", "chat_id", "ts", "message_id"]


def valid_message(rng: random.Random, n: int) -> dict[str, Any]:
    data: dict[str, Any] = {
        "text": rng.choice(TEXTS),
        "user_id": rng.choice(["u1", "u2", "fuzz-user"]),
        "chat_id": rng.choice(["c1", "c2"]),
        "ts": (START + timedelta(minutes=n)).isoformat(),
        "message_id": f"fz-{n}",
    }
    if rng.random() < 0.3:
        data["speaker"] = rng.choice(["Ann", "陈博"])
    if rng.random() < 0.3:
        data["meta"] = {"source": "fuzz", "n": n}
    return data


def bad_message(rng: random.Random, n: int) -> tuple[str, Any]:
    """A message (dict, Message object or not a message at all) with one to three faults."""
    roll = rng.random()
    if roll < 0.05:
        value = bad_value(rng)
        return f"message={describe(value)}", value
    data = valid_message(rng, n)
    faults = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        how = rng.random()
        name = rng.choice(MESSAGE_FIELDS)
        if how < 0.12:
            key = rng.choice(REQUIRED_MESSAGE_FIELDS)
            data.pop(key, None)
            faults.append(f"-{key}")
        elif how < 0.2:
            key = rng.choice(["colour", "", "\ud800", "TEXT", "__class__", "x" * 300])
            data[key] = bad_value(rng, deep=False)
            faults.append(f"+{describe(key)}")
        else:
            if name == "ts":
                value = bad_time(rng)
            elif name == "meta":
                value = bad_meta(rng)
            elif name in {"text", "speaker"}:
                value = bad_text(rng)
            elif rng.random() < 0.7:
                value = bad_id(rng)
            else:
                value = bad_value(rng)
            data[name] = value
            faults.append(f"{name}={describe(value)}")
    label = "message " + ", ".join(faults)
    if rng.random() < 0.1:
        # A Message object changed after it was built: nothing validated the new value.
        good = Message.model_validate(valid_message(rng, n))
        name = rng.choice(MESSAGE_FIELDS)
        value = data.get(name, bad_value(rng))
        object.__setattr__(good, name, value)
        return f"Message object with {name}={describe(value)}", good
    return label, data


# --- the Python API ------------------------------------------------------------------------------

ApiCall = Callable[[Memory, dict[str, Any]], Awaitable[Any]]

API: dict[str, tuple[dict[str, Any], ApiCall]] = {
    "recall": (
        {
            "query": "what did I decide",
            "user_id": "u1",
            "chat_id": None,
            "tenant": "default",
            "k": 5,
            "kinds": None,
            "snippet_tokens": 48,
            "reinforce": False,
        },
        lambda m, a: m.recall(a.pop("query"), **a),
    ),
    "context": (
        {
            "text": "should I look for a new job",
            "user_id": "u1",
            "chat_id": None,
            "tenant": "default",
            "k": 8,
        },
        lambda m, a: m.context(a.pop("text"), **a),
    ),
    "turn_context": (
        {"text": "about the game just now", "user_id": "u1", "chat_id": "c1", "tenant": "default"},
        lambda m, a: m.turn_context(a.pop("text"), **a),
    ),
    "summary": (
        {"user_id": "u1", "depth": None, "token_budget": None, "tenant": "default"},
        lambda m, a: m.summary(**a),
    ),
    "forget": (
        {"user_id": "fuzz-nobody", "chat_id": None, "tenant": "default"},
        lambda m, a: m.forget(**a),
    ),
    "forget_messages": (
        {"chat_id": "fuzz-no-chat", "message_ids": ["nothing"], "tenant": "default"},
        lambda m, a: m.forget_messages(**a),
    ),
    "history": ({"memory_id": 1}, lambda m, a: m.history(a["memory_id"])),
    "decay": ({"now": START + timedelta(days=3)}, lambda m, a: m.decay(a["now"])),
}

PARAM_VALUES: dict[str, Callable[[random.Random], Any]] = {
    "query": bad_text,
    "text": bad_text,
    "user_id": bad_id,
    "chat_id": bad_id,
    "tenant": bad_id,
    "k": bad_int,
    "depth": bad_int,
    "token_budget": bad_int,
    "snippet_tokens": bad_int,
    "memory_id": bad_int,
    "now": bad_time,
    "reinforce": lambda rng: rng.choice([None, "yes", 5, 1.5, [], Opaque()]),
    "kinds": lambda rng: rng.choice(
        [[], "episode", 5, [5], ["\ud800"], ["x" * 1000], [None], {"episode"}, deep_list(), [[]]]
    ),
    "message_ids": lambda rng: rng.choice(
        [
            [],
            "abc",
            5,
            None,
            [5],
            [None],
            [{}],
            ["\ud800"],
            ["x" * 201],
            [""],
            ["m"] * 20_000,
            {"m1"},
            ("m1",),
            [deep_list()],
            Opaque(),
            b"m1",
        ]
    ),
}


def api_case(rng: random.Random, n: int, ingested: list[dict[str, Any]]) -> tuple[str, ApiCall]:
    """One call of a public method with one or two of its arguments made bad."""
    roll = rng.random()
    if roll < 0.22:
        label, message = bad_message(rng, n)

        async def ingest(memory: Memory) -> None:
            result = await memory.ingest(message)
            # Valid by chance and stored: an edit may pick it later (its meta may be odd).
            if result.stored and isinstance(message, dict) and len(ingested) < 64:
                ingested.append(message)

        return f"ingest({label})", lambda m, a: ingest(m)
    if roll < 0.3:
        label, message = bad_message(rng, n)
        return f"triage({label})", lambda m, a: m.triage(message)
    if roll < 0.38:
        if ingested and rng.random() < 0.4:
            base = dict(rng.choice(ingested))
            name = rng.choice(["text", "meta", "speaker", "ts"])
            value = {"meta": bad_meta, "ts": bad_time}.get(name, bad_text)(rng)
            base[name] = value
            return f"edit(stored message, {name}={describe(value)})", lambda m, a: m.edit(base)
        label, message = bad_message(rng, n)
        return f"edit({label})", lambda m, a: m.edit(message)
    if roll < 0.46:
        if rng.random() < 0.2:
            batch: Any = bad_value(rng)
            label = describe(batch)
        else:
            batch = [valid_message(rng, n * 10 + i) for i in range(rng.randint(1, 3))]
            at = rng.randrange(len(batch) + 1)
            fault, message = bad_message(rng, n * 10 + 9)
            batch.insert(at, message)
            label = f"[{len(batch)} messages, #{at}: {fault}]"
        return f"ingest_many({label})", lambda m, a: m.ingest_many(batch)
    name = rng.choice(sorted(API))
    defaults, call = API[name]
    arguments = dict(defaults)
    for param in rng.sample(sorted(arguments), k=min(len(arguments), rng.choice([1, 1, 2]))):
        arguments[param] = PARAM_VALUES.get(param, bad_value)(rng)
    label = f"{name}({', '.join(f'{k}={describe(v)}' for k, v in arguments.items())})"
    return label, lambda m, a: call(m, dict(arguments))


# --- tools: valid arguments from each input schema, then one fault ------------------------------

FIELD_EXAMPLES = {
    "user_id": "u1",
    "chat_id": "c1",
    "tenant": "default",
    "query": "what about work",
    "text": "I decided to quit. Then I left the bank. Later I found a new job.",
    "event": "I decided to quit my job at the bank.",
    "description": "a helpful assistant",
    "relation": "likes",
    "subject": "user",
    "object": "rock",
    "task_id": "Task_fuzz",
    "title": "fuzz story",
}


def _rewrite_example(rng: random.Random) -> dict[str, Any]:
    call = {"id": "c0", "type": "function", "function": {"name": "memory_recall", "arguments": "{}"}}
    return {
        "messages": [
            {"role": "user", "content": "what do you remember?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": '{"edges": []}'},
        ],
        "summary": "I made 1 tool call: memory_recall; nothing relevant was found.",
    }


# Tools whose cross-field rules a schema does not state: hand-written valid calls to start from.
TOOL_EXAMPLES: dict[str, Callable[[random.Random], dict[str, Any]]] = {
    "context_rewrite": _rewrite_example,
    "soul_narrative": lambda rng: rng.choice(
        [
            {"action": "add", "user_id": "u1", "event": "I decided to learn the cello.", "tags": ["music"]},
            {"action": "search", "user_id": "u1", "query": "cello", "k": 3},
            {"action": "list", "user_id": "u1", "min_importance": 0.1},
            {"action": "get", "user_id": "u1", "id": 1},
        ]
    ),
    "narrmem_recall": lambda rng: {"query": "what did I decide", "user_id": "u1", "k": 3},
    "rtm_traverse_narrative": lambda rng: {
        "text": "One day I left. Then I came back. Later I stayed.",
        "title": "t",
        "traversalDepth": 2,
    },
    "rtm_find_optimal_depth": lambda rng: {
        "text": "One day I left. Then I came back. Later I stayed.",
        "title": "t",
        "targetRecallLength": 2,
    },
    "task_create": lambda rng: {
        "user_id": "u1",
        "chat_id": "c1",
        "task_id": f"Task_{rng.randrange(10**9)}",
        "description": "a fuzz task",
    },
}


def example(schema: dict[str, Any], defs: dict[str, Any], rng: random.Random, name: str = "") -> Any:
    """A value that the schema most likely accepts."""
    if "$ref" in schema:
        return example(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, rng, name)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
        return example(options[0], defs, rng, name)
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if kind == "string":
        if schema.get("format") == "date-time":
            return START.isoformat()
        value = FIELD_EXAMPLES.get(name, "fuzz")
        return value[: schema.get("maxLength", len(value))]
    if kind == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
        return int(schema.get("default") or low)
    if kind == "number":
        low, high = schema.get("minimum", 0.0), schema.get("maximum", 1.0)
        return (low + high) / 2
    if kind == "boolean":
        return False
    if kind == "array":
        count = max(1, schema.get("minItems", 0))
        return [example(schema.get("items", {}), defs, rng, name) for _ in range(count)]
    if kind == "object" or "properties" in schema:
        out = {}
        for key, sub in schema.get("properties", {}).items():
            if key in schema.get("required", []) or rng.random() < 0.25:
                out[key] = example(sub, defs, rng, key)
        return out
    return "fuzz"


def bad_for(schema: dict[str, Any], defs: dict[str, Any], rng: random.Random) -> Any:
    """A value this field's schema refuses (or one at its very edge)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        schema = next((s for s in schema["anyOf"] if s.get("type") != "null"), schema)
    kind = schema.get("type")
    if rng.random() < 0.35:
        return bad_value(rng, python=False)
    if "enum" in schema:
        return rng.choice(["not-an-option", str(schema["enum"][0]).upper(), "", 0, None])
    if kind == "string":
        longest = schema.get("maxLength", 1000)
        if schema.get("format") == "date-time":
            return bad_time(rng) if rng.random() < 0.5 else rng.choice(["yesterday", "2026-13-01T00:00:00Z"])
        return rng.choice(["", "x" * (longest + 1), *SURROGATES, 5, None, ["x"], {"x": 1}])
    if kind in {"integer", "number"}:
        low, high = schema.get("minimum"), schema.get("maximum")
        edges = [v for v in (low, high) if v is not None]
        return rng.choice(
            [
                *(e - 1 for e in edges),
                *(e + 1 for e in edges),
                *HUGE_INTS,
                -1,
                0,
                1.5,
                "3",
                True,
                float("nan"),
                float("inf"),
            ]
        )
    if kind == "array":
        most = schema.get("maxItems", 50)
        return rng.choice([[], "item", {"a": 1}, [None], [bad_value(rng, python=False)], [1] * (most + 1)])
    if kind == "object" or "properties" in schema:
        return rng.choice([[], "x", 5, {"unknown": 1}, deep_dict()])
    return bad_value(rng, python=False)


def _slots(value: Any, schema: dict[str, Any], defs: dict[str, Any]) -> list[tuple[list[Any], Any, Any]]:
    """Every (container, key, schema) inside the arguments where a value can be replaced."""
    found: list[tuple[list[Any], Any, Any]] = []
    stack: list[tuple[Any, dict[str, Any]]] = [(value, schema)]
    while stack:
        node, sub = stack.pop()
        while "$ref" in sub or "anyOf" in sub:
            if "$ref" in sub:
                sub = defs[sub["$ref"].rsplit("/", 1)[-1]]
            else:
                sub = next((s for s in sub["anyOf"] if s.get("type") != "null"), {})
        if isinstance(node, dict):
            props = sub.get("properties", {})
            for key, child in node.items():
                found.append(([node], key, props.get(key, {})))
                stack.append((child, props.get(key, {})))
        elif isinstance(node, list):
            for i, child in enumerate(node):
                found.append(([node], i, sub.get("items", {})))
                stack.append((child, sub.get("items", {})))
    return found


def tool_case(rng: random.Random, memory: Memory) -> tuple[str, ApiCall]:
    name = rng.choice(memory.tools.names())
    schema = memory.tools.get(name).input_schema()
    defs = schema.get("$defs", {})
    arguments: Any = TOOL_EXAMPLES[name](rng) if name in TOOL_EXAMPLES else example(schema, defs, rng)
    roll = rng.random()
    if roll < 0.5:
        slots = _slots(arguments, schema, defs)
        if slots:
            [holder], key, sub = rng.choice(slots)
            value = bad_for(sub, defs, rng)
            holder[key] = value
            label = f"{key}={describe(value)}"
        else:
            arguments["x"] = 1
            label = "+x"
    elif roll < 0.6:
        required = schema.get("required", [])
        if required:
            key = rng.choice(required)
            arguments.pop(key, None)
            label = f"-{key}"
        else:
            arguments = {"action": None}
            label = "action=None"
    elif roll < 0.68:
        key = rng.choice(["unknown", "", "\ud800", "USER_ID", "x" * 300])
        arguments[key] = bad_value(rng, python=False, deep=False)
        label = f"+{describe(key)}"
    elif roll < 0.76:
        arguments = bad_value(rng, python=False)
        label = f"arguments={describe(arguments)}"
    elif roll < 0.9:
        text = rng.choice(
            [
                "[" * DEEP + "]" * DEEP,
                deep_json(),
                '{"user_id": ' + "[" * DEEP,
                "{",
                "",
                "null",
                "[]",
                '"a string"',
                "NaN",
                '{"user_id": "\\ud800"}',
                '{"user_id": "u1", "user_id": 5}',
                '{"k": 1e999}',
                "\xff\xfe",
                "x" * 1_000_001,
                json.dumps(arguments, ensure_ascii=False).replace("}", "", 1),
                json.dumps({**arguments, "k": float("nan")}),
            ]
        )
        arguments = text.encode("utf-8", "surrogatepass") if rng.random() < 0.1 else text
        label = f"arguments={describe(arguments)}"
    else:
        tool = rng.choice(["", "\ud800", "no_such_tool", name.upper(), name + " ", "x" * 10_000])
        wrong: Any = rng.choice([tool, 5, None, ["x"]])
        return f"call_tool({describe(wrong)})", lambda m, a: m.call_tool(wrong, {})
    return f"call_tool({name}, {label})", lambda m, a: m.call_tool(name, arguments)


# --- files: chat exports, JSONL messages, export files ------------------------------------------


def _paths_of(data: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) of a JSON document, walked without recursion."""
    found: list[tuple[Any, Any]] = []
    stack = [data]
    while stack:
        node = stack.pop()
        items: Any = (
            node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        )
        for key, child in items:
            found.append((node, key))
            stack.append(child)
    return found


def mutate_json(data: Any, rng: random.Random) -> tuple[Any, str]:
    """One fault somewhere in a JSON document (the document is changed in place)."""
    paths = _paths_of(data)
    if not paths or rng.random() < 0.04:
        value = bad_value(rng, python=False)
        return value, f"document={describe(value)}"
    node, key = rng.choice(paths)
    roll = rng.random()
    if roll < 0.2 and isinstance(node, dict):
        del node[key]
        return data, f"-{key}"
    if roll < 0.28 and isinstance(node, dict):
        node[rng.choice(["unknown", "\ud800", ""])] = bad_value(rng, python=False, deep=False)
        return data, f"+field near {key}"
    value = rng.choice(
        [
            bad_value(rng, python=False),
            bad_time(rng) if rng.random() < 0.3 else "2026",
            "1e400",
            str(10**30),
            -5,
            rng.choice(SURROGATES),
        ]
    )
    if isinstance(value, datetime | Opaque):
        value = str(value)
    node[key] = value
    return data, f"{key}={describe(value)}"


def corrupt(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Damage to the bytes of a file: cut, garbage, another encoding, a NUL, a BOM."""
    roll = rng.random()
    if roll < 0.3:
        cut = rng.randrange(max(1, len(raw)))
        return raw[:cut], f"cut at {cut}"
    if roll < 0.5:
        at = rng.randrange(max(1, len(raw)))
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        return raw[:at] + junk + raw[at:], f"{len(junk)} garbage bytes at {at}"
    if roll < 0.6:
        return raw.decode("utf-8", "surrogatepass").encode("utf-16"), "UTF-16"
    if roll < 0.7:
        return b"\xef\xbb\xbf" + raw, "BOM"
    if roll < 0.8:
        return raw.replace(b'"', b"\x00", 1), "NUL"
    if roll < 0.9:
        return b"", "empty"
    return bytes(rng.randrange(256) for _ in range(200)), "random bytes"


def dump(value: Any) -> bytes:
    """JSON bytes of ``value``, however bad: NaN, lone surrogates (as escapes) and depth kept."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, DEEP * 3))
    try:
        return json.dumps(value, ensure_ascii=True, default=str).encode()
    except RecursionError:
        return deep_json().encode()
    finally:
        sys.setrecursionlimit(limit)


class Files:
    """Input files written in one folder of the harness's own."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.samples = {
            "telegram": (SAMPLES / "telegram_result.json").read_bytes(),
            "telegram-full": (SAMPLES / "telegram_full_export.json").read_bytes(),
            "discord": (SAMPLES / "discord_export.json").read_bytes(),
        }

    def write(self, content: bytes, suffix: str = ".json") -> Path:
        self.count += 1
        path = self.folder / f"input-{self.count}{suffix}"
        path.write_bytes(content)
        return path

    def odd_path(self, rng: random.Random) -> tuple[Path, str]:
        """A path that is not a readable file."""
        choice = rng.choice(["missing", "folder", "under-a-file", "surrogate"])
        if choice == "missing":
            return self.folder / "no-such-file.json", "missing file"
        if choice == "folder":
            return self.folder, "a folder"
        if choice == "under-a-file":
            return self.write(b"{}") / "inside.json", "a path under a file"
        return self.folder / "name-\udcff.json", "a missing file with an undecodable name"

    def chat_export(self, rng: random.Random) -> tuple[Path, str, str]:
        """(file, format, fault) of a damaged chat export."""
        source = rng.choice(["telegram", "telegram-full", "discord", "jsonl"])
        format = source.split("-")[0] if rng.random() < 0.85 else rng.choice(["telegram", "discord", "jsonl"])
        if rng.random() < 0.08:
            path, fault = self.odd_path(rng)
            return path, format, fault
        if source == "jsonl":
            path, fault = self.messages_jsonl(rng)
            return path, format, fault
        raw = self.samples[source]
        if rng.random() < 0.3:
            content, fault = corrupt(raw, rng)
        else:
            data, fault = mutate_json(json.loads(raw), rng)
            content = dump(data)
        return self.write(content), format, f"{source}: {fault}"

    def messages_jsonl(self, rng: random.Random) -> tuple[Path, str]:
        lines = [valid_message(rng, 10_000 + i) for i in range(rng.randint(1, 3))]
        at = rng.randrange(len(lines))
        fault, message = bad_message(rng, 20_000 + self.count)
        if isinstance(message, Message):
            message = message.__dict__
        lines[at] = message
        raw = b"".join(dump(line) + b"\n" for line in lines)
        if rng.random() < 0.2:
            raw, damage = corrupt(raw, rng)
            fault += f", {damage}"
        return self.write(raw, ".jsonl"), f"jsonl line {at + 1}: {fault}"

    def export_file(self, base: bytes, rng: random.Random) -> tuple[Path, str]:
        """A damaged narrmem export (``base`` is a good one)."""
        if rng.random() < 0.06:
            return self.odd_path(rng)
        lines = base.splitlines()
        if rng.random() < 0.25:
            content, fault = corrupt(base, rng)
            return self.write(content, ".jsonl"), fault
        at = rng.randrange(len(lines))
        data = json.loads(lines[at])
        roll = rng.random()
        if roll < 0.15 and "vector" in data:
            data["vector"] = rng.choice(
                ["", "!!!", base64.b64encode(b"\x00" * 12).decode(), "AAAA" * 5000, 5, None]
            )
            fault = f"line {at + 1} vector"
        elif roll < 0.3 and "id" in data:
            data["id"] = rng.choice([*HUGE_INTS, 0, -1, "1", 1.5, None, 10**6 + rng.randrange(1000)])
            fault = f"line {at + 1} id={describe(data['id'])}"
        else:
            data, fault = mutate_json(data, rng)
            fault = f"line {at + 1} {fault}"
        lines[at] = dump(data)
        return self.write(b"\n".join(lines) + b"\n", ".jsonl"), fault

    def user_map(self, rng: random.Random) -> tuple[Path, str]:
        value = rng.choice(
            [
                {"user1001": "alice"},
                {"user1001": 5},
                {"user1001": ""},
                {"user1001": "\ud800"},
                {"user1001": "x" * 201},
                {"user1001": deep_list()},
                ["alice"],
                "alice",
                None,
                deep_dict(),
            ]
        )
        if rng.random() < 0.15:
            content, fault = corrupt(dump(value), rng)
            return self.write(content), f"user map {fault}"
        return self.write(dump(value)), f"user map {describe(value)}"


def import_case(rng: random.Random, files: Files, base_export: bytes) -> tuple[str, ApiCall]:
    roll = rng.random()
    if roll < 0.45:
        path, format, fault = files.chat_export(rng)
        tenant = rng.choice([None, None, None, "", "\ud800", "t" * 201, "team"])
        users: Any = None
        if rng.random() < 0.15:
            users = rng.choice(
                [{"user1001": 5}, {"user1001": "\ud800"}, ["a"], {5: "a"}, {"user1001": "alice"}]
            )

        async def chat(memory: Memory) -> None:
            batch = read_chat(path, format, tenant=tenant, user_map=users)
            if batch.messages:
                await memory.ingest_many(batch.messages[:8])

        return f"read_chat({format}, {fault}, tenant={describe(tenant)})", lambda m, a: chat(m)
    if roll < 0.6:
        path, fault = files.messages_jsonl(rng)
        dry = rng.random() < 0.3

        async def jsonl(memory: Memory) -> None:
            if dry:
                for message in read_dry_run_messages(path)[:3]:
                    await memory.triage(message)
            else:
                await memory.ingest_many(read_messages(path))

        return f"{'read_dry_run_messages' if dry else 'read_messages'}({fault})", lambda m, a: jsonl(m)
    if roll < 0.7:
        path, fault = files.user_map(rng)

        async def user_map(memory: Memory) -> None:
            read_user_map(path)

        if rng.random() < 0.4:
            value = rng.choice([{1: "a"}, {"a": None}, {"a": deep_list()}, Opaque(), {"\ud800": "a"}])

            async def check(memory: Memory) -> None:
                check_user_map(value)

            return f"check_user_map({describe(value)})", lambda m, a: check(m)
        return f"read_user_map({fault})", lambda m, a: user_map(m)
    path, fault = files.export_file(base_export, rng)
    return f"import_jsonl({fault})", lambda m, a: import_jsonl(m, path)


# --- config files and environment variables -----------------------------------------------------

SETTINGS_FIELDS = {
    "storage": [
        "backend",
        "database",
        "index",
        "busy_timeout_ms",
        "batch_size",
        "hnsw_threshold",
        "hnsw_m",
        "hnsw_ef_construction",
        "hnsw_ef_search",
        "hnsw_rebuild_ratio",
    ],
    "embedder": ["backend", "model_path", "cache_dir", "quantize", "threads", "batch_size", "device"],
    "plugins": ["disabled", "load_entrypoints"],
}
TOML_VALUES = [
    '"abc"',
    "-1",
    "0",
    "1e400",
    "nan",
    "inf",
    "9" * 30,
    "true",
    "[]",
    "[1, 2]",
    "{}",
    "{ x = 1 }",
    '""',
    '"\\u0000"',
    '"x"',
    "1.5",
    '"""multi\nline"""',
    "2026-05-04T09:00:00Z",
]


def config_text(rng: random.Random) -> tuple[bytes, str]:
    """A config file with one fault."""
    roll = rng.random()
    if roll < 0.1:
        return b"\xff\xfe[storage]\nbatch_size = 5\n", "not UTF-8"
    if roll < 0.2:
        return rng.choice(
            [b"[storage\n", b"a = \n", b"= 1", b"[[x]\n", b"a = 'x\n", b"[storage]\n[storage]\n"]
        ), ("invalid TOML")
    if roll < 0.27:
        depth = rng.choice([DEEP, 100])
        return ("a = " + "[" * depth + "]" * depth + "\n").encode(), f"array nested {depth} deep"
    if roll < 0.32:
        depth = rng.choice([DEEP, 100])
        return ("[plugin.graph]\nx = " + "{ a = " * depth + "1" + " }" * depth + "\n").encode(), (
            f"inline table nested {depth} deep"
        )
    if roll < 0.45:
        section = rng.choice([*SETTINGS_FIELDS, "plugin.graph", "bogus"])
        return f"[{section}]\nbogus_key = 1\n".encode(), f"unknown key in [{section}]"
    if roll < 0.52:
        return rng.choice(
            [
                b"data_dir = 5\n",
                b"storage = 5\n",
                b"plugin = 5\n",
                b"plugin = { graph = 5 }\n",
                b'data_dir = "\\ud800"\n',
                b"unknown = 1\n",
            ]
        ), "top-level fault"
    section = rng.choice(sorted(SETTINGS_FIELDS))
    key = rng.choice(SETTINGS_FIELDS[section])
    value = rng.choice(TOML_VALUES)
    return f"[{section}]\n{key} = {value}\n".encode(), f"{section}.{key} = {value}"


ENV_NAMES = [
    "NARRMEM_STORAGE",
    "NARRMEM_STORAGE__BATCH_SIZE",
    "NARRMEM_STORAGE__DATABASE",
    "NARRMEM_STORAGE__INDEX",
    "NARRMEM_EMBEDDER__THREADS",
    "NARRMEM_EMBEDDER",
    "NARRMEM_PLUGINS__DISABLED",
    "NARRMEM_PLUGINS",
    "NARRMEM_PLUGIN",
    "NARRMEM_PLUGIN__GRAPH",
    "NARRMEM_PLUGIN__HIPPOCAMPUS__INTERVAL_MINUTES",
    "NARRMEM_DATA_DIR",
    "NARRMEM_BOGUS",
    "NARRMEM_STORAGE__BOGUS",
    "NARRMEM_",
    "NARRMEM___X",
]
ENV_VALUES = [
    "abc",
    "{",
    "[1]",
    "[",
    "}",
    "null",
    "5",
    "-1",
    "1e400",
    "nan",
    "",
    " ",
    '{"batch_size": "x"}',
    '{"bogus": 1}',
    '["graph"]',
    "graph",
    "\udcff",
    "../outside",
    deep_json(),
    "[" * DEEP,
    '{"a": 1}',
    "x" * 100_000,
]


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` (and only them) as NARRMEM_ variables; the previous environment comes back."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("NARRMEM_")}
    try:
        for key in saved:
            del os.environ[key]
        os.environ.update(values)
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("NARRMEM_")]:
            del os.environ[key]
        os.environ.update(saved)


def path_configs(work: Path, user: Path) -> list[tuple[str, str]]:
    """``[storage]`` paths that point outside the data folder or at each other (and a data folder
    that is a user's file): a store opened with one must refuse it, and touch no user file."""
    return [
        (f'[storage]\nindex = "{user}"\n', "index is the user's folder"),
        ('[storage]\nindex = "../user"\n', "index is ../user"),
        ('[storage]\nindex = "narrmem.sqlite3"\n', "index is the database file"),
        ('[storage]\ndatabase = "vectors"\n', "database is the index folder"),
        ('[storage]\ndatabase = "../x.sqlite3"\n', "database outside the data folder"),
        (f'[storage]\ndatabase = "{work / "notes.txt"}"\n', "database is the user's notes"),
        ('[storage]\ndatabase = "../user/diary.txt"\n', "database is the user's diary"),
        ('[storage]\nindex = "."\n', "index is the data folder"),
        ('[storage]\ndatabase = ""\n', "empty database name"),
        ('[storage]\nindex = ""\n', "empty index name"),
        ('[storage]\nindex = "narrmem.sqlite3-wal"\n', "index is the database's WAL"),
        (f'data_dir = "{work / "notes.txt"}"\n', "data_dir is the user's file"),
        (f'data_dir = "{work / "notes.txt" / "sub"}"\n', "data_dir under the user's file"),
    ]


# --- the CLI -------------------------------------------------------------------------------------


def _hash_open(settings: Any, **options: Any) -> Any:
    """The CLI's ``_open`` with the fast hash embedder (no model) and no third-party plugins."""
    embedder = settings.embedder.model_copy(update={"backend": HASH_EMBEDDER})
    settings = settings.model_copy(update={"embedder": embedder})
    return Memory.open(settings=settings, plugins=[TestingPlugin()], load_entrypoints=False, **options)


@dataclass
class CliRun:
    code: int | None
    stdout: str
    stderr: str
    error: BaseException | None = None


def run_cli(argv: list[str]) -> CliRun:
    """``narrmem.doors.cli.main(argv)`` in this process, its output captured."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    error: BaseException | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with mock.patch.object(cli, "_open", _hash_open):
            try:
                code = cli.main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except Exception as exc:
                error = exc
    return CliRun(code, out.getvalue(), err.getvalue(), error)


def cli_argv(
    rng: random.Random, files: Files, data: Path, odd_data: list[Path], base_export: bytes
) -> list[str]:
    """One ``narrmem`` command line with something wrong in it."""

    def text() -> str:
        value = bad_text(rng)
        return value.replace("\x00", "") if isinstance(value, str) else str(describe(value))

    def ident() -> str:
        value = bad_id(rng)
        return value.replace("\x00", "") if isinstance(value, str) else str(value)

    def number() -> str:
        return rng.choice(["0", "-1", "abc", "1.5", "99999999999999999999999", "1e3", "", "0x10", "201", "5"])

    folder = str(rng.choice(odd_data)) if rng.random() < 0.12 else str(data)
    common = ["--data", folder]
    if rng.random() < 0.08:
        config = files.write(config_text(rng)[0], ".toml")
        common += ["--config", str(config)]
    command = rng.choice(
        [
            "ingest",
            "import-chat",
            "import",
            "recall",
            "triage",
            "decay",
            "history",
            "forget",
            "rtm",
            "export",
            "stats",
            "tools",
            "mcp",
            "usage",
        ]
    )
    if command == "ingest":
        path, _ = files.messages_jsonl(rng)
        return ["ingest", str(path), *common, "--json"]
    if command == "import-chat":
        path, format, _ = files.chat_export(rng)
        argv = ["import-chat", str(path), "--format", format, *common]
        if rng.random() < 0.2:
            argv += ["--tenant", ident()]
        if rng.random() < 0.2:
            argv += ["--user-map", str(files.user_map(rng)[0])]
        return argv
    if command == "import":
        path, _ = files.export_file(base_export, rng)
        return ["import", str(path), *common]
    if command == "recall":
        argv = ["recall", text(), *common]
        scope = rng.choice(
            [["--user", ident()], ["--chat", ident()], [], ["--user", "u1", "--tenant", ident()]]
        )
        return argv + scope + (["--k", number()] if rng.random() < 0.4 else [])
    if command == "triage":
        if rng.random() < 0.5:
            return ["triage", text(), *common]
        path, _ = files.messages_jsonl(rng)
        return ["triage", "--file", str(path), *common]
    if command == "decay":
        value = bad_time(rng)
        return [
            "decay",
            "--now",
            value.replace("\x00", "") if isinstance(value, str) else str(value),
            *common,
        ]
    if command == "history":
        return ["history", number(), *common]
    if command == "forget":
        scope = rng.choice(
            [["--user", ident()], ["--chat", ident()], ["--user", "fuzz-nobody", "--tenant", ident()], []]
        )
        return ["forget", *scope, *common]
    if command == "rtm":
        action = rng.choice(["build", "traverse", "ensemble", "depth"])
        if rng.random() < 0.3:
            source = str(files.odd_path(rng)[0])
        else:
            body = rng.choice([b"", b"\xff\xfe bad bytes", b"One. Two. Three.", ("x" * 600_000).encode()])
            source = str(files.write(body, ".txt"))
        options = rng.sample(
            [
                ["--k", number()],
                ["--max-depth", number()],
                ["--level", number()],
                ["--target", number()],
                ["--trees", number()],
                ["--seed", number()],
                ["--partition", "bogus"],
                ["--type", text()],
            ],
            k=rng.randint(0, 2),
        )
        return ["rtm", action, source, *[part for option in options for part in option], *common]
    if command == "export":
        where = rng.choice(
            [
                str(files.folder),
                str(files.folder / "missing" / "out.jsonl"),
                str(files.write(b"x") / "out.jsonl"),
                "",
                str(files.folder / f"export-{files.count}.jsonl"),
            ]
        )
        return ["export", where, *common]
    if command in {"stats", "tools"}:
        return [command, *common]
    if command == "mcp":
        # Only ports that are not numbers: a valid one would start serving.
        return ["mcp", "--http", rng.choice(["abc", "host:", ":", "::x", "127.0.0.1:port"]), *common]
    return rng.choice(
        [
            [],
            ["bogus"],
            ["recall"],
            ["--verbose"],
            ["stats", "--bogus"],
            ["history"],
            ["forget", "--user", ""],
            ["triage"],
            ["rtm", "depth", "x.txt"],
        ]
    )


# Subprocess scenarios: each builds (argv, extra environment) in the work folder.
Scenario = Callable[[Path, Files], tuple[list[str], dict[str, str]]]


def _subprocess_scenarios() -> list[tuple[str, Scenario]]:
    def garbage_db(work: Path, files: Files) -> tuple[list[str], dict[str, str]]:
        folder = work / "sub-garbage"
        folder.mkdir(exist_ok=True)
        (folder / DB_NAME).write_bytes(b"this is not a database" * 50)
        return ["stats", "--data", str(folder)], {}

    def db_is_folder(work: Path, files: Files) -> tuple[list[str], dict[str, str]]:
        folder = work / "sub-dbdir"
        (folder / DB_NAME).mkdir(parents=True, exist_ok=True)
        return ["stats", "--data", str(folder)], {}

    return [
        ("config not UTF-8", lambda w, f: (["stats", "--config", str(f.write(b"\xff\xfe[x]", ".toml"))], {})),
        ("config not TOML", lambda w, f: (["stats", "--config", str(f.write(b"[storage", ".toml"))], {})),
        ("NARRMEM_STORAGE={", lambda w, f: (["stats"], {"NARRMEM_STORAGE": "{"})),
        ("NARRMEM_STORAGE__BATCH_SIZE=abc", lambda w, f: (["stats"], {"NARRMEM_STORAGE__BATCH_SIZE": "abc"})),
        ("NARRMEM_PLUGIN__GRAPH deep", lambda w, f: (["stats"], {"NARRMEM_PLUGIN__GRAPH": deep_json()})),
        ("garbage database", garbage_db),
        ("database is a folder", db_is_folder),
        ("data folder is a file", lambda w, f: (["stats", "--data", str(w / "notes.txt")], {})),
        ("history of a huge id", lambda w, f: (["history", str(10**30), "--data", str(w / "sub-empty")], {})),
        ("decay --now junk", lambda w, f: (["decay", "--now", "5", "--data", str(w / "sub-empty")], {})),
        (
            "import a damaged export",
            lambda w, f: (
                ["import", str(f.write(b'{"format": 5}\n', ".jsonl")), "--data", str(w / "sub-empty")],
                {},
            ),
        ),
        (
            "import-chat deep nesting",
            lambda w, f: (["import-chat", str(f.write(deep_json().encode())), "--format", "telegram"], {}),
        ),
        (
            "ingest deep meta",
            lambda w, f: (
                ["ingest", str(f.write(_deep_meta_line(), ".jsonl")), "--data", str(w / "sub-empty")],
                {},
            ),
        ),
        ("rtm on bytes", lambda w, f: (["rtm", "ensemble", str(f.write(b"\xff\xfe", ".txt"))], {})),
        (
            "export into a folder",
            lambda w, f: (["export", str(f.folder), "--data", str(w / "sub-empty")], {}),
        ),
        (
            "index at the user's folder",
            lambda w, f: (
                [
                    "stats",
                    "--data",
                    str(w / "sub-cfg"),
                    "--config",
                    str(f.write(f'[storage]\nindex = "{w / "user"}"\n'.encode(), ".toml")),
                ],
                {},
            ),
        ),
        ("no command", lambda w, f: ([], {})),
    ]


def _deep_meta_line() -> bytes:
    line = {"text": "x", "user_id": "u", "chat_id": "c", "ts": START.isoformat(), "message_id": "m"}
    return dump({**line, "meta": deep_dict()}) + b"\n"


def run_subprocess(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NARRMEM_")}
    return subprocess.run(
        [sys.executable, "-m", "narrmem.doors.cli", *argv],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        env={**base, "HF_HUB_OFFLINE": "1", **env},
        cwd=cwd,
        timeout=300,
        check=False,
    )


# --- the run -------------------------------------------------------------------------------------


def _shares(count: int) -> dict[str, int]:
    subprocesses = 0 if count < 500 else min(30, max(2, count // 350))
    rest = count - subprocesses
    shares = {door: int(rest * weight) for door, weight in WEIGHTS.items()}
    shares["api"] += rest - sum(shares.values())
    shares["subprocess"] = subprocesses
    return shares


async def _outcome(call: Callable[[], Awaitable[Any]]) -> BaseException | None:
    try:
        await call()
    except Exception as exc:
        return exc
    return None


async def _seed(memory: Memory) -> list[dict[str, Any]]:
    """A small store with something in every table, so that a bad input has rows it could spoil."""
    rng = random.Random(0)
    messages = [valid_message(rng, i) for i in range(12)]
    await memory.ingest_many(messages)
    await memory.call_tool(
        "memory_commit",
        {
            "user_id": "u1",
            "chat_id": "c1",
            "triplets": [{"subject": "user", "relation": "likes", "object": "rock"}],
        },
    )
    await memory.call_tool(
        "task_create",
        {"user_id": "u1", "chat_id": "c1", "task_id": "Task_fuzz", "description": "a fuzz task"},
    )
    await memory.call_tool("persona_set", {"user_id": "u1", "description": "a helpful assistant"})
    await memory.call_tool(
        "soul_narrative", {"action": "add", "user_id": "u1", "event": "I moved to Hangzhou."}
    )
    await memory.call_tool(
        "rtm_create_narrative_tree",
        {"text": "One day I left. Then I came back. Later I stayed.", "title": "t"},
    )
    return messages


async def _in_memory_doors(
    report: Report, rng: random.Random, shares: dict[str, int], work: Path, files: Files, log: _LoggedErrors
) -> None:
    store = work / "store"
    async with open_memory(store, clock=ManualClock(START + timedelta(days=1)), plugin=QUIET) as memory:
        ingested = await _seed(memory)
        export = files.folder / "base-export.jsonl"
        await export_jsonl(memory, export)
        base_export = export.read_bytes()
        doors = ["api"] * shares["api"] + ["tool"] * shares["tool"] + ["import"] * shares["import"]
        rng.shuffle(doors)
        rows = StoreRows(store / DB_NAME)
        try:
            for n, door in enumerate(doors):
                if door == "api":
                    label, call = api_case(rng, n, ingested)
                elif door == "tool":
                    label, call = tool_case(rng, memory)
                else:
                    label, call = import_case(rng, files, base_export)
                log.label = label
                error = await _outcome(functools.partial(call, memory, {}))
                outcome = report.record(door, label, error)
                if rows.changed() and outcome == "refused":
                    report.counts["rows_changed_by_refused"] += 1
                    if len(report.rows_changed_examples) < 10:
                        report.rows_changed_examples.append(f"{label}: {error}"[:400])
        finally:
            rows.close()


def _cli_door(
    report: Report, rng: random.Random, count: int, work: Path, files: Files, log: _LoggedErrors
) -> None:
    data = work / "cli-store"
    seed = files.write(b"".join(dump(valid_message(random.Random(1), i)) + b"\n" for i in range(8)), ".jsonl")
    first = run_cli(["ingest", str(seed), "--data", str(data)])
    if first.code != 0:
        raise RuntimeError(f"the CLI could not seed its store: {first.stderr or first.error}")
    export = files.folder / "cli-export.jsonl"
    run_cli(["export", str(export), "--data", str(data)])
    base_export = export.read_bytes()
    garbage = work / "cli-garbage"
    garbage.mkdir(exist_ok=True)
    (garbage / DB_NAME).write_bytes(b"not a database at all " * 40)
    db_folder = work / "cli-dbdir"
    (db_folder / DB_NAME).mkdir(parents=True, exist_ok=True)
    odd = [work / "notes.txt", work / "notes.txt" / "sub", garbage, db_folder]
    rows = StoreRows(data / DB_NAME)
    try:
        for _ in range(count):
            argv = cli_argv(rng, files, data, odd, base_export)
            label = "narrmem " + " ".join(describe(a) for a in argv)
            log.label = label
            outcome = _judge_cli(report, label, run_cli(argv))
            if rows.changed() and outcome == "refused":
                report.counts["rows_changed_by_refused"] += 1
                if len(report.rows_changed_examples) < 10:
                    report.rows_changed_examples.append(label[:400])
    finally:
        rows.close()


def _judge_cli(report: Report, label: str, run: CliRun) -> str:
    """Exit 0 is accepted, 2 with a message refused; 1 (an internal error), anything raised but
    SystemExit, or a traceback on stderr is a failure."""
    if "Traceback (most recent call last)" in run.stderr:
        report.counts["cli_tracebacks"] += 1
        if len(report.cli_traceback_examples) < 10:
            report.cli_traceback_examples.append(f"{label}: {run.stderr[-400:]}")
    if run.error is not None:
        return report.record("cli", label, run.error)
    message = run.stderr.strip()
    if run.code == 1:
        kind = message.split(":", 3)[2].strip() if message.count(":") >= 3 else "exit 1"
        report.untyped_exit("cli", label, kind, message)
        return "untyped"
    if run.code not in (0, 2, 130) or (run.code == 2 and not message):
        report.untyped_exit("cli", label, f"exit {run.code}", message or "(nothing on stderr)")
        return "untyped"
    if run.code == 2:
        _check_one_line(report, label, message)
    return report.record("cli", label, None if run.code == 0 else _Refused(message))


def _check_one_line(report: Report, label: str, message: str) -> None:
    """A refusal is one line naming what is wrong (argparse's usage line before it is fine, and so
    are logged warnings such as an ignored ``NARRMEM_`` variable's, "narrmem.config: ...")."""
    lines = [line for line in message.splitlines() if not line.startswith("narrmem.")]
    if lines and lines[0].startswith("usage:"):
        lines = [line for line in lines if line.startswith("narrmem")][-1:]
    if len(lines) != 1 or not lines[0].startswith("narrmem"):
        report.counts["cli_messages_not_one_line"] += 1
        if len(report.cli_message_examples) < 10:
            report.cli_message_examples.append(f"{label}: {message[-400:]}")


class _Refused(NarrmemError):
    """Stands for the error of a CLI run that exited 2."""


def _config_door(
    report: Report, rng: random.Random, count: int, work: Path, files: Files, user: UserFiles
) -> None:
    configs = path_configs(work, work / "user")
    for n in range(count):
        roll = rng.random()
        if roll < 0.2:
            text, fault = rng.choice(configs)
            folder = work / f"cfgdata-{n}"
            path = files.write(text.encode(), ".toml")
            label = f"open with {fault}"
            error = asyncio.run(_open_and_write(folder, path))
            report.record("config", label, error)
            touched = user.touched()
            if touched and len(report.foreign_files) < 20:
                report.foreign_files.extend(f"{label}: {t}" for t in touched if t not in report.foreign_files)
            continue
        if roll < 0.3:
            label, options = open_arguments(rng, work, files)
            error = asyncio.run(_open_with(options))
            report.record("config", label, error)
            continue
        if roll < 0.6:
            content, fault = config_text(rng)
            target: Path = files.write(content, ".toml")
            if rng.random() < 0.05:
                target, fault = files.odd_path(rng)
            label = f"load_settings({fault})"
            error = _call(functools.partial(load_settings, target))
            report.record("config", label, error)
            continue
        variables = {rng.choice(ENV_NAMES): rng.choice(ENV_VALUES) for _ in range(rng.choice([1, 1, 2]))}
        label = "environment " + ", ".join(f"{k}={describe(v)}" for k, v in variables.items())
        overrides: dict[str, Any] = {}
        if rng.random() < 0.15:
            overrides = {
                "storage": rng.choice([{"batch_size": "x"}, "x", {"bogus": 1}, None]),
                "data_dir": rng.choice([5, None, "\ud800", "d"]),
            }
            label += f", overrides {describe(overrides)}"
        try:
            with environment(variables):
                error = _call(functools.partial(load_settings, None, **overrides))
        except ValueError as exc:  # the OS refused the variable itself (an embedded NUL, say)
            error = None
            label += f" (not settable: {exc})"
        report.record("config", label, error)


def _call(function: Callable[[], Any]) -> BaseException | None:
    try:
        function()
    except Exception as exc:
        return exc
    return None


def open_arguments(rng: random.Random, work: Path, files: Files) -> tuple[str, dict[str, Any]]:
    """``Memory.open`` keyword arguments with one of them wrong, or a data folder no store fits."""
    garbage = work / "open-garbage"
    if not garbage.exists():
        garbage.mkdir()
        (garbage / DB_NAME).write_bytes(b"not a database " * 64)
        (work / "open-dbdir" / DB_NAME).mkdir(parents=True)
    name, value = rng.choice(
        [
            ("data_dir", rng.choice([5, "", " ", "a\x00b", b"folder", [], Opaque()])),
            (
                "data_dir",
                rng.choice([garbage, work / "open-dbdir", work / "notes.txt", work / "notes.txt" / "x"]),
            ),
            ("settings", rng.choice(["settings", {"data_dir": "x"}, 5, Opaque()])),
            (
                "config_file",
                rng.choice([5, b"x.toml", "a\x00b", files.folder, work / "missing.toml", Opaque()]),
            ),
            ("clock", rng.choice([5, "now", Opaque(), datetime.now])),
            ("plugins", rng.choice(["abc", [5], [None], 5])),
        ]
    )
    options: dict[str, Any] = {"data_dir": work / "open-store", name: value}
    return f"Memory.open({name}={describe(value)})", options


async def _open_with(options: dict[str, Any]) -> BaseException | None:
    try:
        plugins = options.pop("plugins", [])
        async with Memory.open(
            plugins=[TestingPlugin(), *plugins] if isinstance(plugins, list) else plugins,
            load_entrypoints=False,
            warm=False,
            **options,
        ) as memory:
            await memory.stats()
    except Exception as exc:
        return exc
    return None


async def _open_and_write(folder: Path, config: Path) -> BaseException | None:
    """Open a store with ``config`` and write to it: where a bad path setting would do harm."""
    try:
        async with open_memory(folder, config_file=config, plugin=QUIET) as memory:
            await memory.ingest(valid_message(random.Random(2), 1))
    except Exception as exc:
        return exc
    return None


def _subprocess_door(report: Report, rng: random.Random, count: int, work: Path, files: Files) -> None:
    scenarios = _subprocess_scenarios()
    order = [scenarios[i % len(scenarios)] for i in range(count)]
    rng.shuffle(order)
    for name, scenario in order:
        argv, env = scenario(work, files)
        done = run_subprocess(argv, env, work)
        label = f"subprocess: {name}"
        if "Traceback (most recent call last)" in done.stderr:
            report.counts["cli_tracebacks"] += 1
            if len(report.cli_traceback_examples) < 10:
                report.cli_traceback_examples.append(f"{label}: {done.stderr[-600:]}")
        if done.returncode == 0:
            report.record("subprocess", label, None)
        elif done.returncode == 2 and done.stderr.strip():
            _check_one_line(report, label, done.stderr.strip())
            report.record("subprocess", label, _Refused(done.stderr))
        else:
            report.untyped_exit("subprocess", label, f"exit {done.returncode}", done.stderr.strip()[-300:])


def run_fuzz(count: int, seed: int, workdir: Path) -> dict[str, Any]:
    """Run ``count`` fuzzed inputs (``seed`` fixes which) in ``workdir``; returns the figures:
    ``inputs``, ``accepted``, ``refused``, ``untyped`` and ``untyped_kinds`` (kind -> one example),
    ``cli_tracebacks``, ``cli_messages_not_one_line``, ``rows_changed_by_refused``,
    ``foreign_files_touched`` (user files deleted, overwritten, or added to the user's folder),
    ``logged_errors`` (exceptions a plugin raised and the host isolated), each with examples, and
    ``by_door`` / ``seconds_by_door``. ``NARRMEM_`` variables of the caller are set aside while it
    runs (each input sets its own)."""
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    report = Report()
    shares = _shares(count)
    files = Files(work / "inputs")

    user = UserFiles()
    user.plant(work / "notes.txt", b"the user's notes, not narrmem's\n")
    for name, content in [
        ("diary.txt", b"dear diary\n"),
        ("photo.jpg", bytes(range(256))),
        ("manifest.json", b'{"mine": true}\n'),
        (DB_NAME, b"my own file, same name\n"),
    ]:
        user.plant(work / "user" / name, content)
    user.watch_folder(work / "user")
    for folder in ("store", "cli-store"):
        user.plant(work / folder / "keep-me.txt", b"a file the user keeps in the data folder\n")

    handler = _LoggedErrors(report)
    narrmem_log = logging.getLogger("narrmem")
    propagate, level = narrmem_log.propagate, narrmem_log.level
    narrmem_log.addHandler(handler)
    narrmem_log.propagate = False  # thousands of isolated-plugin reports would drown the output
    narrmem_log.setLevel(logging.WARNING)
    threads = _ThreadErrors(report, handler)
    previous_hook = threading.excepthook
    threading.excepthook = threads
    try:
        with environment({}):
            asyncio.run(_in_memory_doors(report, rng, shares, work, files, handler))
            threads.door = "cli"
            _cli_door(report, rng, shares["cli"], work, files, handler)
            threads.door = "config"
            _config_door(report, rng, shares["config"], work, files, user)
            threads.door = "subprocess"
            _subprocess_door(report, rng, shares["subprocess"], work, files)
    finally:
        threading.excepthook = previous_hook
        narrmem_log.removeHandler(handler)
        narrmem_log.propagate, narrmem_log.level = propagate, level

    touched = user.touched()
    report.counts["foreign_files_touched"] = len(touched)
    report.foreign_files = sorted(set(report.foreign_files) | set(touched))
    figures = report.as_dict()
    figures["seed"] = seed
    figures["shares"] = shares
    return figures


if __name__ == "__main__":
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description="fuzz every door of narrmem")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path)
    options = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="narrmem-fuzz-") as scratch:
        result = run_fuzz(options.count, options.seed, options.workdir or Path(scratch))
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=2, ensure_ascii=True, default=str))
