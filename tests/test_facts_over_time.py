"""What a bot is told about someone stays true as their life changes: an update said with a full
stop is read ("I'm in Osaka now.", "I just turned 31!", 我在阿里巴巴工作。), leaving a job, a home or
a partner retires the fact that held ("I quit my job at Google", "Sam and I broke up", 我不住在北京了),
and a move told as the past of a life ("I moved to Berlin 10 years ago") does not replace where
someone lives now. Before, each of these left the old value as the current one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from narrmem_plugins.graph import value_history
from narrmem_plugins.graph.extract import extract

from narrmem.clock import ManualClock
from narrmem.testing import open_memory

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        ("I'm in Osaka now.", [("located_at", "Osaka")]),
        ("I'm not in Tokyo anymore.", [("left", "Tokyo")]),
        ("I just turned 31!", [("age", "31")]),
        ("My age is 31.", [("age", "31")]),
        ("I'm 30 :-)", [("age", "30")]),
        ("我在阿里巴巴工作。", [("works_at", "阿里巴巴")]),
        ("我今年31岁了！", [("age", "31")]),
        ("我是一名医生。", [("job", "医生")]),
        ("I live in Porto 😊", [("lives_in", "Porto")]),
        ("I quit my job at Google last week", [("no_longer_works_at", "Google")]),
        ("I don't work at Google anymore.", [("no_longer_works_at", "Google")]),
        ("I got laid off from Meta", [("no_longer_works_at", "Meta")]),
        ("I quit my job at Amazon after 5 years", [("no_longer_works_at", "Amazon")]),
        ("Sam and I broke up last week.", [("broke_up_with", "Sam")]),
        ("I'm not dating Sam anymore.", [("broke_up_with", "Sam")]),
        ("I don't live in Lisbon anymore.", [("moved_away_from", "Lisbon")]),
        ("我从腾讯离职了", [("no_longer_works_at", "腾讯")]),
        ("我和小红分手了", [("broke_up_with", "小红")]),
        ("我不住在北京了", [("moved_away_from", "北京")]),
        # Not a job, a partner or a home left, and not now; not workplaces.
        ("I work for a living", []),
        ("I'm working for a promotion", []),
        ("He and I work at the same company", []),
        ("I work at Procter and Gamble", [("works_at", "Procter and Gamble")]),
        ("i'm dating sam now", [("partner", "sam")]),
        ("sam and i broke up", [("broke_up_with", "sam")]),
        ("I'm not dating mark anymore", [("broke_up_with", "mark")]),
        ("I left my keys at home", []),
        ("I left Tom a message.", []),
        ("I left Paris last week.", []),
        ("I don't work for free", []),
        ("I'm not seeing any improvement.", []),
        ("I'm no longer with Google", []),
        ("He and I broke up", []),
        ("I quit smoking", []),
        ("the kids and I broke up the fight", []),
        # "I'm 30 and I live in Paris": two facts; "Alex and I live in Austin": the speaker's home.
        ("I'm 30 and I live in Paris.", [("age", "30"), ("lives_in", "Paris")]),
        ("Alex and I live in Austin", [("lives_in", "Austin")]),
        ("I live in Tokyo (for now).", [("lives_in", "Tokyo")]),
        ("I moved to Porto a few months ago", [("lives_in", "Porto")]),
        # The place, not what follows it ("Google as an engineer" and "Google" were two employers).
        ("I work at Google as an engineer", [("works_at", "Google")]),
        ("I'm in Tokyo right now for a conference", [("located_at", "Tokyo")]),
        ("I live in Lisbon until June", [("lives_in", "Lisbon")]),
        ("I started a new job at a Porto startup as a designer.", [("works_at", "Porto startup")]),
    ],
)
def test_what_changes_a_life_is_read(text: str, facts: list[tuple[str, str]]) -> None:
    assert [(f.relation, f.object) for f in extract(text)] == facts


@pytest.mark.parametrize(
    ("text", "fact", "years"),
    [
        ("Funny, I moved to Berlin 10 years ago for a girl", ("lives_in", "Berlin"), 10),
        ("I moved to the US two decades ago", ("lives_in", "US"), 20),
        ("I moved to Berlin with my parents when I was 8", ("lives_in", "Berlin"), 10),
        ("I got a job at Google back in 2015", ("works_at", "Google"), 10),
        ("I started a new job at Meta two years ago.", ("works_at", "Meta"), 2),
        ("I live in Paris - moved here as a student", ("lives_in", "Paris"), 0),
        ("I started a new job at Meta in 2025", ("works_at", "Meta"), 0),
    ],
)
def test_a_one_value_fact_told_as_the_past_is_dated_then(
    text: str, fact: tuple[str, str], years: float
) -> None:
    """Written as of when it held, it replaces nothing said since (the writer keeps a value said
    before a later one as history): the move of ten years ago is where they lived, or still live
    when nothing else was said. As a guess it named "Google back in 2015" and replaced guesses."""
    [found] = extract(text)
    assert (found.relation, found.object, found.years_ago) == (*fact, years) and not found.speculative


async def _tell(mem: Any, clock: ManualClock, user: str, said: list[tuple[int, str]]) -> None:
    """Each message on its day (days after T0), in a direct chat."""
    for n, (day, text) in enumerate(said):
        clock.set(T0 + timedelta(days=day))
        await mem.ingest(msg(f"{user}{n}", text, user=user, chat="dm", ts=clock.now().isoformat()))


@pytest.mark.slow
async def test_the_facts_a_bot_is_told_follow_the_changes(tmp_path: Path) -> None:
    said = [
        (0, "I live in Porto and I work at Google."),
        (1, "I'm currently in Tokyo for a conference"),
        (2, "My girlfriend is Sam."),
        (3, "I'm 30."),
        (90, "I quit my job at Google last week"),
        (91, "I'm in Osaka now."),
        (92, "Sam and I broke up."),
        (200, "Funny, I moved to Berlin 10 years ago for a girl"),
        (380, "I just turned 31!"),
    ]
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        await _tell(mem, clock, "erin", said)
        facts = (await mem.call_tool("memory_facts", {"user_id": "erin"}))["facts"]
        said = {
            (f["relation"], f["object"]) for f in facts if f["status"] == "active" and not f["speculative"]
        }
        assert {("lives_in", "Porto"), ("located_at", "Osaka"), ("age", "31")} <= said
        assert not {("works_at", "Google"), ("partner", "Sam"), ("lives_in", "Berlin"), ("age", "30")} & said
        # The move of ten years ago is history from the start: dated then, before Porto was said.
        homes = await value_history(mem, user_id="erin", relation="lives_in")
        assert [(h.object, h.current) for h in homes] == [("Porto", True), ("Berlin", False)]
        block = (await mem.turn_context("hi", user_id="erin", chat_id="dm", private=True))["rendered"]
        lines = [line.split(" (said ")[0] for line in block.splitlines()]
        assert "- user works_at Google" not in lines and "- user partner Sam" not in lines
        assert "- user lives_in Porto" in lines and "- user no_longer_works_at Google" in lines
        # Where she was a year ago is not where she is; each fact says when it was said.
        assert "- user located_at Osaka" not in lines
        assert "- user age 31 (said 2027-01-20)" in block.splitlines()


@pytest.mark.slow
async def test_a_question_about_now_puts_the_value_that_holds_before_the_one_replaced(tmp_path: Path) -> None:
    """ "Who is Kim dating now?" a year on: the earlier partner's message matched the question's
    word ("dating") and came first; the job the same ("work")."""
    said = [
        (0, "I work at Google as an engineer, I work at the Google campus in Zurich."),
        (1, "I'm dating Alex, we met at a climbing gym."),
        (200, "I started a new job at Meta, first week done!"),
        (210, "My boyfriend is Jordan, we moved in together."),
    ]
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        await _tell(mem, clock, "kim", said)
        clock.set(T0 + timedelta(days=360))
        dating = await mem.recall("Who is Kim dating now?", user_id="kim", k=3, reinforce=False)
        assert dating[0].text.startswith("My boyfriend is Jordan")
        # A question about the past is answered by the value replaced, not lowered for it.
        before = await mem.recall("Where did Kim work before Meta?", user_id="kim", k=3, reinforce=False)
        google = next(h for h in before if h.text.startswith("I work at Google"))
        assert google.why is not None and "recall_facts" not in google.why.boosts
        work = await mem.recall("Where does Kim work now?", user_id="kim", k=3, reinforce=False)
        texts = [hit.text for hit in work]
        assert texts.index("I started a new job at Meta, first week done!") < next(
            i for i, t in enumerate([*texts, "I work at Google"]) if t.startswith("I work at Google")
        )


@pytest.mark.slow
async def test_a_new_home_job_and_partner_are_not_crowded_out_by_likes(tmp_path: Path) -> None:
    """Twenty-two likes said twice each, then a move, a job and a partner: the block held twenty
    likes and none of the three (ranked by how often a fact was said before how recent)."""
    likes = [
        "techno",
        "sushi",
        "chess",
        "hiking",
        "jazz",
        "ramen",
        "tennis",
        "poetry",
        "cycling",
        "tea",
        "yoga",
    ]
    likes += [
        "opera",
        "pottery",
        "surfing",
        "sailing",
        "anime",
        "baking",
        "karaoke",
        "salsa",
        "golf",
        "rugby",
        "ska",
    ]
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        n = 0
        for _ in range(2):
            for thing in likes:
                n += 1
                await mem.ingest(
                    msg(f"l{n}", f"I love {thing}", user="ivy", chat="dm", ts=clock.now().isoformat())
                )
        clock.set(T0 + timedelta(days=300))
        for text in ("I moved to Porto", "I work at Meta now", "My boyfriend is Jordan"):
            n += 1
            await mem.ingest(msg(f"l{n}", text, user="ivy", chat="dm", ts=clock.now().isoformat()))
        block = (await mem.turn_context("hey", user_id="ivy", chat_id="dm", private=True))["rendered"]
        for fact in ("lives_in Porto", "works_at Meta", "partner Jordan"):
            assert f"- user {fact} (said " in block, block


@pytest.mark.slow
async def test_a_summary_dates_what_it_tells_and_ends_with_the_latest(tmp_path: Path) -> None:
    """Nine months after a move, the most abstract summary told the old life alone, undated, as
    the present: "I live in Lisbon… I work at Banco Azul"."""
    old = [
        "I live in Lisbon, in a small flat in Alfama.",
        "Lisbon trams are my daily commute to the bank.",
        "I work at Banco Azul as an analyst in Lisbon.",
        "Weekend in Lisbon: custard tarts and fado again.",
        "My girlfriend Sam and I walked along the Lisbon riverside.",
        "Sam and I adopted a cat in our Lisbon flat.",
        "Another long day at Banco Azul, spreadsheets forever.",
        "Lisbon is so hilly, my legs hurt from the walk home.",
        "Sam cooked bacalhau tonight in our Lisbon kitchen.",
        "The bank promoted me to senior analyst at Banco Azul.",
        "Lisbon summer heat is brutal in the flat.",
        "Sam and I are planning our anniversary dinner in Lisbon.",
    ]
    new = ["Sam and I broke up, I moved to Porto alone last week.", "Porto feels like home already."]
    clock = ManualClock(T0)
    async with open_memory(tmp_path / "m", real_model=True, clock=clock) as mem:
        for n, text in enumerate(old + new):
            await mem.ingest(msg(f"s{n}", text, user="mia", chat="dm", ts=clock.now().isoformat()))
            clock.advance(days=20)
        top = await mem.summary(user_id="mia", depth=1)
        assert top["retelling"].startswith("[2026-01 – 2026-09] ")
        assert top["retelling"].endswith('"Porto feels like home already."')
        assert top["retelling"].count("Porto feels like home") == 1
        assert "Latest: [2026-09-22] " in top["retelling"]
