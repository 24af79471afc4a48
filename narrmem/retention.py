"""Retention: the people who have said nothing for a while are forgotten, when a bot's author
asks for it (``Memory.forget_inactive``, ``narrmem retention``, or the ``retention`` plugin's
schedule). A privacy policy that promises "your data goes after a year of silence" is kept by
the store's own queries, not by a script reading every user.

A person is inactive when every memory of theirs (in a tenant) was said before a time: what they
said, not what others recalled of them (a departed member's memories brought back in a group's
conversations do not keep them). Small talk the triage ignored leaves no memory, so a person who
only says "ok" for a year is inactive too. An imported history counts by when it was said.

Each person goes by the same forget as :meth:`Memory.forget` (rows, vectors, keyword index,
every plugin's copies), one at a time, with the files' purge run once at the end (whatever stops
the pass). Whether they are still inactive is read again inside the forget's turn, once every
write of the process has ended and no other worker writes: one who has spoken by then, or whose
message is received and not yet written by any process, is kept. It leaves no forget mark: the
person did not ask, and a late write of what they said (a backlog, a backfill after downtime) is
stored; the next pass finds it if it is old. A forget that fails midway is finished later,
and takes only what they said before the time if they have spoken by then
(:meth:`Forgetting.scope_unless`, :func:`spoke_since`). One pass runs at a time on a store.

A person the store holds no memory of, whom a plugin keeps something of (facts a bot wrote with
the graph's tools alone, over MCP; trees of their words), is inactive when nothing of theirs was
written since the time (``narrmem_people_held``): such a bot had no one found before.

A pass finding that no one in the store has said anything since the time is refused
(``refused``; what was written in the last day not counted, see :func:`trusted_until`): the
clock is wrong (a machine that woke a year ahead), or the bot has been down that long; either
way, forgetting everyone is not what the policy meant. ``force`` runs it anyway.
A tenant gone silent on its own (a server that removed the bot) is forgotten as the policy says."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from narrmem import logs
from narrmem.answers import id_argument
from narrmem.checks import aware_time_argument, int_argument
from narrmem.errors import InputError, StoreError
from narrmem.models import Scope
from narrmem.store import FindsInactivePeople, InactivePerson, Store

if TYPE_CHECKING:
    from narrmem.forgetting import Forgetting

PAGE = 500
RECENT_UNTRUSTED = timedelta(days=1)  # see trusted_until
NAME = "retention"  # the store's exclusive lock of a pass
log = logs.logger("narrmem.retention")


def finder(store: Store) -> FindsInactivePeople:
    if not isinstance(store, FindsInactivePeople):
        raise StoreError(
            f"the {type(store).__name__} store cannot find inactive people "
            "(narrmem.store.FindsInactivePeople): retention needs a store that can"
        )
    return store


async def inactive_people(
    store: Store, before: object, *, tenant: object = None, limit: object = 1000, after: object = None
) -> list[dict[str, Any]]:
    """:meth:`Memory.inactive_people`, its arguments checked."""
    found = await finder(store).inactive_people(
        aware_time_argument(before, "before"),
        tenant=None if tenant is None else id_argument(tenant, "tenant"),
        limit=int_argument(limit, "limit", high=100_000),
        after=None if after is None else _person_argument(after),
    )
    return [_as_dict(person) for person in found]


async def all_inactive(
    memory: Any, before: object, *, tenant: object = None
) -> AsyncIterator[dict[str, Any]]:
    """Every person :func:`forget_inactive` would forget: those :func:`inactive_people` finds
    (page by page) that no plugin has written of since, then those only plugins keep something of
    (:func:`held_only`)."""
    checked = aware_time_argument(before, "before")
    after: tuple[str, str] | None = None
    while page := await inactive_people(memory.store, before, tenant=tenant, limit=PAGE, after=after):
        for person in page:
            if not await _written_of_since(memory, person["tenant"], person["user_id"], checked):
                yield person
        after = (page[-1]["tenant"], page[-1]["user_id"])
    only = None if tenant is None else id_argument(tenant, "tenant")
    for held in await held_only(memory, finder(memory.store), checked, only):
        yield _as_dict(held)


async def pass_size(memory: Any, before: object, *, tenant: object = None) -> int:
    """How many people a pass visits, each told to its ``progress``: those the store finds
    inactive and those only plugins keep something of, before each is asked again in their turn
    (no plugin is asked person by person here, as :func:`all_inactive` does)."""
    checked = aware_time_argument(before, "before")
    only = None if tenant is None else id_argument(tenant, "tenant")
    people = finder(memory.store)
    count, after = 0, None
    while page := await people.inactive_people(checked, tenant=only, limit=PAGE, after=after):
        count += len(page)
        after = (page[-1].tenant, page[-1].user_id)
    return count + len(await held_only(memory, people, checked, only))


async def plugins_latest(
    memory: Any,
    tenant: str | None = None,
    user_id: str | None = None,
    *,
    after: str | None = None,
    through: str | None = None,
    limit: int | None = None,
) -> dict[tuple[str, str], datetime]:
    """Each person's latest write by any plugin (``narrmem_people_held``), of ``tenant`` (every
    tenant if ``None``), of ``user_id`` alone when given, of the user ids after ``after`` and up
    to ``through``, the first ``limit`` of them, when given (asked of the plugins, which may
    answer more). A time that is not
    an aware datetime says nothing (it cannot be compared)."""
    latest: dict[tuple[str, str], datetime] = {}
    answers = await memory.host.call(
        "narrmem_people_held",
        isolate=False,
        memory=memory,
        tenant=tenant,
        user_id=user_id,
        after=after,
        through=through,
        limit=limit,
    )
    for answer in answers:
        for held_tenant, held_user, last in answer:
            if not isinstance(last, datetime) or last.tzinfo is None:
                continue
            key = (str(held_tenant), str(held_user))
            latest[key] = max(last, latest.get(key, last))
    return latest


async def held_only(
    memory: Any,
    people: FindsInactivePeople,
    before: datetime,
    tenant: str | None,
    latest: dict[tuple[str, str], datetime] | None = None,
) -> list[InactivePerson]:
    """The people of ``tenant`` (every tenant if ``None``) that plugins keep something of and the
    store holds no memory of, with nothing kept of them newer than ``before``; their ``last_said``
    is the plugins' latest write of them, ``memories`` 0. ``latest``: :func:`plugins_latest`,
    when read already."""
    if latest is None:
        latest = await plugins_latest(memory, tenant)
    found = []
    for (held_tenant, user_id), last in sorted(latest.items()):
        if tenant is not None and held_tenant != tenant:
            continue
        if last < before and await people.last_said(held_tenant, user_id) is None:
            found.append(InactivePerson(held_tenant, user_id, 0, last))
    return found


async def _written_of_since(memory: Any, tenant: str, user_id: str, before: datetime) -> bool:
    """Whether a plugin wrote of the person at ``before`` or later (a fact the bot stated with a
    tool lately, for a person whose messages are old): they are kept."""
    last = (await plugins_latest(memory, tenant, user_id)).get((tenant, user_id))
    return last is not None and last >= before


def _person_argument(value: object) -> tuple[str, str]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InputError("must be a (tenant, user id) pair, the last of the previous page", field="after")
    return id_argument(value[0], "after.tenant"), id_argument(value[1], "after.user_id")


def _as_dict(person: InactivePerson) -> dict[str, Any]:
    return {
        "tenant": person.tenant,
        "user_id": person.user_id,
        "memories": person.memories,
        "last_said": person.last_said.isoformat(),
    }


async def forget_inactive(
    forgetting: Forgetting,
    store: Store,
    now: datetime,
    before: object,
    *,
    tenant: object = None,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """Forget every person (of ``tenant``, or of every tenant) with nothing said since ``before``
    (no later than ``now``), ``progress(1)`` after each (forgotten or kept); counts: ``people``
    forgotten, their ``memories``, ``spoke_since`` (found inactive, then not when their turn
    came), ``refused`` (1: no one in the store spoke since ``before``; see the module) and
    ``busy`` (1: another pass on the store is under way, in this process or another; nothing is
    done)."""
    people = finder(store)
    before = aware_time_argument(before, "before")
    if before > now:
        raise InputError(
            f"{before.isoformat()} is later than now: it would forget what people are saying", field="before"
        )
    tenant = None if tenant is None else id_argument(tenant, "tenant")
    if not isinstance(force, bool):
        raise InputError(f"must be true or false, not {force!r}", field="force")
    if progress is not None and not callable(progress):
        raise InputError("must be a function taking the number of people done", field="progress")
    told = progress or _nobody
    counts = {"people": 0, "memories": 0, "spoke_since": 0, "refused": 0, "busy": 0}
    # What plugins keep of whom, store-wide: for the refusal (a store of no memory, written with
    # tools alone, has the plugins' times only) and for the people only they keep something of.
    held = await plugins_latest(forgetting.memory)
    if await refused(people, before, held, now=now) and not force:
        counts["refused"] = 1
        return counts
    exclusive = getattr(store, "exclusive", None)
    if exclusive is None:  # a store older than the protocol's exclusive()
        await _pass(forgetting, people, before, tenant, counts, told, held)
        return counts
    # One pass at a time across the store's workers (the schedule's, a command's, a call's).
    async with exclusive(NAME) as mine:
        if not mine:
            counts["busy"] = 1
            return counts
        await _pass(forgetting, people, before, tenant, counts, told, held)
    return counts


def _nobody(done: int) -> None:
    return None


def trusted_until(before: datetime, now: datetime) -> datetime:
    """The end of what the refusal takes as said since ``before``: what was written in the last
    day (or the last half of a shorter wait) may be dated by the clock that is wrong. A machine
    that woke a year ahead dates by it every message it is given without a time and every fact a
    tool states, and one such write, a minute after the start, was someone who had spoken since
    the cut-off: everyone else was forgotten."""
    return now - min(RECENT_UNTRUSTED, (now - before) / 2)


async def refused(
    people: FindsInactivePeople,
    before: datetime,
    held: dict[tuple[str, str], datetime] | None = None,
    *,
    now: datetime,
) -> bool:
    """Whether no one in the whole store said anything between ``before`` and
    :func:`trusted_until`, nor did a plugin write of anyone then (``held``: :func:`plugins_latest`,
    store-wide), though something is kept (a tenant of its own may well be silent: a server that
    removed the bot). Logged as a warning."""
    until = trusted_until(before, now)
    said = await people.last_said(until=until)
    times = [t for t in (said, *(held or {}).values()) if t is not None and t < until]
    newest = max(times, default=None)
    if newest is None or newest >= before:
        # None: nothing was said before the last day, so no one can be found silent (an empty
        # store, a bot started today): nothing to refuse.
        return False
    log.warning(
        "retention refused: no one said anything between %s and %s (the newest memory before was "
        "said %s; what was written since may be dated by this clock); is the clock right? nothing "
        "is forgotten",
        before.isoformat(),
        until.isoformat(),
        newest.isoformat(),
    )
    return True


async def _pass(
    forgetting: Forgetting,
    people: FindsInactivePeople,
    before: datetime,
    tenant: str | None,
    counts: dict[str, int],
    progress: Callable[[int], None],
    held: dict[tuple[str, str], datetime],
) -> None:
    memory = forgetting.memory
    after: tuple[str, str] | None = None
    # The people visited that plugins keep something of: one whose memories went in their turn
    # holds none after it, and was visited again among those only plugins keep something of
    # (counted twice, forgotten twice). Of those only: as many as ``held`` holds already.
    visited: set[tuple[str, str]] = set()
    try:
        while page := await people.inactive_people(before, tenant=tenant, limit=PAGE, after=after):
            # Received and not yet written by any process (acknowledged on receipt, waiting for
            # a write or its retry): read once a page; what comes after is kept by the forget.
            holders = await forgetting.inbox.holders()
            for person in page:
                if forgetting.memory.closed:
                    return  # the rest wait for the next pass
                if (person.tenant, person.user_id) in held:
                    visited.add((person.tenant, person.user_id))
                forgotten = await forgetting.scope_unless(
                    Scope(tenant=person.tenant, user_id=person.user_id),
                    _spoke_since(memory, people, person, before, holders),
                    silent_since=before,
                )
                if forgotten is None:
                    counts["spoke_since"] += 1
                else:
                    counts["people"] += 1
                    counts["memories"] += forgotten.get("memories", 0)
                progress(1)
            after = (page[-1].tenant, page[-1].user_id)
            # A first pass over a large store takes minutes: said as it goes.
            log.info(
                "retention: %d people forgotten so far, %d kept", counts["people"], counts["spoke_since"]
            )
        # Then those only plugins keep something of (no memory at all).
        holders = await forgetting.inbox.holders()
        for person in await held_only(memory, people, before, tenant, held):
            if (person.tenant, person.user_id) in visited:
                continue
            if memory.closed:
                return
            forgotten = await forgetting.scope_unless(
                Scope(tenant=person.tenant, user_id=person.user_id),
                _spoke_since(memory, people, person, before, holders, held=True),
                silent_since=before,
            )
            counts["spoke_since" if forgotten is None else "people"] += 1
            progress(1)
    finally:
        # Once for every person forgotten (each forget's own purge rewrote the whole file), and
        # whatever stopped the pass (a forget it began goes on to its end, and owes one).
        await forgetting.purge_owed_after_forgets()


def _spoke_since(
    memory: Any,
    people: FindsInactivePeople,
    person: InactivePerson,
    before: datetime,
    holders: set[tuple[str, str]],
    *,
    held: bool = False,
) -> Callable[[], Awaitable[bool]]:
    async def spoke() -> bool:
        if (person.tenant, person.user_id) in holders:
            return True
        last = await people.last_said(person.tenant, person.user_id)
        if held:
            # Known by what plugins keep: any memory means they spoke.
            if last is not None:
                return True
        elif last is None or last >= before:
            # None: gone meanwhile (forgotten by someone else); nothing is left to forget.
            return True
        # A fact the bot wrote of them lately (a tool's, during the pass too): kept.
        return await _written_of_since(memory, person.tenant, person.user_id, before)

    return spoke


async def spoke_since(forgetting: Forgetting, tenant: str, user_id: str, before: datetime) -> bool:
    """Whether the person has said something at ``before`` or later (a memory, or a message
    received and not yet written by any process), or a plugin has written of them since: asked
    when a forget of theirs that a pass began, and that failed midway, is finished later."""
    scope = Scope(tenant=tenant, user_id=user_id)
    memory = forgetting.memory
    if forgetting.calls.holds_scope(tenant, user_id, None) or forgetting.inbox.holds_here(scope):
        return True
    if (tenant, user_id) in await forgetting.inbox.holders():
        return True
    last = await finder(memory.store).last_said(tenant, user_id)
    return (last is not None and last >= before) or await _written_of_since(memory, tenant, user_id, before)
