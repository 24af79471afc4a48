"""How a memory opens and closes, and the parts it owns while open: the settings and clock, one
plugin host and tool registry, the store and embedder the plugins registered, the ingest pipeline
with the hooks it runs after acknowledging, and durable forgetting. :class:`~narrmem.memory.Memory`
adds the public calls on top."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sqlite3
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Self, TypeVar, cast

from narrmem import logs, opening, owed_forgets
from narrmem.checks import folder_argument
from narrmem.clock import Clock, SystemClock
from narrmem.config import Settings, load_settings
from narrmem.edit_marks import EditMarks
from narrmem.editing import OneEditAtATime
from narrmem.embed import Embedder
from narrmem.errors import ClosedError, PluginError
from narrmem.fence import Fence
from narrmem.forget_marks import ForgetMarks
from narrmem.forgetting import PURGE_WAIT_S, Forgetting
from narrmem.host import PluginHost
from narrmem.in_flight import CallsUnderWay
from narrmem.inbox import Inbox
from narrmem.ingest import IngestPipeline, TriggerCallback
from narrmem.models import Message
from narrmem.not_now import not_now
from narrmem.settling import Settling
from narrmem.store import FencesWorkers, Store, shared_by_processes
from narrmem.to_the_end import Outlasting, finished
from narrmem.tools import ToolRegistry
from narrmem.write_turn import WriteTurn

if TYPE_CHECKING:
    from narrmem.view import MemoryView

log = logs.logger("narrmem")

P = ParamSpec("P")
R = TypeVar("R")
L = TypeVar("L", bound="MemoryLifecycle")


def while_open(
    method: Callable[Concatenate[L, P], Awaitable[R]],
) -> Callable[Concatenate[L, P], Coroutine[Any, Any, R]]:
    """A public call refused with :class:`~narrmem.errors.ClosedError` once the memory is closed:
    without it, a recall on a closed memory answered nothing (its sources' errors are isolated
    and logged), and a bot would go on answering without memory. A full disk or a database
    locked too long is a :class:`~narrmem.errors.StoreUnavailableError` (:mod:`narrmem.not_now`)."""

    @functools.wraps(method)
    async def guarded(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._shut:
            raise ClosedError(f"{method.__name__}: the memory is closed; open it again to use it")
        try:
            return await method(self, *args, **kwargs)
        except (OSError, sqlite3.OperationalError) as exc:
            unavailable = not_now(exc, self.data_dir)
            if unavailable is None:
                raise
            raise unavailable from exc

    return guarded


class MemoryLifecycle:
    """What a :class:`~narrmem.memory.Memory` owns (settings, clock, plugin host, tools, store,
    embedder, the ingest pipeline and forgetting) and how it opens and closes."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        plugins: Iterable[object] = (),
        load_entrypoints: bool | None = None,
        builtins: bool = True,
        read_only: bool = False,
        new_store_model: str | None = None,
    ) -> None:
        self.settings = settings
        self.read_only = read_only
        self.new_store_model = new_store_model
        self.clock: Clock = clock or SystemClock()
        self.data_dir = Path(settings.data_dir)
        # Hooks receive the finished Memory (this class's one subclass), which is the plugins' view.
        self.host = PluginHost(cast("MemoryView", self))
        self.tools = ToolRegistry()
        entrypoints = settings.plugins.load_entrypoints if load_entrypoints is None else load_entrypoints
        self._plugins = (builtins, entrypoints, list(plugins))
        self._store: Store | None = None
        self._embedder: Embedder | None = None
        self._trigger_callbacks: list[TriggerCallback] = []
        self._write_turn = write_lock = WriteTurn()  # one writer at a time in this process
        self._fence = fence = Fence()  # forgets against the batches being written
        self._settling = Settling(self)
        self._inbox = Inbox(self, self._settling.token, self._settling.owners_gone, fence)
        self._calls = calls = CallsUnderWay()  # a forget drops what calls begun before it have not written
        self._ingest = IngestPipeline(
            self, write_lock, self._trigger_callbacks, self._settling, self._inbox, fence, calls
        )
        self._edit_marks = EditMarks(self, self._settling)
        self.forget_marks = ForgetMarks(self)
        self._one_edit_at_a_time = OneEditAtATime()
        self._edits_outlasting = Outlasting("an edit")
        self._forgetting = Forgetting(
            self, write_lock, self._settling, self._inbox, fence, calls, self._edit_marks
        )
        self._settling.forget_again = self._forgetting.again
        self._settling.forget_again_later = self._forgetting.again_later
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._shut = False  # closed to the end: public calls are refused (see while_open)
        self._started = False
        self._loop_guard: asyncio.Task[None] | None = None

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
        new_store_model: str | None = None,
    ) -> opening.Opening[Self]:
        """Open a memory. ``data_dir`` overrides the settings' folder; ``warm`` loads the model now
        (set it to ``False`` for commands that never embed). ``read_only`` opens an existing store
        beside the process that writes it: every write is refused with a ``StoreError``, and
        recall reinforces nothing. ``new_store_model``: the model whose vectors a store this open
        creates should hold, such as an export's before importing it; the embedder uses it if it
        offers that model (``[embedder] quantize = "auto"``), and an existing store keeps its own."""
        opening.check_open_arguments(settings, clock, plugins, Settings)
        settings = settings or load_settings(config_file)
        if data_dir is not None:
            folder = folder_argument(data_dir, "data_dir")
            if os.environ.get("NARRMEM_DATA_DIR") and _place(folder) != _place(settings.data_dir):
                # A deployment that sets the folder in the environment (a service, a container's
                # volume) and runs code that names one: the bot wrote one folder, the CLI read the
                # other, and neither said so.
                log.warning(
                    "data folder %s given to Memory.open, not NARRMEM_DATA_DIR's %s: call "
                    "Memory.open() without one to follow the settings",
                    folder,
                    settings.data_dir,
                )
            settings = settings.model_copy(update={"data_dir": folder})
        memory = cls(
            settings,
            clock=clock,
            plugins=plugins,
            load_entrypoints=load_entrypoints,
            builtins=builtins,
            read_only=read_only,
            new_store_model=new_store_model,
        )
        return opening.Opening(memory, warm)

    async def start(self, warm: bool) -> None:
        """Load plugins, the model and the store (``Memory.open`` calls it)."""
        builtins, entrypoints, extra = self._plugins
        self._loop_guard = asyncio.get_running_loop().create_task(
            self._close_when_the_loop_ends(), name="narrmem: close the memory when its event loop ends"
        )
        await opening.start(self, warm=warm, builtins=builtins, load_entrypoints=entrypoints, extra=extra)
        self._started = True
        store = self.store
        if not self.read_only and isinstance(store, FencesWorkers):
            self._fence.workers = store.workers_fence()
        if shared_by_processes(store):
            # A server over the network can stall; an embedded file's long hold (a forget's
            # rewrite of it) is its work, which the writes queued behind it wait for.
            self._write_turn.limit_s = self.settings.storage.timeout_s
        await self.host.call("narrmem_startup", isolate=False, memory=self)
        await self._forgetting.notices.start()
        await self._forgetting.resume()
        if not self.read_only:
            await owed_forgets.settle_at_open(self)
            await self.forget_marks.purge_expired()
        await self._settling.start(self._ingest)
        self._inbox.start(self._ingest, self._forgetting)
        if not self.read_only:
            await self._inbox.recover()
            for message in await self._edit_marks.recover():
                try:
                    await self._edit_again(message)
                except Exception:
                    log.exception("making again an edit that a stopped process left failed")

    async def _edit_again(self, message: Message) -> None:
        """Make an edit a stopped process left between its two steps (:meth:`Memory.edit`)."""
        raise NotImplementedError

    def attach(self, *, store: Store | None = None, embedder: Embedder | None = None) -> None:
        """Set the store and embedder the plugins registered (used while opening)."""
        self._store = store or self._store
        self._embedder = embedder or self._embedder

    async def _close_when_the_loop_ends(self) -> None:
        """Close a memory its program left open once the program's runner ends. ``asyncio.run``
        (which discord.py, aiogram and python-telegram-bot use) cancels the tasks left when the
        main coroutine returns or raises: this one then closes the memory, so that the unsettled
        after-store hooks run and the store's connection thread stops. Without it, the process
        would never exit (the thread waits for a close that never comes) and would keep holding
        the data folder."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self._closed:
                try:
                    await self.close()
                except Exception:
                    log.exception("closing a memory left open when its event loop ended failed")
            raise

    @property
    def closed(self) -> bool:
        """Whether the memory is closed, or closing."""
        return self._closed

    async def close(self) -> None:
        # Once begun, to its end, whoever cancels the caller (a bot's shutdown cancels its
        # tasks): a close cancelled after its first step left the store open, the folder locked
        # and threads that kept the process from exiting, and a second close returned at once.
        # A second close waits for the first.
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close_now(asyncio.current_task()))
        await finished(self._closing)

    async def _close_now(self, caller: asyncio.Task[Any] | None) -> None:
        if self._closed:
            return
        self._closed = True
        guard, self._loop_guard = self._loop_guard, None
        if guard is not None and guard is not caller:
            guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await guard
        try:
            if self._started:
                # An edit whose caller gave up ends first: it found the store shut half way.
                # Bounded as the forgets are: one held by a plugin that hangs held the close for
                # ever, and no cancel could end it.
                left = await self._edits_outlasting.ended_within(PURGE_WAIT_S)
                if left:
                    log.warning(
                        "closing with %d edit(s) whose callers gave up still under way (a plugin "
                        "that does not return): cut short, an edit may not be done; send it again",
                        left,
                    )
                # So does a forget whose caller gave up (a bot's shutdown cancels its tasks):
                # shut while it waited for the messages under way, before its job was recorded,
                # it was lost, and the person's words kept. Bounded: one held at another worker's
                # gate ends with the close, as before.
                await self._forgetting.outlasted_before_close()
                await self._inbox.drained()
                await self._inbox.close()
                # A forget run from hooks is finished once the messages under way have ended.
                await self._settling.settle()
                await self._forgetting.finished_later()
                # Owed hooks stop first: one that finds its message forgotten meanwhile forgets
                # it again, which the forgets' close would cut.
                await self._settling.stop_trying(caller)
                await self._forgetting.close(caller)
                await self._settling.close()
                await self.host.call("narrmem_shutdown", memory=self)
        finally:
            # From here on the store and the model go: calls are refused, not half answered.
            self._shut = True
            for part in (self._store, self._embedder):
                if part is not None:
                    await part.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def store(self) -> Store:
        if self._shut:
            raise ClosedError("the memory is closed; open it again to use its store")
        if self._store is None:
            raise PluginError("the memory is not open")
        return self._store

    @property
    def embedder(self) -> Embedder:
        if self._shut:
            raise ClosedError("the memory is closed; open it again to use its model")
        if self._embedder is None:
            raise PluginError("the memory is not open")
        return self._embedder


def _place(folder: str) -> str:
    """Where a folder setting points (``dd``, ``./dd/`` and its absolute path are one)."""
    return os.path.realpath(os.path.expanduser(folder))
