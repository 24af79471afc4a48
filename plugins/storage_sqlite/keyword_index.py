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
FTS5 weighs a word found in the context (date, the turns around) at two thirds and normalizes by
the whole row's length; so one field holds the text three times and the context twice, which gives
each word the same weighted frequency (format 1 held the text twice and the context once, for the
half weight of before: an index of that format is rebuilt when the store opens). Two fields with
a boost on the context's score (each field normalized on its own) were measured too, at the half
weight: LoCoMo dev R@5 / R@10 0.659 / 0.752 against FTS5's 0.696 / 0.783; one field gave 0.698 /
0.780. The weighting is fixed when a row is written, so a search that asks another context weight
than ``CONTEXT_WEIGHT`` (give or take ``CONTEXT_WEIGHT_TOLERANCE``) is left to FTS5.

SQLite stays the source of truth and FTS5 stays written: this index is derived. Its folder records
the count of keyword changes SQLite's triggers had reached at its last commit; an open that finds
another count (a crash between SQLite's commit and this one, or a folder copied from elsewhere)
rebuilds it from SQLite. A forget's purge rebuilds it too, in a new folder that replaces the old
one, because tantivy only marks deleted documents and keeps their terms until a merge: after the
purge no file holds a forgotten word. Writes and commits run on one thread of the index's own,
searches on another, a rebuild on a third, never on the event loop.

A rebuild reads every row (18 s at a million memories) with writes going on: the store holds its
writes back only while the rebuild starts (:meth:`TantivyKeywords.begin_rebuild`, with SQLite's
count of changes read in the same instant) and while the new index takes the old one's place
(:meth:`TantivyKeywords.finish_rebuild`). In between, every write goes to the index in use, which
keeps answering searches, and is kept aside for the new one, written into it at the end (a row
the rebuild read and written again since is replaced: writing a row deletes its id first). A write
the store could not give the index (:meth:`TantivyKeywords.missed`), or a count at the end other
than the last kept write's, leaves the new index unused, FTS5 serving until the next rebuild.

A search does not wait for a commit (10-20 ms, most of it the disk's flush; tantivy lets a search
run meanwhile): it reads the last committed state and the writes not committed yet beside it. Those
are a message or two in a bot's life, matched and scored here with tantivy's BM25 (k1 1.2, b 0.75)
and the committed index's word statistics, so a recall right after a write sees the write without
paying for its commit. The average length BM25 divides by is not exposed by tantivy; the average of
the documents this process wrote stands in for it, so a pending document's score is close to what
it gets once committed, not equal (``tests/test_keyword_index.py`` holds how close).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from narrmem_plugins.storage_sqlite import durable

from narrmem import logs
from narrmem.errors import StoreError

log = logs.logger("narrmem.keywords")

FORMAT = 4  # 3: words split at spaces alone, nothing folded (2026-12-07); 4: documents of schema 9
# A context word counts two thirds of a text word: the text is written three times, the context twice.
TEXT_COPIES, CONTEXT_COPIES = 3, 2
CONTEXT_WEIGHT = CONTEXT_COPIES / TEXT_COPIES
# A weight written as 0.667 in a config file is this index's weight.
CONTEXT_WEIGHT_TOLERANCE = 0.005
# In every document's kind field, beside its kind (which is lowercase letters, digits and "_"): its
# count is the number of documents tantivy's BM25 divides by, deleted ones not merged away included.
EVERY_DOCUMENT = "*"
STATE_FILE = "narrmem-keywords.json"
# Written into a folder as narrmem creates it: with the state file, what proves a folder is
# narrmem's (a tantivy index of another program's has tantivy's files too, meta.json first).
MARKER = ".narrmem-keywords"
WRITER_HEAP = 32_000_000  # bytes: tantivy flushes a segment when a writer's buffer is this full
BM25_K1 = 1.2  # tantivy's BM25 constants, for the documents scored before their commit
BM25_B = 0.75
COMMIT_INTERVAL = 0.25  # seconds between two commits while writes keep coming (one fsync each)
LENGTHS_SAMPLED = 4096  # documents whose length is counted for the average, then one in this many
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
                "the keyword index needs the tantivy package, one of narrmem's dependencies: pip install "
                "tantivy (or storage.keyword_index = 'fts5')"
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
        self._committed_at = -math.inf  # time.monotonic() when the last commit started
        self._later: asyncio.TimerHandle | None = None  # a flush waiting for COMMIT_INTERVAL
        self._closed = False
        # Set once the index in use missed a write (or is behind SQLite): it answers nothing and
        # records no count again until it is rebuilt, whatever a flush already under way does.
        self._stale = False
        # Writes the current searcher does not see yet, oldest first (queued or being committed):
        # a search reads them beside it. Changed with the searcher, under ``_queue_lock``.
        self._uncommitted: deque[tuple[list[KeywordDoc], list[int]]] = deque()
        # The rebuild in progress (one at a time): writes are kept aside for it.
        self._building: _Building | None = None
        self._lengths = _RunningMean()  # words per document written: BM25's average, estimated
        self._owners = _RunningMean()  # scope tokens per document
        self._schema = self._build_schema()
        self._analyzer = self._build_analyzer()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-keywords")
        self._searching = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-keywords-search")

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self, changes: int) -> bool:
        """Open the folder's index (made empty if there is none); whether it holds ``changes``,
        SQLite's count now. If not, it answers nothing (and takes no write) until rebuilt."""
        current: bool = await self._run(self._open, changes)
        return current

    @property
    def takes_writes(self) -> bool:
        """Whether writes are to be given to it (:meth:`apply`): it holds every one so far, or a
        rebuild keeps them for the index it is making."""
        return self.changes is not None or self._building is not None

    @property
    def rebuilding(self) -> bool:
        return self._building is not None

    async def begin_rebuild(self, changes: int, *, current: bool) -> None:
        """Start a new index in a folder of its own, ``changes`` being SQLite's count now; the
        caller holds its writes back for this call only. From here every write :meth:`apply`
        gets is kept for the new index too. ``current``: whether the index in use holds every
        write so far; if not, searches go to FTS5 until the new one is in place."""
        if self._building is not None:
            raise StoreError(f"the keyword index {self.folder} is already being rebuilt")
        if self._closed:
            raise StoreError(f"the keyword index {self.folder} is closed")
        folder = self.folder.with_name(f"{self.folder.name}{_BUILDING}{os.getpid()}")
        building = _Building(folder, changes)
        if not current:
            self._go_stale()
        try:
            await building.run(self._start_building, building)
        except BaseException:
            building.thread.shutdown(wait=True)
            raise
        with self._queue_lock:
            self._building = building

    async def fill_rebuild(self, batches: AsyncIterator[Sequence[KeywordDoc]]) -> None:
        """Write ``batches`` (every row, read with writes going on) into the new index, then what
        was kept aside meanwhile, and commit it."""
        building = self._being_built()
        async for docs in batches:
            await building.run(self._add_all, building.writer, building.lengths, building.owners, docs)
        await building.run(self._write_kept, building)

    async def finish_rebuild(self, changes: int) -> bool:
        """Write the last kept writes into the new index and put it in the old one's place; the
        caller holds its writes back for this call, ``changes`` being SQLite's count now. Whether
        the new index answers: not if a write was missed meanwhile (FTS5 serves until the next
        rebuild); the purge's end, no file of the old one left, holds either way."""
        building = self._being_built()
        try:
            await building.run(self._write_kept, building)
            await self._run(self._swap, building, changes)
        finally:
            if self._building is None:  # taken by the swap, even one that failed: no abandon follows
                building.thread.shutdown(wait=True)
        return self.changes is not None

    async def abandon_rebuild(self) -> None:
        """Drop the new index; the one in use goes on as it was (it took every write meanwhile)."""
        building = self._building
        if building is None:
            return
        with self._queue_lock:
            self._building = None
        try:
            await building.run(self._discard, building)
        finally:
            building.thread.shutdown(wait=True)

    def missed(self) -> None:
        """A write the store committed and could not give the index: FTS5 serves until a rebuild
        (one in progress now does not count, as it does not have the write either)."""
        with self._queue_lock:
            if self._building is not None:
                self._building.missed = True
        self._go_stale()

    def _go_stale(self) -> None:
        """The index in use stops answering, and its folder's count is spoiled on its thread (after
        any flush under way, which may record a count of its own): the next open rebuilds it."""
        with self._queue_lock:
            self.changes = None
            self._stale = True
        if not self._closed:
            self._thread.submit(_spoil_state, self.folder)

    def _being_built(self) -> _Building:
        if self._building is None:
            raise StoreError(f"the keyword index {self.folder} is not being rebuilt")
        return self._building

    async def flush(self) -> None:
        """Commit what is queued now, without waiting for ``COMMIT_INTERVAL``."""
        await self._run(self._flush)

    async def close(self) -> None:
        self._closed = True
        await self.abandon_rebuild()
        if self._later is not None:
            self._later.cancel()
        try:
            await self._run(self._close)
        finally:
            self._thread.shutdown(wait=True)
            self._searching.shutdown(wait=True)

    # --- writing --------------------------------------------------------------------------

    def apply(self, added: Sequence[KeywordDoc], removed: Sequence[int], changes: int) -> None:
        """Remove ``removed`` ids and add ``added`` (an id in both is replaced); ``changes`` is
        SQLite's count with them. Queued, not waited for: the index's thread writes what is queued
        and commits it (10-20 ms, most of it waiting on the disk) in one go, so a write never
        waits for a commit and the writes of one message share one; a search reads what is not
        committed yet beside the index, so it always sees every write before it. While writes keep
        coming, commits are ``COMMIT_INTERVAL`` apart: each costs a flush to the disk and CPU the
        next message's embedding could use, and no search waits for one."""
        with self._queue_lock:
            if self._building is not None:
                self._building.kept.append((list(added), list(removed), changes))
            self._queue.append((list(added), list(removed), changes))
            self._uncommitted.append((list(added), list(removed)))
            if self._flush_queued:
                return
            self._flush_queued = True
            wait = self._committed_at + COMMIT_INTERVAL - time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            wait = 0.0
        if wait > 0:
            self._later = loop.call_later(wait, self._flush_later)
        else:
            self._thread.submit(self._flush)

    def _flush_later(self) -> None:
        self._later = None
        if not self._closed:
            self._thread.submit(self._flush)

    # --- reading --------------------------------------------------------------------------

    async def search(
        self, owner: Sequence[str], terms: Sequence[str], k: int, *, kinds: Sequence[str] | None = None
    ) -> list[tuple[int, float]] | None:
        """The top ``k`` (id, BM25 score) among documents holding every ``owner`` token (and one
        of ``kinds``) that match any of ``terms``; a word found only in the context counts
        ``CONTEXT_WEIGHT``. None when the index missed a write and cannot answer."""
        hits: list[tuple[int, float]] | None = await asyncio.get_running_loop().run_in_executor(
            self._searching, self._search, list(owner), list(terms), k, kinds
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
        # FTS5's "porter unicode61 ... categories 'L* N* Co M*'" on text the store has already
        # split into words and bigrams, folded (narrmem.text.keyword_terms): split at the spaces
        # alone and stem. The simple tokenizer split a Hindi word at its virama (प्रिया as प and
        # रिया, found by any word starting with प), and ascii_fold folded letters FTS5 kept.
        tv = self._tantivy
        return (
            tv.TextAnalyzerBuilder(tv.Tokenizer.whitespace())
            .filter(tv.Filter.lowercase())
            .filter(tv.Filter.stemmer("english"))
            .build()
        )

    def _load(self, folder: Path) -> None:
        self._index = self._tantivy.Index(self._schema, path=str(folder), reuse=True)
        self._index.register_tokenizer("narrmem", self._analyzer)
        self._writer = self._index.writer(WRITER_HEAP, 1)
        self._index.reload()
        self._searcher = self._index.searcher()

    def _open(self, changes: int) -> bool:
        for stale in self.folder.parent.glob(f"{self.folder.name}.*-*"):
            if (_BUILDING in stale.name or _RETIRED in stale.name) and _marked(stale):
                shutil.rmtree(stale, ignore_errors=True)  # ours, left by a crash mid-rebuild
        check_folder(self.folder)
        state = _read_state(self.folder)  # None (no state, or not ours to trust): rebuilt
        _make_own(self.folder)
        try:
            self._load(self.folder)
        except (ValueError, OSError) as exc:
            log.warning("keyword index %s cannot be opened (%s): it is rebuilt", self.folder, exc)
            self._drop()
            return False
        if state != changes:  # behind SQLite (or ahead: another folder's): never answers as it is
            return False
        self.changes = state
        return True

    def _drop(self) -> None:
        with self._queue_lock:
            self._writer = self._searcher = self._index = None
            self._queue.clear()
            self._uncommitted.clear()

    def _start_building(self, building: _Building) -> None:
        folder = building.folder
        if folder.exists() and not _marked(folder):
            raise StoreError(f"{folder} is a folder narrmem did not write: move it away")
        shutil.rmtree(folder, ignore_errors=True)
        _make_own(folder)
        index = self._tantivy.Index(self._schema, path=str(folder), reuse=True)
        index.register_tokenizer("narrmem", self._analyzer)
        building.writer = index.writer(WRITER_HEAP, 1)

    def _add_all(
        self, writer: Any, lengths: _RunningMean, owners: _RunningMean, docs: Sequence[KeywordDoc]
    ) -> None:
        for doc in docs:
            writer.add_document(self._document(doc))
            # A sample is enough for a mean, and a rebuild of a million rows should not pay for
            # counting each (the analyzer itself stays on the search thread).
            if lengths.count < LENGTHS_SAMPLED or doc.id % LENGTHS_SAMPLED == 0:
                lengths.add(len(_words(doc).split()))  # the analyzer splits at spaces alone
                owners.add(len(doc.owner))

    def _write_kept(self, building: _Building) -> None:
        """Write the writes kept aside so far into the new index, in their order, and commit."""
        with self._queue_lock:
            kept, building.kept = building.kept, []
        for added, removed, changes in kept:
            self._stage(building.writer, building.lengths, building.owners, added, removed)
            building.changes = changes
        building.writer.commit()

    def _swap(self, building: _Building, changes: int) -> None:
        """Put the new index in the old one's place (no write comes meanwhile: the caller holds
        them back, and the queue's last flush ran before this on the same thread). Searches go to
        FTS5 from its first step (the writes queued for the old index are in the new one only)
        until the new one answers; if a step fails, until the next rebuild."""
        with self._queue_lock:
            self._building = None
            self._queue.clear()  # in the new index already, as kept writes
            self._uncommitted.clear()
            self._flush_queued = False  # a flush timer still set finds nothing queued
            self._searcher = None
            self.changes = None
            self._stale = False  # from here, set by a miss reported during the swap
        try:
            self._replace(building, changes)
        except BaseException:
            self._drop()
            self.changes = None
            raise

    def _replace(self, building: _Building, changes: int) -> None:
        missed = building.missed or building.changes != changes
        if missed:
            log.warning(
                "the keyword index %s was rebuilt without a write made meanwhile: FTS5 serves until "
                "it is rebuilt again",
                self.folder,
            )
        building.writer.wait_merging_threads()
        building.writer = None
        if self._writer is not None:
            self._writer.wait_merging_threads()  # no merge of the old one writes into a moved folder
        self._drop()
        if not missed:  # no state: the next open rebuilds it
            _write_state(building.folder, changes)
        retired = self.folder.with_name(f"{self.folder.name}{_RETIRED}{os.getpid()}")
        if self.folder.exists() and not _ours(self.folder):
            shutil.rmtree(building.folder, ignore_errors=True)
            check_folder(self.folder)
        if self.folder.exists():
            os.replace(self.folder, retired)
        os.replace(building.folder, self.folder)
        durable.sync_folder(self.folder.parent)  # the new folder's name on disk before the old goes
        shutil.rmtree(retired, ignore_errors=True)
        self._lengths, self._owners = building.lengths, building.owners
        try:
            self._load(self.folder)
        except (ValueError, OSError):
            log.exception("the rebuilt keyword index %s cannot be opened: FTS5 serves", self.folder)
            self._drop()
            return
        with self._queue_lock:
            self._stale = self._stale or missed
            self.changes = None if self._stale else changes

    def _discard(self, building: _Building) -> None:
        if building.writer is not None:
            building.writer.wait_merging_threads()
            building.writer = None
        if _marked(building.folder):
            shutil.rmtree(building.folder, ignore_errors=True)

    def _stage(
        self,
        writer: Any,
        lengths: _RunningMean,
        owners: _RunningMean,
        added: list[KeywordDoc],
        removed: list[int],
    ) -> None:
        query_type = self._tantivy.Query
        for memory_id in {*removed, *(doc.id for doc in added)}:
            # By query: a delete by term does not match an unsigned field's terms.
            writer.delete_documents_by_query(query_type.term_query(self._schema, "id", memory_id))
        self._add_all(writer, lengths, owners, added)

    def _flush(self) -> None:
        """Write and commit every queued write, and record the last one's count; a failure leaves
        the index unusable (FTS5 serves) until it is rebuilt."""
        with self._queue_lock:
            self._flush_queued = False
            batch = list(self._queue)
            self._queue.clear()
            if batch:
                # Commits start an interval apart; set with the batch taken, so that a write
                # queued from now on waits for the interval.
                self._committed_at = time.monotonic()
        if not batch:
            return
        if self._writer is None or self.changes is None or self._stale:
            self._forget_uncommitted()  # FTS5 serves until a rebuild: nothing to read beside
            return
        try:
            for added, removed, _ in batch:
                self._stage(self._writer, self._lengths, self._owners, added, removed)
            self._writer.commit()
            self._index.reload()
            searcher = self._index.searcher()
            if self._stale:  # missed a write meanwhile: its count is spoiled next on this thread
                self._forget_uncommitted()
                return
            _write_state(self.folder, batch[-1][2])
        except Exception:
            log.exception("the keyword index %s missed a write: FTS5 serves until it is rebuilt", self.folder)
            self.changes = None
            self._forget_uncommitted()
            return
        with self._queue_lock:
            if self._stale:
                self._uncommitted.clear()
                return
            # The new searcher sees the batch: searches stop reading it beside the index.
            self._searcher = searcher
            for _ in batch:
                self._uncommitted.popleft()
            self.changes = batch[-1][2]

    def _forget_uncommitted(self) -> None:
        """An index that no longer answers keeps no writes for its searches (a bot may run for
        days on FTS5 before the next open rebuilds it)."""
        with self._queue_lock:
            self._uncommitted.clear()

    def _document(self, doc: KeywordDoc) -> Any:
        out = self._tantivy.Document()
        out.add_unsigned("id", doc.id)
        for token in doc.owner:
            out.add_text("owner", token)
        out.add_text("kind", doc.kind)
        out.add_text("kind", EVERY_DOCUMENT)
        out.add_text("words", _words(doc))
        return out

    def _search(
        self,
        owner: list[str],
        terms: list[str],
        k: int,
        kinds: Sequence[str] | None,
    ) -> list[tuple[int, float]] | None:
        with self._queue_lock:
            searcher, changes = self._searcher, self.changes
            uncommitted = list(self._uncommitted)
        if changes is None or searcher is None:
            return None
        tv, schema = self._tantivy, self._schema
        words = list(dict.fromkeys(self._analyzer.analyze(" ".join(terms))))
        if not words or not owner:
            return []
        # What the writes not committed yet say: each id's latest version, or gone.
        latest: dict[int, KeywordDoc | None] = {}
        for added, removed in uncommitted:
            latest.update(dict.fromkeys(removed))
            latest.update((doc.id, doc) for doc in added)
        query_type, occur = tv.Query, tv.Occur
        should = [(occur.Should, query_type.term_query(schema, "words", word)) for word in words]
        clauses = [(occur.Must, query_type.term_query(schema, "owner", token)) for token in owner]
        if kinds:
            clauses.append((occur.Must, query_type.term_set_query(schema, "kind", list(kinds))))
        clauses.append((occur.Must, query_type.boolean_query(should)))
        hits = searcher.search(query_type.boolean_query(clauses), k + len(latest), count=False).hits
        ids = searcher.fast_field_values("id", [address for _, address in hits])
        found = [
            (int(i), float(score))
            for (score, _), i in zip(hits, ids, strict=True)
            if i is not None and int(i) not in latest
        ]
        for doc in latest.values():
            if doc is not None and set(owner) <= set(doc.owner) and (not kinds or doc.kind in kinds):
                score = self._pending_score(searcher, doc, owner, words, bool(kinds))
                if score is not None:
                    found.append((doc.id, score))
        found.sort(key=lambda hit: (-hit[1], hit[0]))
        return found[:k]

    def _pending_score(
        self, searcher: Any, doc: KeywordDoc, owner: list[str], words: list[str], kinds: bool
    ) -> float | None:
        """The score tantivy would give ``doc`` were it committed now (None: it does not match):
        BM25 of the words it holds and of its scope tokens (required clauses score too), with the
        committed index's statistics and ``doc`` added to them (those the committed documents of
        the same search are scored with), and 1 for the kind filter (a constant-score query)."""
        counts = Counter(self._analyzer.analyze(_words(doc)))
        matched = [word for word in words if counts[word]]
        if not matched:
            return None
        # BM25's document count is tantivy's: replaced and deleted documents a merge has not
        # dropped yet count too, as they do in the word counts (a reply rewrites the rows before
        # it). Every document holds EVERY_DOCUMENT.
        total = max(searcher.doc_freq("kind", EVERY_DOCUMENT), searcher.num_docs) + 1

        def bm25(field: str, term: str, frequency: int, length: float, average: float) -> float:
            documents = searcher.doc_freq(field, term) + 1
            idf = math.log(1 + (total - documents + 0.5) / (documents + 0.5))
            norm = 1 - BM25_B + BM25_B * length / max(average, 1.0)
            return idf * frequency * (BM25_K1 + 1) / (frequency + BM25_K1 * norm)

        length = sum(counts.values())
        score = sum(bm25("words", w, counts[w], length, self._lengths.mean or length) for w in matched)
        owners = len(doc.owner)
        score += sum(bm25("owner", t, 1, owners, self._owners.mean or owners) for t in owner)
        return score + (1.0 if kinds else 0.0)

    def _close(self) -> None:
        self._flush()
        if self._writer is not None:
            self._writer.wait_merging_threads()
        self._drop()


def _words(doc: KeywordDoc) -> str:
    """The one field's text: the message and its context, each repeated (see the module's note)."""
    return " ".join([doc.body] * TEXT_COPIES + [doc.context] * CONTEXT_COPIES)


class _RunningMean:
    """A mean kept as documents are written (one thread writes it)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0

    def add(self, value: int) -> None:
        self.count += 1
        self.total += value

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


class _Building:
    """A rebuild in progress: its folder, writer and thread, and the writes kept aside for it."""

    def __init__(self, folder: Path, changes: int) -> None:
        self.folder = folder
        self.changes = changes  # SQLite's count the new index holds: at its start, then each kept write's
        self.writer: Any = None
        self.kept: list[tuple[list[KeywordDoc], list[int], int]] = []
        self.missed = False
        self.lengths = _RunningMean()
        self.owners = _RunningMean()
        # Its own thread: the index in use keeps committing writes on its own meanwhile.
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="narrmem-keywords-rebuild")

    async def run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, fn, *args)


def remove_own(folder: Path) -> bool:
    """Delete ``folder`` if it is a keyword index narrmem wrote (marked as its own); whether it did.
    A folder narrmem cannot prove is its own is left as it is."""
    if not (folder.is_dir() and _marked(folder)):
        return False
    shutil.rmtree(folder)
    return True


def check_folder(folder: Path) -> None:
    """Refuse a keyword index folder narrmem cannot prove is its own, before anything is written."""
    if folder.exists() and not (folder.is_dir() and _ours(folder)):
        raise StoreError(
            f"{folder} holds files that are not a narrmem keyword index (no {STATE_FILE} or {MARKER}): "
            "narrmem does not touch it; move it away, or set storage.keyword_index = 'fts5'"
        )


def _ours(folder: Path) -> bool:
    """Whether ``folder`` is empty (nothing in it to lose) or carries narrmem's marker."""
    return not any(folder.iterdir()) or _marked(folder)


def _marked(folder: Path) -> bool:
    """Whether ``folder`` carries what narrmem writes in a keyword index folder of its own."""
    return (folder / STATE_FILE).is_file() or (folder / MARKER).is_file()


def _make_own(folder: Path) -> None:
    """Create ``folder`` (or take an empty one) and mark it as narrmem's."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _marked(folder):
        (folder / MARKER).write_text(json.dumps({"narrmem": "keyword index"}) + "\n", encoding="utf-8")


def _read_state(folder: Path) -> int | None:
    try:
        state = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    changes = state.get("changes")
    return changes if isinstance(changes, int) and not isinstance(changes, bool) else None


def _spoil_state(folder: Path) -> None:
    """Record a count SQLite never reaches (-1) in ``folder``: its next open rebuilds it."""
    if (folder / STATE_FILE).is_file():
        _write_state(folder, -1)


def _write_state(folder: Path, changes: int) -> None:
    partial = folder / f"{STATE_FILE}.{os.getpid()}.partial"
    partial.write_text(json.dumps({"format": FORMAT, "changes": changes}), encoding="utf-8")
    durable.replace_synced(partial, folder / STATE_FILE)
