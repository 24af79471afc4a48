"""``MemoryView``: what a plugin may read and call on the memory it is registered with.

Every hook that hands a plugin the memory types it as this view, so an editor completes it and
mypy checks the line between host and plugin. Nothing private is in it: a plugin that needs more
asks for it to become part of the view.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, Unpack, runtime_checkable

from narrmem.clock import Clock
from narrmem.config import Settings
from narrmem.embed import Embedder
from narrmem.models import Hit, IngestResult, MemoryRecord, Message, RecallOptions
from narrmem.store import Store

if TYPE_CHECKING:
    from narrmem.host import PluginHost

P = TypeVar("P")


@runtime_checkable
class MemoryView(Protocol):
    """The plugin's handle on its memory.

    - ``settings``: every setting (a plugin validates its own ``[plugin.<name>]`` table with
      :func:`narrmem.config.plugin_options`); ``clock``: the injectable clock (never read the
      system time); ``data_dir``: the data folder; ``read_only``: opened beside a writer, so
      nothing may be written.
    - ``store``: the :class:`~narrmem.store.Store` (scope is enforced inside its queries; its
      ``transaction()`` is the one way to write several statements atomically); ``embedder``: the
      loaded model.
    - ``host``: the plugin host, to call other hooks (``call``, ``call_first``) and to find a
      plugin object by class (``plugin(cls)``).
    - ``recall``, ``ingest`` (for derived memories), ``importance_now``, ``decay``,
      ``forget_memories`` (a memory deleted by id, with every plugin told), ``forget_inactive``
      (a retention policy's pass): the public API, as a bot calls it.
    """

    settings: Settings
    clock: Clock
    data_dir: Path
    read_only: bool

    @property
    def store(self) -> Store: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def host(self) -> PluginHost: ...

    async def recall(self, query: str, **options: Unpack[RecallOptions]) -> list[Hit]: ...

    async def ingest(self, message: Message | dict[str, Any]) -> IngestResult: ...

    async def importance_now(self, records: Sequence[MemoryRecord]) -> dict[int, float]: ...

    async def decay(self, now: datetime | None = None) -> dict[str, int]: ...

    async def forget_memories(
        self,
        memory_ids: Sequence[int],
        *,
        user_id: str | None = None,
        chat_id: str | None = None,
        tenant: str = "default",
    ) -> dict[str, int]: ...

    async def forget_inactive(
        self, *, before: datetime, tenant: str | None = None, force: bool = False
    ) -> dict[str, int]: ...
