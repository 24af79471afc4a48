"""Forgets told to the other processes of a shared store, so that what they keep in RAM of the
scope goes too (:func:`narrmem.hookspecs.narrmem_forgotten_elsewhere`).

A forget scrubs the store and this process's plugins (``narrmem_after_forget``); the other workers
of a PostgreSQL store kept, until their caches evicted them, a forgotten person's retelling, a
chat's recent turns, label vectors and cached texts: not answered from (each is checked against
the store), but held for weeks in a quiet chat. On a store that :class:`~narrmem.store.Broadcasts`,
each forget of this process sends its scope (tenant, user id, chat id: ids, never words) on
:data:`CHANNEL`; each process hears the others' and tells its plugins. Nothing is kept: a notice
sent while a process does not listen is not seen by it, and a listener that lost its connection
has every cache dropped. A failed send is logged; the forget stands.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import TYPE_CHECKING, Any

from narrmem import logs
from narrmem.models import Scope
from narrmem.recent_vectors import ForgetsRecentTexts
from narrmem.store import Broadcasts, Listening, shared_by_processes

if TYPE_CHECKING:
    from narrmem.lifecycle import MemoryLifecycle

CHANNEL = "narrmem_forgets"
log = logs.logger("narrmem")


class ForgetNotices:
    def __init__(self, memory: MemoryLifecycle) -> None:
        self.memory = memory
        self.origin = uuid.uuid4().hex  # this process, in what it sends (its own come back to it)
        self._listening: Listening | None = None
        self._telling: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> Broadcasts | None:
        store = self.memory.store
        return store if isinstance(store, Broadcasts) and shared_by_processes(store) else None

    async def start(self) -> None:
        store = self.store
        if store is None or self.memory.read_only:
            # A read-only open is most often a command that reads and ends: a session for it
            # (with a pooler, one of each worker's few) would cost more than its caches hold.
            return
        try:
            self._listening = await store.listen(CHANNEL, self._heard, self._lost)
        except Exception as exc:
            # The forgets still scrub the store and this process; the caches here only age out.
            log.warning("listening for the other workers' forgets failed (%s)", type(exc).__name__)

    async def close(self) -> None:
        listening, self._listening = self._listening, None
        if listening is not None:
            await listening.close()
        for task in list(self._telling):
            task.cancel()
        await asyncio.gather(*self._telling, return_exceptions=True)

    async def send(self, scope: Scope) -> None:
        """Tell the other processes that ``scope`` (a user, a chat, or messages of a chat: its
        chat) was forgotten here."""
        try:
            store = self.store
        except Exception:  # closed meanwhile (a forget that outlived the close): no one to tell
            return
        if store is None:
            return
        payload = json.dumps(
            {"o": self.origin, "t": scope.tenant, "u": scope.user_id, "c": scope.chat_id}, ensure_ascii=False
        )
        if len(payload.encode()) > store.broadcast_limit:
            payload = json.dumps({"o": self.origin, "t": None, "u": None, "c": None})
        try:
            await store.broadcast(CHANNEL, payload)
        except Exception as exc:
            log.warning(
                "telling the other workers of a forget failed (%s); their caches age out", type(exc).__name__
            )

    def _heard(self, payload: str) -> None:
        try:
            notice = json.loads(payload)
            origin, tenant, user_id, chat_id = (notice[k] for k in ("o", "t", "u", "c"))
        except (ValueError, TypeError, KeyError):
            log.warning("a message on %s that is not a forget's notice was left", CHANNEL)
            return
        if origin == self.origin:
            return
        self._tell(tenant, user_id, chat_id)

    def _lost(self) -> None:
        self._tell(None, None, None)

    def _tell(self, tenant: Any, user_id: Any, chat_id: Any) -> None:
        if self.memory.closed:
            return
        task = asyncio.get_running_loop().create_task(self._told(tenant, user_id, chat_id))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _told(self, tenant: Any, user_id: Any, chat_id: Any) -> None:
        if not all(v is None or isinstance(v, str) for v in (tenant, user_id, chat_id)):
            return
        embedder = self.memory.embedder
        if isinstance(embedder, ForgetsRecentTexts):
            embedder.forget_recent_texts()
        try:
            await self.memory.host.call_every(
                "narrmem_forgotten_elsewhere",
                memory=self.memory,
                tenant=tenant,
                user_id=user_id,
                chat_id=chat_id,
            )
        except Exception as exc:
            # Its kind only: the host logged each plugin's failure already.
            log.error(
                "a plugin failed to drop what it kept of another worker's forget (%s)", type(exc).__name__
            )
