"""What the reliability harnesses share: secret tokens and who owns them, a seeded corpus of tenants,
users and chats, scans of a data folder's bytes, and direct reads of the SQLite file.

A secret token is ``zq`` + random lowercase letters and digits + a final digit (the keyword index
stems words, and no stemming rule touches a word that ends in a digit). Every token has exactly one
owner, a ``(tenant, user, chat)``: a probe that finds a token its scope may not see has found a leak.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from narrmem import Message

# Read when the module is imported: the test suite's fixtures clear every NARRMEM_* variable
# before each test runs.
LONG = os.environ.get("NARRMEM_RELIABILITY_LONG", "") == "1"

DB_NAME = "narrmem.sqlite3"
BASE_TS = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
TOKEN_RE = re.compile(r"zq[a-z0-9]{4,}")
_ALPHABET = string.ascii_lowercase + string.digits
TREE = "*tree*"  # the owner user and chat of text given to the rtm tools (trees belong to a tenant)


def tallies(names: str) -> Callable[[], Counter[str]]:
    """The factory of a harness's ``counts`` field: a Counter of its tallies, each of the
    space-separated ``names`` at 0 to start, so that every one is in the figures (flat, beside the
    other fields)."""
    return lambda: Counter(dict.fromkeys(names.split(), 0))


def figures_dict(figures: Any, cut: Mapping[str, int] | None = None, **shown: Any) -> dict[str, Any]:
    """A harness's figures (a dataclass) as JSON-ready values, in field order: counters become
    sorted dicts, a float ``seconds`` is rounded to tenths, private fields stay out, the lists
    named in ``cut`` keep their first N items, and ``shown`` replaces or adds values."""
    out: dict[str, Any] = {}
    for name, value in vars(figures).items():
        if name == "counts":
            out.update(value)
        elif not name.startswith("_"):
            out[name] = dict(sorted(value.items())) if isinstance(value, Counter) else value
    if isinstance(out.get("seconds"), float):
        out["seconds"] = round(out["seconds"], 1)
    out.update(shown)
    for name, keep in (cut or {}).items():
        out[name] = out[name][:keep]
    return out


@dataclass(frozen=True, order=True)
class Owner:
    tenant: str
    user_id: str
    chat_id: str


def new_token(rng: random.Random, used: set[str], length: int = 6) -> str:
    """A fresh secret: ``zq``, ``length`` random characters, one digit."""
    while True:
        token = "zq" + "".join(rng.choice(_ALPHABET) for _ in range(length)) + rng.choice(string.digits)
        if token not in used:
            used.add(token)
            return token


def tokens_in(text: str, known: Mapping[str, Owner]) -> list[str]:
    """The known tokens that occur in ``text`` (each once, in order of appearance)."""
    found: dict[str, None] = {}
    for match in TOKEN_RE.finditer(text):
        if match.group() in known:
            found[match.group()] = None
    return list(found)


ECHOES = ("query", "keywords")  # fields that repeat the caller's own question back


def to_json(value: Any) -> str:
    """Everything a call returned, as text to search (pydantic models, dicts, lists, exceptions),
    less the top-level fields that only echo the question (``ContextPack.query``, the graph
    recall's ``keywords``): a token the caller sent is not a token the memory gave away."""
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):
        keywords, rendered = value.get("keywords"), value.get("rendered")
        value = {k: v for k, v in value.items() if k not in ECHOES}
        if isinstance(keywords, list) and isinstance(rendered, str):
            # The graph recall's block opens with the keywords it was asked for.
            value["rendered"] = rendered.replace("(" + ", ".join(map(str, keywords)) + ")", "()", 1)
    return json.dumps(value, default=_default, ensure_ascii=False, sort_keys=True)


def _default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def excerpt(text: str, token: str, width: int = 70) -> str:
    at = text.find(token)
    return text[max(0, at - width) : at + len(token) + width]


# --- the corpus -------------------------------------------------------------------------------

ACCUMULATE = [
    "so tired today after the {t} meeting",
    "the {t} project is taking all my evenings",
    "we had dinner near {t} last night",
    "my sister moved to {t} in spring",
    "my friend talked about {t} again",
    "still thinking about the {t} trip with my cousins",
]
SCENES = [
    "I decided to quit {t} and move on",
    "I decided to stop working with {t} for good",
    "I finally finished the {t} report!",
    "I finally finished building {t} after months",
    "first time I tried {t} today, it was amazing",
    "For the first time I went to {t} alone",
    "remember this: my locker code is {t}",
    "remember this: the {t} meeting is on Tuesday",
    "I regret selling my {t} last year",
]
FACTS = [
    "I live in {t}",
    "I like {t}",
    "I'm working on {t}",
    "I really love {t} music",
]
FIRST_NAMES = ["Ann", "Bo", "Chen", "Dana", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]


@dataclass
class Corpus:
    """Messages of several tenants whose users' ids repeat across tenants, in group and direct chats."""

    tenants: list[str]
    messages: list[Message] = field(default_factory=list)
    owners: dict[str, Owner] = field(default_factory=dict)  # token -> owner
    tokens: dict[Owner, list[str]] = field(default_factory=dict)
    members: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (tenant, chat) -> users
    people: list[tuple[str, str]] = field(default_factory=list)  # (tenant, user)
    speakers: dict[tuple[str, str], str] = field(default_factory=dict)
    spoken: set[str] = field(default_factory=set)  # tokens in memories (messages, hand-written scenes)
    used: set[str] = field(default_factory=set)

    def token_for(self, owner: Owner, rng: random.Random, length: int = 6) -> str:
        """A new token of ``owner`` (recorded)."""
        token = new_token(rng, self.used, length)
        self.owners[token] = owner
        self.tokens.setdefault(owner, []).append(token)
        return token

    def chats_of(self, tenant: str, user_id: str) -> list[str]:
        return sorted(c for (t, c), users in self.members.items() if t == tenant and user_id in users)

    def owned_by(self, tenant: str, user_id: str | None = None, chat_id: str | None = None) -> list[str]:
        return [
            token
            for token, owner in self.owners.items()
            if owner.tenant == tenant
            and user_id in (None, owner.user_id)
            and chat_id in (None, owner.chat_id)
        ]


def build_corpus(
    rng: random.Random,
    users: int,
    tenants: Sequence[str] = ("default", "t1", "t2"),
    *,
    group_size: tuple[int, int] = (3, 6),
    per_chat: tuple[int, int] = (3, 5),
    token_length: int = 6,
) -> Corpus:
    """``users`` user ids spread over ``tenants`` (a third of them in more than one tenant, as
    separate people), each tenant with busy group chats (ids ``g0``, ``g1``… in every tenant) and a
    direct chat per user. Every (tenant, user, chat) owns two tokens that its messages repeat, so a
    token is a frequent word of its chat; the messages mix scene signals, facts and plain remarks."""
    corpus = Corpus(tenants=list(tenants))
    ids = [f"u{i:03d}" for i in range(users)]
    by_tenant: dict[str, list[str]] = {t: [] for t in tenants}
    for i, user in enumerate(ids):
        home = [tenants[i % len(tenants)]]
        if rng.random() < 0.35:
            home += rng.sample([t for t in tenants if t != home[0]], rng.randint(1, len(tenants) - 1))
        for tenant in home:
            by_tenant[tenant].append(user)
    for tenant in tenants:
        people = sorted(by_tenant[tenant])
        if not people:
            continue
        rng.shuffle(people)
        groups: list[list[str]] = []
        start = 0
        while start < len(people):
            size = rng.randint(*group_size)
            groups.append(people[start : start + size])
            start += size
        if len(groups) > 1 and len(groups[-1]) < 2:
            groups[-2].extend(groups.pop())
        for number, group in enumerate(groups):
            # Some people are in a second group too.
            extra = [p for p in people if p not in group and rng.random() < 0.15]
            corpus.members[(tenant, f"g{number}")] = sorted(group + extra)
        for person in sorted(people):
            corpus.members[(tenant, f"dm-{person}")] = [person]
            corpus.people.append((tenant, person))
            corpus.speakers[(tenant, person)] = f"{rng.choice(FIRST_NAMES)}{person[1:]}"
    corpus.people.sort()
    for (tenant, chat), members in sorted(corpus.members.items()):
        turns: list[tuple[str, str]] = []
        for user in members:
            owner = Owner(tenant, user, chat)
            own = [corpus.token_for(owner, rng, token_length) for _ in range(2)]
            for _ in range(rng.randint(*per_chat)):
                token = rng.choice(own)
                corpus.spoken.add(token)
                turns.append((user, _line(rng, token)))
        rng.shuffle(turns)
        ts = BASE_TS + timedelta(minutes=rng.randint(0, 600))
        for n, (user, text) in enumerate(turns):
            ts += timedelta(minutes=rng.randint(1, 4))
            corpus.messages.append(
                Message(
                    text=text,
                    tenant=tenant,
                    user_id=user,
                    chat_id=chat,
                    ts=ts,
                    message_id=f"{chat}-{n}",
                    speaker=corpus.speakers[(tenant, user)],
                )
            )
    return corpus


def _line(rng: random.Random, token: str) -> str:
    roll = rng.random()
    if roll < 0.4:
        return rng.choice(SCENES).format(t=token)
    if roll < 0.65:
        return rng.choice(FACTS).format(t=token)
    return rng.choice(ACCUMULATE).format(t=token)


# --- the data folder --------------------------------------------------------------------------


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (SQLite main file, -wal, -shm, index files, anything else)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def occurrences(files: Mapping[str, bytes], needle: bytes) -> dict[str, int]:
    found = {name: data.count(needle) for name, data in files.items()}
    return {name: n for name, n in found.items() if n}


def marker_needles(token: str, tail: int = 8) -> list[bytes]:
    """What betrays a token in raw bytes: the token itself, and its last ``tail`` characters (the
    keyword index stores a term as the suffix it does not share with the term before it)."""
    raw = token.encode()
    return [raw, raw[-tail:]] if len(raw) > tail else [raw]


def sql(folder: Path, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """A read straight from the store's SQLite file, not through narrmem."""
    con = sqlite3.connect(f"file:{folder / DB_NAME}?mode=ro", uri=True, timeout=30)
    try:
        return list(con.execute(query, tuple(params)).fetchall())
    finally:
        con.close()


def sqlite_vector_ids(folder: Path) -> set[int]:
    return {int(r[0]) for r in sql(folder, "SELECT id FROM memories WHERE vector IS NOT NULL")}


def stored_message_ids(folder: Path) -> set[tuple[str, str, str]]:
    """``(tenant, chat, message id)`` of every message that has its episode stored."""
    rows = sql(folder, "SELECT tenant, chat_id, message_id FROM memory_sources WHERE is_episode = 1")
    return {(str(t), str(c), str(m)) for t, c, m in rows}


def scene_message_ids(folder: Path) -> set[tuple[str, str, str]]:
    rows = sql(
        folder,
        "SELECT s.tenant, s.chat_id, s.message_id FROM memory_sources s "
        "JOIN memories m ON m.id = s.memory_id WHERE m.kind = 'scene'",
    )
    return {(str(t), str(c), str(m)) for t, c, m in rows}


def user_vectors(folder: Path, tenant: str, user_id: str) -> list[bytes]:
    """The float32 bytes of every vector SQLite holds for a user: memories and graph nodes."""
    out = [
        bytes(r[0])
        for r in sql(
            folder,
            "SELECT vector FROM memories WHERE tenant = ? AND user_id = ? AND vector IS NOT NULL",
            (tenant, user_id),
        )
    ]
    if sql(folder, "SELECT name FROM sqlite_master WHERE name = 'graph_nodes'"):
        for vector, topic in sql(
            folder,
            "SELECT vector, topic_vector FROM graph_nodes WHERE tenant = ? AND user_id = ?",
            (tenant, user_id),
        ):
            out.extend(bytes(v) for v in (vector, topic) if v)
    return out


def all_vectors(folder: Path) -> list[bytes]:
    out = [bytes(r[0]) for r in sql(folder, "SELECT vector FROM memories WHERE vector IS NOT NULL")]
    if sql(folder, "SELECT name FROM sqlite_master WHERE name = 'graph_nodes'"):
        for vector, topic in sql(folder, "SELECT vector, topic_vector FROM graph_nodes"):
            out.extend(bytes(v) for v in (vector, topic) if v)
    return out


def vector_windows(vector: bytes, others: Iterable[bytes], width: int = 64) -> list[bytes]:
    """Slices of a vector's bytes that identify it and are found in none of ``others`` (vectors
    that may stay): the span from its first to its last non-zero float (all of a dense vector;
    a sparse one is mostly zeros, and a zero run is no evidence), and slices of ``width`` bytes
    from its non-zero floats (SQLite may split a row across pages). Empty if none is distinctive."""
    floats = np.frombuffer(vector, dtype=np.float32)
    nonzero = np.flatnonzero(floats)
    if not len(nonzero):
        return []
    last = max(0, len(vector) - width)
    candidates = [vector[int(nonzero[0]) * 4 : int(nonzero[-1]) * 4 + 4]]
    starts = sorted({min(int(i) * 4, last) for i in nonzero})
    if len(starts) > 16:
        starts = [starts[int(i)] for i in np.linspace(0, len(starts) - 1, 16).astype(int)]
    candidates += [vector[start : start + width] for start in starts]
    kept = list(others)
    windows = []
    for window in candidates:
        if np.count_nonzero(np.frombuffer(window[: len(window) // 4 * 4], np.float32)) < 2:
            continue  # one value among zeros recurs in any vector of as many words
        if window in windows or any(window in other for other in kept):
            continue
        windows.append(window)
    return windows
