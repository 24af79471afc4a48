"""``Memory``: the public async API. It owns one plugin host, one store and one embedder."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError

from narrmem import recall as recall_pipeline
from narrmem.checks import (
    aware_time_argument,
    folder_argument,
    has_surrogate,
    int_argument,
    optional_int_argument,
    sequence_argument,
    text_argument,
)
from narrmem.clock import Clock, SystemClock
from narrmem.config import Settings, load_settings
from narrmem.embed import Embedder
from narrmem.errors import ConfigError, InputError, PluginError, StoreError
from narrmem.host import PluginHost
from narrmem.models import (
    MAX_ID_CHARS,
    MAX_QUERY_CHARS,
    ContextPack,
    ForgetJob,
    Hit,
    IngestResult,
    MemoryRecord,
    Message,
    RecallRequest,
    Scope,
    TriageDecision,
    TriggerEvent,
)
from narrmem.store import Store
from narrmem.text import cjk_count
from narrmem.tools import ToolRegistry

log = logging.getLogger("narrmem")

TriggerCallback = Callable[[TriggerEvent], Awaitable[None]]
FALLBACK_DECISION = TriageDecision(layer="accumulate", reason="no triage plugin answered")


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
        self._extra_plugins = list(plugins)
        self._load_entrypoints = (
            settings.plugins.load_entrypoints if load_entrypoints is None else load_entrypoints
        )
        self._builtins = builtins
        self._store: Store | None = None
        self._embedder: Embedder | None = None
        self._trigger_callbacks: list[TriggerCallback] = []
        self._write_lock = asyncio.Lock()
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
    ) -> _Opening:
        """Open a memory. ``data_dir`` overrides the settings' folder; ``warm`` loads the model now
        (set it to ``False`` for commands that never embed). ``read_only`` opens an existing store
        beside the process that writes it: every write is refused with a ``StoreError``, and
        recall reinforces nothing."""
        if settings is not None and not isinstance(settings, Settings):
            raise InputError(f"must be narrmem Settings, not {type(settings).__name__}", field="settings")
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise InputError("must be a clock: an object with a now() method", field="clock")
        if isinstance(plugins, str | bytes | dict) or not isinstance(plugins, Iterable):
            raise InputError(f"must be a list of plugins, not {type(plugins).__name__}", field="plugins")
        if settings is None:
            settings = load_settings(config_file)
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
        return _Opening(memory, warm)

    async def _start(self, warm: bool) -> None:
        settings = self.settings
        self.host.load(
            builtins=self._builtins,
            load_entrypoints=self._load_entrypoints,
            extra=self._extra_plugins,
            disabled=settings.plugins.disabled,
        )
        await self.host.call("narrmem_configure", isolate=False, memory=self, settings=settings)
        unknown = sorted(set(settings.plugin) - set(self.host.plugin_names()))
        if unknown:
            raise ConfigError(f"plugin.{unknown[0]}: no plugin of that name is loaded")
        stores = await self._collect("narrmem_register_stores")
        embedders = await self._collect("narrmem_register_embedders")
        await self.host.call("narrmem_register_tools", isolate=False, register=self.tools.register)
        self._embedder = _pick(embedders, settings.embedder.backend, "embedder.backend")(settings)
        if warm:
            await self._embedder.start()
        try:
            if not self.read_only:
                self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"data folder {self.data_dir}: cannot create it ({exc.strerror})") from exc
        store = _pick(stores, settings.storage.backend, "storage.backend")(self)
        self._store = store  # set before opening, so a failed open is still closed
        await store.open(dim=self._embedder.dim, model=self._embedder.name)
        self._started = True
        await self.host.call("narrmem_startup", isolate=False, memory=self)
        await self._resume_forgets()

    async def _collect(self, hook_name: str) -> dict[str, Callable[..., Any]]:
        found: dict[str, Callable[..., Any]] = {}

        def register(name: str, factory: Callable[..., Any]) -> None:
            if name in found:
                raise PluginError(f"{hook_name}: '{name}' is registered twice")
            found[name] = factory

        await self.host.call(hook_name, isolate=False, register=register)
        return found

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

    # --- ingest -----------------------------------------------------------------------------

    async def ingest(self, message: Message | dict[str, Any]) -> IngestResult:
        """Triage one message and store what it deserves. Ignored messages return at once."""
        [result] = await self.ingest_many([message])
        return result

    async def ingest_many(
        self,
        messages: Sequence[Message | dict[str, Any]],
        *,
        progress: Callable[[int], None] | None = None,
    ) -> list[IngestResult]:
        """Ingest in order with batched embeddings and one transaction per batch.

        Every message is validated before anything is written: one bad message is an
        :class:`InputError` naming its index and field, and nothing from the call is stored.
        """
        messages = sequence_argument(messages, "messages")
        validated = [_as_message(m, index=i if len(messages) > 1 else None) for i, m in enumerate(messages)]
        batches: list[list[IngestResult | None]] = []
        batch_size = self.settings.storage.batch_size
        finishing: asyncio.Task[None] | None = None
        try:
            for start in range(0, len(validated), batch_size):
                chunk = validated[start : start + batch_size]
                results, finishing = await self._ingest_batch(chunk, finishing)
                batches.append(results)
                if progress is not None:
                    progress(len(chunk))
        finally:
            if finishing is not None:
                await finishing
        return [r for results in batches for r in results if r is not None]

    async def _ingest_batch(
        self, messages: list[Message], previous: asyncio.Task[None] | None
    ) -> tuple[list[IngestResult | None], asyncio.Task[None] | None]:
        """Triage, embed and write one batch; return its results and the task running its
        after-store hooks. That task overlaps the next batch's embedding (``previous`` is the last
        batch's), so in bulk the model never waits for counters, facts and triggers."""
        errors: dict[int, list[str]] = {i: [] for i in range(len(messages))}
        decisions = []
        for i, message in enumerate(messages):
            decisions.append(await self._triage(message, errors[i]))
            await _yield_every(i)
        results: list[IngestResult | None] = [None] * len(messages)
        pending: list[tuple[int, list[MemoryRecord]]] = []
        seen: set[tuple[str, str, str]] = set()
        stored = await self._already_stored([(m, d) for m, d in zip(messages, decisions, strict=True)])
        for i, (message, decision) in enumerate(zip(messages, decisions, strict=True)):
            await _yield_every(i)
            key = _key(message)
            if decision.layer == "ignore":
                results[i] = IngestResult(
                    message_id=message.message_id,
                    layer="ignore",
                    stored=False,
                    reason=decision.reason,
                    notes=errors[i],
                )
            elif key in seen or key in stored:
                results[i] = self._duplicate(message, decision)
            else:
                seen.add(key)
                records = [self._episode(message, decision)]
                await self.host.call(
                    "narrmem_before_store",
                    memory=self,
                    message=message,
                    decision=decision,
                    records=records,
                    errors=errors[i],
                )
                pending.append((i, records))
        if not pending:
            if previous is not None:
                await previous
            return results, None
        texts = [r.index_text for _, records in pending for r in records]
        embedding: asyncio.Future[np.ndarray] = asyncio.ensure_future(self.embedder.embed(texts))
        try:
            if previous is not None:
                await previous
            vectors = await embedding
        finally:
            if not embedding.done():
                embedding.cancel()
        kept = await self._write(messages, decisions, pending, vectors, results)
        finishing = asyncio.ensure_future(self._after_store(messages, decisions, kept, results, errors))
        return results, finishing

    async def _write(
        self,
        messages: list[Message],
        decisions: list[TriageDecision],
        pending: list[tuple[int, list[MemoryRecord]]],
        vectors: np.ndarray,
        results: list[IngestResult | None],
    ) -> list[tuple[int, list[MemoryRecord], np.ndarray]]:
        async with self._write_lock:
            # A concurrent ingest may have stored the same message while this one was embedding.
            stored = await self._already_stored([(messages[i], decisions[i]) for i, _ in pending])
            keep: list[tuple[int, list[MemoryRecord], np.ndarray]] = []
            offset = 0
            for i, records in pending:
                own = vectors[offset : offset + len(records)]
                offset += len(records)
                if _key(messages[i]) in stored:
                    results[i] = self._duplicate(messages[i], decisions[i])
                else:
                    keep.append((i, records, own))
            if keep:
                await self.store.add(
                    [r for _, records, _ in keep for r in records], np.vstack([own for _, _, own in keep])
                )
                # Another process sharing the store may have stored a message since the check above:
                # the store skipped its episode (its id stays None), so it is a duplicate here too.
                for i, records, _ in keep:
                    if records[0].id is None:
                        results[i] = self._duplicate(messages[i], decisions[i])
                keep = [entry for entry in keep if entry[1][0].id is not None]
        return keep

    async def _after_store(
        self,
        messages: list[Message],
        decisions: list[TriageDecision],
        keep: list[tuple[int, list[MemoryRecord], np.ndarray]],
        results: list[IngestResult | None],
        errors: dict[int, list[str]],
    ) -> None:
        for n, (i, records, own) in enumerate(keep):
            await _yield_every(n)
            message, decision = messages[i], decisions[i]
            result = IngestResult(
                message_id=message.message_id,
                layer=decision.layer,
                stored=True,
                reason=decision.reason,
                type=decision.type,
                memory_ids=[r.id for r in records if r.id is not None],
                records=records,
                scene=next((r for r in records if r.kind == "scene"), None),
            )
            await self.host.call(
                "narrmem_after_store",
                memory=self,
                message=message,
                decision=decision,
                records=records,
                vectors=own,
                result=result,
                errors=errors[i],
            )
            result.notes.extend(errors[i])
            await self._deliver(result.triggers)
            results[i] = result

    def _duplicate(self, message: Message, decision: TriageDecision) -> IngestResult:
        return IngestResult(
            message_id=message.message_id,
            layer=decision.layer,
            stored=False,
            duplicate=True,
            reason="this message id is already stored in this chat",
        )

    async def triage(self, message: Message | dict[str, Any]) -> TriageDecision:
        """What triage decides for a message, without storing anything (a dry run)."""
        return await self._triage(_as_message(message, None), [])

    async def _triage(self, message: Message, errors: list[str]) -> TriageDecision:
        decision = await self.host.call_first("narrmem_triage", memory=self, message=message, errors=errors)
        if decision is None:
            return FALLBACK_DECISION
        if not isinstance(decision, TriageDecision):
            log.error("triage returned %r, not a TriageDecision; keeping the message", decision)
            return FALLBACK_DECISION
        return decision

    async def _already_stored(self, pairs: list[tuple[Message, TriageDecision]]) -> set[tuple[str, str, str]]:
        by_chat: dict[tuple[str, str], list[str]] = {}
        for m, d in pairs:
            if d.layer != "ignore":
                by_chat.setdefault((m.tenant, m.chat_id), []).append(m.message_id)
        found: set[tuple[str, str, str]] = set()
        for (tenant, chat_id), ids in by_chat.items():
            for mid in await self.store.stored_message_ids(tenant, chat_id, ids):
                found.add((tenant, chat_id, mid))
        return found

    def _episode(self, message: Message, decision: TriageDecision) -> MemoryRecord:
        return MemoryRecord(
            kind="episode",
            tenant=message.tenant,
            user_id=message.user_id,
            chat_id=message.chat_id,
            speaker=message.speaker,
            text=message.text,
            embed_text=attributed(message),
            importance=decision.importance,
            created_at=message.ts,
            stored_at=self.clock.now(),
            message_ids=[message.message_id],
            meta={**message.meta, "layer": decision.layer},
        )

    # --- triggers ---------------------------------------------------------------------------

    def on_trigger(self, callback: TriggerCallback) -> None:
        """Call ``await callback(event)`` for every trigger event; a raising callback is logged."""
        self._trigger_callbacks.append(callback)

    async def _deliver(self, events: list[TriggerEvent]) -> None:
        for event in events:
            await self.host.call("narrmem_on_trigger", memory=self, event=event)
            for callback in self._trigger_callbacks:
                try:
                    await callback(event)
                except Exception:
                    log.exception("trigger callback %r failed", callback)

    # --- recall -----------------------------------------------------------------------------

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
        returns nothing. Each hit says why it ranked (``Hit.why``).

        A memory longer than ``snippet_tokens`` comes back as its sentences most relevant to the
        query (the whole text in ``Hit.detail``); ``None`` returns whole texts. This is the bot's
        path: a few of the most relevant hits are reinforced (see the hippocampus), noted in their
        history as ``reinforce_reason``. ``reinforce=False`` makes a read-only probe.
        ``exclude_message_ids``: memories that came only from these messages are left out (the
        message being answered, already stored, is no context for itself)."""
        try:
            scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
            request = RecallRequest(
                query=query,
                scope=scope,
                k=k,
                kinds=kinds,
                snippet_tokens=snippet_tokens,
                reinforce=reinforce and not self.read_only,
                reason=reinforce_reason,
                exclude_message_ids=list(exclude_message_ids),
            )
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        return await self._recall(request)

    async def _recall(self, request: RecallRequest) -> list[Hit]:
        return await recall_pipeline.run(self, request)

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
        try:
            scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        ids = _memory_ids(memory_ids)
        if self.read_only:
            raise StoreError(f"{self.data_dir} is open read-only: nothing can be reinforced")
        records = list((await self.store.get(ids, scope)).values())
        reinforced: list[int] = []
        for part in await self.host.call("narrmem_used", memory=self, records=records):
            reinforced.extend(part or [])
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
        try:
            Scope(tenant=tenant, user_id=user_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
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

    async def turn_context(
        self, text: str, *, user_id: str, chat_id: str, tenant: str = "default"
    ) -> dict[str, Any]:
        """What to know before answering ``text``: the persona, the working memory chain and the
        relevant facts and memories (the per-turn flow), from the graph plugin or whichever answers
        ``narrmem_turn_context``. ``result["rendered"]`` is the prompt block."""
        try:
            Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        text = text_argument(text, "text", max_chars=MAX_QUERY_CHARS)
        answer = await self.host.call_first(
            "narrmem_turn_context", memory=self, tenant=tenant, user_id=user_id, chat_id=chat_id, text=text
        )
        if answer is None:
            raise PluginError("no plugin builds turn contexts (is the graph plugin disabled?)")
        return dict(answer)

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
        return ContextPack(
            query=text, scope=Scope(tenant=tenant, user_id=user_id, chat_id=chat_id), hits=hits
        )

    # --- tools, maintenance ------------------------------------------------------------------

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
        every plugin's copies (graph, summaries, counters, other memories' keyword context).

        The forget is written down before anything is deleted and reported done only when every
        plugin has finished; one interrupted by a crash is finished on the next open."""
        try:
            scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        async with self._write_lock:
            job = await self.store.begin_forget(
                tenant=scope.tenant, user_id=scope.user_id, chat_id=scope.chat_id
            )
            return await self._finish_forget(job)

    async def forget_messages(
        self, *, chat_id: str, message_ids: Sequence[str], tenant: str = "default"
    ) -> dict[str, int]:
        """Delete what these messages left (episodes and the scenes built from them), as when a
        chat reports a message deleted."""
        try:
            scope = Scope(tenant=tenant, chat_id=chat_id)
        except ValidationError as exc:
            raise InputError.from_pydantic(exc) from exc
        ids = _message_ids(message_ids)
        async with self._write_lock:
            job = await self.store.begin_forget(
                tenant=scope.tenant, user_id=None, chat_id=chat_id, messages=ids
            )
            counts = await self._finish_forget(job)
        return {"memories": counts.get("memories", 0)}

    async def _finish_forget(self, job: ForgetJob) -> dict[str, int]:
        """Delete what ``job`` names and let every plugin scrub its copies; safe to run again."""
        scope = job.scope
        if job.messages is None:
            removed = await self.store.recent(scope, limit=2**62)
            counts = await self.store.forget(tenant=job.tenant, user_id=job.user_id, chat_id=job.chat_id)
        else:
            assert job.chat_id is not None
            ids = await self.store.from_messages(job.tenant, job.chat_id, job.messages)
            removed = list((await self.store.get(ids, scope)).values())
            counts = {"memories": await self.store.delete(ids, scope)}
        await self.host.call(
            "narrmem_after_forget",
            isolate=False,
            memory=self,
            tenant=job.tenant,
            user_id=job.user_id,
            chat_id=job.chat_id,
            removed=removed,
            sources=job.sources,
            messages=job.messages,
        )
        # A deleted message (an edit does this too) is gone from every row; merging the keyword
        # index and emptying the log on each one would cost a bot every edit. A user's or a
        # chat's forget leaves no byte.
        await self.store.finish_forget(job, purge=job.messages is None)
        return counts

    async def _resume_forgets(self) -> None:
        if self.read_only:
            return  # the process that writes the folder finishes them
        for job in await self.store.pending_forgets():
            log.warning("finishing a forget that was interrupted (job %d)", job.id)
            async with self._write_lock:
                await self._finish_forget(job)

    async def edit(self, message: Message | dict[str, Any]) -> IngestResult:
        """A message was edited: what it left is replaced by what the new text deserves, and the
        earlier texts are kept in the new episode's ``meta["edits"]``."""
        edited = _as_message(message, None)
        scope = Scope(tenant=edited.tenant, chat_id=edited.chat_id)
        ids = await self.store.from_messages(edited.tenant, edited.chat_id, [edited.message_id])
        before = [r for r in (await self.store.get(ids, scope)).values() if r.kind == "episode"]
        edits = [e for r in before for e in _earlier_edits(r)]
        edits += [{"text": r.text, "replaced_at": self.clock.now().isoformat()} for r in before]
        meta = {**edited.meta, "edits": edits} if edits else edited.meta
        # Checked before the old message is forgotten: the earlier texts can take meta past its
        # limit, and a refused edit must leave the old message as it was.
        replacement = _as_message(edited.model_copy(update={"meta": meta}), None)
        await self.forget_messages(
            chat_id=edited.chat_id, message_ids=[edited.message_id], tenant=edited.tenant
        )
        return await self.ingest(replacement)

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


class _Opening:
    """Lets ``Memory.open`` be both awaited and used with ``async with``."""

    def __init__(self, memory: Memory, warm: bool) -> None:
        self._memory = memory
        self._warm = warm

    async def _open(self) -> Memory:
        try:
            await self._memory._start(self._warm)
        except BaseException:
            await self._memory.close()
            raise
        return self._memory

    def __await__(self) -> Generator[Any, None, Memory]:
        return self._open().__await__()

    async def __aenter__(self) -> Memory:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._memory.close()


# Where bot libraries and chat exports put a person's display name in ``meta``.
DISPLAY_NAME_KEYS = ("display_name", "name", "username", "first_name")


def speaker_of(message: Message) -> str:
    """Who said it: ``speaker``, else a display name from ``meta``, else the user id. Recall needs
    the attribution (questions name people), so a message never goes without one."""
    if message.speaker:
        return message.speaker
    for key in DISPLAY_NAME_KEYS:
        value = message.meta.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_ID_CHARS]
    return message.user_id


def attributed(message: Message) -> str:
    """The message as reported speech ("Ann said, "…""): who said it is part of what it means,
    and questions name people ("what did Ann decide?")."""
    speaker = speaker_of(message)
    if cjk_count(message.text) * 2 > len(message.text):
        return f"{speaker}说：“{message.text}”"
    return f'{speaker} said, "{message.text}"'


def _key(message: Message) -> tuple[str, str, str]:
    return (message.tenant, message.chat_id, message.message_id)


async def _yield_every(n: int, every: int = 8) -> None:
    """Let the event loop run between messages of a batch: a hook whose awaits complete at once
    never suspends, and a batch of them would otherwise hold the loop for tens of milliseconds."""
    if n % every == every - 1:
        await asyncio.sleep(0)


def _as_message(message: Message | dict[str, Any], index: int | None) -> Message:
    try:
        return Message.model_validate(message)
    except ValidationError as exc:
        prefix = f"messages[{index}]." if index is not None else ""
        raise InputError.from_pydantic(exc, prefix=prefix) from exc


def _message_ids(message_ids: Sequence[str]) -> list[str]:
    if isinstance(message_ids, str) or not isinstance(message_ids, Sequence):
        raise InputError("must be a list of message ids", field="message_ids")
    for i, mid in enumerate(message_ids):
        if not isinstance(mid, str) or not 0 < len(mid) <= MAX_ID_CHARS:
            raise InputError(f"must be a string of 1 to {MAX_ID_CHARS} characters", field=f"message_ids[{i}]")
        if has_surrogate(mid):
            raise InputError("holds a lone surrogate (not valid Unicode)", field=f"message_ids[{i}]")
    return list(message_ids)


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


def _pick(registry: dict[str, Callable[..., Any]], name: str, setting: str) -> Callable[..., Any]:
    if name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise ConfigError(f"{setting}: no backend named '{name}' is registered (known: {known})")
    return registry[name]
