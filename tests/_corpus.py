"""A small, varied chat corpus and paraphrased questions for the real-model tests."""

from __future__ import annotations

from typing import Any

from _helpers import msg


def _said(user: str, chat: str, lines: list[tuple[str, str]], **extra: Any) -> list[dict[str, Any]]:
    """Messages (id, text) one person sent in one chat."""
    return [msg(message_id, text, user=user, chat=chat, **extra) for message_id, text in lines]


MESSAGES: list[dict[str, Any]] = [
    *_said(
        "alice",
        "dm-alice",
        [
            ("a1", "I just moved to Lisbon last week, my new apartment is still full of boxes."),
            ("a2", "I decided to quit my job at the bank after ten years."),
            ("a3", "My cat Miso knocked over the plant again this morning."),
            ("a4", "I'm learning to play the cello, lessons are on Thursday evenings."),
            ("a5", "My sister is getting married next spring and I'm giving a speech."),
            ("a6", "I've been vegetarian since 2019, mostly for environmental reasons."),
            ("a7", "The dentist said I need a root canal on my back molar."),
            ("a8", "I'm reading a biography of Charles Darwin and can't put it down."),
            ("a9", "ok"),
        ],
    ),
    *_said(
        "bob",
        "dm-bob",
        [
            ("b1", "I twisted my ankle during the trail run on Saturday."),
            ("b2", "I withdrew from the Berlin marathon because of the injury."),
            ("b3", "My daughter starts kindergarten in September."),
            ("b4", "I'm saving up to buy a used camper van for road trips."),
            ("b5", "Our team finally shipped the billing system rewrite at work."),
        ],
    ),
    *_said("wei", "dm-wei", [("w1", "我喜欢摇滚乐，尤其是九十年代的乐队。")], ts="2026-05-05T19:30:00+08:00"),
    *_said("wei", "dm-wei", [("w2", "我最近在做一个开源的天气预报项目。")], ts="2026-05-06T19:30:00+08:00"),
    *_said("alice", "guild-books", [("g1", "For next month the club will read The Left Hand of Darkness.")]),
    *_said("bob", "guild-books", [("g2", "Can someone bring snacks to the meeting on Friday?")]),
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
