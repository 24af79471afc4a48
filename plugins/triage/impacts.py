"""A scene's Impact: the later scenes of the same person and chat that build on it, quoted.

Linking copies a later scene's Core into the earlier scene (its Impact field and its rendered
text). Those words are the later message's: when that message is deleted or edited, they must go
from the earlier scene too. So each quote is kept in the earlier scene with the ids of the
messages it came from (``meta["impact_sources"]``), and plugin state (:data:`NAMESPACE`, ids
only) says which scenes quote a message: a forget of messages reads it by their ids, also when it
is finished after a crash, when the deleted scenes themselves are no longer there to say which
scene they built on. A person's or a chat's forget deletes the quoting scenes themselves (the same
person's, in the same chat) and the state of what it forgets. A scene deleted by id (not its
message) takes its quote out of the scene it built on, and no entry names a deleted scene
(:func:`drop_deleted`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from narrmem.checks import SQLITE_MAX_INT
from narrmem.errors import InputError
from narrmem.models import MemoryRecord, SceneDraft, Scope
from narrmem.view import MemoryView

NAMESPACE = "triage.impacts"
MAX_IMPACTS = 3  # the Impact field keeps the latest few consequences
# The scenes ever quoted, kept only to quote a scene once when its hooks run again after a stop:
# those are the latest few, and a much-linked scene's list grew by one id per link for good.
QUOTED_KEPT = 64
SOURCES = "impact_sources"


def impact_entry(scene: MemoryRecord, core: str) -> str:
    """How ``scene`` (with its Core ``core``) is quoted in the Impact of the scene it builds on."""
    return f'{scene.meta.get("type") or "later"} on {scene.created_at:%Y-%m-%d}: "{core}"'


def _key(tenant: str, chat_id: str, message_id: str) -> str:
    # Ids hold no NUL: the last one ends the key, so a prefix delete of "m1" spares "m12".
    return f"{tenant}\0{chat_id}\0{message_id}\0"


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse an entry (of an imported file) that :func:`drop_impacts` could not read back."""
    parts = key.split("\0")
    if len(parts) != 4 or parts[3] or not all(parts[:3]):
        raise InputError(
            "is not a key of a quoted message (tenant, chat and message, each ended by NUL)", field="key"
        )
    if set(value) != {"user", "scenes"}:
        raise InputError("a quoted message's entry holds 'user' and 'scenes'", field="value")
    if not isinstance(value["user"], str) or not value["user"]:
        raise InputError("must be the text of a user id", field="value.user")
    scenes = value["scenes"]
    if not isinstance(scenes, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 < s <= SQLITE_MAX_INT for s in scenes
    ):
        raise InputError("must be a list of memory ids", field="value.scenes")


async def add_impact(
    memory: MemoryView, target: MemoryRecord, fields: SceneDraft, scene: MemoryRecord, core: str
) -> None:
    """Quote ``scene`` in ``target``'s Impact (the latest few kept) and write both down; once:
    the hooks of a message run again at the next open when a process stopped before their record
    went (the Impact quoted the scene twice)."""
    if scene.id in target.meta.get("impacts", []):
        if scene.meta.get("builds_on") != target.id:  # stopped between the two writes
            scene.meta = {**scene.meta, "builds_on": target.id}
            await memory.store.update(scene)
        return
    entry = impact_entry(scene, core)
    earlier = [part for part in fields.impact.split("; ") if part][-(MAX_IMPACTS - 1) :]
    fields.impact = "; ".join([*earlier, entry])
    sources = _sources(target)
    kept = [s for s in sources if s["entry"] in fields.impact]
    target.meta = {
        **target.meta,
        **fields.stored(),
        "impacts": [*target.meta.get("impacts", []), scene.id][-QUOTED_KEPT:],
        SOURCES: [*kept, {"scene": scene.id, "messages": list(scene.message_ids), "entry": entry}],
    }
    target.text = fields.render()
    scene.meta = {**scene.meta, "builds_on": target.id}
    await memory.store.update(target)
    await memory.store.update(scene)
    for message_id in scene.message_ids:
        key = _key(scene.tenant, scene.chat_id, message_id)
        listed = (await memory.store.state_get(NAMESPACE, key)) or {}
        scenes = sorted({*listed.get("scenes", []), target.id})
        await memory.store.state_put(NAMESPACE, key, {"user": scene.user_id, "scenes": scenes})
    # A quote that fell out of the Impact no longer holds its message's words: its entry would
    # only grow the state, one per linked message for good.
    quoted = {m for s in target.meta[SOURCES] for m in s["messages"]}
    fallen = {m for s in sources if s not in kept for m in s["messages"]} - quoted
    for message_id in sorted(fallen):
        await _unquote(memory, _key(target.tenant, target.chat_id, message_id), target.id)


async def _unquote(memory: MemoryView, key: str, target_id: int | None) -> None:
    """Take ``target_id`` out of the scenes the entry ``key`` says quote its message."""
    listed = await memory.store.state_get(NAMESPACE, key)
    if listed is None:
        return
    scenes = [s for s in _scene_ids(listed) if s != target_id]
    if scenes:
        await memory.store.state_put(NAMESPACE, key, {**listed, "scenes": scenes})
    else:
        await memory.store.state_delete(NAMESPACE, key)


async def drop_impacts(
    memory: MemoryView,
    tenant: str,
    user_id: str | None,
    chat_id: str | None,
    messages: Sequence[str] | None,
    removed: Iterable[MemoryRecord],
) -> int:
    """Take the quotes of forgotten messages out of the scenes that hold them, and the state of
    what is forgotten; returns how many scenes were rewritten."""
    store = memory.store
    if messages is None:
        await _forget_state(memory, tenant, user_id, chat_id, removed)
        return 0
    if chat_id is None:
        return 0
    forgotten = set(messages)
    quoting: set[int] = set()
    for message_id in sorted(forgotten):
        listed = await store.state_get(NAMESPACE, _key(tenant, chat_id, message_id))
        if listed is not None:
            quoting.update(_scene_ids(listed))
    # Quotes written before the state named them: found from the deleted scene's side.
    entries: dict[int, list[tuple[str, int | None]]] = {}
    for scene in removed:
        target_id = scene.meta.get("builds_on")
        if scene.kind != "scene" or not isinstance(target_id, int):
            continue
        draft = SceneDraft.of(scene)
        core = draft.core if draft is not None else scene.text
        entries.setdefault(target_id, []).append((impact_entry(scene, core), scene.id))
        quoting.add(target_id)
    rewritten = 0
    if quoting:
        found = await store.get(sorted(quoting), Scope(tenant=tenant, chat_id=chat_id))
        for target in found.values():
            if _without(target, forgotten, entries.get(target.id or 0, [])):
                await store.update(target)
                rewritten += 1
    for message_id in sorted(forgotten):
        await store.state_delete(NAMESPACE, _key(tenant, chat_id, message_id))
    return rewritten


async def _forget_state(
    memory: MemoryView, tenant: str, user_id: str | None, chat_id: str | None, removed: Iterable[MemoryRecord]
) -> None:
    """A person's or a chat's forget: the state of the messages it forgot goes."""
    store = memory.store
    if user_id is None and chat_id is not None:
        await store.state_delete(NAMESPACE, f"{tenant}\0{chat_id}\0")
        return
    scenes = [r for r in removed if r.kind == "scene"]
    if scenes:
        # An entry is a later scene's message, and that scene is the person's, in the chat: it is
        # among what this call deleted, or, deleted by id before, still quoted by one that is
        # (its sources). (Reading every entry of every person took a person's forget a second
        # per million linked messages.)
        keys = {_key(r.tenant, r.chat_id, m) for r in scenes for m in r.message_ids}
        keys |= {_key(r.tenant, r.chat_id, m) for r in scenes for s in _sources(r) for m in s["messages"]}
        for key in sorted(keys):
            await store.state_delete(NAMESPACE, key)
        return
    # Nothing deleted in this call (a forget finished after a crash, the rows gone before it):
    # what is left of the person is found by reading every entry.
    for key, value in await store.state_items(NAMESPACE):
        key_tenant, key_chat, *_ = [*key.split("\0", 2), ""]
        if key_tenant == tenant and value.get("user") == user_id and chat_id in (None, key_chat):
            await store.state_delete(NAMESPACE, key)


async def drop_deleted(memory: MemoryView, tenant: str, removed: Iterable[MemoryRecord]) -> int:
    """Memories deleted by id (their messages stay): a deleted scene's quote goes from the scene it
    built on, with the entry of its message; a deleted scene that quoted others leaves no entry
    naming it. Returns how many scenes were rewritten."""
    scenes = [r for r in removed if r.kind == "scene" and r.id is not None]
    gone = {r.id for r in scenes}
    rewritten = 0
    for scene in scenes:
        target_id = scene.meta.get("builds_on")
        if not isinstance(target_id, int) or isinstance(target_id, bool) or target_id in gone:
            continue
        draft = SceneDraft.of(scene)
        entry = impact_entry(scene, draft.core if draft is not None else scene.text)
        scope = Scope(tenant=tenant, user_id=scene.user_id, chat_id=scene.chat_id)
        target = (await memory.store.get([target_id], scope)).get(target_id)
        still: set[str] = set()
        if target is not None:
            if _without(target, set(), [(entry, scene.id)]):
                await memory.store.update(target)
                rewritten += 1
            still = {m for s in _sources(target) for m in s["messages"]}
        for message_id in sorted(set(scene.message_ids) - still):
            await _unquote(memory, _key(tenant, scene.chat_id, message_id), target_id)
    for scene in scenes:
        # The entries of what it quoted: its sources' messages, and those of the later scenes it
        # names (quoted before sources were kept).
        listed = scene.meta.get("impacts")
        listed = listed if isinstance(listed, list) else []
        later = [i for i in listed if isinstance(i, int) and not isinstance(i, bool)]
        scope = Scope(tenant=tenant, user_id=scene.user_id, chat_id=scene.chat_id)
        found = await memory.store.get(later, scope) if later else {}
        messages = {m for s in _sources(scene) for m in s["messages"]}
        messages |= {m for r in found.values() for m in r.message_ids}
        for message_id in sorted(messages):
            await _unquote(memory, _key(tenant, scene.chat_id, message_id), scene.id)
    return rewritten


def _scene_ids(listed: dict[str, Any]) -> list[int]:
    """The scenes an entry names; what is not an id (an entry written by hand) is passed over, so
    that a forget never fails on it."""
    scenes = listed.get("scenes")
    if not isinstance(scenes, list):
        return []
    return [s for s in scenes if isinstance(s, int) and not isinstance(s, bool)]


def _without(target: MemoryRecord, forgotten: set[str], entries: list[tuple[str, int | None]]) -> bool:
    """Take the quotes of ``forgotten`` messages (and ``entries``: quotes and the scenes they
    quote) out of ``target``; whether it changed."""
    fields = SceneDraft.of(target)
    if fields is None:
        return False
    sources = _sources(target)
    deleted = {sid for _, sid in entries if sid is not None}
    dropped = [s for s in sources if forgotten & set(s["messages"]) or s.get("scene") in deleted]
    gone = {*(s["entry"] for s in dropped), *(entry for entry, _ in entries)}
    impact = "; ".join(part for part in fields.impact.split("; ") if part and part not in gone)
    # A quote whose own words hold "; " was split apart above: taken out whole instead.
    for entry in gone:
        impact = _remove(impact, entry)
    if impact == fields.impact and not dropped:
        return False
    fields.impact = impact
    gone_scenes = {*(s["scene"] for s in dropped), *(sid for _, sid in entries)}
    target.meta = {
        **target.meta,
        **fields.stored(),
        "impacts": [sid for sid in target.meta.get("impacts", []) if sid not in gone_scenes],
        SOURCES: [s for s in sources if s not in dropped],
    }
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


async def person_entries(memory: MemoryView, tenant: str, user_id: str) -> list[dict[str, Any]]:
    """The entries of the person's quoted scenes (what a forget of them deletes), as records of a
    person's export: the namespace, the key and the value as stored."""
    return [
        {"namespace": NAMESPACE, "key": key, "value": value}
        for key, value in await memory.store.state_items(NAMESPACE)
        if key.startswith(f"{tenant}\0") and value.get("user") == user_id
    ]
