"""Forgets against the writes in flight in this process.

A batch of an ingest call is a unit of work from the moment it may write until its after-store
hooks have run, or been scheduled (``[storage] acknowledge`` other than ``"after_hooks"``: the
forget waits for those through :mod:`narrmem.settling`). A forget waits for every unit begun before
it, and a unit begun while a forget runs waits for the forget to end. Without this, a batch's
hooks (a fact the graph extracts, a count) could write after a forget had deleted the batch's
records, and what the forget was to remove would stay.

Work a unit or a forget runs itself (after-store hooks, trigger callbacks, and what they call)
passes the fence: waiting there would wait for itself. The pass ends with that work (a
:class:`Grant`): a task it started and left running is fenced as any caller's afterwards.

On a store shared by processes that offers it (:class:`narrmem.store.FencesWorkers`, the
PostgreSQL store), the same holds between processes: a forget waits for the units of every
worker, their after-store hooks run after the answer included, and their units begun meanwhile
wait for it. There a batch holds the fence from its first step (:meth:`Fence.hold`: triage, the
duplicate check, the embedding), its unit taking the hold over: another process's forget cannot
learn what this one's calls hold (:mod:`narrmem.in_flight` is this process's), so it waits for
them. A forget of this process waits for none of its own batches on their way (what they hold of
its scope is dropped): once no other process's forget can come first, they let go (suspended), and
batches begun during it hold nothing yet; as it ends, before another process's forget may begin,
its session holds the fence for all of them again (``to_carry`` of the store's fence). So a batch on
its way is held from its first step to its write, whatever forgets run in between. A forget run
from hooks or a callback waits for no other worker's units either.

A forget run from hooks or a callback cannot wait for the units begun before it (one of them may
be waiting for the code that forgets), so what their hooks still make could outlive it. It is
finished again once they have ended (:mod:`narrmem.forgetting`): :meth:`Fence.under_way` names
the units to wait for, by the scopes of the messages each writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from narrmem.store import WorkersFence

T = TypeVar("T")


class Grant:
    """A pass through the fence for the code of one block (a unit's hooks, a forget, hooks run
    later). It ends with the block: a task that code started and left running holds it in its
    copy of the context, but is fenced as any caller's once the block has ended."""

    __slots__ = ("active", "number")

    def __init__(self, number: int) -> None:
        self.number = number
        self.active = True

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        try:
            yield
        finally:
            self.active = False


# The passes of the units and forgets the running code is part of.
_INSIDE: ContextVar[tuple[Grant, ...]] = ContextVar("narrmem_fence_inside", default=())


def _inside() -> frozenset[int]:
    """The units and forgets the running code is part of, while they last."""
    return frozenset(grant.number for grant in _INSIDE.get() if grant.active)


# What the hooks of a batch acknowledged earlier are part of (:mod:`narrmem.settling`): no unit.
HOOKS_LATER = -1

# Where a message belongs: its tenant, user and chat.
ScopeKey = tuple[str, str, str]


def own_work(number: int = HOOKS_LATER) -> contextlib.AbstractContextManager[None]:
    """Code in this block is part of unit or forget ``number`` (or of hooks run later): it passes
    the fence."""
    return _passing(Grant(number))


@contextlib.contextmanager
def _passing(grant: Grant) -> Iterator[None]:
    """Code in this block passes the fence with ``grant``, while it is active."""
    token = _INSIDE.set((*_INSIDE.get(), grant))
    try:
        with grant.held():
            yield
    finally:
        _INSIDE.reset(token)


def inside_own_work() -> bool:
    """Whether the running code is part of a unit, a forget or hooks run later."""
    return bool(_inside())


@contextlib.contextmanager
def not_own_work() -> Iterator[None]:
    """Code in this block is part of nothing (a task that hooks started to run later): it is
    fenced as any caller's."""
    token = _INSIDE.set(())
    try:
        yield
    finally:
        _INSIDE.reset(token)


class Fence:
    def __init__(self) -> None:
        self._numbers = itertools.count()
        self._units: dict[int, asyncio.Future[None]] = {}
        self._scopes: dict[int, frozenset[ScopeKey] | None] = {}  # None: may write anywhere
        self._forgets = 0
        self._forgets_ended: asyncio.Future[None] | None = None
        # The fence between processes, where the store offers one (set once the store is open).
        self.workers: WorkersFence | None = None
        self._across: set[int] = set()  # units that hold the fence between processes
        self._held: set[int] = set()  # batches being prepared that hold it (see hold())
        # Batches on their way whose hold waits for a forget of this process to end (suspended).
        self._suspended: set[int] = set()
        self._reserved: set[int] = set()  # holds for after a forget of this process (reserve())
        # Forgets of this process that hold or wait for the gate between processes (not run from
        # hooks or a callback) and have not handed the fence over to its batches yet.
        self._outer = 0
        self._entering: set[int] = set()  # units waiting to pass the fence between processes
        self._covered: dict[int, list[Grant]] = {}  # the hooks each hold covers, while they run

    async def hold(self) -> int | None:
        """A batch about to be triaged, checked and embedded holds the fence between processes
        from now (once no forget of another process runs) until its unit takes the hold over
        (``enter(held=...)``) or it lets go (:meth:`let_go`): another process's forget waits for
        it as for a unit. Without it, a message still embedding in one worker while another
        forgot its user was written a moment after that forget had returned. While a forget of
        this process runs, the hold is suspended: that forget holds the fence for it as it ends.
        ``None`` on a store without that fence, and for code that is part of a unit or a forget
        (covered by it)."""
        if self.workers is None or _inside():
            return None
        number = next(self._numbers)
        if self._outer:
            self._suspended.add(number)
            return number
        await self.workers.begin()
        if self._outer:
            # A forget of this process began while this waited at another process's gate: it
            # does not wait for this batch.
            self.workers.end()
            self._suspended.add(number)
        else:
            self._held.add(number)
        return number

    def reserve(self) -> int | None:
        """A hold for a batch that will begin once a forget of this process has ended (an edit's
        new text, after its forget of the old one, which is given it as ``carrying``): held from
        that forget's end, as it hands the fence over (so another process's forget that waited at
        the gate meanwhile waits for the batch), until the batch takes it over (``held``). Held
        earlier, it would hold that other forget back while the edit waited for it at the gate.
        ``None`` where :meth:`hold` gives none."""
        if self.workers is None or _inside():
            return None
        number = next(self._numbers)
        self._reserved.add(number)
        return number

    def let_go(self, held: int | None) -> None:
        """A batch's hold that no unit took over ends (nothing of it to write, an error)."""
        if held is not None and self._end_hold(held):
            assert self.workers is not None
            self.workers.end()

    def _end_hold(self, held: int) -> bool:
        """Whether ``held`` was held; the code it covered is covered no longer."""
        self._suspended.discard(held)
        self._reserved.discard(held)
        for grant in self._covered.pop(held, []):
            grant.active = False
        if held not in self._held:
            return False
        self._held.discard(held)
        return True

    def _suspend(self, held: int) -> None:
        """A forget of this process does not wait for batch ``held``: its hold is let go until
        that forget ends, and the code it covers is fenced as any caller's meanwhile."""
        if held not in self._held:
            return
        self._held.discard(held)
        self._suspended.add(held)
        for grant in self._covered.get(held, []):
            grant.active = False
        assert self.workers is not None
        self.workers.end()

    def _suspend_all(self) -> None:
        for held in list(self._held):
            self._suspend(held)

    def _carry(self) -> int:
        """The suspended holds, held again by the forget that ends (see ``to_carry``)."""
        carried = len(self._suspended)
        for held in self._suspended:
            self._held.add(held)
            for grant in self._covered.get(held, []):
                grant.active = True
        self._suspended.clear()
        return carried

    @contextlib.contextmanager
    def covering(self, held: int | None) -> Iterator[None]:
        """Hooks a holding batch runs before its unit (triage, before-store) are covered by its
        hold while it lasts: an ingest they call does not wait for it, which waits for them. While
        the hold is suspended (a forget of this process), they are fenced as any caller's."""
        if held is None or (held not in self._held and held not in self._suspended):
            yield
            return
        grant = Grant(held)
        grant.active = held in self._held
        self._covered.setdefault(held, []).append(grant)
        try:
            with _passing(grant):
                yield
        finally:
            grants = self._covered.get(held)
            if grants is not None and grant in grants:
                grants.remove(grant)
                if not grants:
                    del self._covered[held]

    async def enter(
        self,
        *,
        receiving: bool = False,
        scopes: Collection[ScopeKey] | None = None,
        held: int | None = None,
    ) -> int:
        """Begin a unit (once no forget runs, unless this code is part of one); returns its number.
        ``receiving``: the write of messages received earlier (:mod:`narrmem.inbox`), which
        passes this process's fence but is fenced against other processes' forgets too.
        ``scopes``: where the unit's messages belong (``None``: not known). ``held``: the
        batch's :meth:`hold`, which the unit takes over."""
        if held is not None and self._outer and not _inside():
            # A forget of this process waits for the fence between processes, which this batch
            # holds: it is suspended, and waits as a batch begun during the forget (what the
            # forget takes of it, narrmem.in_flight has dropped), held again as it ends.
            self._suspend(held)
        while self._forgets_ended is not None and not _inside():
            await asyncio.shield(self._forgets_ended)
        number = next(self._numbers)
        self._units[number] = asyncio.get_running_loop().create_future()
        self._scopes[number] = None if scopes is None else frozenset(scopes)
        if held is not None and self._end_hold(held):
            self._across.add(number)  # the hold is the unit's from here
            return number
        # Part of a unit or a forget, it is covered by that one (and waiting could wait for it).
        if self.workers is not None and (receiving or not _inside()):
            self._entering.add(number)
            try:
                if receiving:
                    counted = await self.workers.join()
                else:
                    await self.workers.begin()
                    counted = True
            except BaseException:
                self.leave(number)
                raise
            finally:
                self._entering.discard(number)
            if counted:
                self._across.add(number)
        return number

    def leave(self, number: int) -> None:
        done = self._units.pop(number, None)
        self._scopes.pop(number, None)
        if number in self._across:
            self._across.discard(number)
            assert self.workers is not None
            self.workers.end()
        if done is not None and not done.done():
            done.set_result(None)

    def hooks_later(self) -> Callable[[], None]:
        """Keep other processes' forgets waiting for hooks run after the answer, as for the unit
        that schedules them (called while it is under way); returns what ends that wait."""
        workers = self.workers
        if workers is None or not workers.extend():
            return _nothing
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                workers.end()

        return end

    def under_way(self, touches: Callable[[ScopeKey], bool]) -> list[asyncio.Future[None]]:
        """What ends each unit under way (the running code's own included) with a message for
        which ``touches`` holds, or with messages not known."""
        ends = []
        for number, done in self._units.items():
            scopes = self._scopes.get(number)
            if scopes is None or any(touches(key) for key in scopes):
                ends.append(done)
        return ends

    async def run_inside(self, number: int, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work`` as part of unit ``number`` (its hooks): a forget or an ingest it calls does
        not wait for the unit."""
        with own_work(number):
            return await work()

    @contextlib.asynccontextmanager
    async def forgetting(
        self, begin: Callable[[], object] | None = None, carrying: int | None = None
    ) -> AsyncIterator[None]:
        """Wait for the units begun before, and hold new ones back until the block ends. Called
        from a unit's hooks or hooks run later, it holds new units back and waits for none.
        ``begin`` is called as the forget begins (what it takes of the calls under way is what
        they hold then): at once, or, on a store shared by processes, once it holds the gate
        between them, so that no other process's forget comes between its beginning and its end.
        ``carrying``: a hold :meth:`reserve` gave, held from this forget's end."""
        inside = _inside()
        number = next(self._numbers)
        if self.workers is None or inside:
            self._begin_forget(begin)
            try:
                with own_work(number):
                    # Run from hooks or a trigger callback, it waits for no unit: another unit may
                    # be waiting for a forget of its own, or for the hooks this one runs in.
                    if not inside:
                        await self._units_begun_before()
                    yield
            finally:
                self._end_forget()
            return
        begun = outer = False

        async def at_gate() -> None:
            nonlocal begun, outer
            self._begin_forget(begin)
            begun = outer = True
            self._outer += 1
            # It drops what the batches on their way here hold of its scope (narrmem.in_flight)
            # and waits for none of them: they let go, and their units wait for it.
            self._suspend_all()
            with own_work(number):
                await self._units_begun_before()

        def hand_over() -> int:
            nonlocal outer
            self._outer -= 1
            outer = False
            if carrying is not None and carrying in self._reserved:
                self._reserved.discard(carrying)
                self._suspended.add(carrying)
            # Another forget of this process that holds the gate already holds it for them.
            return 0 if self._outer else self._carry()

        try:
            async with self.workers.forgetting(at_gate=at_gate, to_carry=hand_over):
                with own_work(number):
                    yield
        finally:
            if outer:
                self._outer -= 1
            if begun:
                self._end_forget()

    def _begin_forget(self, begin: Callable[[], object] | None) -> None:
        self._forgets += 1
        if self._forgets_ended is None:
            self._forgets_ended = asyncio.get_running_loop().create_future()
        if begin is not None:
            begin()

    def _end_forget(self) -> None:
        self._forgets -= 1
        ended = self._forgets_ended
        if self._forgets == 0 and ended is not None:
            self._forgets_ended = None
            ended.set_result(None)

    async def _units_begun_before(self) -> None:
        """Wait for the units begun before (but those still waiting at the gate between processes,
        which this process's forget may hold: they come after it)."""
        before = [done for number, done in self._units.items() if number not in self._entering]
        if before:
            await asyncio.gather(*(asyncio.shield(done) for done in before))


def _nothing() -> None:
    return None
