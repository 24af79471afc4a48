"""The version of the graph's tables (:mod:`.schema`), kept in the store's plugin state: a worker of
an older narrmem must not write tables a newer one changed (several workers are upgraded one at a
time), and a later change of them finds which stores it has to bring up to date. Tables made
before the version was kept are of version 1, as they are now."""

from __future__ import annotations

from typing import Any

from narrmem.errors import StoreError
from narrmem.store import STORE_NOTES, Store

GRAPH_SCHEMA = 1  # raised, with a step that brings older tables up, by a change of schema.py
NAMESPACE, KEY = STORE_NOTES, "graph_schema"  # not exported: the target store's tables are its own


async def check_graph_schema(store: Store, *, read_only: bool) -> None:
    """Refuse tables of a newer version (a ``StoreError`` naming both); note this version on a
    store that has none noted (a writable open)."""
    stored = await store.state_get(NAMESPACE, KEY)
    version = _version_of(stored)
    if version > GRAPH_SCHEMA:
        raise StoreError(
            f"the graph's tables are of version {version}, newer than this narrmem's ({GRAPH_SCHEMA}): "
            "upgrade narrmem (a worker of an older one must not write them)"
        )
    if not read_only and (stored is None or version < GRAPH_SCHEMA):
        # Of workers opening at once, one writes it; the others find it written.
        await store.state_put_if(NAMESPACE, KEY, {"version": GRAPH_SCHEMA}, stored)


def _version_of(stored: dict[str, Any] | None) -> int:
    if stored is None:
        return 1  # made before the version was kept: what version 1 is
    value = stored.get("version")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise StoreError(
            f"the graph's schema version in {NAMESPACE!r} is not as narrmem writes it: {stored!r}"
        )
    return value
