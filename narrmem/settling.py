"""After-store hooks after the acknowledgement (``[storage] acknowledge = "after_write"``).

Ingest then returns once a batch is written; the batch's after-store hooks (counters, facts,
triggers) run afterwards, one batch after another in the order they were written. A plugin's hook
that found the store unreachable is owed: the entry of its message stays, marked with the plugin,
and that hook alone runs again once the store answers (in this process after
:mod:`narrmem.trying_again`'s delays, outside that order and outside :meth:`Settling.settle`; at
the next open when it stops first). What they need
is put in the store in the same transaction as the records (plugin state, namespace
:data:`NAMESPACE`) and deleted once they have run, so a process that stops first has them run at the
next open: by the next process to open the store, once the one that wrote them is gone (its
:meth:`narrmem.store.Store.exclusive` claim on its own entries is released). With the default
acknowledgement the hooks run before ingest returns, and their work is recorded the same way.

An entry holds no text of the message: the ids that find its records, its speaker, the names of
its ``meta`` keys and triage's decision without its text (``gist`` and string-valued signals, which may quote
it). The message the hooks get back is rebuilt from its stored episode. A forget deletes the
entries of what it forgets before it finishes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from narrmem import logs
from narrmem.errors import InputError, StoreError, StoreUnavailableError
from narrmem.fence import HOOKS_LATER, Grant, inside_own_work, own_work
from narrmem.models import ForgetJob, MemoryRecord, Message, Scope, TriageDecision
from narrmem.store import StateEntry, Store, shared_by_processes
from narrmem.to_the_end import finished
from narrmem.trying_again import TryingAgain

if TYPE_CHECKING:
    from narrmem.ingest import IngestPipeline, Pending
    from narrmem.lifecycle import MemoryLifecycle

log = logs.logger("narrmem")

NAMESPACE = "narrmem.settling"
ENTRY_KEY = re.compile(r"[0-9a-f]{32}:[0-9]{12}:[0-9]{6}")  # as batch_prefix and entries write them
# How long a claim found free on a shared store must stay free before its owner counts as gone:
# a live worker whose connection ended takes its claim again within about 1.7 s (the first steps of
# the PostgreSQL store's retake delays), and a worker checking whether the owner is gone holds the
# claim for a moment only.
TAKEOVER_GRACE_S = 2.0
# Messages acknowledged whose hooks have not run yet, past which ingest waits for them: the lag of
# counts and triggers, and what a stop leaves for the next open, stay bounded.
MAX_UNSETTLED = 1024
# Owed batches in a row that find the store away before a try of them all ends (see _pay_owed).
AWAY_IN_A_ROW = 3
# Set in the task that runs a batch's hooks, for as long as they run.
_IN_BATCH: ContextVar[Grant | None] = ContextVar("narrmem_in_settling_batch", default=None)


class Settling:
    def __init__(self, memory: MemoryLifecycle) -> None:
        self.memory = memory
        # This process's entries: the owner's token starts every key (not randomness that changes
        # any result, only a name no other process uses).
        self.token = uuid.uuid4().hex
        self._batches = itertools.count()
        self._tail: asyncio.Future[None] | None = None
        self._batches_running: collections.deque[asyncio.Future[None]] = collections.deque()
        self._unsettled = 0
        self._claim = contextlib.AsyncExitStack()
        self._claiming: asyncio.Future[None] | None = None
        # Owners of entries found gone by this open (see stopped_owners), for every namespace.
        self.owners_gone: set[str] = set()
        self.trying_again = TryingAgain()  # hooks that found the store unreachable (see settled)
        # In the order they are tried (owed first, or found the store away last); paid by one
        # loop however many there are (see _pay_owed).
        self._owing: dict[Owing, None] = {}
        self._paying: asyncio.Task[None] | None = None
        self._pipeline: IngestPipeline | None = None
        # Set by the memory: forget again a message a forget took while its owed hooks ran.
        self.forget_again: Callable[[Scope, Sequence[str], Sequence[int]], Awaitable[None]] | None = None
        self.forget_again_later: Callable[[Scope, Sequence[str], Sequence[int]], None] | None = None

    async def claim(self) -> None:
        """Hold this process's claim on its entries, from the first call that leaves any until
        the memory closes: while it is held, no other process runs or writes them. Calls at once
        wait for the one claim."""
        claiming = self._claiming
        if claiming is None or (
            claiming.done() and (claiming.cancelled() or claiming.exception() is not None)
        ):
            claiming = self._claiming = asyncio.ensure_future(self._take_claim())
        await asyncio.shield(claiming)

    async def _take_claim(self) -> None:
        held = await self._claim.enter_async_context(self.memory.store.exclusive(claim_name(self.token)))
        if not held:  # a token is this process's alone: another holder means a broken store
            raise StoreError(f"the claim {claim_name(self.token)!r} is held elsewhere")

    # --- while ingesting ---------------------------------------------------------------------

    def batch_prefix(self) -> str:
        """The key prefix of the next batch's entries (keys of one width, so none is another's prefix)."""
        return f"{self.token}:{next(self._batches):012d}:"

    def entries(self, prefix: str, items: Sequence[Pending]) -> list[StateEntry]:
        return [
            (NAMESPACE, f"{prefix}{n:06d}", _entry(item.message, item.decision))
            for n, item in enumerate(items)
        ]

    async def discard(self, keys: Sequence[str]) -> None:
        """Delete entries whose message turned out to be stored already (by another ingest)."""
        for key in keys:
            await self.memory.store.state_delete(NAMESPACE, key)

    async def settled(self, prefix: str, owing: Sequence[tuple[Pending, list[str]]] = ()) -> None:
        """The hooks of the batch whose entries start with ``prefix`` have run: its entries go.
        ``owing``: its messages, each with the plugins whose hook found the store unreachable;
        those messages' entries stay, marked with those plugins, whose hooks are tried again
        until they have run (see the module). An entry that cannot be deleted for the moment is
        deleted later: left, the next open ran every hook of its message again."""
        batch = Owing(
            prefix,
            [
                Debt(item.settling_key, list(plugins))
                for item, plugins in owing
                if plugins and item.settling_key
            ],
        )
        try:
            await self._mark(batch)  # at once: a stop before the first try again runs these alone
        except StoreUnavailableError:
            pass
        if batch.cleared and not batch.debts:
            return
        self._owing[batch] = None
        loop = self._paying
        if loop is None or loop.done():
            self._paying = self.trying_again.keep_trying(
                self._pay_owed, "the after-store hooks that found the store unreachable"
            )

    async def _pay_owed(self) -> None:
        """One try of every batch owed, in :attr:`_owing`'s order, batches owed meanwhile included. One loop
        for all: a store away for an hour left a batch owing per message (36,000 at 10 a
        second), and a loop each tried them all against the store as it came back. A batch that
        finds the store away goes last, and :data:`AWAY_IN_A_ROW` of them in a row end the try
        (the store is away: the others would find it so); a batch whose plugin alone says so
        holds no other back. Any other failure holds no other batch back either, and is raised
        once all were tried."""
        tried: set[Owing] = set()
        failed: Exception | None = None
        away_in_a_row = 0
        while pending := [batch for batch in self._owing if batch not in tried]:
            for batch in pending:
                tried.add(batch)
                try:
                    await self._pay(batch)
                    away_in_a_row = 0
                except StoreUnavailableError:
                    if batch in self._owing:  # last in the order, so the others get their turn
                        del self._owing[batch]
                        self._owing[batch] = None
                    away_in_a_row += 1
                    if away_in_a_row >= AWAY_IN_A_ROW:
                        if failed is not None:
                            log.warning("owed after-store hooks failed (%s)", type(failed).__name__)
                        raise
                except Exception as exc:
                    failed = exc
        if failed is not None:
            raise failed
        if self._owing:  # some found it away, but not AWAY_IN_A_ROW in a row
            raise StoreUnavailableError(f"the hooks of {self.owed} messages found the store away")

    async def _mark(self, batch: Owing) -> None:
        """Bring ``batch``'s entries up to date: what each message owes recorded in its entry (an
        open after a stop then runs those plugins' hooks alone), the entries of messages that
        owe nothing deleted."""
        store = self.memory.store
        if not batch.cleared:
            if not batch.debts:
                await store.state_delete(NAMESPACE, batch.prefix)
            else:
                owed = {debt.key for debt in batch.debts}
                for key, _ in await store.state_items(NAMESPACE):
                    if key.startswith(batch.prefix) and key not in owed:
                        await store.state_delete(NAMESPACE, key)
            batch.cleared = True
        for debt in list(batch.debts):
            if not debt.plugins:  # its hooks have run: what is left is the entry's delete
                await store.state_delete(NAMESPACE, debt.key)
                batch.debts.remove(debt)
            elif debt.recorded != debt.plugins:
                await self._record(debt)

    async def _pay(self, batch: Owing) -> None:
        """One try of what ``batch`` owes: its entries brought up to date, then the hooks owed,
        each message as a unit of :mod:`narrmem.fence` from the read of its records, as
        :meth:`recover` does. Raises while anything is still owed."""
        pipeline = self._pipeline
        assert pipeline is not None  # set by start(), before any ingest
        await self._mark(batch)
        for debt in list(batch.debts):
            debt.plugins = await self._run_owed(pipeline, debt)
        await self._mark(batch)
        if batch.debts:
            raise StoreUnavailableError(f"the hooks of {len(batch.debts)} messages found the store away")
        self._owing.pop(batch, None)

    async def _run_owed(self, pipeline: IngestPipeline, debt: Debt) -> list[str]:
        """Run the hooks ``debt`` owes; the plugins still owed."""
        store = self.memory.store
        unit = await pipeline.fence.enter()
        batch = Grant(HOOKS_LATER)
        _IN_BATCH.set(batch)  # a trigger callback that settles does not wait for itself
        vanished: Pending | None = None
        try:
            value = await store.state_get(NAMESPACE, debt.key)
            item = None if value is None else await self._rebuild(value, debt.key)
            if item is None:
                return []  # forgotten meanwhile (its entry went with it), or not narrmem's
            hooks = functools.partial(pipeline.after_store, [item], None, [debt.plugins])
            with batch.held():
                [still] = await pipeline.fence.run_inside(unit, hooks)
            if still != debt.plugins and not await self._stored(item):
                vanished = item  # some hook ran, and the message went meanwhile
        finally:
            pipeline.fence.leave(unit)
        if vanished is not None:
            # Outside the unit: the forget's own hooks are fenced as any caller's.
            await self._forget_again(vanished)
        return still

    async def _stored(self, item: Pending) -> bool:
        """Whether ``item``'s message is stored still (a store that cannot say: yes)."""
        message = item.message
        try:
            ids = await self.memory.store.from_messages(message.tenant, message.chat_id, [message.message_id])
        except StoreUnavailableError:
            return True  # then the hooks found it away as well, and run again
        return bool(ids)

    async def _forget_again(self, item: Pending) -> None:
        """A forget again of the message (narrmem.inbox: another worker's forget took it while
        this one wrote it), which no unit holds back, deleted it while its hooks ran: what they
        made of it goes too, forgotten again at once (its job recorded), or tried again until it
        is."""
        if self.forget_again is None or self.forget_again_later is None:
            return
        message = item.message
        scope = Scope(tenant=message.tenant, chat_id=message.chat_id)
        try:
            await finished(asyncio.ensure_future(self.forget_again(scope, [message.message_id], [])))
        except Exception:
            self.forget_again_later(scope, [message.message_id], [])

    async def _record(self, debt: Debt) -> None:
        """Mark ``debt``'s entry with the plugins whose hooks it owes, unless a forget took it."""
        store = self.memory.store
        stored = await store.state_get(NAMESPACE, debt.key)
        if stored is not None and stored.get("owed") != debt.plugins:
            # Compare-and-set: a forget that deletes the entry meanwhile is not undone.
            await store.state_put_if(NAMESPACE, debt.key, {**stored, "owed": debt.plugins}, stored)
        debt.recorded = list(debt.plugins)

    def schedule(
        self,
        run: Callable[[], Awaitable[Sequence[tuple[Pending, list[str]]]]],
        prefix: str,
        count: int,
        ended: Callable[[], None],
    ) -> None:
        """Run a written batch's hooks after the batches before it; delete its entries once they
        ran (see :meth:`settled`). ``ended`` is called once they have run, or will not."""
        previous = self._tail

        async def settle_batch() -> None:
            if previous is not None:
                await _quietly(previous)
            batch = Grant(HOOKS_LATER)
            _IN_BATCH.set(batch)  # this task's own context: what its hooks and callbacks call sees it
            try:
                with batch.held(), own_work():
                    owing = await run()
                await self.settled(prefix, owing)
            except Exception:
                # The entries stay: the next open runs the hooks again.
                log.exception("after-store hooks of an acknowledged batch failed; kept for the next open")
            finally:
                self._unsettled -= count

        self._unsettled += count
        self._tail = asyncio.ensure_future(settle_batch())
        # Also when the task is cancelled before it starts, which skips its own ending.
        self._tail.add_done_callback(lambda _: ended())
        while self._batches_running and self._batches_running[0].done():
            self._batches_running.popleft()  # they finish in order: the done ones lead
        self._batches_running.append(self._tail)

    def schedule_left(
        self, pipeline: IngestPipeline, prefix: str, keys: set[str], ended: Callable[[], None]
    ) -> None:
        """Run, as :meth:`schedule` does, the hooks of the entries ``keys`` of a batch whose caller
        was cancelled as it was written: those the write left in the store (none when it rolled
        back), rebuilt from the records as the next open does."""

        async def run() -> list[tuple[Pending, list[str]]]:
            items = [
                item
                for key, value in await self.memory.store.state_items(NAMESPACE)
                if key in keys and (item := await self._rebuild(value, key)) is not None
            ]
            return await pipeline.hooks_owing(items) if items else []

        self.schedule(run, prefix, len(keys), ended)

    @property
    def owed(self) -> int:
        """Messages whose hooks of some plugin found the store unreachable and are owed."""
        return sum(len(batch.debts) for batch in list(self._owing))

    def scheduled(self) -> asyncio.Future[None] | None:
        """What ends once the hooks scheduled so far have run (``None``: none is scheduled)."""
        tail = self._tail
        return None if tail is None or tail.done() else tail

    async def hold_back(self) -> None:
        """Wait, oldest batch first, until at most :data:`MAX_UNSETTLED` acknowledged messages
        are unsettled; at once inside hooks (an ingest by a trigger callback), which could wait
        for itself."""
        while not inside_own_work() and self._unsettled > MAX_UNSETTLED and self._batches_running:
            await _quietly(self._batches_running[0])
            while self._batches_running and self._batches_running[0].done():
                self._batches_running.popleft()

    async def settle(self) -> None:
        """Wait until the hooks of every message acknowledged so far have run. Inside a batch's
        hooks (a trigger callback that settles or forgets) the batches before it have run, and it
        and the later ones cannot be waited for there: it returns at once."""
        while self._tail is not None and not _in_batch():
            tail = self._tail
            await _quietly(tail)
            if self._tail is tail:
                self._tail = None
                self._batches_running.clear()

    # --- opening, closing, forgetting ----------------------------------------------------------

    async def start(self, pipeline: IngestPipeline) -> None:
        """Claim this process's entries, and run the hooks of the entries stopped processes left."""
        self._pipeline = pipeline
        if self.memory.read_only:
            return  # the process that writes the folder runs them
        if self.memory.settings.storage.acknowledge != "after_hooks":
            await self.claim()
        await self.recover(pipeline)

    async def stop_trying(self, closing: asyncio.Task[Any] | None) -> None:
        """Stop trying owed hooks again (``closing``: the task that closes, not waited for), and
        bring their entries up to date a last time, or the next open runs every hook of them."""
        await self.trying_again.close(closing)
        for batch in list(self._owing):
            with contextlib.suppress(Exception):
                await self._mark(batch)

    async def close(self) -> None:
        await self.settle()
        await self._claim.aclose()

    async def recover(self, pipeline: IngestPipeline) -> int:
        """Run the hooks of entries whose process is gone; return how many messages they were."""
        store = self.memory.store
        done = 0
        async for entries in stopped_owners(store, NAMESPACE, self.token, self.owners_gone):
            log.warning("running the after-store hooks of %d acknowledged messages", len(entries))
            for prefix, batch in itertools.groupby(entries, key=lambda e: _batch_of(e[0])):
                # A unit of narrmem.fence from the read of its records: another worker's forget
                # waits for these hooks as for those of a message being written.
                unit = await pipeline.fence.enter()
                try:
                    rebuilt = [(item, v) for key, v in batch if (item := await self._rebuild(v, key))]
                    items = [item for item, _ in rebuilt]
                    # An entry marked with what is owed runs those plugins' hooks alone.
                    among = [_owed(value) for _, value in rebuilt]
                    self._missing(among)
                    owing: list[tuple[Pending, list[str]]] = []
                    if items:
                        hooks = functools.partial(pipeline.hooks_owing, items, among)
                        owing = await pipeline.fence.run_inside(unit, hooks)
                finally:
                    pipeline.fence.leave(unit)
                try:
                    if any(plugins for _, plugins in owing):
                        # Still owed: this process's own, tried again by it (the stopped
                        # owner's claim is let go once this open has read its entries).
                        await self.settled(*await self._as_own(prefix, owing))
                    else:
                        await store.state_delete(NAMESPACE, prefix)
                except StoreUnavailableError:
                    log.warning(
                        "the store went away as hooks of a stopped process ran: left for the next open"
                    )
                done += len(items)
        return done

    async def _as_own(
        self, prefix: str, owing: list[tuple[Pending, list[str]]]
    ) -> tuple[str, list[tuple[Pending, list[str]]]]:
        """Move the entries of a stopped process's batch that still owe hooks under this
        process's token (marked), and delete its batch; the new prefix and what it owes."""
        await self.claim()
        store = self.memory.store
        own = self.batch_prefix()
        moved: list[tuple[Pending, list[str]]] = []
        for n, (item, plugins) in enumerate(owing):
            theirs = item.settling_key
            value = None if theirs is None else await store.state_get(NAMESPACE, theirs)
            if not plugins or theirs is None or value is None:
                continue
            item.settling_key = f"{own}{n:06d}"
            await store.state_put(NAMESPACE, item.settling_key, {**value, "owed": plugins})
            # Entry by entry: a stop in between leaves one message's owed hooks to run twice
            # (which a hook may), not the whole batch's.
            await store.state_delete(NAMESPACE, theirs)
            moved.append((item, plugins))
        await store.state_delete(NAMESPACE, prefix)
        return own, moved

    def _missing(self, among: Sequence[list[str] | None]) -> None:
        """Say which plugins owed hooks are not loaded now: their work for those messages is lost."""
        loaded = set(self.memory.host.plugin_names())
        missing = {name for names in among if names for name in names} - loaded
        if missing:
            log.warning(
                "after-store hooks owed by plugins not loaded now are not run: %s", ", ".join(sorted(missing))
            )

    async def drop(self, job: ForgetJob) -> None:
        """Delete the entries of the messages a forget removes (ids are a trace of them too)."""
        await drop_forgotten(self.memory.store, NAMESPACE, job, lambda value: value)

    async def _rebuild(self, value: dict[str, Any], key: str) -> Pending | None:
        """The message entry ``key`` stands for, from its stored records (``None`` when they are
        gone, or the entry is not one this module writes: it came from an imported file, say)."""
        from narrmem.ingest import Pending

        try:
            entry = SettlingEntry.model_validate(value)
        except ValidationError:
            log.error("an entry of after-store hooks to run is not as narrmem writes it; dropped")
            return None
        store = self.memory.store
        tenant, user_id, chat_id, message_id = entry.tenant, entry.user_id, entry.chat_id, entry.message_id
        scope = Scope(tenant=tenant, user_id=user_id, chat_id=chat_id)
        ids = await store.from_messages(tenant, chat_id, [message_id])
        found = await store.get(ids, scope)
        own = sorted((r for r in found.values() if r.message_ids == [message_id]), key=lambda r: r.id or 0)
        episodes = [r for r in own if r.kind == "episode"]
        if not episodes:
            return None
        records: list[MemoryRecord] = [episodes[0], *(r for r in own if r is not episodes[0])]
        vectors = await store.vectors([r.id for r in records if r.id is not None], scope)
        if len(vectors) != len(records):
            return None
        episode = records[0]
        message = Message(
            text=episode.text,
            user_id=user_id,
            chat_id=chat_id,
            tenant=tenant,
            ts=episode.created_at,
            message_id=message_id,
            speaker=entry.speaker,
            meta={k: episode.meta[k] for k in entry.meta_keys if k in episode.meta},
        )
        item = Pending(0, message, entry.decision)
        item.settling_key = key
        item.records = records
        item.vectors = np.vstack([vectors[r.id] for r in records if r.id is not None])
        return item


class SettlingEntry(BaseModel):
    """An entry as :func:`_entry` writes it: the message whose after-store hooks are to run."""

    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(min_length=1)
    user_id: str = Field(min_length=1)
    chat_id: str = Field(min_length=1)
    message_id: str = Field(min_length=1)
    speaker: str | None = None
    meta_keys: list[str] = Field(default_factory=list)
    decision: TriageDecision
    # The plugins whose after-store hooks are still owed (their hook found the store unreachable);
    # absent: every plugin's hooks are to run.
    owed: list[str] | None = None


@dataclass
class Debt:
    """A message whose after-store hooks of ``plugins`` found the store unreachable (none: only its
    entry is left to delete); ``recorded``: the plugins its entry names (``None``: not yet)."""

    key: str
    plugins: list[str]
    recorded: list[str] | None = None


@dataclass(eq=False)
class Owing:
    """What a batch (entries ``prefix``…) still owes; ``cleared``: the entries of its messages
    that owed nothing are deleted."""

    prefix: str
    debts: list[Debt]
    cleared: bool = False


def _owed(value: dict[str, Any]) -> list[str] | None:
    """The plugins an entry owes the hooks of (``None``: every plugin)."""
    owed = value.get("owed")
    return owed if isinstance(owed, list) else None


def check_entry(key: str, value: dict[str, Any]) -> None:
    """Refuse an entry (of an imported file) that this module would not read back."""
    if not ENTRY_KEY.fullmatch(key):
        raise InputError("is not a key of after-store hooks to run (token:batch:number)", field="key")
    try:
        SettlingEntry.model_validate(value)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, prefix="value.") from exc


def entry_message(value: object) -> Message:
    """The message an entry of state keeps under ``message``, or an :class:`InputError` naming
    its field as ``value.message.<field>`` (the checks of imported state)."""
    try:
        return Message.model_validate(value)
    except InputError as exc:
        raise InputError(exc.reason, field=f"value.message.{exc.field or ''}".rstrip(".")) from exc
    except ValidationError as exc:
        raise InputError.from_pydantic(exc, prefix="value.message.") from exc


def _entry(message: Message, decision: TriageDecision) -> dict[str, Any]:
    signals = {k: v for k, v in decision.signals.items() if not isinstance(v, str)}
    return {
        "tenant": message.tenant,
        "user_id": message.user_id,
        "chat_id": message.chat_id,
        "message_id": message.message_id,
        "speaker": message.speaker,
        "meta_keys": sorted(message.meta),
        "decision": decision.model_copy(update={"gist": None, "signals": signals}).model_dump(mode="json"),
    }


async def drop_forgotten(
    store: Store, namespace: str, job: ForgetJob, ids: Callable[[dict[str, Any]], object]
) -> None:
    """Delete the entries of ``namespace`` whose message ``job`` forgets; ``ids(value)`` is the
    part of an entry that names the message (tenant, user_id, chat_id, message_id)."""
    for key, value in await store.state_items(namespace):
        named = ids(value)
        if isinstance(named, dict) and forgotten_by(named, job):
            await store.state_delete(namespace, key)


def forgotten_by(value: dict[str, Any], job: ForgetJob) -> bool:
    """Whether ``job`` forgets the message ``value`` names (tenant, user_id, chat_id, message_id)."""
    if value.get("tenant") != job.tenant:
        return False
    if job.user_id is not None and value.get("user_id") != job.user_id:
        return False
    if job.chat_id is not None and value.get("chat_id") != job.chat_id:
        return False
    return job.messages is None or value.get("message_id") in job.messages


async def stopped_owners(
    store: Store, namespace: str, own_token: str, confirmed: set[str]
) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
    """The entries of ``namespace`` (keys ``token:…``) of each process that is gone, in key order,
    each given while its claim is held here, so that no other process takes them meanwhile; the
    entries of running processes, this one's included, are left to them.

    On a store other processes share, a claim found free may be a live owner's, lost with its
    connection for the moment it takes to be taken again: it counts as gone only if it is still
    free :data:`TAKEOVER_GRACE_S` later. ``confirmed`` holds the owners found gone so (the
    namespaces of one open wait once)."""
    owners = _by_owner(await store.state_items(namespace), own_token)
    if not owners:
        return
    if shared_by_processes(store):
        unsure = [token for token in owners if token not in confirmed]
        free = [token for token in unsure if await _claim_free(store, token)]
        if free:
            log.info(
                "the claims of %d other processes' entries are free: taken if still free in %.1f s",
                len(free),
                TAKEOVER_GRACE_S,
            )
            await asyncio.sleep(TAKEOVER_GRACE_S)
        confirmed.update(free)
        owners = {token: owners[token] for token in owners if token in confirmed}
    for token, entries in owners.items():
        async with store.exclusive(claim_name(token)) as gone:
            if not gone:
                continue
            # Read again under the claim: an owner that was alive may have run some of its
            # entries, and closed, since the first read.
            entries = _by_owner(await store.state_items(namespace), own_token).get(token, [])
            if entries:
                yield entries


def _by_owner(
    items: Sequence[tuple[str, dict[str, Any]]], own_token: str
) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Entries by the token their keys start with, this process's left out."""
    owners: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for key, value in items:
        token = key.split(":", 1)[0]
        if token != own_token:
            owners.setdefault(token, []).append((key, value))
    return owners


async def _claim_free(store: Store, token: str) -> bool:
    """Whether no process holds ``token``'s claim now (taken, and let go at once)."""
    async with store.exclusive(claim_name(token)) as free:
        return free


def _batch_of(key: str) -> str:
    """The prefix of the batch an entry's key is in (the key itself when it has none: an entry
    of another shape, which deleting the prefix must take too)."""
    return key[: key.rfind(":") + 1] or key


def claim_name(token: str) -> str:
    return f"{NAMESPACE}:{token}"


async def _quietly(future: asyncio.Future[None]) -> None:
    """Wait for ``future`` to end. Its own failure was logged where it happened; a batch cancelled
    with its event loop left its entries for the next open."""
    await asyncio.wait([future])


def _in_batch() -> bool:
    """Whether the running code is part of a batch's hooks (not a task they left running)."""
    batch = _IN_BATCH.get()
    return batch is not None and batch.active
