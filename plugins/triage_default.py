"""The foundation's triage: drop empty messages and bare acknowledgements, keep everything else
as an episode. Cheap string rules only, so an ignored message never costs an embedding."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from narrmem import hookimpl
from narrmem.config import Settings, plugin_options
from narrmem.models import Message, TriageDecision
from narrmem.text import cjk_count

NAME = "triage_default"

ACKNOWLEDGEMENTS = (
    "ok okay k kk okk yes yep yeah yup sure no nope thanks thank you thx ty got it gotcha cool nice fine "
    "alright right lol lmao haha hahaha hmm hm mm ah oh wow great good 👍 🙏 😂 ❤️ +1 好 好的 嗯 嗯嗯 收到 "
    "哦 噢 行 可以 对 是 是的 谢谢 多谢 哈哈 哈哈哈 知道了 明白"
)
_PHRASES = frozenset(
    {
        "thank you",
        "got it",
        "sounds good",
        "no problem",
        "all right",
        "ok thanks",
        "okay thanks",
        "thanks a lot",
    }
)
_WORDS = frozenset(ACKNOWLEDGEMENTS.split())
_TRIM = re.compile(r"^[\s\W_]+|[\s\W_]+$")


class TriageOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_chars: int = Field(default=2, ge=0, le=1000, description="shorter messages are ignored")
    extra_acknowledgements: list[str] = Field(default_factory=list, description="more phrases to ignore")


class DefaultTriage:
    def __init__(self) -> None:
        self.options = TriageOptions()
        self.phrases = _WORDS | _PHRASES

    @hookimpl
    def narrmem_configure(self, settings: Settings) -> None:
        self.options = plugin_options(settings, NAME, TriageOptions)
        extra = {p.strip().lower() for p in self.options.extra_acknowledgements}
        self.phrases = _WORDS | _PHRASES | extra

    @hookimpl(trylast=True)
    def narrmem_triage(self, message: Message) -> TriageDecision:
        raw = message.text.strip()
        if not raw:
            return TriageDecision(layer="ignore", reason="empty")
        lowered = raw.lower()
        core = _TRIM.sub("", lowered)
        if lowered in self.phrases or core in self.phrases:
            return TriageDecision(layer="ignore", reason="acknowledgement")
        # A CJK character carries about a word, so it counts as two characters of length.
        if len(raw) + cjk_count(raw) < self.options.min_chars:
            return TriageDecision(layer="ignore", reason="too short")
        return TriageDecision(layer="accumulate", reason="kept as an episode", importance=0.3)
