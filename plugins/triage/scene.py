"""The built-in scene composer: a narrative fragment from the message and the speaker's recent
messages in the chat, without an LLM. Time in the user's own clock, Scene a short phrase from the
message's own structure (see ``phrase.py``), Vibe from the window's moods, Core quoted verbatim."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from narrmem_plugins.triage.emotions import emotions_in
from narrmem_plugins.triage.language import has_cjk
from narrmem_plugins.triage.phrase import chinese_phrase, english_phrase, fallback_phrase
from narrmem_plugins.triage.signals import CATEGORY
from narrmem_plugins.triage.topics import topic_words

from narrmem.models import MemoryRecord, Message, SceneDraft

_WEEKDAYS_EN = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_WEEKDAYS_ZH = ("周一", "周二", "周三", "周四", "周五", "周六", "周日")
_DEFAULT_VIBE = {
    "decision": ("resolute", "坚定"),
    "value": ("thoughtful", "认真思考"),
    "emotional_turn": ("reflective", "回望与释然"),
    "milestone": ("proud, relieved", "自豪、松了口气"),
    "first_time": ("excited, curious", "兴奋、新奇"),
    "regret": ("rueful", "懊悔"),
    None: ("matter-of-fact", "平静"),
}
_MOODS_ZH = {
    "tired": "疲惫",
    "stressed": "压力大",
    "anxious": "焦虑",
    "sad": "低落",
    "angry": "生气",
    "lonely": "孤独",
    "happy": "开心",
}


def describe_time(ts: datetime, language: str) -> str:
    """ "Friday 11pm" / "周五晚上11点", in the offset the message was sent with."""
    weekday = ts.weekday()
    hour = ts.hour
    if language == "zh":
        part = (
            "凌晨"
            if hour < 5
            else "早上"
            if hour < 9
            else "上午"
            if hour < 12
            else "中午"
            if hour < 13
            else ("下午" if hour < 18 else "晚上")
        )
        shown = hour if hour <= 12 else hour - 12
        return f"{_WEEKDAYS_ZH[weekday]}{part}{shown}点"
    suffix = "am" if hour < 12 else "pm"
    shown = hour % 12 or 12
    return f"{_WEEKDAYS_EN[weekday]} {shown}{suffix}"


def compose(
    message: Message,
    scene_type: str | None,
    core: str,
    window: list[MemoryRecord],
    names: frozenset[str] = frozenset(),
) -> SceneDraft:
    language = "zh" if has_cjk(core) else "en"
    texts = [r.text for r in window[-6:]] + [message.text]
    moods: list[str] = []
    for text in texts:
        moods.extend(m for m in emotions_in(text) if m not in moods)
    default_en, default_zh = _DEFAULT_VIBE.get(scene_type, _DEFAULT_VIBE[None])
    if language == "zh":
        scene = chinese_phrase(core)
        vibe = "、".join(_MOODS_ZH[m] for m in moods) or default_zh
        words: list[str] = []
    else:
        words = topic_words(texts, names=names)
        scene = english_phrase(core) or fallback_phrase(core, scene_type)
        vibe = ", ".join(moods) or default_en
    return SceneDraft(
        time=describe_time(message.ts, language),
        scene=scene,
        vibe=vibe,
        core=core,
        category=CATEGORY.get(scene_type, "general"),
        tags=[t for t in [scene_type, *moods, *words] if t],
        language=language,
    )


def scene_record(
    message: Message,
    draft: SceneDraft,
    *,
    embed_text: str,
    importance: float,
    stored_at: datetime,
    message_ids: list[str],
    meta: dict[str, Any],
) -> MemoryRecord:
    """The scene ``draft`` tells, as the speaker's memory in the message's chat. ``meta`` starts
    with the scene's ``type``; the draft's fields follow it."""
    return MemoryRecord.from_message(
        message,
        kind="scene",
        text=draft.render(),
        embed_text=embed_text,
        importance=importance,
        stored_at=stored_at,
        message_ids=message_ids,
        meta={**meta, "category": draft.category, "tags": draft.tags, **draft.stored()},
    )
