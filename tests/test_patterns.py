"""``Memory.patterns``: what keeps coming back for a person, read from the store, so it is the same
after a restart and in a process that only reads, agrees with what ingest counted, writes nothing,
and loses what is forgotten."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _helpers import PluginErrors, msg, store_fingerprint

from narrmem import Memory, Scope
from narrmem.clock import ManualClock

START = datetime(2026, 7, 1, 9, tzinfo=UTC)
ROADMAP = [
    "we talked about the product roadmap again",
    "our roadmap for the product is a mess",
    "spent the whole afternoon on the product roadmap",
]
TIRED = ["so tired today", "so tired again today", "still so tired today", "tired today again"]


def _messages() -> list[dict[str, Any]]:
    texts = [*ROADMAP, *TIRED, "hey, are you around?"]
    return [
        msg(f"m{i}", text, user="ann", chat="dm-ann", ts=(START + timedelta(days=i % 6, hours=i)).isoformat())
        for i, text in enumerate(texts)
    ]


def _by_label(patterns: dict[str, Any]) -> dict[tuple[str, str], int]:
    return {(c["kind"], c["label"]): c["count"] for c in patterns["counts"]}


async def test_patterns_survive_a_restart_match_ingest_and_read_nothing_into_the_store(
    tmp_path: Path,
) -> None:
    clock = ManualClock(START + timedelta(days=6))
    async with Memory.open(tmp_path, clock=clock) as memory:
        results = await memory.ingest_many(_messages())
    counted = {(c.kind, c.label): c.count for r in results for c in r.counts}
    fired = {(t.kind, t.label) for r in results for t in r.triggers}
    assert ("emotion", "tired") in fired

    async with Memory.open(tmp_path, clock=clock, read_only=True) as reader:
        before = await store_fingerprint(reader)
        found = await reader.patterns(user_id="ann")
        assert await reader.patterns(user_id="bob") == {"counts": [], "triggers": []}
        assert await store_fingerprint(reader) == before  # reading wrote nothing

    seen = _by_label(found)
    assert seen[("emotion", "tired")] == counted[("emotion", "tired")] == 4
    [topic] = [key for key in seen if key[0] == "topic"]
    assert "roadmap" in topic[1] and seen[topic] == counted[topic] == 3
    assert {(t["kind"], t["label"]) for t in found["triggers"]} >= {("emotion", "tired")}
    assert all("fired_at" in t and t["count"] >= 2 for t in found["triggers"])


async def test_a_deleted_message_is_no_longer_counted_and_forget_leaves_no_pattern(tmp_path: Path) -> None:
    clock = ManualClock(START + timedelta(days=6))
    async with Memory.open(tmp_path, clock=clock) as memory:
        await memory.ingest_many(_messages())
        await memory.forget_messages(chat_id="dm-ann", message_ids=["m0"])
        seen = _by_label(await memory.patterns(user_id="ann"))
        assert [count for (kind, _), count in seen.items() if kind == "topic"] == [2]
        clock.advance(days=100)  # past both windows (90 and 7 days): nothing is coming back now
        assert (await memory.patterns(user_id="ann"))["counts"] == []
        clock.advance(days=-100)
        await memory.forget(user_id="ann")
        assert await memory.patterns(user_id="ann") == {"counts": [], "triggers": []}


async def test_a_readout_past_what_it_reads_says_its_counts_are_lower_bounds(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The readout reads the newest episodes of the window up to a bound (2,000); a user with more
    gets counts marked ``at_least``, not counts that look exact."""
    import narrmem_plugins.triage.readout as readout

    clock = ManualClock(START + timedelta(days=6))
    async with Memory.open(tmp_path, clock=clock) as memory:
        await memory.ingest_many(_messages())
        exact = (await memory.patterns(user_id="ann"))["counts"]
        assert exact and not any(c["at_least"] for c in exact)
        monkeypatch.setattr(readout, "MAX_EPISODES", 5)  # fewer than the user's seven episodes
        bounded = (await memory.patterns(user_id="ann"))["counts"]
        assert bounded and all(c["at_least"] for c in bounded)


async def test_a_bots_own_emotions_in_meta_are_not_moods(tmp_path: Path) -> None:
    """A bot's ``meta["emotions"]`` shares triage's key. As an object it counted as a mood on
    SQLite (whose JSON walk reads an object's values) and not on PostgreSQL; a label triage does
    not know, or a list in the list, failed every later count of the person's moods."""
    clock = ManualClock(START)
    errors = PluginErrors()
    theirs: list[Any] = [{"detected": "tired"}, ["grumpy"], [["tired"]], "tired?"]
    async with Memory.open(tmp_path, clock=clock, plugins=[errors]) as memory:
        for n, emotions in enumerate(theirs):
            clock.set(START + timedelta(minutes=10 * n))
            message = msg(f"b{n}", f"another long meeting, number {n}", user="ann", chat="dm-ann")
            await memory.ingest({**message, "ts": clock.now().isoformat(), "meta": {"emotions": emotions}})
        clock.set(START + timedelta(hours=1))
        result = await memory.ingest(
            msg("t", "so tired today", user="ann", chat="dm-ann", ts=clock.now().isoformat())
        )
        assert [(c.kind, c.count) for c in result.counts if c.kind == "emotion"] == [("emotion", 1)]
        patterns = await memory.patterns(user_id="ann")
        assert [c for c in patterns["counts"] if c["kind"] == "emotion"] == []  # one mention is no pattern
        # The bot's own data stays as it sent it.
        first = result.memory_ids[0] - len(theirs)
        found = await memory.store.get([first], Scope(tenant="default", user_id="ann"))
        assert found[first].meta["emotions"] == {"detected": "tired"}
    assert errors.seen == []


async def test_the_topics_are_compared_off_the_event_loop(tmp_path: Path, monkeypatch: Any) -> None:
    """Up to 2,000 episodes compared pairwise, with their words: on the event loop, an
    inspector's readout held up every other request of the server meanwhile."""
    from narrmem_plugins.triage.counters import Counters

    compared_on: set[str] = set()
    same_topic = Counters.same_topic

    def watched(self: Counters, episode: Any, other: Any) -> bool:
        compared_on.add(threading.current_thread().name)
        return same_topic(self, episode, other)

    monkeypatch.setattr(Counters, "same_topic", watched)
    clock = ManualClock(START + timedelta(days=6))
    async with Memory.open(tmp_path, clock=clock) as memory:
        await memory.ingest_many(_messages())
        compared_on.clear()
        found = await memory.patterns(user_id="ann")
    assert any(key[0] == "topic" for key in _by_label(found))
    assert compared_on and threading.main_thread().name not in compared_on
