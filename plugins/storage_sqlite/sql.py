"""Plugin tables on SQLite: the connection :class:`narrmem.store.SQLCapable` lends (the store's
own, whose SQL is the one plugins write)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import aiosqlite

from narrmem.errors import StoreError
from narrmem.store import check_sql_params


class SQLiteSQL:
    dialect = "sqlite"

    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        check_sql_params(params)
        try:
            async with self._db.execute(sql, tuple(params)) as cursor:
                return max(0, cursor.rowcount)
        except sqlite3.Error as exc:
            raise _error(sql, exc) from exc

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = [tuple(row) for row in rows]
        for row in rows:
            check_sql_params(row)
        try:
            await self._db.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise _error(sql, exc) from exc

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        check_sql_params(params)
        try:
            return [tuple(row) for row in await self._db.execute_fetchall(sql, tuple(params))]
        except sqlite3.Error as exc:
            raise _error(sql, exc) from exc

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None


def _error(sql: str, exc: sqlite3.Error) -> StoreError:
    return StoreError(f"{' '.join(sql.split())[:80]}: {exc}")
