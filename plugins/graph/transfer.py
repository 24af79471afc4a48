"""The graph in a full export (``narrmem export`` / ``narrmem import``): each of the plugin's tables is
a section (``graph.nodes``, ``graph.edges``, ``graph.purges``), every column of every row, ids
included, so that supersessions, provenance, validity intervals and the purge log come back as they
were. Node vectors are exported as they are cached (base64), so an import re-embeds nothing.

Both backends export the same records, so a graph moves between SQLite and PostgreSQL with
``narrmem migrate`` (which uses these hooks) as it is.
"""

from __future__ import annotations

from typing import Any

from narrmem_plugins.graph.backend import GraphBackend
from narrmem_plugins.graph.schema import TABLES as GRAPH_TABLES

from narrmem import hookimpl
from narrmem.table_transfer import TableSpec, export_tables, import_tables
from narrmem.view import MemoryView

# Every table the schema creates, in creation order: a table others refer to comes first. A node's
# label vector is a cache (stores written before 2026-12-05 filled it when a recall first needed
# it): a later import does not conflict on it.
TABLES = [
    TableSpec(
        section=f"graph.{name.removeprefix('graph_')}",
        table=name,
        derived=("vector", "vector_text") if name == "graph_nodes" else (),
    )
    for name in GRAPH_TABLES
]


class GraphTransfer:
    """The export hooks of :class:`~narrmem_plugins.graph.GraphPlugin` (a base class of it); idle
    when the plugin is (a store without the graph's tables)."""

    _graph: GraphBackend | None

    @hookimpl
    async def narrmem_export_records(self, memory: MemoryView) -> dict[str, list[dict[str, Any]]] | None:
        if self._graph is None:
            return None
        return await export_tables(memory.store, TABLES)

    @hookimpl
    async def narrmem_import_records(
        self, memory: MemoryView, sections: dict[str, list[dict[str, Any]]], dry_run: bool
    ) -> dict[str, int] | None:
        if self._graph is None:
            return None
        counts = await import_tables(memory.store, TABLES, sections, dry_run=dry_run)
        if counts and not dry_run:
            await _continue_ids(self._graph)
        return counts


async def _continue_ids(graph: GraphBackend) -> None:
    """After rows came in with their ids, the ids PostgreSQL gives new rows continue after them
    (SQLite takes the largest id + 1 by itself)."""
    async with graph.transaction() as db:
        if db.dialect == "sqlite":
            return
        for table in GRAPH_TABLES:
            await db.fetchone(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false) "
                f"FROM {table}"
            )
