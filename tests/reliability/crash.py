"""Crash harness: a child process works on a data folder and is killed with SIGKILL at a random
moment; then the folder is reopened and checked.

Kinds of run (``run_crash`` cycles through them):

* ``ingest``: single ``Memory.ingest`` calls; each message is acknowledged once its call returned.
* ``receipt``: single ``Memory.ingest`` calls with ``[storage] acknowledge = "on_receipt"``: each
  message is acknowledged once its call returned, before it is written (the reopen writes it).
* ``bulk``: ``ingest_many`` batches of 1 to 80 messages (16 per write transaction, so a batch spans
  several); a batch is acknowledged once its call returned.
* ``forget``: the folder is filled first (group chats with several speakers, so other users' keyword
  context, scenes and graph facts exist; personas, tasks and hand-written scenes from the tools),
  then the child forgets one user after another and is killed during it.

After each kill the folder is reopened with a fresh ``Memory.open`` and checked: the open succeeds;
every acknowledged message is stored (and its scene, when triage made one); the vector index holds
exactly the ids SQLite holds vectors for (whether the open had to rebuild it is counted), and a
search finds sampled vectors; SQLite and its keyword index pass their integrity checks; a second
open after a clean close needs no rebuild. For forget runs: a forget that returned, and one that was
interrupted once the reopen has finished it, leave no trace (no recall, graph recall, summary or
export shows the user's tokens, and no byte of the data folder holds them); an interrupted forget
either completed on reopen or never started (the user fully intact), never half done; users the
child never reached are intact.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np

from narrmem import ManualClock, Memory, Scope
from narrmem.doors.transfer import export_jsonl
from narrmem.testing import open_memory

from . import crash_child
from .common import (
    BASE_TS,
    DB_NAME,
    Corpus,
    Owner,
    build_corpus,
    figures_dict,
    folder_files,
    marker_needles,
    occurrences,
    scene_message_ids,
    sql,
    sqlite_vector_ids,
    stored_message_ids,
    tallies,
    to_json,
    tokens_in,
)

KINDS = ("ingest", "bulk", "forget")
CLOCK_START = BASE_TS.replace(month=6)
READY_TIMEOUT_S = 180.0  # the first start of the real model on a machine exports it
BULK_TRANSACTION = 16
# Seconds after the chosen forget starts within which the kill comes (one forget of a small store
# takes a few to a few tens of milliseconds).
FORGET_KILL_WINDOW_S = 0.05
# The store steps a forget goes through, in order (a kill on entering each one): before the job is
# written down, while rows are deleted, while a plugin scrubs its copies, before the job is marked
# done, and before the freed pages and the keyword index are purged. A step of another name (the
# store changed) is reported as not reached rather than passing unseen.
FORGET_STEPS = ("begin_forget", "forget", "state_delete", "finish_forget", "purge_deleted")


@dataclass
class Acks:
    ready: bool = False
    messages: list[tuple[str, str, str, str]] = field(default_factory=list)  # tenant, chat, id, layer
    forgetting: list[tuple[str, str]] = field(default_factory=list)
    forgot: list[tuple[str, str]] = field(default_factory=list)
    done: bool = False
    died_at: str | None = None
    missing_step: str | None = None


@dataclass
class Figures:
    counts: Counter[str] = field(
        default_factory=tallies(
            "runs acknowledged lost scenes_lost failed_reopens rebuilds_needed index_mismatches "
            "search_misses rebuilds_after_clean_close children_finished_before_kill forgets_returned "
            "forgets_interrupted forgets_completed_on_reopen forgets_not_started forgets_half_done "
            "users_over_deleted leftover_traces"
        )
    )
    runs_by_kind: Counter[str] = field(default_factory=Counter)
    real_model_runs: Counter[str] = field(default_factory=Counter)
    lost_examples: list[str] = field(default_factory=list)
    reopen_errors: list[str] = field(default_factory=list)
    integrity_failures: list[str] = field(default_factory=list)
    steps_not_reached: list[str] = field(default_factory=list)
    leftover_examples: list[str] = field(default_factory=list)
    steps_killed_at: Counter[str] = field(default_factory=Counter)
    details: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return figures_dict(
            self,
            cut={"lost_examples": 10, "leftover_examples": 10, "reopen_errors": 5},
            integrity_failures=len(self.integrity_failures),
            integrity_examples=self.integrity_failures[:5],
        )


def run_crash(
    runs: int,
    seed: int,
    workdir: Path,
    *,
    real_model_runs: bool = True,
    kinds: tuple[str, ...] = KINDS,
    steps: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``runs`` kill-and-reopen cycles over ``kinds`` (ingest, bulk and forget), in turn. With
    ``real_model_runs`` the first run of each kind uses the real default embedder (the rest the
    hash embedder). With ``steps`` (names of store methods a forget calls) the runs are forget runs
    whose child kills itself on entering each step in turn instead of at a random moment.
    Returns the figures (see :class:`Figures`)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    workdir.mkdir(parents=True, exist_ok=True)
    figures = Figures()
    real_kinds = set(kinds) if real_model_runs else set()
    for number in range(runs):
        kind = "forget" if steps else kinds[number % len(kinds)]
        real = kind in real_kinds
        real_kinds.discard(kind)
        step = steps[number % len(steps)] if steps else None
        folder = workdir / (f"run-{number:03d}-{kind}" + (f"-at-{step}" if step else ""))
        _one_run(kind, real, folder, random.Random(rng.getrandbits(64)), figures, step)
    figures.seconds = time.perf_counter() - started
    return figures.as_dict()


def _one_run(
    kind: str, real: bool, folder: Path, rng: random.Random, figures: Figures, step: str | None = None
) -> None:
    figures.counts["runs"] += 1
    figures.runs_by_kind[kind] += 1
    if real:
        figures.real_model_runs[kind] += 1
    folder.mkdir(parents=True)
    data = folder / "data"
    plan: dict[str, Any] = {"kind": kind, "real_model": real, "clock": CLOCK_START.isoformat()}
    if kind == "bulk":  # a batch spans several write transactions
        plan["environment"] = {"NARRMEM_STORAGE__BATCH_SIZE": str(BULK_TRANSACTION)}
    if kind == "receipt":
        plan["environment"] = {"NARRMEM_STORAGE__ACKNOWLEDGE": "on_receipt"}
    before: dict[tuple[str, str], tuple[int, int]] = {}
    corpus = build_corpus(
        rng, users=16 if kind != "forget" else 10, tenants=("default", "t1"), per_chat=(4, 7), token_length=10
    )
    if kind == "forget":
        before = asyncio.run(_fill(data, corpus, real, rng))
        order = list(corpus.people)
        rng.shuffle(order)
        plan["forget"] = [list(p) for p in order]
        # Killed a moment after a randomly chosen person's forget starts: within it, or a few
        # later. (A delay after the first one alone let all ten end first in about half the runs.)
        tenant, user = order[rng.randrange(len(order))]
        trigger, delay = f"forgetting {tenant} {user}", rng.uniform(0.0, FORGET_KILL_WINDOW_S)
    else:
        messages = [m.model_dump(mode="json") for m in sorted(corpus.messages, key=lambda m: m.ts)]
        if kind in ("ingest", "receipt"):
            plan["batches"] = [[m] for m in messages]
        else:
            batches, start = [], 0
            while start < len(messages):
                size = rng.randint(1, 80)
                batches.append(messages[start : start + size])
                start += size
            plan["batches"] = batches
        trigger, delay = "ready", rng.uniform(0.05, 1.5 if real else 1.2)
    if step is not None:
        plan["kill_at"] = step
        trigger, delay = "", 0.0  # the child kills itself
    plan_path = folder / "plan.json"
    plan_path.write_text(json.dumps(plan), encoding="utf-8")
    ack_path = folder / "ack.txt"
    acks = _run_child(data, ack_path, plan_path, folder / "child.log", trigger, delay)
    if acks.done:
        figures.counts["children_finished_before_kill"] += 1
    if step is not None:
        if acks.died_at == step:
            figures.steps_killed_at[step] += 1
        else:
            figures.steps_not_reached.append(step)
    figures.details.append(
        {
            "run": folder.name,
            "real_model": real,
            "kill_after_s": round(delay, 3),
            "after": trigger,
            "acknowledged": len(acks.messages),
            "forgets_returned": len(acks.forgot),
            "forgets_started": len(acks.forgetting),
            "finished_before_kill": acks.done,
        }
    )
    asyncio.run(_check(kind, real, data, folder, corpus, acks, before, rng, figures))


def _run_child(
    data: Path, ack_path: Path, plan_path: Path, log_path: Path, trigger: str, delay: float
) -> Acks:
    """Start the child, wait for ``trigger`` in its acknowledgements, wait ``delay`` more, SIGKILL it."""
    child = _children().Process(
        target=crash_child.child_main, args=(str(data), str(ack_path), str(plan_path), str(log_path))
    )
    child.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        if not trigger:  # it kills itself at a step, or says "done" if it never reached it
            while child.is_alive() and not _has_line(ack_path, "done"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the crash child neither died nor finished: {_tail(log_path)}")
                time.sleep(0.005)
            return _read_acks(ack_path)
        while not _has_line(ack_path, trigger):
            if not child.is_alive():
                raise RuntimeError(f"the crash child exited with {child.exitcode}: {_tail(log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the crash child never said '{trigger}': {_tail(log_path)}")
            time.sleep(0.005)
        time.sleep(delay)
        if not child.is_alive():
            raise RuntimeError(f"the crash child exited with {child.exitcode}: {_tail(log_path)}")
    finally:
        if child.is_alive():
            child.kill()  # SIGKILL
        child.join(timeout=30)
    if child.exitcode != -signal.SIGKILL:
        raise RuntimeError(f"the crash child ended with {child.exitcode}, not by the kill: {_tail(log_path)}")
    return _read_acks(ack_path)


_CONTEXT: Any = None


def _children() -> Any:
    """Processes forked from a server that imported narrmem and its plugins once."""
    global _CONTEXT
    if _CONTEXT is None:
        context = multiprocessing.get_context("forkserver")
        plugins = sorted({e.module for e in entry_points(group="narrmem")})
        context.set_forkserver_preload(["narrmem.testing", "narrmem.memory", *plugins])
        _CONTEXT = context
    return _CONTEXT


def _has_line(path: Path, word: str) -> bool:
    if not path.exists():
        return False
    # A trigger of one word matches a line's first word; a longer one, the whole line.
    lines = path.read_text(encoding="utf-8").splitlines()
    return any(line == word or line.split(" ", 1)[0] == word for line in lines)


def _tail(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-2000:]


def _read_acks(path: Path) -> Acks:
    acks = Acks()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    # A line cut by the kill has no newline: it was not acknowledged.
    complete = text[: text.rfind("\n") + 1]
    for line in complete.splitlines():
        word, *rest = line.split(" ")
        if word == "ready":
            acks.ready = True
        elif word == "ack":
            tenant, chat, message_id, layer = rest
            acks.messages.append((tenant, chat, message_id, layer))
        elif word == "forgetting":
            acks.forgetting.append((rest[0], rest[1]))
        elif word == "forgot":
            acks.forgot.append((rest[0], rest[1]))
        elif word == "done":
            acks.done = True
        elif word == "dying":
            acks.died_at = rest[0]
        elif word == "nostep":
            acks.missing_step = rest[0]
    return acks


# --- the forget runs' folder --------------------------------------------------------------------


async def _fill(
    data: Path, corpus: Corpus, real: bool, rng: random.Random
) -> dict[tuple[str, str], tuple[int, int]]:
    """Ingest the corpus and write with the tools; returns each person's (memories, graph rows)."""
    clock = ManualClock(CLOCK_START)
    async with open_memory(data, real_model=real, clock=clock) as mem:
        await mem.ingest_many(sorted(corpus.messages, key=lambda m: m.ts))
        for tenant, user in corpus.people:
            chats = corpus.chats_of(tenant, user)
            chat = rng.choice(chats)
            # Each tool writes a fresh token of this person's; ``{token}`` in an argument stands for it.
            for tool, arguments in (
                ("soul_narrative", {"action": "add", "event": "I kept {token}"}),
                ("persona_set", {"description": "a friend who knows {token}"}),
                ("task_create", {"task_id": "task-{token}", "description": "plan the {token} visit"}),
            ):
                token = corpus.token_for(Owner(tenant, user, chat), rng, 10)
                filled = {key: value.format(token=token) for key, value in arguments.items()}
                await mem.call_tool(tool, {**filled, "user_id": user, "chat_id": chat, "tenant": tenant})
            await mem.summary(user_id=user, tenant=tenant)
            await mem.recall(f"what about {token}", user_id=user, tenant=tenant)
    return {person: _person_rows(data, *person) for person in corpus.people}


def _person_rows(data: Path, tenant: str, user: str) -> tuple[int, int]:
    [(memories,)] = sql(
        data, "SELECT COUNT(*) FROM memories WHERE tenant = ? AND user_id = ?", (tenant, user)
    )
    [(edges,)] = sql(
        data, "SELECT COUNT(*) FROM graph_edges WHERE tenant = ? AND user_id = ?", (tenant, user)
    )
    return int(memories), int(edges)


# --- after the kill ----------------------------------------------------------------------------


async def _check(
    kind: str,
    real: bool,
    data: Path,
    folder: Path,
    corpus: Corpus,
    acks: Acks,
    before: dict[tuple[str, str], tuple[int, int]],
    rng: random.Random,
    figures: Figures,
) -> None:
    clock = ManualClock(CLOCK_START.replace(month=7))
    try:
        mem = await open_memory(data, real_model=real, clock=clock)
    except Exception as exc:
        figures.counts["failed_reopens"] += 1
        figures.reopen_errors.append(f"{folder.name}: {type(exc).__name__}: {exc}")
        return
    gone: list[tuple[str, str]] = []
    try:
        await _check_index(mem, data, rng, figures)
        if kind == "forget":
            gone = await _check_forgets(mem, data, folder, corpus, acks, before, figures)
        else:
            _check_acknowledged(data, acks, figures)
    finally:
        await mem.close()
    _check_integrity(data, folder.name, figures)
    if gone:
        _check_bytes(data, corpus, gone, figures)
    try:
        async with open_memory(data, real_model=real, clock=clock) as again:
            if _index_of(again).rebuilt_reason is not None:
                figures.counts["rebuilds_after_clean_close"] += 1
    except Exception as exc:
        figures.counts["failed_reopens"] += 1
        figures.reopen_errors.append(f"{folder.name} (second open): {type(exc).__name__}: {exc}")


def _index_of(mem: Memory) -> Any:
    """The SQLite store's vector index (this harness runs on the embedded store)."""
    return getattr(mem.store, "index")  # noqa: B009 - not part of the Store protocol


async def _check_index(mem: Memory, data: Path, rng: random.Random, figures: Figures) -> None:
    index = _index_of(mem)
    if index.rebuilt_reason is not None:
        figures.counts["rebuilds_needed"] += 1
    held = {int(i) for i in index.ids()}
    expected = sqlite_vector_ids(data)
    if held != expected:
        figures.counts["index_mismatches"] += 1
    rows = sql(data, "SELECT id, tenant, user_id, vector FROM memories WHERE vector IS NOT NULL ORDER BY id")
    for memory_id, tenant, user, blob in rng.sample(rows, min(5, len(rows))):
        vector = np.frombuffer(blob, dtype=np.float32)
        found = await mem.store.search_vectors(Scope(tenant=tenant, user_id=user), vector, 5)
        if memory_id not in {mid for mid, _ in found}:
            figures.counts["search_misses"] += 1


def _check_acknowledged(data: Path, acks: Acks, figures: Figures) -> None:
    stored = stored_message_ids(data)
    scenes = scene_message_ids(data)
    for tenant, chat, message_id, layer in acks.messages:
        if layer == "ignore":
            continue
        figures.counts["acknowledged"] += 1
        key = (tenant, chat, message_id)
        if key not in stored:
            figures.counts["lost"] += 1
            figures.lost_examples.append(f"{data.parent.name}: {key}")
        elif layer == "scene" and key not in scenes:
            figures.counts["scenes_lost"] += 1
            figures.lost_examples.append(f"{data.parent.name}: scene of {key}")


def _check_integrity(data: Path, run: str, figures: Figures) -> None:
    con = sqlite3.connect(data / DB_NAME, timeout=30)
    try:
        [(verdict,)] = con.execute("PRAGMA integrity_check").fetchall()
        if verdict != "ok":
            figures.integrity_failures.append(f"{run}: {verdict}")
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE sql LIKE '%USING fts5%'")]
        for table in tables:
            try:
                con.execute(f"INSERT INTO {table} ({table}) VALUES ('integrity-check')")
            except sqlite3.DatabaseError as exc:
                figures.integrity_failures.append(f"{run}: {table}: {exc}")
    finally:
        con.close()


async def _check_forgets(
    mem: Memory,
    data: Path,
    folder: Path,
    corpus: Corpus,
    acks: Acks,
    before: dict[tuple[str, str], tuple[int, int]],
    figures: Figures,
) -> list[tuple[str, str]]:
    """Classify every person; return those that must be gone (for the byte scan after close)."""
    returned = set(acks.forgot)
    interrupted = [p for p in acks.forgetting if p not in returned]
    figures.counts["forgets_returned"] += len(returned)
    figures.counts["forgets_interrupted"] += len(interrupted)
    must_go = sorted(returned)
    for person in interrupted:
        rows = _person_rows(data, *person)
        if rows == before[person]:
            figures.counts["forgets_not_started"] += 1
        elif rows == (0, 0):
            figures.counts["forgets_completed_on_reopen"] += 1
            must_go.append(person)
        else:
            figures.counts["forgets_half_done"] += 1
            must_go.append(person)
            figures.leftover_examples.append(
                f"{folder.name}: {person} half forgotten: {before[person]} -> {rows}"
            )
    for person in corpus.people:
        if person in acks.forgetting:
            continue
        if _person_rows(data, *person) != before[person]:
            figures.counts["users_over_deleted"] += 1
    if must_go:
        export = folder / "export.jsonl"
        await export_jsonl(mem, export)
        exported = export.read_text(encoding="utf-8")
        for tenant, user in must_go:
            secrets = {t: o for t, o in corpus.owners.items() if (o.tenant, o.user_id) == (tenant, user)}
            places = await _answers(mem, corpus, tenant, user, secrets)
            places["export"] = exported
            for place, text in places.items():
                found = tokens_in(text, secrets)
                if found:
                    figures.counts["leftover_traces"] += 1
                    figures.leftover_examples.append(
                        f"{folder.name}: {tenant}/{user} in {place}: {found[:3]}"
                    )
    return must_go


async def _answers(
    mem: Memory, corpus: Corpus, tenant: str, user: str, secrets: dict[str, Any]
) -> dict[str, str]:
    """What every read path answers about a forgotten user, asked with the user's own tokens."""
    query = " ".join(sorted(secrets)[:12])
    out: dict[str, str] = {}
    out["recall user"] = to_json(await mem.recall(query, user_id=user, tenant=tenant, k=50))
    for chat in corpus.chats_of(tenant, user):
        out[f"recall chat {chat}"] = to_json(await mem.recall(query, chat_id=chat, tenant=tenant, k=50))
        for member in [m for m in corpus.members[(tenant, chat)] if m != user][:2]:
            turn = await mem.turn_context(query, user_id=member, chat_id=chat, tenant=tenant)
            out[f"turn_context {member} {chat}"] = to_json(turn)
    out["summary"] = to_json(await mem.summary(user_id=user, tenant=tenant))
    graph = await mem.call_tool(
        "memory_recall", {"user_id": user, "tenant": tenant, "query_intent": ",".join(sorted(secrets)[:12])}
    )
    out["memory_recall"] = to_json(graph)
    out["persona_get"] = to_json(await mem.call_tool("persona_get", {"user_id": user, "tenant": tenant}))
    scenes = await mem.call_tool(
        "soul_narrative", {"action": "list", "user_id": user, "tenant": tenant, "k": 200}
    )
    out["soul_narrative list"] = to_json(scenes)
    return out


def _check_bytes(data: Path, corpus: Corpus, gone: list[tuple[str, str]], figures: Figures) -> None:
    files = folder_files(data)
    for tenant, user in gone:
        for token, owner in corpus.owners.items():
            if (owner.tenant, owner.user_id) != (tenant, user):
                continue
            for needle in marker_needles(token, tail=7):
                where = occurrences(files, needle)
                if where:
                    figures.counts["leftover_traces"] += 1
                    figures.leftover_examples.append(
                        f"{data.parent.name}: {tenant}/{user} token {token} ({needle.decode()}) in bytes of "
                        f"{sorted(where)}"
                    )
                    break
