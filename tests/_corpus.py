"""A small, varied chat corpus and paraphrased questions for the real-model tests."""

from __future__ import annotations

from typing import Any

from _helpers import msg

MESSAGES: list[dict[str, Any]] = [
    msg(
        "a1",
        "I just moved to Lisbon last week, my new apartment is still full of boxes.",
        user="alice",
        chat="dm-alice",
    ),
    msg("a2", "I decided to quit my job at the bank after ten years.", user="alice", chat="dm-alice"),
    msg("a3", "My cat Miso knocked over the plant again this morning.", user="alice", chat="dm-alice"),
    msg(
        "a4",
        "I'm learning to play the cello, lessons are on Thursday evenings.",
        user="alice",
        chat="dm-alice",
    ),
    msg(
        "a5",
        "My sister is getting married next spring and I'm giving a speech.",
        user="alice",
        chat="dm-alice",
    ),
    msg(
        "a6",
        "I've been vegetarian since 2019, mostly for environmental reasons.",
        user="alice",
        chat="dm-alice",
    ),
    msg("a7", "The dentist said I need a root canal on my back molar.", user="alice", chat="dm-alice"),
    msg(
        "a8",
        "I'm reading a biography of Charles Darwin and can't put it down.",
        user="alice",
        chat="dm-alice",
    ),
    msg("a9", "ok", user="alice", chat="dm-alice"),
    msg("b1", "I twisted my ankle during the trail run on Saturday.", user="bob", chat="dm-bob"),
    msg("b2", "I withdrew from the Berlin marathon because of the injury.", user="bob", chat="dm-bob"),
    msg("b3", "My daughter starts kindergarten in September.", user="bob", chat="dm-bob"),
    msg("b4", "I'm saving up to buy a used camper van for road trips.", user="bob", chat="dm-bob"),
    msg("b5", "Our team finally shipped the billing system rewrite at work.", user="bob", chat="dm-bob"),
    msg(
        "w1",
        "我喜欢摇滚乐，尤其是九十年代的乐队。",
        user="wei",
        chat="dm-wei",
        ts="2026-05-05T19:30:00+08:00",
    ),
    msg(
        "w2", "我最近在做一个开源的天气预报项目。", user="wei", chat="dm-wei", ts="2026-05-06T19:30:00+08:00"
    ),
    msg(
        "g1", "For next month the club will read The Left Hand of Darkness.", user="alice", chat="guild-books"
    ),
    msg("g2", "Can someone bring snacks to the meeting on Friday?", user="bob", chat="guild-books"),
]

# (question, scope, message id of the memory that answers it): paraphrases, not quotes.
QUESTIONS: list[tuple[str, dict[str, str], str]] = [
    ("Where did she relocate to?", {"user_id": "alice"}, "a1"),
    ("Did she leave her employer?", {"user_id": "alice"}, "a2"),
    ("What pet does she have?", {"user_id": "alice"}, "a3"),
    ("Which musical instrument is she studying?", {"user_id": "alice"}, "a4"),
    ("Is anyone in her family having a wedding?", {"user_id": "alice"}, "a5"),
    ("Does she eat meat?", {"user_id": "alice"}, "a6"),
    ("Any problems with her teeth?", {"user_id": "alice"}, "a7"),
    ("Which scientist's life story is she into?", {"user_id": "alice"}, "a8"),
    ("What happened to his foot?", {"user_id": "bob"}, "b1"),
    ("Is he still competing in the German race?", {"user_id": "bob"}, "b2"),
    ("When does his child begin school?", {"user_id": "bob"}, "b3"),
    ("What vehicle does he want to purchase?", {"user_id": "bob"}, "b4"),
    ("What did his company release?", {"user_id": "bob"}, "b5"),
    ("Which novel is the group going to discuss?", {"chat_id": "guild-books"}, "g1"),
    ("Who brings food on Friday?", {"chat_id": "guild-books"}, "g2"),
]
