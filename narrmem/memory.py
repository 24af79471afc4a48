"""``Memory``: the public async API, a thin façade over the engine's parts: the plugin host, the
ingest and recall pipelines (:mod:`narrmem.ingest`, :mod:`narrmem.recall`), durable forgetting
(:mod:`narrmem.forgetting`) and opening (:mod:`narrmem.opening`). It owns one host, one store and
one embedder; plugins see it as a :class:`~narrmem.view.MemoryView`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from narrmem import opening
from narrmem import recall as recall_pipeline
from narrmem.checks import (
    aware_time_argument,
    folder_argument,
    int_argument,
    optional_int_argument,
    sequence_argument,
    text_argument,
)
from narrmem.clock import Clock, SystemClock
from narrmem.config import Settings, load_settings
from narrmem.embed import Embedder
from narrmem.errors import InputError, PluginError, StoreError
from narrmem.forgetting import Forgetting
from narrmem.host import PluginHost
from narrmem.ingest import IngestPipeline, TriggerCallback, as_message, attributed, speaker_of
from narrmem.models import (
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    ContextPack,
    Hit,
    IngestResult,
    MemoryRecord,
    Message,
    RecallRequest,
    TriageDecision,
)
from narrmem.store import Store
from narrmem.tools import ToolRegistry

__all__ = ["Memory", "attributed", "speaker_of"]


class Memory:
    """Open with ``async with Memory.open("folder") as mem:`` (or ``mem = await Memory.open(...)``
    and ``await mem.close()``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        plugins: Iterable[object] = (),
        load_entrypoints: bool | None = None,
        builtins: bool = True,
        read_only: bool = False,
    ) -> None:
        self.settings = settings
        self.read_only = read_only
        self.clock: Clock = clock or SystemClock()
        self.data_dir = Path(settings.data_dir)
        self.host = PluginHost(self)
        self.tools = ToolRegistry()
        self._plugins = (
            builtins,
            settings.plugins.load_entrypoints if load_entrypoints is None else load_entrypoints,
            list(plugins),
        )
        self._store: Store | None = None
        self._embedder: Embedder | None = None
        self._trigger_callbacks: list[TriggerCallback] = []
        write_lock = asyncio.Lock()  # one writer at a time in this process
        self._ingest = IngestPipeline(self, write_lock, self._trigger_callbacks)
        self._forgetting = Forgetting(self, write_lock)
        self._closed = False
        self._started = False

    # --- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        data_dir: str | Path | None = None,
        *,
        settings: Settings | None = None,
        config_file: str | Path | None = None,
        clock: Clock | None = None,
        plugins: Iterable[object] = (),
        load_entrypoints: bool | None = None,
        builtins: bool = True,
        warm: bool = True,
        read_only: bool = False,
    ) -> opening.Opening:
        """Open a memory. ``data_dir`` overrides the settings' folder; ``warm`` loads the model now
        (set it to ``False`` for commands that never embed). ``read_only`` opens an existing store
        beside the process that writes it: every write is refused with a ``StoreError``, and
        recall reinforces nothing."""
        opening.check_open_arguments(settings, clock, plugins, Settings)
        settings = settings or load_settings(config_file)
        if data_dir is not None:
            settings = settings.model_copy(update={"data_dir": folder_argument(data_dir, "data_dir")})
        memory = cls(
            settings,
            clock=clock,
            plugins=plugins,
            load_entrypoints=load_entrypoints,
            builtins=builtins,
            read_only=read_only,
        )
        return opening.Opening(memory, warm)

    async def start(self, warm: bool) -> None:
        """Load plugins, the model and the store (``Memory.open`` calls it)."""
        builtins, entrypoints, extra = self._plugins
        await opening.start(self, warm=warm, builtins=builtins, load_entrypoints=entrypoints, extra=extra)
        self._started = True
        await self.host.call("narrmem_startup", isolate=False, memory=self)
        await self._forgetting.resume()

    def attach(self, *, store: Store | None = None, embedder: Embedder | None = None) -> None:
        """Set the store and embedder the plugins registered (used while opening)."""
        self._store = store or self._store
        self._embedder = embedder or self._embedder

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self.host.call("narrmem_shutdown", memory=self)
        if self._store is not None:
            await self._store.close()
        if self._embedder is not None:
            await self._embedder.close()

    async def __aenter__(self) -> Memory:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def store(self) -> Store:
        if self._store is None:
            raise PluginError("the memory is not open")
        return self._store

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            raise PluginError("the memory is not open")
        return self._embedder

    # --- ingest ---------------------------------------------------------------------------------

    async def ingest(self, message: Message | dict[str, Any]) -> IngestResult:
        """Triage one message and store what it deserves. Ignored messages return at once."""
        [result] = await self.ingest_many([message])
        return result

    async def ingest_many(
        self, messages: Sequence[Message | dict[str, Any]], *, progress: Callable[[int], None] | None = None
    ) -> list[IngestResult]:
        """Ingest in order with batched embeddings and one transaction per batch. Every message is
        validated before anything is written: one bad message is an :class:`InputError` naming
        its index and field, and nothing from the call is stored."""
        return await self._ingest.run(sequence_argument(messages, "messages"), progress)

    async def triage(self, message: Message | dict[str, Any]) -> TriageDecision:
        """What triage decides for a message, without storing anything (a dry run)."""
        return await self._ingest.triage(as_message(message, None), [])

    async def edit(self, message: Message | dict[str, Any]) -> IngestResult:
        """A message was edited: what it left is replaced by what the new text deserves, and the
        earlier texts are kept in the new episode's ``meta["edits"]``."""
        edited = as_message(message, None)
        ids = await self.store.from_messages(edited.tenant, edited.chat_id, [edited.message_id])
        found = await self.store.get(ids, opening.scope_argument(edited.tenant, chat_id=edited.chat_id))
        before = [r for r in found.values() if r.kind == "episode"]
        edits = [e for r in before for e in _earlier_edits(r)]
        edits += [{"text": r.text, "replaced_at": self.clock.now().isoformat()} for r in before]
        meta = {**edited.meta, "edits": edits} if edits else edited.meta
        # Checked before the old message is forgotten: the earlier texts can take meta past its
        # limit, and a refused edit must leave the old message as it was.
        replacement = as_message(edited.model_copy(update={"meta": meta}), None)
        await self.forget_messages(
            chat_id=edited.chat_id, message_ids=[edited.message_id], tenant=edited.tenant
        )
        return await self.ingest(replacement)

    def on_trigger(self, callback: TriggerCallback) -> None:
        """Call ``await callback(event)`` for every trigger event; a raising callback is logged."""
        self._trigger_callbacks.append(callback)

    # --- recall ---------------------------------------------------------------------------------

    async def recall(
        self,
        query: str,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
        k: int = 5,
        kinds: list[str] | None = None,
        snippet_tokens: int | None = 48,
        reinforce: bool = True,
        reinforce_reason: Literal["relevance", "tool"] = "relevance",
        exclude_message_ids: Sequence[str] = (),
    ) -> list[Hit]:
        """At most ``k`` memories that answer ``query`` inside the scope, best first: only those
        that clear the relevance floor (``[recall]``), so a query about something never said
        returns nothing. Each hit says why it ranked (``Hit.why``). A memory longer than
        ``snippet_tokens`` comes back as its sentences most relevant to the query (the whole text
        in ``Hit.detail``). This is the bot's path: a few of the most relevant hits are reinforced,
        noted as ``reinforce_reason``; ``reinforce=False`` makes a read-only probe. Memories that
        came only from ``exclude_message_ids`` (the message being answered) are left out."""
        try:
            request = RecallRequest(
                query=query,
                scope=opening.scope_argument(tenant, user_id, chat_id),
                k=k,
                kinds=kinds,
                snippet_tokens=snippet_tokens,
                reinforce=reinforce and not self.read_only,
                reason=reinforce_reason,
                exclude_message_ids=list(exclude_message_ids),
            )
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        return await recall_pipeline.run(self, request)

    async def context(
        self,
        text: str,
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
        k: int = 8,
        exclude_message_ids: Sequence[str] = (),
    ) -> ContextPack:
        """What to put in front of the bot's next answer to ``text``: ``pack.render(token_budget)``.
        Pass the id of the message being answered in ``exclude_message_ids`` once it is stored."""
        hits = await self.recall(
            text,
            user_id=user_id,
            chat_id=chat_id,
            tenant=tenant,
            k=k,
            exclude_message_ids=exclude_message_ids,
        )
        return ContextPack(query=text, scope=opening.scope_argument(tenant, user_id, chat_id), hits=hits)

    async def turn_context(
        self, text: str, *, user_id: str, chat_id: str, tenant: str = "default"
    ) -> dict[str, Any]:
        """What to know before answering ``text``: the persona, the working memory chain and the
        relevant facts and memories (the per-turn flow), from the graph plugin or whichever answers
        ``narrmem_turn_context``. ``result["rendered"]`` is the prompt block."""
        opening.scope_argument(tenant, user_id, chat_id)
        text = text_argument(text, "text", max_chars=MAX_QUERY_CHARS)
        answer = await self.host.call_first(
            "narrmem_turn_context", memory=self, tenant=tenant, user_id=user_id, chat_id=chat_id, text=text
        )
        if answer is None:
            raise PluginError("no plugin builds turn contexts (is the graph plugin disabled?)")
        return dict(answer)

    async def summary(
        self,
        *,
        user_id: str,
        depth: int | None = None,
        token_budget: int | None = None,
        tenant: str = "default",
    ) -> dict[str, Any]:
        """ "Who is this person" at an abstraction level (``depth``, 1 = most abstract) or the most
        detailed telling that fits ``token_budget``; from the rtm plugin or whichever answers."""
        opening.scope_argument(tenant, user_id)
        # Checked here: a plugin's own refusal would be isolated and reported as no answer at all.
        depth = optional_int_argument(depth, "depth")
        token_budget = optional_int_argument(token_budget, "token_budget")
        answer = await self.host.call_first(
            "narrmem_user_summary",
            memory=self,
            tenant=tenant,
            user_id=user_id,
            depth=depth,
            token_budget=token_budget,
        )
        if answer is None:
            raise PluginError("no plugin tells user summaries (is the rtm plugin disabled?)")
        return dict(answer)

    # --- importance -----------------------------------------------------------------------------

    async def importance_now(self, records: Sequence[MemoryRecord]) -> dict[int, float]:
        """Each record's importance after decay as of the clock's now (the stored value when no
        plugin models decay)."""
        answer = await self.host.call_first(
            "narrmem_importance_now", memory=self, records=list(records), now=self.clock.now()
        )
        now_values = {int(k): float(v) for k, v in (answer or {}).items()}
        return {r.id: now_values.get(r.id, r.importance) for r in records if r.id is not None}

    async def mark_used(
        self,
        memory_ids: Sequence[int],
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
    ) -> list[int]:
        """The bot used these memories in its answer: they are reinforced (at most once per spacing
        window, see the hippocampus). Ids outside the scope are ignored. Returns the ids reinforced."""
        scope = opening.scope_argument(tenant, user_id, chat_id)
        ids = _memory_ids(memory_ids)
        if self.read_only:
            raise StoreError(f"{self.data_dir} is open read-only: nothing can be reinforced")
        records = list((await self.store.get(ids, scope)).values())
        reinforced = [
            i for part in await self.host.call("narrmem_used", memory=self, records=records) for i in part
        ]
        return sorted(set(reinforced))

    async def decay(self, now: datetime | None = None) -> dict[str, int]:
        """Run the decay pass as of ``now`` (default: the clock); returns counts."""
        when = self.clock.now() if now is None else aware_time_argument(now, "now")
        counts: dict[str, int] = {}
        for part in await self.host.call("narrmem_decay", memory=self, now=when):
            counts.update(part)
        return counts

    async def history(self, memory_id: int) -> dict[str, Any]:
        """A memory's importance over time: its stored state, the recorded changes, and what the
        decay plugin projects."""
        memory_id = int_argument(memory_id, "memory_id")
        record = (await self.store.get([memory_id], None)).get(memory_id)
        if record is None:
            raise InputError(f"no memory with id {memory_id}", field="memory_id")
        result: dict[str, Any] = {
            "memory": record.model_dump(mode="json", exclude={"embed_text", "context_text"}),
            "events": await self.store.history(memory_id),
        }
        for part in await self.host.call("narrmem_history", memory=self, record=record, now=self.clock.now()):
            result.update(part)
        return result

    # --- tools, forgetting, figures ---------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any] | str | None = None) -> dict[str, Any]:
        """Run a registered tool with JSON arguments; returns its typed result as a JSON-ready dict."""
        tool, args = self.tools.validate(name, arguments)
        output = await tool.handler(self, args)
        if isinstance(output, dict):
            output = tool.output_model.model_validate(output)
        return dict(output.model_dump(mode="json"))

    async def forget(
        self, *, user_id: str | None = None, chat_id: str | None = None, tenant: str = "default"
    ) -> dict[str, int]:
        """Delete every trace of a user (and/or a chat): rows, keyword index, vectors, history, and
        every plugin's copies (graph, summaries, counters, other memories' keyword context). The
        forget is written down before anything is deleted and reported done only when every
        plugin has finished; one interrupted by a crash is finished on the next open."""
        return await self._forgetting.scope(opening.scope_argument(tenant, user_id, chat_id))

    async def forget_messages(
        self, *, chat_id: str, message_ids: Sequence[str], tenant: str = "default"
    ) -> dict[str, int]:
        """Delete what these messages left (episodes and the scenes built from them), as when a
        chat reports a message deleted."""
        return await self._forgetting.messages(opening.scope_argument(tenant, chat_id=chat_id), message_ids)

    async def stats(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for part in await self.host.call("narrmem_stats", memory=self):
            extra.update(part)
        return {
            **(await self.store.stats()),
            **extra,
            "data_dir": str(self.data_dir),
            "embedder": {"backend": self.settings.embedder.backend, "model": self.embedder.name},
            "plugins": self.host.plugin_names(),
            "tools": self.tools.names(),
        }

    async def users(self, tenant: str | None = None, *, limit: int = 1000) -> list[dict[str, Any]]:
        """Who has memories: per user of ``tenant`` (every tenant if ``None``) how many memories and
        scenes, in how many chats, and the time of the oldest and newest. For inspection; it reads
        no memory's text and changes nothing."""
        if tenant is not None:
            tenant = text_argument(tenant, "tenant", max_chars=MAX_ID_CHARS)
            if not tenant:
                raise InputError("must not be empty", field="tenant")
        limit = int_argument(limit, "limit", high=100_000)
        return await self.store.users(tenant, limit=limit)


def _memory_ids(memory_ids: Sequence[int]) -> list[int]:
    if isinstance(memory_ids, str | bytes) or not isinstance(memory_ids, Sequence):
        raise InputError("must be a list of memory ids", field="memory_ids")
    for i, memory_id in enumerate(memory_ids):
        if isinstance(memory_id, bool) or not isinstance(memory_id, int) or not 0 < memory_id < 2**63:
            raise InputError("must be a positive integer", field=f"memory_ids[{i}]")
    return list(memory_ids)


def _earlier_edits(record: MemoryRecord) -> list[Any]:
    """The texts an episode replaced; a caller's own ``meta["edits"]`` of another shape is not ours."""
    edits = record.meta.get("edits", [])
    return edits if isinstance(edits, list) else []
