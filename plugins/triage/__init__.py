"""Triage and scenes: the three layers (ignore / accumulate / write a scene), narrative fragments,
importance, and the counters that notice what keeps coming back. English and Chinese.

Importance of a scene (documented in the README):
``base(type) + 0.10·strength + 0.10·intensity + 0.10·novelty + 0.05·prototype similarity``,
clamped to [0, 1]; an explicit "remember this" is at least 0.9. Accumulated messages get 0.30,
0.35 when they state a mood.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from narrmem_plugins.triage import impacts, readout
from narrmem_plugins.triage.counters import Counters
from narrmem_plugins.triage.emotions import emotions_in, intensity
from narrmem_plugins.triage.gist import gist
from narrmem_plugins.triage.ignore_rules import ignore_reason, without_media
from narrmem_plugins.triage.impacts import drop_deleted, drop_impacts
from narrmem_plugins.triage.options import TriageOptions
from narrmem_plugins.triage.prototypes import PROTOTYPES
from narrmem_plugins.triage.scene import compose, scene_record
from narrmem_plugins.triage.signals import CATEGORY, Signal, candidates
from narrmem_plugins.triage.topics import forget_cached_words

from narrmem import hookimpl
from narrmem.config import Settings
from narrmem.configured import Configured
from narrmem.embed import TellsIfLoaded
from narrmem.models import MemoryRecord, Message, PatternCount, SceneDraft, Scope, TriageDecision
from narrmem.products import inner_products
from narrmem.view import MemoryView

NAME = "triage"
WINDOW_MESSAGES = 12  # the most a scene's window of the chat's recent messages holds

BASE_IMPORTANCE = {
    "decision": 0.55,
    "value": 0.5,
    "emotional_turn": 0.5,
    "milestone": 0.5,
    "first_time": 0.45,
    "regret": 0.5,
    None: 0.6,
}
ACCUMULATE_IMPORTANCE = 0.30
MOOD_IMPORTANCE = 0.35
EXPLICIT_IMPORTANCE = 0.9


class Triage(Configured[TriageOptions], name=NAME, options=TriageOptions):
    def __init__(self) -> None:
        super().__init__()
        self._prototypes: asyncio.Future[dict[str, np.ndarray]] | None = None
        self.counters = Counters(self.options)

    def configured(self, settings: Settings) -> None:
        self.counters = Counters(self.options)

    @hookimpl
    def narrmem_startup(self, memory: MemoryView) -> None:
        """A memory opened warm embeds the scene prototypes now, in the background: the first
        message with a scene signal would otherwise wait for all of them (about 40 ms, against
        4 ms for the next one)."""
        embedder = memory.embedder
        if not memory.read_only and isinstance(embedder, TellsIfLoaded) and embedder.model_loaded:
            self._embed_prototypes_once(memory)

    @hookimpl
    def narrmem_check_state(self, namespace: str, key: str, value: dict[str, Any]) -> bool | None:
        """The entries of which scenes quote a message (:mod:`.impacts`)."""
        if namespace != impacts.NAMESPACE:
            return None
        impacts.check_entry(key, value)
        return True

    @hookimpl
    async def narrmem_shutdown(self) -> None:
        embedding = self._prototypes
        if embedding is not None and not embedding.done():
            embedding.cancel()
            await asyncio.gather(embedding, return_exceptions=True)

    # --- layer decision ---------------------------------------------------------------------

    @hookimpl(trylast=True)
    async def narrmem_triage(self, memory: MemoryView, message: Message) -> TriageDecision:
        reason = ignore_reason(
            message.text,
            min_chars=self.options.min_chars,
            extra=self.options.ignore_phrases,
            names=self.options.names,
        )
        if reason is not None:
            return TriageDecision(layer="ignore", reason=reason)
        found = candidates(without_media(message.text))
        if not found:
            moods = emotions_in(message.text)
            decision = TriageDecision(
                layer="accumulate",
                reason="says something about the user's world",
                importance=MOOD_IMPORTANCE if moods else ACCUMULATE_IMPORTANCE,
                signals={"emotions": moods} if moods else {},
            )
        else:
            decision = await self._scene_decision(memory, message, found)
        if self.options.gist_vectors:
            decision.gist = gist(message.text)
        return decision

    @hookimpl(trylast=True)
    def narrmem_episode_gist(self, memory: MemoryView, text: str) -> str | None:
        return gist(text) if self.options.gist_vectors else None

    async def _scene_decision(
        self, memory: MemoryView, message: Message, found: list[Signal]
    ) -> TriageDecision:
        prototypes = await self.prototype_vectors(memory)
        vectors = await memory.embedder.embed([s.sentence for s in found])
        similarity = [
            float(np.max(inner_products(prototypes[s.type], v))) if s.type else 0.0
            for s, v in zip(found, vectors, strict=True)
        ]
        scored = sorted(
            zip(found, similarity, vectors, strict=True),
            key=lambda item: item[0].strength + self.options.prototype_weight * item[1],
            reverse=True,
        )
        signal, prototype_similarity, vector = scored[0]
        novelty = await self._novelty(memory, message, vector)
        feeling = intensity(message.text)
        importance = (
            BASE_IMPORTANCE[signal.type]
            + 0.10 * signal.strength
            + 0.10 * feeling
            + 0.10 * novelty
            + 0.05 * max(0.0, prototype_similarity)
        )
        if signal.explicit:
            importance = max(importance, EXPLICIT_IMPORTANCE)
        return TriageDecision(
            layer="scene",
            type=signal.type,
            reason=signal.reason,
            importance=round(min(1.0, max(0.0, importance)), 4),
            signals={
                "core": signal.sentence,
                "strength": signal.strength,
                "prototype_similarity": round(prototype_similarity, 4),
                "intensity": round(feeling, 4),
                "novelty": round(novelty, 4),
                "explicit": signal.explicit,
                "category": CATEGORY[signal.type],
                "other_types": [s.type for s, _, _ in scored[1:]],
            },
        )

    async def prototype_vectors(self, memory: MemoryView) -> dict[str, np.ndarray]:
        """The scene prototypes' vectors by scene type, embedded once: callers that come while
        they are embedded wait for that one embedding, and a caller's cancel does not stop it."""
        return await asyncio.shield(self._embed_prototypes_once(memory))

    def _embed_prototypes_once(self, memory: MemoryView) -> asyncio.Future[dict[str, np.ndarray]]:
        embedding = self._prototypes
        if embedding is None or (embedding.done() and (embedding.cancelled() or embedding.exception())):
            embedding = asyncio.ensure_future(self._embed_prototypes(memory))
            # A failure is met again by the next scene decision, which tries anew; unseen here.
            embedding.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._prototypes = embedding
        return embedding

    async def _embed_prototypes(self, memory: MemoryView) -> dict[str, np.ndarray]:
        # One request: it takes the model's long lane, in slices, so a message that comes while
        # it runs is embedded first (and, one text to a model run, each vector is the same as
        # alone).
        sentences = [sentence for kind in PROTOTYPES.values() for sentence in kind]
        vectors = await memory.embedder.embed(sentences)
        by_kind: dict[str, np.ndarray] = {}
        start = 0
        for kind, kind_sentences in PROTOTYPES.items():
            by_kind[kind] = vectors[start : start + len(kind_sentences)]
            start += len(kind_sentences)
        return by_kind

    async def _novelty(self, memory: MemoryView, message: Message, vector: np.ndarray) -> float:
        """1 minus the similarity to the closest scene this user already has (1 for a first scene)."""
        scope = Scope(tenant=message.tenant, user_id=message.user_id)
        nearest = await memory.store.search_vectors(scope, vector, 16)
        records = await memory.store.get([mid for mid, _ in nearest], scope)
        scores = [score for mid, score in nearest if mid in records and records[mid].kind == "scene"]
        return 1.0 - max(0.0, max(scores, default=0.0))

    # --- writing the scene -------------------------------------------------------------------

    @hookimpl
    async def narrmem_before_store(
        self,
        memory: MemoryView,
        message: Message,
        decision: TriageDecision,
        records: list[MemoryRecord],
        unwritten: list[MemoryRecord],
    ) -> None:
        episode = records[0]
        moods = emotions_in(message.text)
        if moods:
            episode.meta["emotions"] = moods
        if decision.layer != "scene":
            return
        window = await self._window(memory, message, unwritten)
        draft = await memory.host.call_first(
            "narrmem_compose_scene", memory=memory, message=message, decision=decision, window=window
        )
        if not isinstance(draft, SceneDraft):
            return
        records.append(
            scene_record(
                message,
                draft,
                embed_text=draft.core,
                importance=decision.importance,
                stored_at=memory.clock.now(),
                message_ids=[message.message_id],
                meta={"type": decision.type},
            )
        )
        records[-1].meta["explicit"] = bool(decision.signals.get("explicit"))

    async def _window(
        self, memory: MemoryView, message: Message, unwritten: list[MemoryRecord]
    ) -> list[MemoryRecord]:
        """The speaker's own messages in this chat said in the window before this one, oldest
        first: those stored, and those earlier in the same call (``unwritten``). Only theirs: a
        scene is the speaker's memory, and other people's words in it would be shown to the
        speaker and outlive those people's forget. Read up to the message's own time: an old
        message imported after today's was given today's as its window, cut to nothing."""
        since = message.ts - timedelta(minutes=self.options.window_minutes)
        recent = await memory.store.recent(
            Scope(tenant=message.tenant, user_id=message.user_id, chat_id=message.chat_id),
            since=since,
            until=message.ts,
            kinds=["episode"],
            limit=WINDOW_MESSAGES,
        )
        found = {tuple(r.message_ids): r for r in reversed(recent)}
        for record in unwritten:
            if since <= record.created_at:
                found.setdefault(tuple(record.message_ids), record)
        window = [
            r
            for r in found.values()
            if message.message_id not in r.message_ids and r.created_at <= message.ts
        ]
        return sorted(window, key=lambda r: r.created_at)[-WINDOW_MESSAGES:]

    @hookimpl(trylast=True)
    def narrmem_compose_scene(
        self, message: Message, decision: TriageDecision, window: list[MemoryRecord]
    ) -> SceneDraft:
        core = str(decision.signals.get("core") or message.text)
        draft: SceneDraft = compose(message, decision.type, core, window, self.options.names)
        return draft

    # --- counting ----------------------------------------------------------------------------

    @hookimpl
    async def narrmem_patterns(self, memory: MemoryView, user: Scope, now: datetime) -> list[PatternCount]:
        return await readout.patterns(memory, self.counters, user, now)

    @hookimpl
    async def narrmem_person_records(
        self, memory: MemoryView, tenant: str, user_id: str
    ) -> dict[str, list[dict[str, Any]]] | None:
        """The person's scenes quoted by later ones (``triage.impacts`` entries, keyed by the chat
        and message rather than the person)."""
        entries = await impacts.person_entries(memory, tenant, user_id)
        return {"triage.impacts": entries} if entries else None

    @hookimpl
    def narrmem_forgotten_elsewhere(self) -> None:
        """Another worker's forget: its texts may be in the topic counter's cache here."""
        forget_cached_words()

    @hookimpl
    async def narrmem_after_delete(
        self, memory: MemoryView, tenant: str, removed: list[MemoryRecord]
    ) -> None:
        """A memory deleted by id: the topic counter's cache of message words may hold its text; a
        deleted scene's quote goes from the scene it built on, and no entry names a deleted scene."""
        forget_cached_words()
        await drop_deleted(memory, tenant, removed)

    @hookimpl
    async def narrmem_after_forget(
        self,
        memory: MemoryView,
        tenant: str,
        user_id: str | None,
        chat_id: str | None,
        removed: list[MemoryRecord],
        messages: list[str] | None,
    ) -> None:
        """The topic counter's cache of message words holds forgotten texts too: emptied. A
        deleted message's words quoted in an earlier scene's Impact go from it."""
        forget_cached_words()
        await drop_impacts(memory, tenant, user_id, chat_id, messages, removed)

    @hookimpl
    async def narrmem_after_store(
        self,
        memory: MemoryView,
        message: Message,
        records: list[MemoryRecord],
        vectors: np.ndarray,
        result: Any,
    ) -> None:
        await self.counters.update(memory, message, list(zip(records, vectors, strict=True)), result)
