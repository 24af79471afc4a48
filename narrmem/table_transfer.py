"""A plugin's own table in and out of a full export, for ``narrmem_export_records`` and
``narrmem_import_records`` (see :mod:`narrmem.hookspecs`).

A row becomes a JSON object of its columns, read from the database itself, so a column added to the
table is exported without a change here; ``BLOB`` values are base64 text. Rows are read in a stable
order and written back with their keys, so export → import into a fresh store → export gives the
same records. Importing checks every record first (shape, JSON types per column, what a text column
holds when the spec says so, conflicts with what is stored) and names the record and the column at
fault; a record already stored with identical content is skipped.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from narrmem.checks import JsonShapeError, check_time_range, loads_json
from narrmem.errors import InputError
from narrmem.store import ReadsSnapshots, SQLCapable, SQLConnection

_COLUMNS_SQL = {
    "sqlite": "SELECT name, type FROM pragma_table_info(?) ORDER BY cid",
    "postgres": "SELECT column_name, data_type FROM information_schema.columns "
    "WHERE table_name = ? AND table_schema = current_schema() ORDER BY ordinal_position",
}


@dataclass(frozen=True)
class Column:
    name: str
    kind: str  # "blob", "integer", "real", "text" or "any"
    bits: int = 64  # the widest integer the column takes (PostgreSQL's integer: 32)

    def check(self, value: Any) -> str | None:
        """Why ``value`` (from JSON) cannot go in this column, or ``None``."""
        if value is None:
            return None
        allowed: dict[str, tuple[type, ...]] = {
            "blob": (str,),
            "integer": (int,),
            "real": (int, float),
            "text": (str,),
            "any": (str, int, float),
        }
        ok = isinstance(value, allowed[self.kind]) and not isinstance(value, bool)
        if not ok:
            return f"must be {'base64 text' if self.kind == 'blob' else self.kind} or null"
        # The database would refuse it with an error of its own driver, naming nothing.
        limit = 1 << (self.bits - 1)
        if isinstance(value, int) and not -limit <= value < limit:
            return f"must fit in a {self.bits}-bit integer"
        return None

    def to_json(self, value: Any) -> Any:
        if self.kind == "blob" and isinstance(value, bytes | bytearray | memoryview):
            return base64.b64encode(bytes(value)).decode("ascii")
        return value

    def from_json(self, value: Any) -> Any:
        if self.kind == "blob" and value is not None:
            return base64.b64decode(value, validate=True)
        return value


# What a text column holds, beyond being text: JSON of an object, of an array, of an array of
# strings, or an ISO-8601 time with a timezone. The database takes any text; the plugin that reads
# it back does not, so a file holding other text is refused at the import, not at a later recall.
TextFormat = Literal["object", "array", "strings", "time"]


def text_format_problem(value: Any, text_format: TextFormat) -> str | None:
    """Why ``value`` (a column's text, or ``None``) is not ``text_format``, or ``None``."""
    if not isinstance(value, str):
        return None  # null, or a type :meth:`Column.check` refuses
    if text_format == "time":
        return _time_problem(value)
    try:
        parsed = loads_json(value)
    except (JsonShapeError, json.JSONDecodeError, ValueError) as exc:
        return f"must be JSON text of {_FORMAT_WORDS[text_format]} ({exc})"
    wanted = dict if text_format == "object" else list
    if not isinstance(parsed, wanted) or (
        text_format == "strings" and not all(isinstance(item, str) for item in parsed)
    ):
        return f"must be JSON text of {_FORMAT_WORDS[text_format]}"
    return None


_FORMAT_WORDS = {"object": "an object", "array": "an array", "strings": "an array of strings"}


def _time_problem(text: str) -> str | None:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return "must be an ISO-8601 time with a timezone"
    if when.tzinfo is None or when.utcoffset() is None:
        return "must be an ISO-8601 time with a timezone"
    try:
        check_time_range(when)
    except ValueError as exc:
        return str(exc)
    return None


def _kind(declared: str) -> str:
    declared = declared.upper()
    if "BLOB" in declared or "BYTEA" in declared:
        return "blob"
    if "INT" in declared:
        return "integer"
    if any(word in declared for word in ("REAL", "FLOA", "DOUB", "NUMERIC")):
        return "real"
    if any(word in declared for word in ("TEXT", "CHAR", "CLOB")):
        return "text"
    return "any"


def _bits(declared: str, dialect: str) -> int:
    """The width of an integer column: SQLite's integers are all 64 bits."""
    declared = declared.upper()
    if dialect == "sqlite" or "BIG" in declared or "INT8" in declared:
        return 64
    if "SMALL" in declared or "INT2" in declared:
        return 16
    return 32 if "INT" in declared or "SERIAL" in declared else 64


async def table_columns(db: SQLConnection, table: str, exclude: Collection[str] = ()) -> list[Column]:
    """The table's columns, in their order, less ``exclude`` (a column the database fills itself)."""
    rows = await db.fetchall(_COLUMNS_SQL.get(db.dialect, _COLUMNS_SQL["postgres"]), (table,))
    return [
        Column(str(name), _kind(str(declared)), _bits(str(declared), db.dialect))
        for name, declared in rows
        if name not in exclude
    ]


@dataclass(frozen=True)
class RowsOf:
    """Which rows of a table an export reads: those of one person (``user_id``) or of a tenant,
    by the table's own columns of those names."""

    tenant: str
    user_id: str | None = None

    def clause(self) -> tuple[list[str], list[Any]]:
        clauses, params = ["tenant = ?"], [self.tenant]
        if self.user_id is not None:
            clauses.append("user_id = ?")
            params.append(self.user_id)
        return clauses, params


async def export_page(
    db: SQLConnection,
    spec: TableSpec,
    *,
    after: Any = None,
    limit: int | None = 1000,
    rows_of: RowsOf | None = None,
) -> list[tuple[Any, dict[str, Any]]]:
    """Up to ``limit`` rows (``None``: all) of the spec's table past ``after`` in ``order_by``
    (from the first when ``None``), of ``rows_of`` only when given, each as (its ``order_by``
    value, the row as a JSON object)."""
    columns = await table_columns(db, spec.table, spec.exclude)
    names = ", ".join(c.name for c in columns)
    clauses, params = rows_of.clause() if rows_of is not None else ([], [])
    if after is not None:
        clauses.append(f"{spec.order_by} > ?")
        params.append(after)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    bound = "" if limit is None else " LIMIT ?"
    rows = await db.fetchall(
        f"SELECT {spec.order_by}, {names} FROM {spec.table} {where}ORDER BY {spec.order_by}{bound}",
        [*params] if limit is None else [*params, limit],
    )
    return [(row[0], {c.name: c.to_json(v) for c, v in zip(columns, row[1:], strict=True)}) for row in rows]


async def check_table_records(
    db: SQLConnection,
    table: str,
    records: Sequence[Any],
    *,
    key: Sequence[str],
    section: str,
    exclude: Collection[str] = (),
    derived: Collection[str] = (),
    formats: Mapping[str, TextFormat] | None = None,
) -> list[tuple[Any, ...]]:
    """The rows to insert for ``records`` (those not stored yet), as tuples in the table's column
    order; a malformed record or one that conflicts with a stored row raises an ``InputError``
    naming ``section[index].column``. A column a record leaves out is refused: an export holds them
    all. ``formats`` says what text columns hold (see :class:`TableSpec`)."""
    spec = TableSpec(
        section=section,
        table=table,
        key=tuple(key),
        exclude=tuple(exclude),
        derived=tuple(derived),
        formats=dict(formats or {}),
    )
    return [row for _, row in await _checked_rows(db, spec, records)]


async def _checked_rows(
    db: SQLConnection,
    spec: TableSpec,
    records: Sequence[Any],
    first: int = 0,
    seen: dict[tuple[Any, ...], int] | None = None,
) -> list[tuple[int, tuple[Any, ...]]]:
    """:func:`check_table_records`' rows, each with the index of its record in the section
    (``records`` are the section's from its ``first``). ``seen``: the keys of the section's
    records before these, with their indexes, to which theirs are added: a key twice in a section
    is refused whichever chunks hold the two (a later chunk found the first written, and took the
    second for it stored already)."""
    table, section = spec.table, spec.section
    columns = await table_columns(db, table, spec.exclude)
    by_name = {c.name: c for c in columns}
    rows: list[tuple[int, tuple[Any, ...]]] = []
    for index, record in enumerate(records, start=first):
        where = f"{section}[{index}]"
        if not isinstance(record, dict):
            raise InputError("must be a JSON object", field=where)
        for name in record:
            if name not in by_name:
                raise InputError(f"{table} has no column '{name}'", field=f"{where}.{name}")
        values = []
        for column in columns:
            if column.name not in record:
                raise InputError("missing", field=f"{where}.{column.name}")
            problem = column.check(record[column.name])
            text_format = spec.formats.get(column.name)
            if problem is None and text_format is not None:
                problem = text_format_problem(record[column.name], text_format)
            try:
                values.append(column.from_json(record[column.name]) if problem is None else None)
            except (binascii.Error, ValueError):
                problem = "not valid base64"
            if problem:
                raise InputError(problem, field=f"{where}.{column.name}")
        row = tuple(values)
        if seen is not None:
            key = tuple(row[i] for i, c in enumerate(columns) if c.name in spec.key)
            earlier = seen.setdefault(key, index)
            if earlier != index:
                raise InputError(f"is in the section twice (first as {section}[{earlier}])", field=where)
        if not await _stored_same(db, table, columns, (spec.key, spec.derived), row, where):
            rows.append((index, row))
    return rows


async def _stored_same(
    db: SQLConnection,
    table: str,
    columns: list[Column],
    key_and_derived: tuple[Sequence[str], Collection[str]],
    row: tuple[Any, ...],
    where: str,
) -> bool:
    """``True`` if the row is stored as it is (derived columns, caches the plugin fills again, aside);
    an error if its key is stored with other content."""
    key, derived = key_and_derived
    index = {c.name: i for i, c in enumerate(columns)}
    names = ", ".join(c.name for c in columns)
    condition = " AND ".join(f"{k} = ?" for k in key)
    stored = await db.fetchone(f"SELECT {names} FROM {table} WHERE {condition}", [row[index[k]] for k in key])
    if stored is None:
        return False
    kept = [i for i, c in enumerate(columns) if c.name not in derived]
    stored = tuple(bytes(v) if isinstance(v, memoryview) else v for v in stored)
    if [stored[i] for i in kept] != [row[i] for i in kept]:
        shown = ", ".join(f"{k} {row[index[k]]!r}" for k in key)
        raise InputError(f"{table} already holds {shown} with other content", field=where)
    return True


async def insert_rows(
    db: SQLConnection, table: str, rows: Sequence[tuple[Any, ...]], exclude: Collection[str] = ()
) -> None:
    """Write rows :func:`check_table_records` returned, keys included, in the caller's transaction."""
    if not rows:
        return
    columns = await table_columns(db, table, exclude)
    names = ", ".join(c.name for c in columns)
    marks = ", ".join("?" for _ in columns)
    await db.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)


class _TrialOver(Exception):
    """Ends a dry run's transaction, rolling back what it wrote."""


async def _try_rows(db: SQLConnection, spec: TableSpec, placed: list[tuple[int, tuple[Any, ...]]]) -> None:
    """Insert the rows one at a time (a dry run's, rolled back), naming the first the table refuses."""
    columns = await table_columns(db, spec.table, spec.exclude)
    names = ", ".join(c.name for c in columns)
    marks = ", ".join("?" for _ in columns)
    for index, row in placed:
        try:
            await db.execute(f"INSERT INTO {spec.table} ({names}) VALUES ({marks})", row)
        except Exception as exc:  # each database's driver raises its own constraint errors
            reason = exc.__cause__ or exc  # the driver's own words, not the statement
            where = f"{spec.section}[{index}]"
            raise InputError(f"the {spec.table} table refuses it: {reason}", field=where) from exc


async def _check_references(
    db: SQLConnection, specs: Sequence[TableSpec], sections: Mapping[str, Sequence[Any]]
) -> None:
    """On SQLite, references are checked when the transaction commits, and a dry run never
    commits: the rows that name a row no table holds are asked for instead."""
    if db.dialect != "sqlite":
        # PostgreSQL's references are deferred to the commit as well: checked here instead.
        try:
            await db.execute("SET CONSTRAINTS ALL IMMEDIATE")
        except Exception as exc:  # the driver's own error, naming the table and the key
            reason = exc.__cause__ or exc
            raise InputError(
                f"names a row that neither the store nor the file holds ({reason})",
                field=_named_record(specs, sections, str(reason)),
            ) from exc
        return
    for spec in specs:
        for found in await db.fetchall(f"PRAGMA foreign_key_check({spec.table})"):
            rowid, parent = found[1], found[2]
            records = sections[spec.section]
            index = next(
                (i for i, r in enumerate(records) if isinstance(r, dict) and r.get(spec.key[0]) == rowid),
                None,
            )
            where = spec.section if index is None else f"{spec.section}[{index}]"
            raise InputError(
                f"names a row that neither the store nor the file holds (in {parent})", field=where
            )


def _named_record(specs: Sequence[TableSpec], sections: Mapping[str, Sequence[Any]], reason: str) -> str:
    """The record a database's reference error names (``table "t"`` and ``Key (column)=(value)``),
    as ``section[index]``; the section alone, or the first, when it cannot be told."""
    table = re.search(r'table "(\w+)"', reason)
    spec = next((s for s in specs if table is not None and s.table == table.group(1)), specs[0])
    key = re.search(r"Key \((\w+)\)=\(([^)]*)\)", reason)
    if key is not None:
        column, value = key.groups()
        for index, record in enumerate(sections[spec.section]):
            if isinstance(record, dict) and str(record.get(column)) == value:
                return f"{spec.section}[{index}]"
    return spec.section


IMPORT_CHUNK = 1000  # records checked and written per step of an import


@dataclass(frozen=True)
class TableSpec:
    """One table of a plugin as one section of an export."""

    section: str  # "<plugin>.<name>"
    table: str
    key: tuple[str, ...] = ("id",)
    # A column whose values are unique and only grow (an id, SQLite's rowid): the table is read
    # in pages past the last value read, in its order, which is the section's.
    order_by: str = "id"
    page_rows: int = 1000
    exclude: tuple[str, ...] = ()  # columns the database fills itself
    derived: tuple[str, ...] = ()  # caches: exported, but not a conflict when they differ
    # What text columns hold (JSON of a shape, or a time), checked at an import: the database
    # takes any text, and a column its plugin cannot read back broke the store after the import.
    formats: Mapping[str, TextFormat] = field(default_factory=dict)


async def export_tables(
    store: object, specs: Sequence[TableSpec], *, rows_of: RowsOf | None = None
) -> dict[str, AsyncIterator[dict[str, Any]]] | None:
    """Each table as its section, read a page of :attr:`TableSpec.page_rows` at a time as the
    export writes it (``None`` on a store that lends no tables): a store of millions of rows is
    exported without holding them (the sections were read whole, about 1.3 KB of memory a row).
    A table is read on one state of the database (:class:`narrmem.store.ReadsSnapshots`), as its
    one query read it before: a fact purged and stated again between two pages was otherwise in
    the file twice, and the import refused the file. A store that lends no such state has its
    tables read whole, as before.

    ``specs`` come in the order an import writes them (a table others refer to first); the sections
    come, and are read, in the other order. The memory may write between two tables: read after
    the rows that name them, the rows named are all there (a node written after the edges were read
    has no edge in the file); read before, an edge written meanwhile named a node the file lacked,
    and the import refused the whole file. ``rows_of``: only one person's or tenant's rows (a
    person's own export), chosen by the query."""
    if not isinstance(store, SQLCapable):
        return None
    return {spec.section: _pages(store, spec, rows_of) for spec in reversed(specs)}


async def _pages(store: SQLCapable, spec: TableSpec, rows_of: RowsOf | None) -> AsyncIterator[dict[str, Any]]:
    # A connection of its own for the table: the store's is shared with recalls, and an export's
    # reader may be a slow HTTP client.
    reading = store.snapshot() if isinstance(store, ReadsSnapshots) else store.sql()
    limit = spec.page_rows if isinstance(store, ReadsSnapshots) else None
    async with reading as db:
        after = None
        while True:
            page = await export_page(db, spec, after=after, limit=limit, rows_of=rows_of)
            for _, record in page:
                yield record
            if limit is None or len(page) < limit:
                return
            after = page[-1][0]


async def import_tables(
    store: object,
    specs: Sequence[TableSpec],
    sections: Mapping[str, Sequence[dict[str, Any]]],
    *,
    dry_run: bool,
) -> dict[str, int] | None:
    """The ``narrmem_import_records`` contract for these tables, in the order given (a table that
    others refer to first): checked on a dry run, written in one transaction otherwise. Foreign keys
    are checked when it commits (on SQLite), since a row may name a later one of its own table.
    Records are taken :data:`IMPORT_CHUNK` at a time: a section read from a file as it is asked
    for (:class:`narrmem.doors.importing.FileRecords`) is never held whole."""
    mine = [s for s in specs if s.section in sections]
    if not mine:
        return None
    if not isinstance(store, SQLCapable):
        raise InputError(f"this store has no tables for section {mine[0].section}", field=mine[0].section)
    counts: dict[str, int] = {}
    try:
        # The dry run writes too, in a transaction rolled back at its end: the tables' own
        # constraints (a status the CHECK refuses, an edge naming a missing node, an id twice in
        # the file) are met there, naming the record, before the memories are written. Checked
        # only at the real write, after the memories' commit, they left an import half done.
        async with store.sql(write=True) as db:
            if db.dialect == "sqlite":
                await db.execute("PRAGMA defer_foreign_keys = ON")  # reset when the transaction ends
            for spec in mine:
                records = sections[spec.section]
                counts[spec.section] = 0
                seen: dict[tuple[Any, ...], int] = {}  # about 100 bytes a record
                for first in range(0, len(records), IMPORT_CHUNK):
                    chunk = records[first : first + IMPORT_CHUNK]
                    placed = await _checked_rows(db, spec, chunk, first, seen)
                    if dry_run:
                        await _try_rows(db, spec, placed)
                    else:
                        await insert_rows(db, spec.table, [row for _, row in placed], spec.exclude)
                    counts[spec.section] += len(placed)
            if dry_run:
                await _check_references(db, mine, sections)
                raise _TrialOver
    except _TrialOver:
        pass
    return counts
