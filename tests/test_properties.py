"""Property tests (hypothesis, hash embedder): arbitrary text round-trips losslessly through ingest,
export and import; arbitrary query text never breaks the keyword search."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from narrmem_plugins.storage_sqlite.store import fts_query

from narrmem import Memory, Scope, TriageDecision, hookimpl
from narrmem.clock import ManualClock
from narrmem.doors.importing import import_jsonl
from narrmem.doors.transfer import export_jsonl
from narrmem.models import MAX_QUERY_CHARS
from narrmem.testing import open_memory
from narrmem.text import cjk_count, fts_document, keyword_terms

PROFILE = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


class KeepEverything:
    """Round trips are about storage, not triage: every message is kept as one episode."""

    narrmem_name = "keep_everything"

    @hookimpl(tryfirst=True)
    def narrmem_triage(self) -> TriageDecision:
        return TriageDecision(layer="accumulate", reason="kept for the round trip")


class Runner:
    """One event loop kept across hypothesis examples, so each example is cheap."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def open(self, folder: Path) -> Memory:
        async def _open() -> Memory:
            # Each example adds a message to a chat of earlier examples, which are re-imported
            # each time: a reply's words in their context would make them records with other
            # content (rightly refused), which is not what this round trip is about.
            alone = {"recall_hybrid": {"replies_in_context": False}}
            # A clock past every generated date: a message dated ahead of its memory's clock is refused.
            clock = ManualClock(datetime(2200, 1, 2, tzinfo=UTC))
            return await open_memory(folder, plugins=[KeepEverything()], plugin=alone, clock=clock)

        return self.run(_open())

    def close(self) -> None:
        self.loop.close()


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()


# --- lossless round trip ----------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m))
)
timestamps = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=offsets)
texts = st.text(min_size=1, max_size=600)
ids = st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=40)  # NUL: refused


@pytest.fixture(scope="module")
def roundtrip(runner: Runner, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("roundtrip")
    source = runner.open(base / "source")
    target = runner.open(base / "target")
    state = {"source": source, "target": target, "base": base, "counter": itertools.count(), "stored": 0}
    yield state
    runner.run(source.close())
    runner.run(target.close())


@PROFILE
@given(
    text=texts,
    speaker=st.none() | st.text(max_size=50),
    user=ids,
    chat=ids,
    ts=timestamps,
    meta=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
)
def test_arbitrary_text_round_trips_through_export_and_import(
    runner: Runner,
    roundtrip: dict[str, Any],
    text: str,
    speaker: str | None,
    user: str,
    chat: str,
    ts: datetime,
    meta: dict[str, Any],
) -> None:
    source: Memory = roundtrip["source"]
    target: Memory = roundtrip["target"]
    n = next(roundtrip["counter"])
    body = "memo: " + text
    message = msg(f"m{n}", body, user=user, chat=chat, ts=ts.isoformat(), speaker=speaker, meta=meta)

    result = runner.run(source.ingest(message))
    assert result.stored, result
    added = len(result.memory_ids)  # the episode, plus a scene if triage wrote one
    roundtrip["stored"] += added
    records = runner.run(source.store.get(result.memory_ids, None))
    [record] = [r for r in records.values() if r.kind == "episode"]
    memory_id = record.id
    assert record.text == body
    assert record.speaker == speaker
    assert (record.user_id, record.chat_id) == (user, chat)
    assert record.created_at == ts and record.created_at.utcoffset() == ts.utcoffset()
    # The user's meta comes back exactly; plugins add their own keys beside it ("layer" is the core's).
    assert {k: record.meta[k] for k in meta if k != "layer"} == {
        k: v for k, v in meta.items() if k != "layer"
    }
    assert record.meta["layer"] == result.layer
    assert record.message_ids == [f"m{n}"]
    assert all(
        r.message_ids == [f"m{n}"] and (r.user_id, r.chat_id) == (user, chat) for r in records.values()
    )

    first = roundtrip["base"] / "first.jsonl"
    second = roundtrip["base"] / "second.jsonl"
    assert runner.run(export_jsonl(source, first)) == roundtrip["stored"]
    counts = runner.run(import_jsonl(target, first))
    assert (counts["imported"], counts["skipped"]) == (added, roundtrip["stored"] - added)
    runner.run(export_jsonl(target, second))
    assert second.read_bytes() == first.read_bytes()
    # The imported copy is still findable by its own words in its own scope.
    words = [w for w in body.split() if w.isalnum()]
    hits = runner.run(target.recall(body[:MAX_QUERY_CHARS], user_id=user, chat_id=chat, k=50))
    assert memory_id in {h.id for h in hits} or not words


# --- keyword search never breaks --------------------------------------------------------------

FTS_SPECIALS = [
    '"',
    "'",
    "*",
    "^",
    "(",
    ")",
    ":",
    "-",
    "+",
    "AND",
    "OR",
    "NOT",
    "NEAR",
    "NEAR(",
    "{",
    "}",
    ",",
    ".",
    "body:",
    "\\",
    "摇滚",
    "我喜欢",
    "ǅ",
    "ß",
    "İ",
    "é",
    "\u0301",
    "\x00",
    " ",
    "\t",
    "\n",
    "🎸",
    "٣",
    "ⅷ",
    "_",
    "x_y",
    "the",
    "don't",
    "ﬁ",
    "Ⅻ",
    "\u200b",
    "\ufeff",
    "한국어",
    "ひらがな",
]
queries = (
    st.text(min_size=1, max_size=200)
    | st.lists(st.sampled_from(FTS_SPECIALS), min_size=1, max_size=12).map("".join)
    | st.lists(st.sampled_from(FTS_SPECIALS) | st.text(max_size=5), min_size=1, max_size=12).map(" ".join)
)
queries = queries.filter(lambda q: 0 < len(q) <= MAX_QUERY_CHARS)


@pytest.fixture(scope="module")
def searchable(runner: Runner, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Memory]:
    mem = runner.open(tmp_path_factory.mktemp("fts") / "store")
    runner.run(
        mem.ingest_many(
            [
                msg("1", "I like rock music and NEAR the sea", user="u1"),
                msg("2", "我喜欢摇滚乐", user="u1"),
                msg("3", 'body: AND OR NOT * ^ quotes " here', user="u1"),
                msg("4", "the other user's private words", user="u2"),
                msg("5", "ﬁsh café naïve ǅemal İstanbul ß", user="u1"),
            ]
        )
    )
    yield mem
    runner.run(mem.close())


@PROFILE
@given(query=queries)
def test_keyword_search_never_raises_and_stays_in_scope(
    runner: Runner, searchable: Memory, query: str
) -> None:
    scope = Scope(user_id="u1")
    found = runner.run(searchable.store.search_keywords(scope, query, 10))
    assert all(mid != 4 for mid, _ in found)
    hits = runner.run(searchable.recall(query, user_id="u1", k=10))
    assert all(h.user_id == "u1" for h in hits)


@PROFILE
@given(query=queries, document=st.text(max_size=100))
def test_fts_query_is_always_valid_fts5(query: str, document: str) -> None:
    con = sqlite3.connect(":memory:")
    try:
        con.execute(
            "CREATE VIRTUAL TABLE t USING fts5 (body, tokenize = 'porter unicode61 remove_diacritics 2')"
        )
        con.execute("INSERT INTO t (body) VALUES (?)", (fts_document(document),))
        match = fts_query(query)
        if match:
            con.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,)).fetchall()
        # A query made of a document's own words always finds it.
        own = fts_query(document)
        if own:
            assert con.execute("SELECT COUNT(*) FROM t WHERE t MATCH ?", (own,)).fetchone() == (1,)
    finally:
        con.close()


def test_utc_timestamps_keep_their_offset(runner: Runner, tmp_path: Path) -> None:
    mem = runner.open(tmp_path / "m")
    try:
        result = runner.run(
            mem.ingest(msg("1", "utc timestamp", ts=datetime(2026, 1, 1, tzinfo=UTC).isoformat()))
        )
        record = runner.run(mem.store.get(result.memory_ids, None))[result.memory_ids[0]]
        assert record.created_at == datetime(2026, 1, 1, tzinfo=UTC)
        assert record.created_at.utcoffset() == timedelta(0)
    finally:
        runner.run(mem.close())


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_text_takes_the_fast_path_to_the_same_keyword_terms(text: str) -> None:
    """ASCII text skips the Unicode scan; a CJK character after it sends the same text down the
    general path, which must find the same words before it."""
    assert keyword_terms(text + " 中") == [*keyword_terms(text), "中"]
    assert cjk_count(text) == 0
