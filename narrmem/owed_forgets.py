"""Forgets a plugin was not there for. A plugin that keeps copies of what people said scrubs them
in ``narrmem_after_forget``; one that is not loaded when a forget runs (disabled for a while, its
package uninstalled and later put back) kept the person's copies, and, loaded again, showed them.

Every writable open records the names of the plugins loaded that scrub at a forget (namespace
:data:`NAMESPACE`, key :data:`SCRUBBERS_KEY`, the names of every open so far). A forget that
finishes while one of them is not loaded leaves it an entry (the forget's job: its scope, its
messages, and the message ids its memories came from, by which plugins find their copies once the
memories are gone), and the first open with that plugin loaded has it scrub, then deletes the
entry. Until then the entry holds the ids of the forgotten person (what the absent plugin holds
of them is no less); exports leave the namespace out, and every open names the plugins awaited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from narrmem import logs
from narrmem.errors import InputError, PluginError
from narrmem.models import ForgetJob

if TYPE_CHECKING:
    from narrmem.lifecycle import MemoryLifecycle

log = logs.logger("narrmem")

NAMESPACE = "narrmem.forgets_owed"
SCRUBBERS_KEY = "scrubbers"
HOOK = "narrmem_after_forget"
SAID_BY = "said_by"  # beside a job's fields in an entry (see owe)


class Scrubbers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(default_factory=list)


async def owe(
    memory: MemoryLifecycle, job: ForgetJob, *, part: str | None = None, said_by: str | None = None
) -> list[str]:
    """Leave ``job`` to each plugin that scrubbed at an earlier open and is not loaded now;
    return their names. ``part``: which of the forgets a job is told as (a retention forget
    finished after its person spoke is told chat by chat, each owed on its own, keyed by its
    chat), and ``said_by`` the person it is told as said by (see ``narrmem_after_forget``)."""
    absent = sorted(set(await _scrubbers(memory)) - set(memory.host.implementers(HOOK)))
    entry = job.model_dump(mode="json")
    if said_by is not None:
        entry[SAID_BY] = said_by
    for name in absent:
        await memory.store.state_put(NAMESPACE, owed_key(name, job.id, part), entry)
    if absent:
        log.warning(
            "forget %d: plugins %s are not loaded; they scrub what they hold of it at the next open "
            "that loads them",
            job.id,
            ", ".join(repr(name) for name in absent),
        )
    return absent


async def settle_at_open(memory: MemoryLifecycle) -> int:
    """Record the plugins loaded that scrub, and have each scrub the forgets it was not there
    for; return how many it scrubbed. One that fails keeps its entries for the next open."""
    loaded = memory.host.implementers(HOOK)
    known = await _scrubbers(memory)
    if not set(loaded) <= set(known):
        names = sorted({*known, *loaded})
        await memory.store.state_put(NAMESPACE, SCRUBBERS_KEY, Scrubbers(names=names).model_dump())
    done = 0
    for key, value in await memory.store.state_items(NAMESPACE):
        plugin, _, _ = key.partition("\0")
        if key == SCRUBBERS_KEY or plugin not in loaded:
            continue
        said_by = value.pop(SAID_BY, None)
        job = ForgetJob.model_validate(value)
        told = {
            "memory": memory,
            "removed": [],
            "resumed": True,
            "said_by": said_by,
            **job.model_dump(exclude={"id"}),
        }
        try:
            await memory.host.call_every(HOOK, among=[plugin], **told)
        except PluginError:
            log.exception("plugin %r could not scrub a forget made while it was not loaded", plugin)
            continue
        await memory.store.state_delete(NAMESPACE, key)
        done += 1
    awaited = sorted(
        {key.partition("\0")[0] for key, _ in await memory.store.state_items(NAMESPACE)} - {SCRUBBERS_KEY}
    )
    if awaited:
        log.warning(
            "forgets wait for plugins %s, not loaded: they scrub their copies of the people forgotten "
            "at the first open that loads them",
            ", ".join(repr(name) for name in awaited),
        )
    return done


async def awaited(memory: MemoryLifecycle) -> dict[str, int]:
    """How many forgets each absent plugin is owed, by its name."""
    forgets: set[tuple[str, str]] = set()
    for key, _ in await memory.store.state_items(NAMESPACE):
        if key != SCRUBBERS_KEY:
            plugin, _, job = key.partition("\0")
            forgets.add((plugin, job[:12]))  # a forget told chat by chat is one forget
    counts: dict[str, int] = {}
    for plugin, _ in forgets:
        counts[plugin] = counts.get(plugin, 0) + 1
    return counts


async def drop(memory: MemoryLifecycle, plugin: str) -> int:
    """``plugin`` is gone for good (its copies removed with it): the forgets it is owed go, and
    later forgets owe it nothing. Return how many went."""
    if plugin in memory.host.implementers(HOOK):
        raise InputError(
            f"{plugin!r} is loaded: it scrubbed what it was owed as this open began", field="plugin"
        )
    names = await _scrubbers(memory)
    if plugin not in names:
        raise InputError(
            f"{plugin!r} never scrubbed at a forget here (known: {', '.join(names) or 'none'})",
            field="plugin",
        )
    dropped = (await awaited(memory)).get(plugin, 0)  # forgets, as awaited counts them
    await memory.store.state_delete(NAMESPACE, _owed_prefix(plugin))
    await memory.store.state_put(
        NAMESPACE, SCRUBBERS_KEY, Scrubbers(names=[n for n in names if n != plugin]).model_dump()
    )
    return dropped


def owed_key(plugin: str, job_id: int, part: str | None = None) -> str:
    key = f"{_owed_prefix(plugin)}{job_id:012d}"
    return key if part is None else f"{key}/{part}"


def _owed_prefix(plugin: str) -> str:
    # NUL ends the plugin's name: no name holds one, so one name is never another's prefix.
    return f"{plugin}\0"


async def _scrubbers(memory: MemoryLifecycle) -> list[str]:
    value = await memory.store.state_get(NAMESPACE, SCRUBBERS_KEY)
    return [] if value is None else Scrubbers.model_validate(value).names
