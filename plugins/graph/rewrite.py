"""``context_rewrite``: replace one turn's tool-call messages with a summary, once the summary proves
it knows what it summarizes.

Messages are OpenAI-style chat messages::

    {"role": "user", "content": "..."}
    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "memory_recall", "arguments": "{...}"}}]}
    {"role": "tool", "tool_call_id": "call_1", "content": "{...json...}"}

One turn: ``system`` messages may lead, then exactly one ``user`` message, then assistant and tool
messages. Every tool message answers an earlier call by its id; every call has its answer.

The summary must name every tool that was called (as written in ``function.name``) and state how many
calls it summarizes as a number in digits; another number next to "call(s)" / "次" is a
contradiction unless it is one tool's own count ("memory_recall (2 calls)"). A summary that fails is
refused with the reason (field ``summary``). The result is
``[the user message, {"role": "assistant", "content": summary}]``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from narrmem_plugins.graph.schemas import ChatMessage

from narrmem.errors import InputError

_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])\d+(?![0-9.])")
_CLAIMED_COUNT = re.compile(
    r"(?<![A-Za-z0-9_.])(\d+)\s*(?:(?:tool|function|memory|api)\s+)?(?:calls?\b|invocations?\b|次|个(?:工具)?调用)",
    re.IGNORECASE,
)


@dataclass
class Turn:
    user: ChatMessage
    calls: list[tuple[str, str]]  # (call id, tool name) in call order
    replaced: int


def read_turn(messages: list[ChatMessage]) -> Turn:
    """Check the messages are one well-formed turn with tool calls, and list its calls."""
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if len(users) != 1:
        raise InputError(f"one turn holds exactly one user message, not {len(users)}", field="messages")
    start = users[0]
    if any(m.role != "system" for m in messages[:start]):
        raise InputError("only system messages may come before the user message", field="messages")
    calls: list[tuple[str, str]] = []
    answered: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if message.tool_calls and message.role != "assistant":
            raise InputError("only assistant messages make tool calls", field=f"{where}.tool_calls")
        if message.role == "tool":
            if message.tool_call_id is None:
                raise InputError(
                    "a tool message needs the id of the call it answers", field=f"{where}.tool_call_id"
                )
            if message.tool_call_id not in {c for c, _ in calls}:
                raise InputError(
                    f"answers no earlier call (id '{message.tool_call_id}')", field=f"{where}.tool_call_id"
                )
            if message.tool_call_id in answered:
                raise InputError("this call is already answered", field=f"{where}.tool_call_id")
            answered.add(message.tool_call_id)
        elif message.tool_call_id is not None:
            raise InputError("only tool messages carry tool_call_id", field=f"{where}.tool_call_id")
        for call in message.tool_calls or []:
            if call.id in {c for c, _ in calls}:
                raise InputError(f"call id '{call.id}' is used twice", field=f"{where}.tool_calls")
            calls.append((call.id, call.function.name))
    if not calls:
        raise InputError("the messages hold no tool calls: there is nothing to rewrite", field="messages")
    unanswered = [c for c, _ in calls if c not in answered]
    if unanswered:
        raise InputError(f"call '{unanswered[0]}' has no tool message answering it", field="messages")
    return Turn(user=messages[start], calls=calls, replaced=len(messages) - start - 1)


def check_summary(summary: str, turn: Turn) -> None:
    """Refuse a summary that does not say which tools were called and how many calls it covers."""
    lowered = summary.lower()
    missing = sorted({name for _, name in turn.calls if name.lower() not in lowered})
    if missing:
        raise InputError(
            f"must name every tool that was called; missing: {', '.join(missing)}", field="summary"
        )
    count = len(turn.calls)
    numbers = [int(n) for n in _NUMBER.findall(summary)]
    if count not in numbers:
        raise InputError(f"must say how many calls it summarizes ({count}) as a number", field="summary")
    # "memory_recall (2 calls)" is a fine breakdown; a count that fits neither the total nor any
    # one tool's calls is a summary that lost track.
    per_tool = Counter(name for _, name in turn.calls)
    wrong = sorted({int(m.group(1)) for m in _CLAIMED_COUNT.finditer(summary)} - {count, *per_tool.values()})
    if wrong:
        raise InputError(f"claims {wrong[0]} calls, but the messages hold {count}", field="summary")


def rewrite(messages: list[ChatMessage], summary: str) -> tuple[list[ChatMessage], Turn]:
    turn = read_turn(messages)
    check_summary(summary, turn)
    return [turn.user, ChatMessage(role="assistant", content=summary)], turn
