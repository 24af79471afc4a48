"""The graph in a full export (``narrmem export`` / ``narrmem import``): each of the plugin's tables is
a section (``graph.nodes``, ``graph.edges``, ``graph.purges``), every column of every row, ids
included, so that supersessions, provenance, validity intervals and the purge log come back as they
were. Node vectors are exported as they are cached (base64), so an import re-embeds nothing.
"""

from __future__ import annotations

import re
from typing import Any

from narrmem_plugins.graph.schema import SCHEMA

from narrmem import hookimpl
from narrmem.table_transfer import TableSpec, export_tables, import_tables
from narrmem.view import MemoryView

# Every table the schema creates, in creation order: a table others refer to comes first. A node's
# label vector is a cache (filled when a recall first needs it): a later import does not conflict on it.
TABLES = [
    TableSpec(
        section=f"graph.{name.removeprefix('graph_')}",
        table=name,
        derived=("vector", "vector_text") if name == "graph_nodes" else (),
    )
    for name in re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", "\n".join(SCHEMA))
]


class GraphTransfer:
    """The export hooks of :class:`~narrmem_plugins.graph.GraphPlugin` (a base class of it); idle
    when the plugin is (a store without the graph's tables)."""

    _graph: Any

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
        return await import_tables(memory.store, TABLES, sections, dry_run=dry_run)
