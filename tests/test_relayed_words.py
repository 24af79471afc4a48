"""What a message's author quotes or relays is not the author's life, and what is not a place or
a name does not replace where someone lives or whom they love: a reply quoting "> I decided
to quit my job" with "lol no you didn't", "Alice told me: I moved to Berlin", "he said, I like
rock", 小明说：我住在北京, a pasted "@bob: I work at Google". Before, each made a scene or a fact of
the author's own (a move relayed from a friend replaced where the author lives), and a sentence
about a partner replaced the partner's name ("my girlfriend is moving to Berlin" → partner
"moving to Berlin")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from _helpers import msg
from narrmem_plugins.graph.extract import extract
from narrmem_plugins.triage.relayed import without_relayed
from narrmem_plugins.triage.signals import candidates

from narrmem.models import Scope
from narrmem.testing import open_memory

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)


def _facts(text: str) -> list[tuple[str, str]]:
    return [(f.relation, f.object) for f in extract(text)]


@pytest.mark.parametrize(
    "text",
    [
        "Alice told me: I moved to Berlin last week",
        "Alice said: I moved to Berlin",
        "he said, I like rock",
        "my sister said, I hate cats",
        "Bob wrote - I moved to Lisbon",
        "@bob: hey\n@alice: I live in Berlin",
        "Mom: I moved to Berlin!\nMe: wow that's great",  # someone's line, and the author's reply
        "May: I moved to Berlin!\nBob: nice",  # beside a name, a month's name is someone's
        "<@123456789>: hi\n<@987654321>: I work at Google",
        "Alice (quoting Bob): I love sushi",
        "> I live in Paris\nlol no",
        ">>> I live in Paris\nI love jazz",
        "Bob: hey\nAlice: I live in Berlin",
        "小明说：我住在北京",
        "她说：我喜欢寿司",
        "my girlfriend is moving to Berlin",
        "my wife is sick",
        "my husband is 45",
        "my wife is a doctor",
        "I'm dating someone who lives in Paris",
        "my boyfriend is cheating on me",
        "my girlfriend is so sweet",
        "my wife is pregnant",
        # In lower case no name but one said to be, or whom one dates (everyday "seeing"s).
        "I'm seeing friends tonight.",
        "i'm seeing things",
        "I'm dating apps again",
        "my wife is abroad",
        "my girlfriend is sam",
        "I'm dating myself lol",
        "my job is killing me",
        "my job is so boring",
        "我老公是医生",
        # Not places: a one-value relation (where they live, work, are) replaced the true one.
        "I moved to a new team",
        "I moved to the couch",
        "I moved to Python 3",
        "I live in fear",
        "I work at home",
        "I'm in trouble now",
        "I'm in a meeting right now",
        "I like to think so",
    ],
)
def test_nothing_of_the_authors_is_read_from_others_words_or_from_what_a_partner_does(text: str) -> None:
    assert _facts(text) == []


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        # The author's own, around or beside what is relayed.
        ("I live in Lisbon but Alice told me: I moved to Berlin", [("lives_in", "Lisbon")]),
        ('she texted "I\'m moving to Berlin" and I love jazz', [("likes", "jazz")]),
        ("Alice told me: I love sushi. I love ramen though", [("likes", "ramen")]),
        # Indirect speech: "I" is the author ("Bob said that I…" states nothing either way).
        ("I said, I like rock", [("likes", "rock")]),
        ("I just told him: I'm married to Ana Lima", [("partner", "Ana Lima")]),
        ("Update: I moved to Porto", [("lives_in", "Porto")]),
        ("Alice: I live in Berlin", [("lives_in", "Berlin")]),  # one "Name:" line is a heading
        ("@team: I moved to Porto", [("lives_in", "Porto")]),  # addressed, not quoted
        ("Update: I moved to Porto\nEdit: I work at Google", [("lives_in", "Porto"), ("works_at", "Google")]),
        ("Me: I moved to Porto\nBoss: ok", [("lives_in", "Porto")]),
        ("Monday: I moved to Porto\nTuesday: I work at Meta", [("lives_in", "Porto"), ("works_at", "Meta")]),
        # The author's own speech, whatever comes between them and the verb.
        ("I finally told him: I moved to Berlin", [("lives_in", "Berlin")]),
        ("I stood up and said: I live in Porto now", [("lives_in", "Porto")]),
        ("我喜欢看小说，我住在北京", [("likes", "看小说"), ("lives_in", "北京")]),
        ("我说：我喜欢摇滚", [("likes", "摇滚")]),
        # Partners by name; two facts joined by "and".
        ("my girlfriend is Sam", [("partner", "Sam")]),
        ("my girlfriend's name is sam", [("partner", "sam")]),
        ("i'm dating sam", [("partner", "sam")]),  # chat is typed in lower case
        ("My wife is Élodie", [("partner", "Élodie")]),
        ("I'm married to Łukasz", [("partner", "Łukasz")]),
        ("我老公叫张德生", [("partner", "张德生")]),
        ("I work at the Ministry and I'm dating Jordan", [("works_at", "Ministry"), ("partner", "Jordan")]),
        ("我女朋友叫小红", [("partner", "小红")]),
        ("my job is nursing", [("job", "nursing")]),
        ("I like rock and roll", [("likes", "rock and roll")]),
        ("I moved to the US", [("lives_in", "US")]),
        ("I moved to New York last year", [("lives_in", "New York")]),
        ("i moved to berlin", [("lives_in", "berlin")]),  # all lower case: a name cannot be told
        ("I'm at home right now", [("located_at", "home")]),
        ("I work at the hospital", [("works_at", "hospital")]),
    ],
)  # fmt: skip
def test_the_authors_own_words_still_state_their_facts(text: str, facts: list[tuple[str, str]]) -> None:
    assert _facts(text) == facts


def test_a_quote_or_relayed_moment_makes_no_scene_of_the_authors() -> None:
    for text in (
        "> I decided to quit my job\nlol no you didn't",
        "> I got my PhD today\ncongrats Alice!",
        "Alice told me: I decided to quit my job at the bank",
        "小明说：我决定辞职了",
        "> please remember that I'm allergic to peanuts\nlol ok",
    ):
        assert candidates(text) == [], text
    for text in ("I looked at my boss and said, I decided to quit my job.", "@team: I got promoted today!"):
        assert candidates(text), text
    own = candidates("Mom told me I'm adopted, so I decided to find my birth parents")
    assert [c.type for c in own] == ["decision"]
    assert without_relayed("> quoted\nmine") == "mine"


@pytest.mark.slow
async def test_a_friend_s_relayed_move_does_not_replace_where_the_author_lives(tmp_path: Path) -> None:
    """End to end on the real model: Bob's own city holds, the quoted decision is no scene of his."""
    said = [
        ("b1", "I live in Lisbon, been here five years"),
        ("b2", "Alice told me: I moved to Berlin last week"),
        ("b3", "小明说：我住在北京"),
        ("b4", "> I decided to quit my job\nlol no you didn't"),
        ("b5", "my girlfriend is Sam"),
        ("b6", "my girlfriend is moving to Berlin next month"),
    ]
    async with open_memory(tmp_path / "m", real_model=True) as mem:
        for minutes, (message_id, text) in enumerate(said):
            ts = (T0 + timedelta(minutes=minutes)).isoformat()
            await mem.ingest(msg(message_id, text, user="bob", chat="general", ts=ts))
        facts = (await mem.call_tool("memory_facts", {"user_id": "bob"}))["facts"]
        active = {(f["relation"], f["object"]) for f in facts if f["status"] == "active"}
        assert active == {("lives_in", "Lisbon"), ("partner", "Sam")}, facts
        scenes = [r for r in await mem.store.recent(Scope(user_id="bob"), limit=50) if r.kind == "scene"]
        assert scenes == [], [s.text for s in scenes]
