"""A keyword index on tantivy, beside FTS5, for stores whose users have many memories.

FTS5 ranks every row that shares a word with the question before it can return the first ten: a
user with 200,000 memories asking a broad question pays for tens of thousands of rows (about 80 ms
at p95 on the 1M benchmark store). tantivy, the Rust search library behind Quickwit, keeps its
postings block-compressed with per-block score bounds and finds the top k without walking every
match (4 ms at p95 on the same rows and questions). It was chosen over two FTS5 variants measured
on that store: dropping a question's most frequent words (p95 36 ms, and a quarter of the top 50
changed) and FTS5's smaller ``detail=column`` layout (slower, 167 ms).

What it indexes is what FTS5 indexes (the same pre-tokenized text, so CJK bigrams and speaker
attribution match alike), plus each row's scope tokens and kind, so the scope and kind filters
run inside the search; the store still checks every returned row against its scope columns.
FTS5 weighs a word found in the context (date, earlier turns) at half and normalizes by the whole
row's length; so one field holds the text twice and the context once, which gives each word the
same weighted frequency. Two fields with a 0.5 boost on the context's score (each field
normalized on its own) were measured too: LoCoMo dev R@5 / R@10 0.659 / 0.752 against FTS5's
0.696 / 0.783; one field gives 0.698 / 0.780. The weighting is fixed when a row is written, so a
search that asks another context weight than ``CONTEXT_WEIGHT`` is left to FTS5.

SQLite stays the source of truth and FTS5 stays written: this index is derived. Its folder records
the count of keyword changes SQLite's triggers had reached at its last commit; an open that finds
another count (a crash between SQLite's commit and this one, or a folder copied from elsewhere)
rebuilds it from SQLite. A forget's purge rebuilds it too, in a new folder that replaces the old
one, because tantivy only marks deleted documents and keeps their terms until a merge: after the
purge no file holds a forgotten word. Every call runs on one thread of its own, never on the event
loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from collections import deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narrmem.errors import StoreError

log = logging.getLogger("narrmem.keywords")

FORMAT = 1
CONTEXT_WEIGHT = 0.5  # a context word counts half a text word: the text is written twice
STATE_FILE = "narrmem-keywords.json"
WRITER_HEAP = 32_000_000  # bytes: tantivy flushes a segment when a writer's buffer is this full
_BUILDING = ".building-"  # suffix of a folder being rebuilt (per process), replaced once complete
_RETIRED = ".retired-"  # suffix of a replaced folder on its way out


@dataclass(frozen=True)
class KeywordDoc:
    """One memory as the index sees it: text already in the store's keyword form."""

    id: int
    kind: str
    owner: tuple[str, ...]
    body: str
    context: str


class TantivyKeywords:
    """The index in ``folder``: ``open``, then ``add``/``remove``/``search``; ``rebuild`` replaces it."""

    def __init__(self, folder: Path) -> None:
        try:
            import tantivy
        except ImportError as exc:
            raise StoreError(
                "storage.keyword_index = 'tantivy' needs the tantivy package: pip install 'narrmem[tantivy]'"
            ) from exc
        self._tantivy: Any = tantivy
        self.folder = folder
        self.changes: int | None = None  # SQLite's keyword change count the files hold
        self._index: Any = None
        self._writer: Any = None
        self._searcher: Any = None
        # Writes not yet in the index, and whether a flush of them is already on the thread.
        self._queue: deque[tuple[list[KeywordDoc], list[int], int]] = deque()
        self._queue_lock = threading.Lock()
        self._flush_queued = False
        self._schema = self._build_schema()
        self._analyzer = self._build_analyzer()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-keywords")

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self) -> int | None:
        """Open the folder's index (made empty if there is none); the change count it holds, or
        None when it holds nothing usable and must be rebuilt."""
        state: int | None = await self._run(self._open)
        return state

    async def rebuild(self, batches: AsyncIterator[Sequence[KeywordDoc]], changes: int) -> None:
        """Replace the index with ``batches`` (every memory), recording ``changes``. Built in a
        new folder that takes the old one's place only once complete."""
        building = self.folder.with_name(f"{self.folder.name}{_BUILDING}{os.getpid()}")
        await self._run(self._start_building, building)
        try:
            async for docs in batches:
                await self._run(self._add_all, docs)
            await self._run(self._finish_building, building, changes)
        except BaseException:
            await self._run(self._abandon, building)
            raise

    async def close(self) -> None:
        try:
            await self._run(self._close)
        finally:
            self._thread.shutdown(wait=True)

    # --- writing --------------------------------------------------------------------------

    def apply(self, added: Sequence[KeywordDoc], removed: Sequence[int], changes: int) -> None:
        """Remove ``removed`` ids and add ``added`` (an id in both is replaced); ``changes`` is
        SQLite's count with them. Queued, not waited for: the index's thread writes what is queued
        and commits it (10-20 ms, most of it waiting on the disk) in one go, so a write never
        waits for a commit and the writes of one message share one; a search first takes in
        whatever is still queued, so it always sees every write before it."""
        self._queue.append((list(added), list(removed), changes))
        with self._queue_lock:
            if self._flush_queued:
                return
            self._flush_queued = True
        self._thread.submit(self._flush)

    # --- reading --------------------------------------------------------------------------

    async def search(
        self, owner: Sequence[str], terms: Sequence[str], k: int, *, kinds: Sequence[str] | None = None
    ) -> list[tuple[int, float]] | None:
        """The top ``k`` (id, BM25 score) among documents holding every ``owner`` token (and one
        of ``kinds``) that match any of ``terms``; a word found only in the context counts
        ``CONTEXT_WEIGHT``. None when the index missed a write and cannot answer."""
        hits: list[tuple[int, float]] | None = await self._run(
            self._search, list(owner), list(terms), k, kinds
        )
        return hits

    # --- on the index's thread -------------------------------------------------------------

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _build_schema(self) -> Any:
        tv = self._tantivy
        builder = tv.SchemaBuilder()
        builder.add_unsigned_field("id", stored=False, indexed=True, fast=True)
        builder.add_text_field("owner", tokenizer_name="raw", index_option="basic")
        builder.add_text_field("kind", tokenizer_name="raw", index_option="basic")
        builder.add_text_field("words", tokenizer_name="narrmem", index_option="freq")
        return builder.build()

    def _build_analyzer(self) -> Any:
        # FTS5's "porter unicode61 remove_diacritics 2" on text the store has already split into
        # words and CJK bigrams: split on anything but letters and digits, fold accents, stem.
        tv = self._tantivy
        return (
            tv.TextAnalyzerBuilder(tv.Tokenizer.simple())
            .filter(tv.Filter.lowercase())
            .filter(tv.Filter.ascii_fold())
            .filter(tv.Filter.stemmer("english"))
            .build()
        )

    def _load(self, folder: Path) -> None:
        self._index = self._tantivy.Index(self._schema, path=str(folder), reuse=True)
        self._index.register_tokenizer("narrmem", self._analyzer)
        self._writer = self._index.writer(WRITER_HEAP, 1)
        self._index.reload()
        self._searcher = self._index.searcher()

    def _open(self) -> int | None:
        for stale in self.folder.parent.glob(f"{self.folder.name}.*-*"):
            if _BUILDING in stale.name or _RETIRED in stale.name:
                shutil.rmtree(stale, ignore_errors=True)  # ours, left by a crash mid-rebuild
        if self.folder.exists() and not _ours(self.folder):
            raise StoreError(
                f"{self.folder} holds files that are not a narrmem keyword index: move them away"
            )
        state = _read_state(self.folder)  # None (no state, or not ours to trust): rebuilt
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self._load(self.folder)
        except (ValueError, OSError) as exc:
            log.warning("keyword index %s cannot be opened (%s): it is rebuilt", self.folder, exc)
            self._drop()
            return None
        self.changes = state
        return state

    def _drop(self) -> None:
        self._writer = self._searcher = self._index = None
        self._queue.clear()

    def _start_building(self, building: Path) -> None:
        self._close()
        # Until the new folder is complete, searches go to FTS5, not to a half-built index.
        self.changes = None
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        self._load(building)

    def _add_all(self, docs: Sequence[KeywordDoc]) -> None:
        for doc in docs:
            self._writer.add_document(self._document(doc))

    def _finish_building(self, building: Path, changes: int) -> None:
        self._writer.commit()
        self._writer.wait_merging_threads()
        self._drop()
        _write_state(building, changes)
        retired = self.folder.with_name(f"{self.folder.name}{_RETIRED}{os.getpid()}")
        if self.folder.exists() and not _ours(self.folder):
            shutil.rmtree(building, ignore_errors=True)
            raise StoreError(
                f"{self.folder} holds files that are not a narrmem keyword index: move them away"
            )
        if self.folder.exists():
            os.replace(self.folder, retired)
        os.replace(building, self.folder)
        shutil.rmtree(retired, ignore_errors=True)
        self._load(self.folder)
        self.changes = changes

    def _abandon(self, building: Path) -> None:
        self._close()
        shutil.rmtree(building, ignore_errors=True)
        try:
            self._load(self.folder)
        except (ValueError, OSError):
            self._drop()
        self.changes = None

    def _stage(self, added: list[KeywordDoc], removed: list[int]) -> None:
        writer, query_type = self._writer, self._tantivy.Query
        for memory_id in {*removed, *(doc.id for doc in added)}:
            # By query: a delete by term does not match an unsigned field's terms.
            writer.delete_documents_by_query(query_type.term_query(self._schema, "id", memory_id))
        self._add_all(added)

    def _flush(self) -> None:
        """Write and commit every queued write, and record the last one's count; a failure leaves
        the index unusable (FTS5 serves) until it is rebuilt."""
        with self._queue_lock:
            self._flush_queued = False
        batch = []
        while self._queue:
            batch.append(self._queue.popleft())
        if not batch or self._writer is None or self.changes is None:
            return
        try:
            for added, removed, _ in batch:
                self._stage(added, removed)
            self._writer.commit()
            self._index.reload()
            self._searcher = self._index.searcher()
            _write_state(self.folder, batch[-1][2])
        except Exception:
            log.exception("the keyword index %s missed a write: FTS5 serves until it is rebuilt", self.folder)
            self.changes = None
            return
        self.changes = batch[-1][2]

    def _document(self, doc: KeywordDoc) -> Any:
        out = self._tantivy.Document()
        out.add_unsigned("id", doc.id)
        for token in doc.owner:
            out.add_text("owner", token)
        out.add_text("kind", doc.kind)
        out.add_text("words", f"{doc.body} {doc.body} {doc.context}")
        return out

    def _search(
        self,
        owner: list[str],
        terms: list[str],
        k: int,
        kinds: Sequence[str] | None,
    ) -> list[tuple[int, float]] | None:
        self._flush()
        if self.changes is None:
            return None
        tv, schema = self._tantivy, self._schema
        words = list(dict.fromkeys(self._analyzer.analyze(" ".join(terms))))
        if not words or not owner:
            return []
        query_type, occur = tv.Query, tv.Occur
        should = [(occur.Should, query_type.term_query(schema, "words", word)) for word in words]
        clauses = [(occur.Must, query_type.term_query(schema, "owner", token)) for token in owner]
        if kinds:
            clauses.append((occur.Must, query_type.term_set_query(schema, "kind", list(kinds))))
        clauses.append((occur.Must, query_type.boolean_query(should)))
        searcher = self._searcher
        hits = searcher.search(query_type.boolean_query(clauses), k, count=False).hits
        ids = searcher.fast_field_values("id", [address for _, address in hits])
        return [(int(i), float(score)) for (score, _), i in zip(hits, ids, strict=True) if i is not None]

    def _close(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.wait_merging_threads()
        self._drop()


def _ours(folder: Path) -> bool:
    """Whether ``folder`` is empty or a tantivy index (which narrmem made there)."""
    names = {p.name for p in folder.iterdir()}
    return not names or STATE_FILE in names or "meta.json" in names


def _read_state(folder: Path) -> int | None:
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    changes = state.get("changes")
    return changes if isinstance(changes, int) and not isinstance(changes, bool) else None


def _write_state(folder: Path, changes: int) -> None:
    partial = folder / f"{STATE_FILE}.{os.getpid()}.partial"
    partial.write_text(json.dumps({"format": FORMAT, "changes": changes}), encoding="utf-8")
    os.replace(partial, folder / STATE_FILE)
