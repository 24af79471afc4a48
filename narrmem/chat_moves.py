"""Chats that go on under a new id (a Telegram group upgraded to a supergroup): what a chat was
before, kept in the store's plugin state (ids only) for every worker and restart. The bot
integrations note a move and read a chat with the chats it was; a forget of a chat
(:meth:`narrmem.memory.Memory.forget`) takes the chats it was too, and the note with them."""

from __future__ import annotations

from typing import Any

from narrmem import logs
from narrmem.store import Store

log = logs.logger("narrmem")

# Plugin state: the chats a chat was before, by (tenant, chat id) -- ids only.
MOVED = "narrmem.chats_moved"
MAX_EARLIER = 16  # chats read with one (each is a recall of its own)


def _moved_key(tenant: str, chat_id: str) -> str:
    return f"{tenant}\0{chat_id}\0"


async def chat_moved(store: Store, *, tenant: str, from_chat: str, to_chat: str) -> None:
    """``from_chat`` goes on as ``to_chat`` (a Telegram group upgraded to a supergroup takes a new
    id; its members and history stay): the context and ``memory`` of ``to_chat`` read what was
    said in ``from_chat`` too. Kept in the store, for every worker and every restart; told twice
    (Telegram sends the move in both chats), it is noted once."""
    if from_chat == to_chat:
        return
    key = _moved_key(tenant, to_chat)
    for _ in range(5):  # a compare-and-set: another worker noting the same move at once
        stored = await store.state_get(MOVED, key)
        earlier = _earlier_in(stored)
        if from_chat in earlier:
            return
        if await store.state_put_if(MOVED, key, {"from": [*earlier, from_chat]}, stored):
            log.info("a chat moved to a new id: its earlier messages are read with it")
            return
    log.warning("a chat's move could not be noted: its earlier messages stay apart from it")


def _earlier_in(stored: dict[str, Any] | None) -> list[str]:
    """The chats a stored note names (at most :data:`MAX_EARLIER`; a note not as written, none)."""
    named = (stored or {}).get("from", [])
    return [c for c in named if isinstance(c, str)][:MAX_EARLIER] if isinstance(named, list) else []


async def earlier_chats(store: Store, tenant: str, chat_id: str) -> list[str]:
    """The chats ``chat_id`` was before (see :func:`chat_moved`), and those they were, in turn."""
    found: list[str] = []
    todo = [chat_id]
    while todo and len(found) < MAX_EARLIER:
        stored = await store.state_get(MOVED, _moved_key(tenant, todo.pop()))
        for earlier in _earlier_in(stored):
            if earlier != chat_id and earlier not in found and len(found) < MAX_EARLIER:
                found.append(earlier)
                todo.append(earlier)
    return found


async def forget_moves(store: Store, tenant: str, chat_ids: list[str]) -> None:
    """Delete the notes of ``chat_ids``, and their ids from the notes of the chats they became
    (forgotten: no id of them stays)."""
    gone = set(chat_ids)
    for chat_id in chat_ids:
        await store.state_delete(MOVED, _moved_key(tenant, chat_id))
    for key, stored in await store.state_items(MOVED):
        if not key.startswith(_moved_key(tenant, "")[:-1]):
            continue
        earlier = _earlier_in(stored)
        kept = [c for c in earlier if c not in gone]
        if kept == earlier:
            continue
        if kept:
            await store.state_put_if(MOVED, key, {"from": kept}, stored)
        else:
            await store.state_delete_if(MOVED, key, stored)
