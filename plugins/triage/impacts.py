"""A scene's Impact: the later scenes of the same person and chat that build on it, quoted.

Linking copies a later scene's Core into the earlier scene (its Impact field and its rendered
text). Those words are the later message's: when that message is deleted or edited, they must go
from the earlier scene too. So each quote is kept with the ids of the messages it came from
(``meta["impact_sources"]``, and every such id in ``meta["impact_messages"]``, which a store can
filter on), and a forget of messages rewrites the scenes that quote them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from narrmem.models import MemoryRecord, SceneDraft, Scope
from narrmem.view import MemoryView

MAX_IMPACTS = 3  # the Impact field keeps the latest few consequences
SOURCES = "impact_sources"
MESSAGES = "impact_messages"
# The most scenes of one chat that quote one forgotten message (a message's scene is linked into
# at most one earlier scene; older stores are read as a safety margin).
MAX_QUOTING = 1000


def impact_entry(scene: MemoryRecord, core: str) -> str:
    """How ``scene`` (with its Core ``core``) is quoted in the Impact of the scene it builds on."""
    return f'{scene.meta.get("type") or "later"} on {scene.created_at:%Y-%m-%d}: "{core}"'


def add_impact(target: MemoryRecord, fields: SceneDraft, scene: MemoryRecord, core: str) -> None:
    """Quote ``scene`` in ``target``'s Impact (the latest few kept), remembering whose words it are."""
    entry = impact_entry(scene, core)
    earlier = [part for part in fields.impact.split("; ") if part][-(MAX_IMPACTS - 1) :]
    fields.impact = "; ".join([*earlier, entry])
    kept = [s for s in _sources(target) if s["entry"] in fields.impact]
    sources = [*kept, {"scene": scene.id, "messages": list(scene.message_ids), "entry": entry}]
    target.meta = {
        **target.meta,
        **fields.stored(),
        "impacts": [*target.meta.get("impacts", []), scene.id],
        SOURCES: sources,
        MESSAGES: sorted({mid for s in sources for mid in s["messages"]}),
    }
    target.text = fields.render()


async def drop_impacts(
    memory: MemoryView,
    tenant: str,
    chat_id: str | None,
    messages: Sequence[str] | None,
    removed: Iterable[MemoryRecord],
) -> int:
    """Take the quotes of forgotten messages out of the scenes that hold them; returns how many
    scenes were rewritten. A forget of a person or a chat deletes the quoting scenes themselves
    (they are the same person's, in the same chat): only a forget of messages rewrites."""
    if messages is None or chat_id is None:
        return 0
    forgotten = set(messages)
    scope = Scope(tenant=tenant, chat_id=chat_id)
    quoting: dict[int, MemoryRecord] = {}
    for message_id in sorted(forgotten):
        for record in await memory.store.recent(
            scope, kinds=["scene"], limit=MAX_QUOTING, meta_has=(MESSAGES, message_id)
        ):
            if record.id is not None:
                quoting[record.id] = record
    # Scenes linked before quotes named their messages: found from the forgotten scene's side.
    gone_entries: dict[int, list[tuple[str, int | None]]] = {}
    for scene in removed:
        target_id = scene.meta.get("builds_on")
        if scene.kind != "scene" or not isinstance(target_id, int):
            continue
        draft = SceneDraft.of(scene)
        core = draft.core if draft is not None else scene.text
        gone_entries.setdefault(target_id, []).append((impact_entry(scene, core), scene.id))
    missing = [mid for mid in gone_entries if mid not in quoting]
    if missing:
        quoting.update(await memory.store.get(missing, scope))
    rewritten = 0
    for target in quoting.values():
        if _without(target, forgotten, gone_entries.get(target.id or 0, [])):
            await memory.store.update(target)
            rewritten += 1
    return rewritten


def _without(target: MemoryRecord, forgotten: set[str], entries: list[tuple[str, int | None]]) -> bool:
    """Take the quotes of ``forgotten`` messages (and ``entries``: quotes and the scenes they
    quote) out of ``target``; whether it changed."""
    fields = SceneDraft.of(target)
    if fields is None:
        return False
    sources = _sources(target)
    dropped = [s for s in sources if forgotten & set(s["messages"])]
    gone = {*(s["entry"] for s in dropped), *(entry for entry, _ in entries)}
    parts = [part for part in fields.impact.split("; ") if part]
    left = [part for part in parts if part not in gone]
    # A quote whose own words hold "; " was split apart above: taken out whole instead.
    impact = "; ".join(left)
    for entry in gone:
        impact = _remove(impact, entry)
    if impact == fields.impact and not dropped:
        return False
    fields.impact = impact
    kept = [s for s in sources if s not in dropped]
    gone_scenes = {*(s["scene"] for s in dropped), *(sid for _, sid in entries)}
    meta: dict[str, Any] = {
        **target.meta,
        **fields.stored(),
        "impacts": [sid for sid in target.meta.get("impacts", []) if sid not in gone_scenes],
        SOURCES: kept,
        MESSAGES: sorted({mid for s in kept for mid in s["messages"]}),
    }
    target.meta = meta
    target.text = fields.render()
    return True


def _remove(impact: str, entry: str) -> str:
    for form in (f"{entry}; ", f"; {entry}", entry):
        if form in impact:
            return impact.replace(form, "", 1)
    return impact


def _sources(target: MemoryRecord) -> list[dict[str, Any]]:
    listed = target.meta.get(SOURCES)
    if not isinstance(listed, list):
        return []
    return [
        s
        for s in listed
        if isinstance(s, dict) and isinstance(s.get("entry"), str) and isinstance(s.get("messages"), list)
    ]
