"""``narrmem demo``: the main job on the embedded default, with a small sample chat."""

from __future__ import annotations

from collections import Counter
from importlib import resources
from typing import TextIO

from narrmem.doors.transfer import read_messages
from narrmem.memory import Memory

QUESTIONS: list[tuple[str, dict[str, str]]] = [
    ("What did Alice decide about her job?", {"user_id": "alice"}),
    ("Where does Alice live now?", {"user_id": "alice"}),
    ("What is Bob's injury and what did he do about the marathon?", {"user_id": "bob"}),
    ("伟喜欢什么音乐？", {"user_id": "wei"}),
    ("伟在做什么项目？", {"user_id": "wei"}),
    ("Which book does the club read next?", {"chat_id": "guild-books"}),
]


def sample_path() -> str:
    return str(resources.files("narrmem").joinpath("data/sample_chat.jsonl"))


async def run_demo(memory: Memory, out: TextIO, k: int = 2) -> None:
    messages = read_messages(sample_path())
    results = await memory.ingest_many(messages)
    layers = Counter(r.layer for r in results)
    new = sum(r.stored for r in results)
    again = sum(r.duplicate for r in results)
    print(f"Ingested {len(messages)} sample messages from 3 people over 4 weeks.", file=out)
    print(
        f"  kept {layers['accumulate'] + layers['scene']} (new {new}, already stored {again}), "
        f"ignored {layers['ignore']}",
        file=out,
    )
    print("\nIgnored (not worth remembering):", file=out)
    for message, result in zip(messages, results, strict=True):
        if result.layer == "ignore":
            print(f"  {message.speaker}: {message.text!r}  ({result.reason})", file=out)
    print("\nRecall:", file=out)
    for question, scope in QUESTIONS:
        hits = await memory.recall(question, k=k, user_id=scope.get("user_id"), chat_id=scope.get("chat_id"))
        where = ", ".join(f"{key}={value}" for key, value in scope.items())
        print(f"\n? {question}  [{where}]", file=out)
        for hit in hits:
            when = hit.created_at.strftime("%d %b")
            text = " | ".join(line for line in hit.text.splitlines() if line.strip())
            print(
                f"  {hit.score:.3f}  {when}  [{hit.kind}] {text}  <- {', '.join(hit.message_ids)}", file=out
            )
    stats = await memory.stats()
    print(f"\nStored in {memory.data_dir}: {stats['memories']} memories, {stats['users']} users.", file=out)
