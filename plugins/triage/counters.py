"""Layer 2 counters: topics (by meaning), moods, value judgements and habits, per user.

Counts are derived from stored memories rather than kept in a table of their own: a topic's
count is the number of this user's episodes close to this one in meaning, a mood's count the
number of this week's episodes that state it. So forgetting a user, importing a store or
replaying a chat leaves the counts right, and each count carries the message ids behind it.
A count is the user's, across chats; what a count made by a message says in words (a topic's
label) and the message ids it names come from that message's chat only, since the ingest result
and the trigger go to that chat.
Counts are taken as of the message (memories with a larger id do not count), so a batch ingest
counts exactly as one-by-one ingest does.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
from narrmem_plugins.triage.emotions import moods_of
from narrmem_plugins.triage.impacts import add_impact
from narrmem_plugins.triage.options import TriageOptions
from narrmem_plugins.triage.scene import describe_time, scene_record
from narrmem_plugins.triage.topics import content_bigrams, shares_words, topic_words

from narrmem.models import (
    MemoryRecord,
    Message,
    PatternCount,
    SceneDraft,
    Scope,
)
from narrmem.text import character_end, cjk_count
from narrmem.view import MemoryView

_ORDINAL = {1: "st", 2: "nd", 3: "rd"}
SAME_SCENE = 0.95  # cosine above which a later scene restates an earlier one
CJK_TOPIC_SIMILARITY = 0.3
# The most similar earlier memories a topic count reads: when all of them are on the topic, the
# count is a lower bound ("at least 64 times"); the pattern readout counts further.
TOPIC_NEIGHBOURS = 64
# How far a topic count searches past the messages written after it (a batch of an import is
# written before its counts are made; a batch holds at most a few hundred records).
MAX_TOPIC_SEARCH = 2048
PATTERN_TYPE = "pattern"  # meta["type"] of the scene a repeated mood becomes
_MOOD_WORDS = {
    "tired": "tired",
    "stressed": "stressed",
    "anxious": "anxious",
    "sad": "down",
    "angry": "angry",
    "lonely": "lonely",
    "happy": "happy",
}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else _ORDINAL.get(n % 10, "th")
    return f"{n}{suffix}"


def _count(
    result: Any,
    message: Message,
    kind: str,
    label: str,
    members: list[MemoryRecord],
    *,
    count: int,
    threshold: int,
    suggestion: str,
    at_least: bool = False,
    quiet: float | None = None,
) -> None:
    """Put a count in the ingest result, and a trigger event when it just reached its threshold.
    The count and its times are the user's, across chats; the message ids behind it are those of
    the message's chat only: the result and the event go to that chat's readers."""
    message_ids = [mid for r in members if r.chat_id == message.chat_id for mid in r.message_ids]
    pattern = PatternCount(
        kind=kind,
        label=label,
        count=count,
        message_ids=message_ids,
        times=[r.created_at for r in members],
        at_least=at_least,
        quiet_days_before=quiet,
        memory_ids=[r.id for r in members if r.id is not None],
    )
    result.counts.append(pattern)
    if count == threshold:
        result.triggers.append(pattern.event(message, suggestion=suggestion))


class Counters:
    def __init__(self, options: TriageOptions) -> None:
        self.options = options

    async def update(
        self, memory: MemoryView, message: Message, stored: list[tuple[MemoryRecord, np.ndarray]], result: Any
    ) -> None:
        """After a message is stored (its records with their vectors, the episode first): count its
        moods, topic, habit and values, and link its scenes."""
        (episode, episode_vector), *others = stored
        user = Scope(tenant=message.tenant, user_id=message.user_id)
        await self._moods(memory, message, episode, user, result)
        members, label = await self._topic(memory, message, episode, episode_vector, user, result)
        self._habit(message, episode, members, label, result)
        for record, vector in others:
            if record.kind == "scene":
                if record.meta.get("type") == "value":
                    await self._values(memory, message, record, vector, user, result)
                # A link writes this scene's words into the earlier scene: only within one chat,
                # or a chat's readers would see what the user said elsewhere.
                chat = Scope(tenant=message.tenant, user_id=message.user_id, chat_id=message.chat_id)
                await self._link(memory, record, vector, chat, result)

    # --- moods -----------------------------------------------------------------------------

    async def _moods(
        self, memory: MemoryView, message: Message, episode: MemoryRecord, user: Scope, result: Any
    ) -> None:
        moods = moods_of(episode.meta)
        if not moods:
            return
        window = timedelta(days=self.options.emotion_window_days)
        since = message.ts - window
        bound = _as_of(message, memory.clock.now(), window)
        for mood in moods:
            # Only the records that state this mood: a heavy user's week is thousands of messages.
            stated = await memory.store.recent(
                user, since=since, kinds=["episode"], limit=10_000, meta_has=("emotions", mood)
            )
            said = [r for r in stated if _before(r, episode, bound) and mood in moods_of(r.meta)]
            # The message itself always counts, even when it is older than what `recent` returned.
            said = [*sorted(said, key=lambda r: r.id or 0), episode]
            count = len(said)
            if count >= 2:
                result.notes.append(f"said '{_MOOD_WORDS[mood]}' for the {ordinal(count)} time this week")
            _count(
                result,
                message,
                "emotion",
                mood,
                said,
                count=count,
                threshold=self.options.emotion_threshold,
                suggestion=(
                    f"You've mentioned feeling {_MOOD_WORDS[mood]} {count} times this week. "
                    "Is something wearing you down?"
                ),
            )
            if count == self.options.emotion_threshold:
                if self.options.promote_patterns:
                    await self._promote(memory, message, mood, count, said)

    async def _promote(
        self, memory: MemoryView, message: Message, mood: str, count: int, said: list[MemoryRecord]
    ) -> None:
        """A repeated mood becomes a scene of its own: "said 'tired' 3 times this week". The count
        is the user's, but the scene belongs to this chat: it quotes and cites only this chat's
        messages (a chat's readers must not see what the user said elsewhere)."""
        core = f"said '{_MOOD_WORDS[mood]}' {count} times this week"
        said = [r for r in said if r.chat_id == message.chat_id]
        draft = SceneDraft(
            time=describe_time(message.ts, "en"),
            scene="A pattern across the week: " + " / ".join(r.text[:60] for r in said[-3:]),
            vibe=_MOOD_WORDS[mood],
            core=core,
            category="emotion_change",
            tags=["pattern", mood],
        )
        scene = scene_record(
            message,
            draft,
            embed_text=f"{message.speaker or 'the user'} {core}",
            importance=0.6,
            stored_at=memory.clock.now(),
            message_ids=[mid for r in said for mid in r.message_ids],
            meta={"type": PATTERN_TYPE},
        )
        if await _promoted_already(memory, scene):
            return
        vectors = await memory.embedder.embed([scene.index_text])
        await memory.store.add([scene], vectors)

    # --- topics and habits ------------------------------------------------------------------

    async def _topic(
        self,
        memory: MemoryView,
        message: Message,
        episode: MemoryRecord,
        vector: np.ndarray,
        user: Scope,
        result: Any,
    ) -> tuple[list[MemoryRecord], str | None]:
        """The earlier mentions of this message's topic (itself included) and the topic's label
        when it was counted (a heavy user's topic has dozens of mentions: named once)."""
        nearest = await self._neighbours(memory, user, vector, episode)
        # For Chinese the (English) model's cosine is weak evidence: shared words decide instead.
        threshold = CJK_TOPIC_SIMILARITY if cjk_count(episode.text) else self.options.topic_similarity
        close = [mid for mid, score in nearest if score >= threshold]
        # Every memory the count read is close: there may be more beyond them, and reading them
        # all would make a heavy user's favourite topic cost a record read per mention.
        at_least = len(nearest) >= TOPIC_NEIGHBOURS and len(close) == len(nearest)
        found = await memory.store.get(close, user)
        if episode.id is not None:
            # Itself, even when the nearest are all earlier copies of it (equal vectors, and ties
            # go to the older): someone who says the very same thing often.
            found.setdefault(episode.id, episode)
        window = timedelta(days=self.options.topic_window_days)
        since = message.ts - window
        bound = _as_of(message, memory.clock.now(), window)
        earlier = [
            r
            for r in found.values()
            if r.kind == "episode" and _before(r, episode, bound) and self.same_topic(episode, r)
        ]
        # The mention before this one however long ago (the window counts, a return measures
        # the silence: a topic back after 91 quiet days had no earlier mention in a 90-day window).
        previous = max(
            (r for r in earlier if r.created_at <= episode.created_at),
            key=lambda r: (r.created_at, r.id or 0),
            default=None,
        )
        quiet = (
            None if previous is None else (episode.created_at - previous.created_at).total_seconds() / 86_400
        )
        members = sorted((r for r in [*earlier, episode] if r.created_at >= since), key=lambda r: r.id or 0)
        count = len(members)
        alike = members if count >= 2 or previous is None else [previous, episode]
        shared_moods = set.intersection(*(set(moods_of(r.meta)) for r in alike))
        if len(alike) < 2 or shared_moods:
            # Messages alike because they state the same mood are the mood counter's business.
            return members, None
        # Named with the words of this chat's mentions: the label goes to this chat's readers,
        # who must not read what the user said elsewhere (the count is the user's).
        label = topic_label(_in_chat(alike, message), self.options.names)
        if count < 2:
            # Back after longer than the window: no count to speak of, but a return to tell.
            _count(result, message, "topic", label, members, count=1, threshold=0, suggestion="", quiet=quiet)
            return members, None
        if at_least:
            result.notes.append(f"topic '{label}' mentioned at least {count} times")
        else:
            result.notes.append(f"topic '{label}' mentioned for the {ordinal(count)} time")
        _count(
            result,
            message,
            "topic",
            label,
            members,
            count=count,
            threshold=self.options.topic_threshold,
            suggestion=f"This is the {ordinal(count)} time '{label}' comes up. Want to dig into it?",
            at_least=at_least,
            quiet=quiet,
        )
        return members, label

    async def _neighbours(
        self, memory: MemoryView, user: Scope, vector: np.ndarray, episode: MemoryRecord
    ) -> list[tuple[int, float]]:
        """The user's ``TOPIC_NEIGHBOURS`` memories most similar to ``vector`` among those written
        up to ``episode``. In a batch the messages after it are written already and may fill the
        nearest places: the search looks past them, so a message imported with its chat counts
        what it counted arriving alone."""
        k = TOPIC_NEIGHBOURS
        while True:
            nearest = await memory.store.search_vectors(user, vector, k)
            earlier = [(mid, score) for mid, score in nearest if mid <= (episode.id or 0)]
            if len(earlier) >= TOPIC_NEIGHBOURS or len(nearest) < k or k >= MAX_TOPIC_SEARCH:
                return earlier[:TOPIC_NEIGHBOURS]
            k = min(MAX_TOPIC_SEARCH, 2 * k)

    def same_topic(self, episode: MemoryRecord, other: MemoryRecord) -> bool:
        """Close in meaning is not enough: the two must also share words that carry meaning, so
        greetings, the bot's name and media placeholders never make a topic."""
        if other.id == episode.id:
            return True
        # Chinese, Japanese and Korean by their bigrams. Thai and its neighbours make no topic:
        # the model reads every Thai sentence as the same (cosine 1.0), and their shared bigrams
        # (มา, "come") made one topic of unrelated messages.
        if cjk_count(episode.text) or cjk_count(other.text):
            return _same_bigrams(episode.text, other.text)
        return shares_words(episode.text, other.text, self.options.names)

    def _habit(
        self,
        message: Message,
        episode: MemoryRecord,
        members: list[MemoryRecord],
        topic: str | None,
        result: Any,
    ) -> None:
        weekday = episode.created_at.weekday()
        same_day = [r for r in members if r.created_at.weekday() == weekday]
        weeks = sorted({tuple(r.created_at.isocalendar())[:2] for r in same_day})
        if len(weeks) < 2:
            return
        day = describe_time(episode.created_at, "en").split()[0]
        if topic is None:
            topic = topic_label(_in_chat(members, message), self.options.names)
        label = f"{topic} on {day}s"
        this_week = tuple(episode.created_at.isocalendar())[:2]
        # Fire once: on the first mention of the week that makes the count.
        first_of_week = min(
            (r.id or 0) for r in same_day if tuple(r.created_at.isocalendar())[:2] == this_week
        ) == (episode.id or 0)
        _count(
            result,
            message,
            "habit",
            label,
            same_day,
            count=len(weeks),
            threshold=self.options.habit_weeks if first_of_week else -1,
            suggestion=f"It's {day} again: {len(weeks)} weeks running this comes up. A ritual?",
        )

    # --- values and links -------------------------------------------------------------------

    async def _values(
        self,
        memory: MemoryView,
        message: Message,
        scene: MemoryRecord,
        vector: np.ndarray,
        user: Scope,
        result: Any,
    ) -> None:
        similar = await _similar_scenes(memory, scene, vector, user, self.options.value_similarity)
        values = [r for r in similar if r.meta.get("type") == "value"] + [scene]
        count = len(values)
        label = _core(scene)[:80]
        _count(
            result,
            message,
            "value",
            label,
            values,
            count=count,
            threshold=self.options.value_threshold,
            suggestion="This value keeps guiding them; it may help frame the next decision.",
        )

    async def _link(
        self, memory: MemoryView, scene: MemoryRecord, vector: np.ndarray, chat: Scope, result: Any
    ) -> None:
        """Fill the Impact of the earlier scene of this user in this chat (``chat``) this one
        builds on.

        A decision that cites a value rarely paraphrases it, so the link score is the cosine plus
        a bonus when the two cores share a content word ("friends"); the best score above
        ``link_similarity`` wins.
        """
        if scene.meta.get("type") == PATTERN_TYPE:
            return
        own_words = set(topic_words([_core(scene)], limit=20, names=self.options.names))
        scored = []
        for record, similarity in await _scored_scenes(
            memory, scene, vector, chat, self.options.link_similarity - 0.15
        ):
            if record.meta.get("type") == PATTERN_TYPE or SceneDraft.of(record) is None:
                continue
            if similarity >= SAME_SCENE:
                continue  # a restatement, not a moment that builds on the earlier one
            shared = own_words & set(topic_words([_core(record)], limit=20, names=self.options.names))
            score = similarity + (0.15 if shared else 0.0)
            if score >= self.options.link_similarity:
                scored.append((score, record))
        if not scored:
            return
        target = max(scored, key=lambda item: item[0])[1]
        fields = SceneDraft.of(target)
        assert fields is not None  # filtered above
        await add_impact(memory, target, fields, scene, _core(scene))
        result.notes.append(f"scene builds on scene {target.id}")


async def _promoted_already(memory: MemoryView, scene: MemoryRecord) -> bool:
    """Whether this pattern's scene is stored: the hooks of its message ran before, in a process
    that stopped before their record went, and run again at this open (it was written twice)."""
    chat = Scope(tenant=scene.tenant, user_id=scene.user_id, chat_id=scene.chat_id)
    ids = await memory.store.from_messages(scene.tenant, scene.chat_id, scene.message_ids[-1:])
    return any(
        r.kind == "scene" and r.meta.get("type") == PATTERN_TYPE and r.message_ids == scene.message_ids
        for r in (await memory.store.get(ids, chat)).values()
    )


async def _scored_scenes(
    memory: MemoryView, scene: MemoryRecord, vector: np.ndarray, scope: Scope, threshold: float
) -> list[tuple[MemoryRecord, float]]:
    """Earlier scenes in ``scope`` at least ``threshold`` close to ``scene``, closest first."""
    nearest = await memory.store.search_vectors(scope, vector, 32)
    scores = {mid: score for mid, score in nearest if score >= threshold and mid != scene.id}
    found = await memory.store.get(list(scores), scope)
    earlier = [r for r in found.values() if r.kind == "scene" and _not_after(r, scene)]
    return sorted(((r, scores[r.id or 0]) for r in earlier), key=lambda item: -item[1])


async def _similar_scenes(
    memory: MemoryView, scene: MemoryRecord, vector: np.ndarray, user: Scope, threshold: float
) -> list[MemoryRecord]:
    return [record for record, _ in await _scored_scenes(memory, scene, vector, user, threshold)]


def _in_chat(records: list[MemoryRecord], message: Message) -> list[str]:
    """The texts of ``records`` said in ``message``'s chat."""
    return [r.text for r in records if r.chat_id == message.chat_id]


def _core(scene: MemoryRecord) -> str:
    draft = SceneDraft.of(scene)
    return draft.core if draft is not None else scene.text


def _not_after(record: MemoryRecord, reference: MemoryRecord) -> bool:
    return (record.id or 0) <= (reference.id or 0)


def _as_of(message: Message, now: datetime, window: timedelta) -> datetime:
    """The latest time a mention counted with ``message`` may be dated: the clock's now, or the
    message's time if later (a mention dated ahead, a device clock running ahead, is not counted
    before its time, as the patterns' readout has it), and no later than the counting window
    after the message (one that arrives late counts the week it was said in, whose days after
    it the readout counts too). Up to now alone, a message of last year imported after this
    week's counted this week's: a "said 'tired' 3 times this week" scene dated a year ago quoted
    messages a year apart."""
    return min(max(now, message.ts), message.ts + window)


def _before(record: MemoryRecord, reference: MemoryRecord, bound: datetime) -> bool:
    """Written before ``reference``, and dated no later than ``bound`` (:func:`_as_of`)."""
    return _not_after(record, reference) and record.id != reference.id and record.created_at <= bound


def _same_bigrams(a: str, b: str) -> bool:
    """The embedding model reads English; for Chinese, Japanese and Korean, a shared topic must
    also share words, which are bigrams there (Korean and Japanese kana alone were compared by
    English words, none, and never made a topic)."""
    return a == b or len(content_bigrams(a) & content_bigrams(b)) >= 2


def topic_label(texts: list[str], names: frozenset[str] = frozenset()) -> str:
    """A short name for a topic: the content words most of its messages use (for Chinese, shared
    bigrams); never a greeting, a placeholder or the bot's name."""
    words = topic_words(texts, limit=2, names=names, min_share=0.5)
    if words:
        return " ".join(words)
    counts: dict[str, int] = {}
    for text in texts:
        for bigram in content_bigrams(text):
            counts[bigram] = counts.get(bigram, 0) + 1
    shared = sorted(counts, key=lambda b: (-counts[b], b))[:2]
    if not shared:
        return texts[0][: character_end(texts[0], 8)]
    # Two bigrams make a label when they overlap (公园, 园跑: 公园跑); side by side, two unrelated
    # ones read as nonsense (公园又在).
    first, *rest = shared
    if rest and first[1] == rest[0][0]:
        return first + rest[0][1]
    if rest and rest[0][1] == first[0]:
        return rest[0] + first[1]
    return first
