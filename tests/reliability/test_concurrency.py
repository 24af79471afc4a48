"""One memory, hundreds (thousands, long) of concurrent calls; and two processes on one data folder."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import selectors
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from narrmem import ManualClock, Memory, Message, StoreError
from narrmem.testing import open_memory

from .common import BASE_TS, LONG, Corpus, build_corpus, sql, stored_message_ids, tokens_in

pytestmark = pytest.mark.reliability

CALLS = 4000 if LONG else 500


class Calls:
    """The concurrent calls and what they saw."""

    def __init__(self, mem: Memory, corpus: Corpus, rng: random.Random) -> None:
        self.mem = mem
        self.corpus = corpus
        self.rng = rng
        self.violations: list[str] = []
        self.ingested: dict[tuple[str, str, str], list[Any]] = {}
        self.kinds: Counter[str] = Counter()

    def _scope_ok(self, hit: dict[str, Any], scope: tuple[str, str | None, str | None], where: str) -> None:
        tenant, user, chat = scope
        if (
            hit["tenant"] != tenant
            or user not in (None, hit["user_id"])
            or chat not in (None, hit["chat_id"])
        ):
            self.violations.append(
                f"{where} {scope}: hit of {hit['tenant']}/{hit['user_id']}/{hit['chat_id']}"
            )
        # A hit's text is the message itself (a scene's Core): its tokens are its owner's.
        for token in tokens_in(hit["text"], self.corpus.owners):
            owner = self.corpus.owners[token]
            if (
                owner.tenant != tenant
                or user not in (None, owner.user_id)
                or chat not in (None, owner.chat_id)
            ):
                self.violations.append(f"{where} {scope}: token of {owner} in {hit['text']!r}")

    def _scope(self) -> tuple[str, str | None, str | None]:
        tenant, user = self.rng.choice(self.corpus.people)
        chat = self.rng.choice(self.corpus.chats_of(tenant, user))
        return self.rng.choice([(tenant, user, None), (tenant, None, chat), (tenant, user, chat)])

    def _question(self) -> str:
        return f"what about {self.rng.choice(sorted(self.corpus.spoken))}?"

    def ingest(self, message: Message) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            self.kinds["ingest"] += 1
            result = await self.mem.ingest(message)
            self.ingested.setdefault((message.tenant, message.chat_id, message.message_id), []).append(result)

        return call

    def ingest_many(self, messages: list[Message]) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            self.kinds["ingest_many"] += 1
            for message, result in zip(messages, await self.mem.ingest_many(messages), strict=True):
                key = (message.tenant, message.chat_id, message.message_id)
                self.ingested.setdefault(key, []).append(result)

        return call

    def recall(self) -> Callable[[], Awaitable[None]]:
        scope, query = self._scope(), self._question()

        async def call() -> None:
            self.kinds["recall"] += 1
            tenant, user, chat = scope
            for hit in await self.mem.recall(query, user_id=user, chat_id=chat, tenant=tenant, k=10):
                self._scope_ok(hit.model_dump(mode="json"), scope, "recall")

        return call

    def tool(self) -> Callable[[], Awaitable[None]]:
        scope, query = self._scope(), self._question()
        tenant, user, chat = scope
        if user is None:
            user = self.rng.choice(self.corpus.members[(tenant, str(chat))])
        scoped = {"tenant": tenant, "user_id": user, **({"chat_id": chat} if chat else {})}
        name = self.rng.choice(["narrmem_recall", "soul_narrative", "memory_recall", "summary"])

        async def call() -> None:
            self.kinds[name] += 1
            if name == "narrmem_recall":
                out = await self.mem.call_tool("narrmem_recall", {**scoped, "query": query})
                for hit in out["hits"]:
                    self._scope_ok(hit, (tenant, user, chat), name)
            elif name == "soul_narrative":
                out = await self.mem.call_tool("soul_narrative", {**scoped, "action": "list", "k": 20})
                for scene in out["scenes"]:
                    if not set(scene["message_ids"]) <= self._message_ids(tenant, user, chat):
                        self.violations.append(
                            f"soul_narrative {scope}: scene of messages {scene['message_ids']}"
                        )
            elif name == "memory_recall":
                await self.mem.call_tool("memory_recall", {**scoped, "query_intent": query[11:-1]})
            else:
                await self.mem.summary(user_id=user, tenant=tenant)

        return call

    def forget_messages(self, message: Message) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            self.kinds["forget_messages"] += 1
            await self.mem.forget_messages(
                chat_id=message.chat_id, message_ids=[message.message_id], tenant=message.tenant
            )

        return call

    def _message_ids(self, tenant: str, user: str, chat: str | None) -> set[str]:
        return {
            m.message_id
            for m in self.corpus.messages
            if (m.tenant, m.user_id) == (tenant, user) and chat in (None, m.chat_id)
        }


async def test_concurrent_calls_on_one_memory(tmp_path: Path) -> None:
    rng = random.Random(4242)
    corpus = build_corpus(rng, users=max(12, CALLS // 50), per_chat=(3, 5))
    messages = sorted(corpus.messages, key=lambda m: m.ts)
    early, late = messages[: len(messages) // 3], messages[len(messages) // 3 :]
    folder = tmp_path / "data"
    async with open_memory(folder, clock=ManualClock(BASE_TS.replace(month=6))) as mem:
        await mem.ingest_many(early)
        doomed = rng.sample(early, len(early) // 10)
        calls = Calls(mem, corpus, rng)
        work: list[Callable[[], Awaitable[None]]] = [calls.forget_messages(m) for m in doomed]
        pending = list(late)
        rng.shuffle(pending)
        pending = pending[: CALLS // 2]  # the rest of the calls read
        twice = set(rng.sample(range(len(pending)), len(pending) // 8))
        batch: list[Message] = []
        for number, message in enumerate(pending):
            if number not in twice and rng.random() < 0.2:
                batch.append(message)  # some go in batches through ingest_many
                if len(batch) >= rng.randint(2, 12):
                    work.append(calls.ingest_many(batch))
                    batch = []
                continue
            work.append(calls.ingest(message))
            if number in twice:  # the same message again, at the same time: stored once
                work.append(calls.ingest(message))
        if batch:
            work.append(calls.ingest_many(batch))
        while len(work) < CALLS:
            work.append(calls.recall() if rng.random() < 0.6 else calls.tool())
        rng.shuffle(work)
        results = await asyncio.gather(*(call() for call in work), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:5]
    assert calls.violations == [], calls.violations[:5]
    assert calls.kinds["recall"] > CALLS // 5 and calls.kinds["forget_messages"] == len(doomed)
    # Every message sent twice at once: one stored, one reported as a duplicate.
    for results_of_one in calls.ingested.values():
        assert sum(r.stored for r in results_of_one) <= 1
        if len(results_of_one) == 2 and results_of_one[0].layer != "ignore":
            assert sorted(r.duplicate for r in results_of_one) == [False, True]
    # Each message is stored once: one episode, at most one scene.
    for table_kind in ("episode", "scene"):
        repeated = sql(
            folder,
            "SELECT s.tenant, s.chat_id, s.message_id, COUNT(*) FROM memory_sources s "
            "JOIN memories m ON m.id = s.memory_id WHERE m.kind = ? AND m.meta NOT LIKE '%\"pattern\"%' "
            "GROUP BY 1, 2, 3 HAVING COUNT(*) > 1",
            (table_kind,),
        )
        assert repeated == [], repeated[:5]
    expected = {(m.tenant, m.chat_id, m.message_id) for m in messages} - {
        (m.tenant, m.chat_id, m.message_id) for m in doomed
    }
    sent = {(m.tenant, m.chat_id, m.message_id) for m in early} | set(calls.ingested)
    assert stored_message_ids(folder) == expected & sent


# --- two processes ------------------------------------------------------------------------------

HOLDER = """
import asyncio, os, sys
from narrmem.testing import open_memory

async def main():
    async with open_memory(sys.argv[1]):
        print("open", os.getpid(), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

asyncio.run(main())
"""


def _holder(folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _first_line(child: subprocess.Popen[str], timeout: float = 120.0) -> str:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError("the holding process did not open the memory in time")
    line = child.stdout.readline()
    if not line:
        stderr = child.stderr.read() if child.stderr else ""
        raise AssertionError(f"the holding process ended: {stderr[-2000:]}")
    return line


def _end(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(BrokenPipeError, OSError):
        if child.stdin is not None:
            child.stdin.close()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(timeout=30)


async def test_a_second_process_is_refused_with_the_folder_and_pid(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    async with open_memory(folder):
        pass  # the folder exists, with its store
    child = _holder(folder)
    try:
        assert _first_line(child).split() == ["open", str(child.pid)]
        with pytest.raises(StoreError) as refused:
            await open_memory(folder)
        message = str(refused.value)
        assert str(folder) in message or str(folder.resolve()) in message, message
        assert str(child.pid) in message, message
    finally:
        _end(child)
    assert child.returncode == 0
    async with open_memory(folder) as mem:  # once the first process closed, the folder opens
        assert (await mem.stats())["memories"] == 0


async def test_the_lock_of_a_killed_process_does_not_keep_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    child = _holder(folder)
    try:
        assert _first_line(child).startswith("open")
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        _end(child)
    async with open_memory(folder) as mem:
        result = await mem.ingest(
            Message(
                text="I decided to learn the cello", user_id="u1", chat_id="c1", ts=BASE_TS, message_id="m1"
            )
        )
        assert result.stored
