"""The ``[plugin.triage]`` table."""

from __future__ import annotations

from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from narrmem.config import share


class TriageOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_chars: int = Field(default=2, ge=0, le=1000, description="shorter messages are ignored")
    extra_acknowledgements: list[str] = Field(default_factory=list, description="more phrases to ignore")
    bot_names: list[str] = Field(
        default_factory=list,
        description="the bot's own names: never a topic, and 'thanks <name>' is an acknowledgement",
    )
    prototype_weight: float = Field(
        default=0.5, ge=0, le=10, description="weight of prototype similarity when several scene types match"
    )
    window_minutes: float = Field(
        default=120, gt=0, le=10_080, description="recent window for Scene and Vibe"
    )
    topic_threshold: int = Field(
        default=3, ge=2, le=1000, description="mentions of a topic that fire a trigger"
    )
    emotion_threshold: int = Field(
        default=3, ge=2, le=1000, description="repeats of a mood that fire a trigger"
    )
    value_threshold: int = Field(default=2, ge=2, le=1000, description="repeats of a value judgement")
    habit_weeks: int = Field(default=3, ge=2, le=52, description="weeks with the topic on the same weekday")
    topic_similarity: float = share(0.55, "cosine that makes two mentions one topic")
    value_similarity: float = share(0.5, "cosine that makes two values one")
    link_similarity: float = share(0.4, "cosine that links a scene to an earlier one")
    emotion_window_days: float = Field(default=7, gt=0, le=365)
    topic_window_days: float = Field(default=90, gt=0, le=3650)
    promote_patterns: bool = Field(default=True, description="write a scene when a mood pattern fires")
    gist_vectors: bool = Field(
        default=True,
        description="embed a message without the small talk around what it says (thanks, greetings)",
    )

    @cached_property
    def names(self) -> frozenset[str]:
        """The bot's names, lowered (read for every topic comparison: made once)."""
        return frozenset(n.strip().lower() for n in self.bot_names if n.strip())

    @property
    def ignore_phrases(self) -> frozenset[str]:
        return frozenset(p.strip().lower() for p in self.extra_acknowledgements)
