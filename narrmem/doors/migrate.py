"""``narrmem migrate``: move a whole memory between backends (a data folder and a PostgreSQL DSN,
either way), losslessly and resumably, and check the result.

What moves: every memory with its vector, provenance and ids, the importance history and each
memory's importance after decay, plugin state, pending forget jobs, and every plugin's own data
that the target's plugins can hold (the graph and RTM trees, on both backends). Re-running skips
what the target already holds (records by id with identical content, side rows by key), so an
interrupted migration is finished by running it again.
The end check compares row counts per table and the top hits of a sample of recalls.

``reembed``: the target is a store of the model its own settings give (``target_settings``), and
every memory's vector is made again with it from the text it was first made of
(:mod:`narrmem.reembedding`), so a memory can move to another model; the plugins' cached vectors
of the old model stay behind (a plugin remakes them). The end check is then that the sampled
memories hold on the target the vectors its model makes of them (the two models' top hits need not
agree). A model is its name and, for a folder of its own, its weights' digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import tempfile
from array import array
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import SecretStr
from tqdm import tqdm

from narrmem import logs
from narrmem.config import Settings, load_settings
from narrmem.doors.importing import ReadWhenAsked
from narrmem.doors.transfer import each_record, plugin_sections
from narrmem.errors import ConfigError, InputError, StoreError
from narrmem.memory import Memory
from narrmem.models import MemoryRecord, Scope
from narrmem.reembedding import model_identity, vectors
from narrmem.store import STORE_NOTES

log = logs.logger("narrmem.doors.migrate")

BATCH = 500
RECALL_AGREEMENT = 0.9  # the share of the sample that must agree (or hold its vector) to verify
SAME_VECTOR = 0.999  # cosine of a vector made again to the one held: one model, one text
SIDE_TABLES = ("memory_history", "plugin_state", "forget_jobs")
# Tables of the memories themselves, compared after the copy.
COUNTED = ("memories", "memory_sources", "memory_history", "plugin_state", "forget_jobs", "vectors")


def is_dsn(where: str) -> bool:
    return where.startswith(("postgresql://", "postgres://")) or "host=" in where or "dbname=" in where


def endpoint_settings(where: str, settings: Settings) -> tuple[Settings, str | None]:
    """Settings that open ``where`` (a DSN or a data folder) and the folder a DSN needs as its
    ``data_dir`` (``None`` for a folder)."""
    if not isinstance(where, str) or not where.strip():
        raise InputError("must be a data folder or a postgresql:// DSN", field="from/to")
    storage = settings.storage
    if is_dsn(where):
        update: dict[str, Any] = {"backend": "postgres", "dsn": SecretStr(where)}
        return settings.model_copy(update={"storage": storage.model_copy(update=update)}), where
    update = {"backend": "sqlite"}
    return (
        settings.model_copy(update={"data_dir": where, "storage": storage.model_copy(update=update)}),
        None,
    )


@contextlib.asynccontextmanager
async def _open(
    where: str,
    settings: Settings,
    *,
    read_only: bool,
    plugins: Iterable[object],
    load_entrypoints: bool | None,
    warm: bool,
    new_store_model: str | None = None,
) -> AsyncIterator[Memory]:
    opened, dsn = endpoint_settings(where, settings)
    with contextlib.ExitStack() as stack:
        if dsn is not None:
            # A Memory needs a folder even when its store is a server: an empty temporary one.
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="narrmem-migrate-"))
            opened = opened.model_copy(update={"data_dir": folder})
        async with Memory.open(
            settings=opened,
            read_only=read_only,
            plugins=plugins,
            load_entrypoints=load_entrypoints,
            warm=warm,
            new_store_model=new_store_model,
        ) as memory:
            yield memory


async def migrate(
    source: str,
    target: str,
    *,
    settings: Settings | None = None,
    config_file: str | Path | None = None,
    plugins: Iterable[object] = (),
    load_entrypoints: bool | None = None,
    queries: int = 20,
    k: int = 5,
    progress: bool = True,
    reembed: bool = False,
    target_settings: Settings | None = None,
) -> dict[str, Any]:
    """Copy everything from ``source`` to ``target`` and check it; return a report (counts per
    table on both sides, what was copied and skipped, the recall comparison, what was left out).
    The source is opened read-only and never changed. ``target_settings`` open the target
    (default: ``settings``); ``reembed`` makes every vector again with the target's model."""
    if source == target:
        raise InputError("source and target are the same", field="to")
    settings = settings or load_settings(config_file)
    plugins = list(plugins)
    report: dict[str, Any] = {"source": _shown(source), "target": _shown(target), "reembedded": reembed}
    opening = functools.partial(_open, plugins=plugins, load_entrypoints=load_entrypoints)
    async with (
        # Re-embedding, the source's model is never run: its store is only read.
        opening(source, settings, read_only=True, warm=queries > 0 and not reembed) as src,
        # A target created here holds the source's vectors, copied as they are, or, re-embedding,
        # its own model's.
        opening(
            target,
            target_settings or settings,
            read_only=False,
            warm=True,
            new_store_model=None if reembed else src.embedder.name,
        ) as dst,
    ):
        models = {"source": await model_identity(src.embedder), "target": await model_identity(dst.embedder)}
        report["models"] = models
        if not reembed and models["target"] != models["source"]:
            raise ConfigError(
                f"embedder: the target's model is {models['target']}, the source's vectors are "
                f"{models['source']}'s: copied, they would be searched with another model's "
                "(re-embed them: --reembed)"
            )
        for side in (src, dst):
            for method in ("dump_rows", "load_rows", "table_counts"):
                if not callable(getattr(side.store, method, None)):
                    raise StoreError(
                        f"the {side.settings.storage.backend} store cannot be migrated ({method})"
                    )
        before = await src.store.table_counts()  # type: ignore[attr-defined]
        report["memories"] = await _copy_memories(src, dst, before["memories"], progress, reembed)
        report["side_tables"] = {
            table: await _copy_side(src, dst, table, before[table], progress) for table in SIDE_TABLES
        }
        report["current_importance"] = await _copy_current_importance(src, dst)
        # Re-embedding, the plugins are told the vectors are another model's (a folder of the same
        # name as the target's too): what they cached of the old model goes.
        vectors_of = models["source"] if reembed else dst.embedder.name
        report["plugin_sections"], report["not_migrated"] = await _copy_plugin_sections(src, dst, vectors_of)
        after = await dst.store.table_counts()  # type: ignore[attr-defined]
        # Each store's notes of itself (its tables' versions, its model's weights) are its own, not
        # copied (the source's weights note refused the target's own model folder): the rest of
        # plugin state is compared.
        before["plugin_state"] -= len(await _own_notes(src))
        after["plugin_state"] -= len(await _own_notes(dst))
        report["counts"] = {table: {"source": before[table], "target": after[table]} for table in COUNTED}
        report["counts_match"] = all(before[t] == after[t] for t in COUNTED)
        report["recall"] = await _compare_recall(src, dst, queries, k, reembed) if queries > 0 else None
    # A plugin's data left behind is not a finished migration: the run said "verified" and exited
    # 0 while a plugin not loaded on the target kept its whole table at the source.
    report["verified"] = (
        bool(report["counts_match"])
        and not report["not_migrated"]
        and (report["recall"] is None or report["recall"]["agreement"] >= RECALL_AGREEMENT)
    )
    return report


async def _copy_memories(
    src: Memory, dst: Memory, total: int, progress: bool, reembed: bool
) -> dict[str, int]:
    done = {"imported": 0, "skipped": 0}
    batch: list[tuple[MemoryRecord, np.ndarray]] = []

    async def write() -> None:
        items = await _made_again(dst, batch) if reembed else batch
        _add(done, await dst.store.import_records(items))
        bar.update(len(batch))
        batch.clear()

    with tqdm(total=total, desc="memories", unit="rec", disable=not progress) as bar:
        async for item in src.store.export():
            batch.append(item)
            if len(batch) >= BATCH:
                await write()
        if batch:
            await write()
    return done


async def _made_again(
    dst: Memory, batch: Sequence[tuple[MemoryRecord, np.ndarray]]
) -> list[tuple[MemoryRecord, np.ndarray]]:
    """``batch`` with the vectors of ``dst``'s model. What the target holds already (a migration
    run again) is not embedded again: the import only checks it is the same record."""
    held = await dst.store.get([record.id for record, _ in batch if record.id is not None], None)
    new = [record for record, _ in batch if record.id not in held]
    made = iter(await vectors(dst, new)) if new else iter(())
    unused = np.zeros(dst.embedder.dim, dtype=np.float32)
    return [(record, unused if record.id in held else next(made)) for record, _ in batch]


async def _own_notes(memory: Memory) -> set[str]:
    return {key for key, _ in await memory.store.state_items(STORE_NOTES)}


async def _copy_side(src: Memory, dst: Memory, table: str, total: int, progress: bool) -> dict[str, int]:
    copied = seen = 0
    after = 0
    last_key: tuple[str, str] | None = None
    with tqdm(total=total, desc=table, unit="row", disable=not progress) as bar:
        while True:
            # plugin_state by the last key seen (an offset skipped a row for each one deleted
            # before it meanwhile), the others by id.
            rows = await src.store.dump_rows(  # type: ignore[attr-defined]
                table, after, BATCH, **({"after_key": last_key} if last_key is not None else {})
            )
            if not rows:
                break
            seen += len(rows)
            if table == "plugin_state":
                last_key = (str(rows[-1]["namespace"]), str(rows[-1]["key"]))
                rows = [row for row in rows if row["namespace"] != STORE_NOTES]
            copied += await dst.store.load_rows(table, rows) if rows else 0  # type: ignore[attr-defined]
            if table != "plugin_state":
                after = int(rows[-1]["id"])
            bar.update(len(rows))
    return {"copied": copied, "skipped": seen - copied}


async def _copy_current_importance(src: Memory, dst: Memory) -> int:
    """Each memory's importance after decay at the source's last pass (its history rows travel
    with the side tables)."""
    copied = last = 0
    while states := await src.store.importance_states(last, BATCH):
        values = [(memory_id, current) for memory_id, _, _, current in states if current is not None]
        if values:
            await dst.store.set_current_importance(values, [], src.clock.now())
            copied += len(values)
        last = states[-1][0]
    return copied


async def _copy_plugin_sections(
    src: Memory, dst: Memory, vectors_of: str
) -> tuple[dict[str, int], dict[str, int]]:
    """Every plugin's own data (``narrmem_export_records``: graph, RTM trees), imported into the
    target by its plugins the way ``narrmem import`` does it (checked on a dry run first). Sections
    no plugin of the target takes (a plugin idle on that backend) are left out, with their row
    counts returned as not migrated and a warning."""
    with tempfile.TemporaryDirectory(prefix="narrmem-migrate-") as folder:
        sections: dict[str, SpooledSection] = {}
        for name, rows in (await plugin_sections(src)).items():
            spooled = SpooledSection(Path(folder) / f"section-{len(sections)}.jsonl")
            async with contextlib.aclosing(each_record(rows)) as records:
                await spooled.fill(records)
            if len(spooled):
                sections[name] = spooled
        if not sections:
            return {}, {}
        claimed: dict[str, int] = {}
        for dry_run in (True, False):
            claimed = {}
            parts = await dst.host.call(
                "narrmem_import_records",
                isolate=False,
                memory=dst,
                sections=sections,
                dry_run=dry_run,
                vectors_of=vectors_of,
            )
            for part in parts:
                claimed.update(part or {})
    left = {name: len(rows) for name, rows in sections.items() if name not in claimed}
    if left:
        log.warning("not migrated (no plugin of the target takes them): %s", left)
    return claimed, left


class SpooledSection(ReadWhenAsked):
    """A plugin section of the source, written to a temporary file as it is read and read back
    from it as the target's plugins ask (as ``narrmem import`` hands a file's sections over): held
    whole, a graph of millions of rows took gigabytes at the migration a store outgrowing one
    process needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: array[int] = array("q")

    async def fill(self, records: AsyncIterator[dict[str, Any]]) -> None:
        batch: list[dict[str, Any]] = []
        async for record in records:
            batch.append(record)
            if len(batch) >= BATCH:
                await asyncio.to_thread(self._append, batch)
                batch = []
        await asyncio.to_thread(self._append, batch)

    def _append(self, records: list[dict[str, Any]]) -> None:
        with self.path.open("ab") as out:
            for record in records:
                self.offsets.append(out.tell())
                out.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")

    def __len__(self) -> int:
        return len(self.offsets)

    def _read(self, indexes: Sequence[int]) -> Iterator[dict[str, Any]]:
        with self.path.open("rb") as source:
            for index in indexes:
                source.seek(self.offsets[index])
                record: dict[str, Any] = json.loads(source.readline())
                yield record


async def _compare_recall(src: Memory, dst: Memory, queries: int, k: int, reembed: bool) -> dict[str, Any]:
    """Recall the same sample of queries (texts of evenly spaced memories, in their user's scope)
    from both sides: the share of top-k ids that agree. Re-embedded, the two models' hits need
    not agree: the share of the sampled memories whose vector on the target is the one its model
    makes of them (:func:`_holds_its_vector`; ``agreement`` too, so one bar judges both)."""
    # Counted, then read again for the picks: not every memory held at once (4.7 GB at 1.5M, after
    # a copy that succeeded, killed the migration before it said "verified").
    count = 0
    async for _ in src.store.export():
        count += 1
    if not count:
        return {"queries": 0, "agreement": 1.0}
    wanted = {int(i) for i in np.linspace(0, count - 1, min(queries, count))}
    picks: list[MemoryRecord] = []
    place = 0
    async for record, _ in src.store.export():
        if place in wanted:
            picks.append(record)
        place += 1
    agree = total = 0
    for record in picks:
        query = record.text[:500]
        if reembed:
            agree += await _holds_its_vector(dst, record)
            total += 1
            continue
        left, right = await _top(src, query, record, k), await _top(dst, query, record, k)
        agree += len(set(left) & set(right))
        total += max(len(left), len(right))
    measure = "vectors made again agree" if reembed else "top hits agree"
    return {
        "queries": len(picks),
        "k": k,
        "measure": measure,
        "agreement": round(agree / total, 4) if total else 1.0,
    }


async def _holds_its_vector(memory: Memory, record: MemoryRecord) -> bool:
    """Whether the target holds, for ``record``, the vector its model makes of the record's text
    (made again here): a recall of the record's own text found it by its words whatever its
    vector was, random or another model's."""
    assert record.id is not None
    held = await memory.store.vectors([record.id], Scope(tenant=record.tenant, user_id=record.user_id))
    if record.id not in held:
        return False
    [made] = await vectors(memory, [record])
    return float(np.dot(held[record.id], made)) >= SAME_VECTOR


async def _top(memory: Memory, query: str, record: MemoryRecord, k: int) -> list[int]:
    hits = await memory.recall(query, user_id=record.user_id, tenant=record.tenant, k=k, reinforce=False)
    return [h.id for h in hits]


def _add(total: dict[str, int], part: dict[str, int]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0) + value


def _shown(where: str) -> str:
    if not is_dsn(where):
        return where
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(where)
    except ValueError:
        return "<dsn>"
    netloc = parts.netloc
    if "@" in netloc and ":" in netloc.rsplit("@", 1)[0]:
        user = netloc.rsplit("@", 1)[0].split(":", 1)[0]
        netloc = f"{user}:***@{netloc.rsplit('@', 1)[1]}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
