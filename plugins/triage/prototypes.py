"""Prototype sentences for each scene type. A rule match is compared with them by embedding:
the similarity settles which type wins when several rules fire and feeds the signal strength."""

from __future__ import annotations

PROTOTYPES: dict[str, tuple[str, ...]] = {
    "decision": (
        "I decided to quit my job.",
        "I finally chose the offer from the smaller company.",
        "I gave up on the plan and moved on.",
        "I've made up my mind: we're moving to another city.",
        "我决定辞职了。",
        "最终我选择了留在家乡。",
    ),
    "value": (
        "I think time with family is more important than money.",
        "For me, honesty matters more than being polite.",
        "Health is worth more to me than any promotion.",
        "我觉得健康比工作更重要。",
        "对我来说，自由最重要。",
    ),
    "emotional_turn": (
        "I went from dreading Mondays to actually enjoying my work.",
        "I used to be scared of public speaking, now I love it.",
        "I'm no longer angry about what happened.",
        "我从害怕到慢慢喜欢上了这份工作。",
        "以前我很焦虑，现在平静多了。",
    ),
    "milestone": (
        "I finally finished my thesis.",
        "We shipped the first version today.",
        "I got promoted this week.",
        "我终于完成了论文答辩。",
        "项目终于上线了。",
    ),
    "first_time": (
        "Today I went surfing for the first time.",
        "It was my first time ever on a plane.",
        "I've never done anything like this before.",
        "我第一次一个人去旅行。",
        "这是我第一次上台演讲。",
    ),
    "regret": (
        "I shouldn't have yelled at her.",
        "I regret not calling my grandfather more often.",
        "I wish I had studied harder.",
        "我很后悔当初没有坚持。",
        "我不应该对他发脾气的。",
    ),
}
