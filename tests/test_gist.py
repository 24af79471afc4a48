"""A message's vector is made of what it says, without the small talk around it; the keyword
index and what recall returns keep the whole message."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from narrmem_plugins.triage.gist import gist, is_small_talk

from narrmem import hookimpl
from narrmem.ingest import attributed
from narrmem.models import Message, Scope
from narrmem.testing import open_memory

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)
CLEAR_CASES = [
    (
        "Hey Jon! Thanks so much, you're the best! Haha. I adopted a little puppy from the shelter "
        "yesterday. Wow, so cool!",
        "What pet did Maria get?",
    ),
    (
        "Thanks, Mel! Congrats on the new job, so happy for you! I finally signed up for pottery "
        "classes on Tuesdays. See you soon!",
        "What class did Maria sign up for?",
    ),
]
NEWS = (
    "Hey John, been a few days! Thanks for asking. "
    "I donated my old car to the homeless shelter I volunteer at. Wow, haha!"
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (NEWS, "Hey John, been a few days! I donated my old car to the homeless shelter I volunteer at."),
        ("Thanks, Mel! My friends and mentors are my rocks. 😊", "My friends and mentors are my rocks."),
        ("Congrats!! We moved to Lisbon last week.", "We moved to Lisbon last week."),
        # A short sentence that answers is not small talk, whatever word it opens with.
        ("No, I'm allergic to nuts. Thanks for asking!", "No, I'm allergic to nuts."),
        ("Sure, I'll bring the cake. See you!", "Sure, I'll bring the cake."),
        # A number is not a sentence's end.
        ("I paid $3.50 for it. Haha!", "I paid $3.50 for it."),
        ("哈哈哈！我下个月搬去上海。我很开心。好的。", "我下个月搬去上海。我很开心。"),
    ],
)
def test_the_gist_leaves_out_the_small_talk_sentences(text: str, expected: str) -> None:
    assert gist(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "I donated my old car to the homeless shelter.",  # one sentence: it is all it says
        "I went hiking. It rained all day.",  # nothing to leave out
        "Wow! Thanks!",  # all small talk: the ignore layer's business, the vector keeps it whole
        "Thanks so much for the help with my thesis, I finally handed it in today!",
    ],
)
def test_a_message_with_nothing_to_leave_out_has_no_gist(text: str) -> None:
    assert gist(text) is None


def test_small_talk_is_short_and_opens_with_thanks_a_greeting_or_a_reaction() -> None:
    assert is_small_talk("Thanks, Caroline!")
    assert is_small_talk("Hey Jon!")
    assert is_small_talk("Good morning!")
    assert is_small_talk("See you tomorrow!")
    assert not is_small_talk("Thanks to my sister I finally found a flat in Porto.")
    assert not is_small_talk("Yes, I love it.")
    assert not is_small_talk("How was the concert?")


def message(text: str, message_id: str = "m1") -> dict[str, Any]:
    return {
        "text": text,
        "user_id": "maria",
        "chat_id": "c",
        "speaker": "Maria",
        "ts": T0,
        "message_id": message_id,
    }


@pytest.mark.asyncio
async def test_the_episode_vector_is_the_gists_and_keywords_and_recall_keep_the_whole_message(
    tmp_path: Path,
) -> None:
    async with open_memory(tmp_path / "m", real_model=True) as mem:
        [result] = await mem.ingest_many([message(NEWS)])
        assert result.stored
        episode = result.records[0]
        assert episode.id is not None and episode.text == NEWS
        whole = attributed(Message(**message(NEWS)))
        gist_text = attributed(Message(**message(NEWS)), gist(NEWS))
        assert episode.embed_text == whole  # the keyword index's text
        stored = (await mem.store.vectors([episode.id], Scope(user_id="maria")))[episode.id]
        [of_gist, of_whole] = await mem.embedder.embed([gist_text, whole])
        assert np.allclose(stored, of_gist, atol=1e-5)
        assert not np.allclose(stored, of_whole, atol=1e-3)
        # What the gist is for: where the small talk says much, a question about the news is
        # nearer the gist's vector than the whole message's (on the news above it is a wash).
        for text, question in CLEAR_CASES:
            said = Message(**message(text))
            [of_text_gist, of_text, asked] = await mem.embedder.embed(
                [attributed(said, gist(text)), attributed(said), question]
            )
            assert float(of_text_gist @ asked) > float(of_text @ asked) + 0.02, question
        # Words of the small talk alone are still searched, and recall returns the whole message.
        keyword_hits = await mem.store.search_keywords(Scope(user_id="maria"), "haha", 5)
        assert [mid for mid, _ in keyword_hits] == [episode.id]
        [hit] = await mem.recall("What did Maria give to the shelter?", user_id="maria", k=1, reinforce=False)
        assert hit.message_ids == ["m1"]
        assert "shelter" in hit.text and (hit.detail or hit.text).startswith("Hey John")


class EmbedTextRewriter:
    @hookimpl
    async def narrmem_before_store(self, records: list[Any]) -> None:
        records[0].embed_text = "Maria said she gave a car away"


@pytest.mark.asyncio
async def test_a_hook_that_rewrites_the_embed_text_gets_its_own_text_embedded(tmp_path: Path) -> None:
    async with open_memory(tmp_path / "m", real_model=True, plugins=[EmbedTextRewriter()]) as mem:
        [result] = await mem.ingest_many([message(NEWS)])
        episode = result.records[0]
        assert episode.id is not None
        stored = (await mem.store.vectors([episode.id], Scope(user_id="maria")))[episode.id]
        [own] = await mem.embedder.embed(["Maria said she gave a car away"])
        assert np.allclose(stored, own, atol=1e-5)


@pytest.mark.asyncio
async def test_gist_vectors_off_embeds_the_whole_message(tmp_path: Path) -> None:
    triage = {"triage": {"gist_vectors": False}}
    async with open_memory(tmp_path / "m", real_model=True, plugin=triage) as mem:
        [result] = await mem.ingest_many([message(NEWS)])
        episode = result.records[0]
        assert episode.id is not None
        stored = (await mem.store.vectors([episode.id], Scope(user_id="maria")))[episode.id]
        [of_whole] = await mem.embedder.embed([attributed(Message(**message(NEWS)))])
        assert np.allclose(stored, of_whole, atol=1e-5)
