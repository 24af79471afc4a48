"""Opening a memory: plugins loaded and configured, the embedder and the store picked from what
plugins registered, the store opened, plugins started, interrupted forgets finished."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Generator, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from narrmem import logs
from narrmem.embed import ModelChooser, weights_digest
from narrmem.errors import ConfigError, InputError, PluginError, StoreError
from narrmem.models import Scope
from narrmem.store import IMPORT_UNDER_WAY, STORE_NOTES, RecordsModel

if TYPE_CHECKING:
    from narrmem.lifecycle import MemoryLifecycle

log = logs.logger("narrmem")
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T", bound="MemoryLifecycle")


async def start(
    memory: MemoryLifecycle, *, warm: bool, builtins: bool, load_entrypoints: bool, extra: list[object]
) -> None:
    settings = memory.settings
    host = memory.host
    host.load(
        builtins=builtins, load_entrypoints=load_entrypoints, extra=extra, disabled=settings.plugins.disabled
    )
    await host.call("narrmem_configure", isolate=False, memory=memory, settings=settings)
    # A disabled plugin's table stays where it was (disabling is one line, not two edits); a table
    # no plugin of any state answers to is refused, since it is most often a misspelt name.
    unknown = sorted(set(settings.plugin) - set(host.plugin_names()) - set(settings.plugins.disabled))
    if unknown:
        raise ConfigError(f"plugin.{unknown[0]}: no plugin of that name is loaded")
    stores = await _collect(memory, "narrmem_register_stores")
    embedders = await _collect(memory, "narrmem_register_embedders")
    await host.call_each(
        "narrmem_register_tools",
        lambda plugin: {"register": functools.partial(memory.tools.register, plugin=plugin)},
    )
    embedder = _pick(embedders, settings.embedder.backend, "embedder.backend")(settings)
    memory.attach(embedder=embedder)
    store = _make_store(memory, stores)
    if isinstance(embedder, ModelChooser):
        recorded = await store.recorded_model() if isinstance(store, RecordsModel) else None
        embedder.choose_model(recorded or memory.new_store_model)
    # The model loads on its own thread while the store opens: both are mostly work outside the
    # interpreter (onnxruntime, SQLite, reading index files), so on two cores the open costs the
    # longer of the two rather than their sum.
    loading = asyncio.ensure_future(embedder.start()) if warm else None
    try:
        await store.open(dim=embedder.dim, model=embedder.name)
    except BaseException:
        if loading is not None:
            # The load cannot be interrupted; it is waited for (its own failure aside) so that
            # closing the memory never races a model still loading.
            await asyncio.gather(loading, return_exceptions=True)
        raise
    if loading is not None:
        await loading
    await _check_weights(memory, embedder)
    await _tell_of_a_cut_import(memory)


async def _tell_of_a_cut_import(memory: MemoryLifecycle) -> None:
    cut = await memory.store.state_get(STORE_NOTES, IMPORT_UNDER_WAY)
    if cut is not None:
        log.warning(
            "an import of %s begun at %s did not end: run it again before anything is written here "
            "(its plugins' data, the graph, is not in yet, and what is written meanwhile may take the "
            "ids the file keeps, which then refuse it; refused, import the file into a new store)",
            cut.get("file"),
            cut.get("began"),
        )


WEIGHTS_NOTE = "embedder.weights"  # STORE_NOTES key: the digest of a model folder's weights


async def _check_weights(memory: MemoryLifecycle, embedder: Any) -> None:
    """Refuse a model folder whose weights are not those the store's vectors were made with (see
    :func:`narrmem.embed.weights_digest`); recorded at the first open that knows them."""
    model_path = getattr(embedder, "model_path", None)
    if not isinstance(model_path, str):
        return  # an embedder of no model folder (a plugin's): nothing to compare
    digest = await asyncio.to_thread(weights_digest, model_path)
    if digest is None:
        return
    store = memory.store
    noted = await store.state_get(STORE_NOTES, WEIGHTS_NOTE)
    if noted is None:
        mine = {"sha256": digest, "folder": model_path}
        # Put only where none is: two workers opening at once with other weights, the second
        # compares with the first's note.
        if memory.read_only or await store.state_put_if(STORE_NOTES, WEIGHTS_NOTE, mine, None):
            return
        noted = await store.state_get(STORE_NOTES, WEIGHTS_NOTE) or mine
    if noted.get("sha256") != digest:
        raise ConfigError(
            f"embedder.model_path: the weights in {model_path} (digest {digest}) are not those this "
            f"store's vectors were made with (digest {noted.get('sha256')}): another model's vectors "
            "would be mixed with them. Put that model back, or move the memory to a data folder of the "
            "new one's (narrmem migrate --reembed, with the old model in the config, the new in --to-config)"
        )


def _make_store(memory: MemoryLifecycle, stores: dict[str, Callable[..., Any]]) -> Any:
    # Picked before the data folder is made: a backend that is not there creates nothing.
    factory = _pick(stores, memory.settings.storage.backend, "storage.backend")
    try:
        if not memory.read_only:
            memory.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"data folder {memory.data_dir}: cannot create it ({exc.strerror})") from exc
    store = factory(memory)
    memory.attach(store=store)  # before opening, so a failed open is still closed
    return store


async def _collect(memory: MemoryLifecycle, hook_name: str) -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    registered_by: dict[str, str] = {}

    def register(plugin: str, name: str, factory: Callable[..., Any]) -> None:
        if name in found:
            raise PluginError(
                f"{hook_name}: '{name}' is registered twice, by plugin {registered_by[name]!r} "
                f"and by plugin {plugin!r}"
            )
        found[name] = factory
        registered_by[name] = plugin

    await memory.host.call_each(hook_name, lambda plugin: {"register": functools.partial(register, plugin)})
    return found


def _pick(registry: dict[str, Callable[..., Any]], name: str, setting: str) -> Callable[..., Any]:
    if name not in registry:
        known = ", ".join(sorted(registry)) or "none"
        raise ConfigError(f"{setting}: no backend named '{name}' is registered (known: {known})")
    return registry[name]


def check_open_arguments(settings: object, clock: object, plugins: object, settings_type: type) -> None:
    if settings is not None and not isinstance(settings, settings_type):
        raise InputError(f"must be narrmem Settings, not {type(settings).__name__}", field="settings")
    if clock is not None and not callable(getattr(clock, "now", None)):
        raise InputError("must be a clock: an object with a now() method", field="clock")
    if clock is not None:
        # Checked once here: a naive time failed later, deep in a write (pydantic on a record),
        # in recall (a TypeError), or quietly (a decay pass that did nothing).
        now = clock.now()  # type: ignore[attr-defined]
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise InputError(f"must give timezone-aware datetimes: now() returned {now!r}", field="clock")
    if isinstance(plugins, str | bytes | dict) or not isinstance(plugins, Iterable):
        raise InputError(f"must be a list of plugins, not {type(plugins).__name__}", field="plugins")


def scope_argument(tenant: str, user_id: str | None = None, chat_id: str | None = None) -> Scope:
    """A :class:`Scope` from a public call's arguments; a bad one is an ``InputError`` naming it."""
    return model_argument(Scope, tenant=tenant, user_id=user_id, chat_id=chat_id)


def model_argument(model: type[M], **fields: Any) -> M:
    """``model(**fields)`` from a public call's arguments; a bad field is an ``InputError`` naming it."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise InputError.from_pydantic(exc) from exc


class Opening(Generic[T]):
    """Lets ``Memory.open`` be both awaited and used with ``async with``."""

    def __init__(self, memory: T, warm: bool) -> None:
        self._memory = memory
        self._warm = warm

    async def _open(self) -> T:
        try:
            await self._memory.start(self._warm)
        except BaseException:
            await self._memory.close()
            raise
        return self._memory

    def __await__(self) -> Generator[Any, None, T]:
        return self._open().__await__()

    async def __aenter__(self) -> T:
        return await self._open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._memory.close()
