"""A forget in one worker against the writes in flight in the others (``narrmem.store.WorkersFence``).

Two session advisory locks, the same in every worker of the database, taken by a worker's units
on one connection of the worker's own and by each of its forgets on one of the forget's own:

* the **units** lock, held shared by a worker while it has a unit under way (an ingest batch from
  its first step, triage and the embedding, until its after-store hooks have run), and
  exclusively by a forget, which so waits for every other worker's units;
* the **gate** lock, held exclusively by a forget from before it asks for the units lock until it
  ends. On its units' session a worker only tries the gate, never waits there: before its first
  unit it passes it if it is open (takes it shared, then the units lock, then lets the gate go,
  in one trip), and while it holds the units lock each new unit checks it with a try. Once a
  forget holds or waits for the gate, the try fails: the unit then waits at the gate on a session
  of its own (a *waiting room*, shared by the units that come meanwhile), which holds the units
  lock for them once through. So a forget is not held off for ever by a worker that is never idle,
  a unit begun during it is written after it, and a unit that came before a later forget is ahead
  of it in the server's queue: that forget waits for it. (Before, the unit waited for its
  worker's units to end and the lock to go back, outside the queue, and a forget called meanwhile
  went first without waiting for it.)

The lock is given back as soon as the worker has no unit under way: a worker that held it while
idle would hold every forget back until its next message. The sessions that hold it beside the
units' session (a waiting room, or a forget's, below) count units of their own, and each is given
back once as many units have ended (any of the worker's ``end`` calls counts: the lock is held
while any count is above zero).

A forget of this worker does not wait for this worker's batches on their way (a slow triage hook
would hold it): once it holds the gate, they let go (``at_gate``), and so do batches begun during
it. As it ends, its session takes the units lock shared for them before it lets the gate go
(``to_carry``), in one trip: a forget of another worker waiting at the gate then waits for them, as
it would have without this worker's forget.

The write of messages the worker received earlier (``join``) never waits at the gate while it
holds the units lock: hooks run after the answer may be waiting for that write, and a forget for
those hooks. Without it, the write looks at the gate again every 50 ms rather than waiting there,
and goes on unfenced while this worker's own forget holds the gate: that forget waits for the
write (what was received goes first) and its hooks, so the write must not wait for it.

A connection lost while the units lock is held takes the lock with it: the units under way are
unfenced until the next unit, which takes it again on a new connection (logged). A command that
may take a lock and is cancelled halfway ends its session, in the server too. Closing ends every
session at once, without waiting for a unit or a forget that waits at a gate. Two forgets from
workers whose trigger callbacks forget could wait for each other across workers, so a forget run
from hooks or a callback does not use this fence (``narrmem.fence`` does the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import asyncpg
from narrmem_plugins.storage_postgres.advisory import CONNECTION_ENDED, lock_key
from narrmem_plugins.storage_postgres.dsn import scrub
from narrmem_plugins.storage_postgres.reach import KEEPALIVE_SQL, unreachable

from narrmem import logs
from narrmem.errors import ClosedError, StoreError, StoreUnavailableError
from narrmem.write_turn import WriteTurn

log = logs.logger("narrmem.storage_postgres")
T = TypeVar("T")

GATE = lock_key("fence:gate")
UNITS = lock_key("fence:units")
# One trip: wait at the gate (a forget holds it), take the units lock shared, let the gate go.
PASS_GATE = (
    f"SELECT pg_advisory_lock_shared({GATE}); SELECT pg_advisory_lock_shared({UNITS}); "
    f"SELECT pg_advisory_unlock_shared({GATE})"
)
# Without waiting: through the gate to the units lock, shared, if no forget holds or waits for the
# gate (then no forget holds the units lock either, so taking it does not wait); false otherwise.
TRY_PASS_GATE = (
    f"SELECT CASE WHEN pg_try_advisory_lock_shared({GATE}) "
    f"THEN pg_advisory_lock_shared({UNITS})::text IS NOT NULL AND pg_advisory_unlock_shared({GATE}) "
    "ELSE false END"
)
# Whether no forget holds or waits for the gate, taking nothing (CASE evaluates in order).
GATE_OPEN = (
    f"SELECT CASE WHEN pg_try_advisory_lock_shared({GATE}) "
    f"THEN pg_advisory_unlock_shared({GATE}) ELSE false END"
)
# How often a unit that found the gate closed looks at it again.
GATE_POLL_S = 0.05
GIVE_BACK = f"SELECT pg_advisory_unlock_shared({UNITS})"
# Sessions of ended forgets kept for the next ones (a forget at a time is the common case).
SPARE_SESSIONS = 2
# What a command on the fence's connection raises when its session is gone or in doubt (the
# server ended it: an error or a protocol state the client cannot go on from).
BROKEN = (*CONNECTION_ENDED, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError)
# Commands failing in a row on new sessions before a unit gives up with a StoreError.
TRIES = 3
CLOSE_GATE = f"SELECT pg_advisory_lock({GATE})"
TAKE_UNITS = f"SELECT pg_advisory_lock({UNITS})"
OPEN_GATE = f"SELECT pg_advisory_unlock({UNITS}); SELECT pg_advisory_unlock({GATE})"
# A forget's end that goes on holding the units lock, shared, for this worker's batches on their
# way: a session's own locks do not conflict, so it takes the shared one before it lets go the rest.
HAND_OVER = (
    f"SELECT pg_advisory_lock_shared({UNITS}); SELECT pg_advisory_unlock({UNITS}); "
    f"SELECT pg_advisory_unlock({GATE})"
)


class _Carrier:
    """A forget's session that holds the units lock, shared, for ``count`` units of this worker."""

    __slots__ = ("conn", "count")

    def __init__(self, conn: Any, count: int) -> None:
        self.conn = conn
        self.count = count


class PostgresWorkersFence:
    def __init__(self, dsn: str, *, timeout_s: float = 60.0) -> None:
        self._dsn = dsn
        # The limit of opening a session and of each command on the units' session, none of which
        # waits for a lock (tries, and letting go): past it, the server stalls. The sessions that
        # wait at a gate have none: they wait as long as the forget that holds it.
        self._timeout_s = timeout_s
        self._conn: Any = None
        # One command at a time on the connection; a unit waits for its turn no longer than the
        # limit (those queued behind a connect to a stalled server each waited theirs in turn).
        self._lock = WriteTurn(timeout_s)
        self._units = 0
        self._held = False  # the units lock, shared, by this connection's session
        self._giving_back: set[asyncio.Task[None]] = set()
        # The server's pid and name of each session: kept past the client's end of it, which a
        # network cut may hide from the server.
        self._sessions: weakref.WeakKeyDictionary[Any, tuple[int, str]] = weakref.WeakKeyDictionary()
        self._gate_held = 0  # forgets of this process that hold the gate
        self._spare: list[Any] = []  # sessions of forgets that ended, for the next ones
        self._forget_sessions: set[Any] = set()  # sessions of forgets under way
        self._carriers: list[_Carrier] = []  # sessions that hold units beside the units' session
        # A session waiting at the gate for the units that found it closed while the units'
        # session held the lock (see begin), and how many wait for it.
        self._room: asyncio.Future[None] | None = None
        self._room_waiters = 0
        self._room_sessions: set[Any] = set()
        self._closed = False
        self._shut = False  # closed to the end: no task of the fence is started any more

    async def begin(self) -> None:
        failures = 0
        while True:
            async with self._lock:
                conn = await self._connection()
                try:
                    if not self._held:
                        if await self._taking(conn.fetchval(TRY_PASS_GATE)):
                            self._hold()
                            self._units += 1
                            return
                    elif await conn.fetchval(GATE_OPEN):
                        self._units += 1
                        return
                    elif self._units == 0:
                        await self._give_back(conn)
                        continue
                except BROKEN as exc:
                    failures = self._failed(exc, failures)
                    continue
            # A forget holds the gate or waits for it: this unit waits at the gate on a session
            # of its own, in the server's queue behind that forget and ahead of any forget that
            # comes later. Waiting on the units' session, it would hold that session (and every
            # unit of this worker behind it); waiting for this worker's units to end first, a
            # forget that came meanwhile went first and did not wait for this unit's batch,
            # which it may have been asked to forget.
            try:
                await self._through_room()
                return
            except BROKEN as exc:
                # The room's session ended: the next try opens another, up to a few times.
                failures += 1
                if failures >= TRIES:
                    raise self._error("the fence between workers failed", exc) from exc

    async def _through_room(self) -> None:
        """Wait at the gate on the waiting room's session, and count as one of its units once it
        is through."""
        if self._room is None:
            self._room = asyncio.ensure_future(self._open_room())
        room = self._room
        self._room_waiters += 1
        try:
            await asyncio.shield(room)
        except asyncio.CancelledError:
            if not room.done():
                self._room_waiters -= 1  # not counted: the room counts who waits as it opens
            elif not room.cancelled() and room.exception() is None:
                self.end()  # counted by the room as it opened
            raise

    async def _open_room(self) -> None:
        """A session through the gate that holds the units lock, shared, for the units that
        waited for it (counted as they wait, so that one given up meanwhile is not)."""
        conn: Any = None
        try:
            if self._closed:
                raise ClosedError("the memory is closed")
            conn = self._spare.pop() if self._spare else await self._connect()
            self._room_sessions.add(conn)
            await self._waiting(conn, PASS_GATE)
            if self._closed:
                raise ClosedError("the memory is closed")
        except BaseException:
            self._room = None
            self._room_waiters = 0
            if conn is not None:
                self._room_sessions.discard(conn)
                self._end_session(conn)
            raise
        self._room_sessions.discard(conn)
        carrier = _Carrier(conn, self._room_waiters)
        self._room, self._room_waiters = None, 0
        if carrier.count:
            self._carriers.append(carrier)
        else:
            self._track(self._release(conn))

    async def join(self) -> bool:
        if self.extend():
            return True
        failures = 0
        while True:
            # This process's forget that holds the gate waits for this write (what was received
            # goes first) and for its hooks: they are covered by it, and must not wait for it.
            if self._gate_held:
                return False
            async with self._lock:
                conn = await self._connection()
                try:
                    if self._held:
                        if await conn.fetchval(GATE_OPEN):
                            self._units += 1
                            return True
                        if self._units == 0:
                            await self._give_back(conn)
                    elif await self._taking(conn.fetchval(TRY_PASS_GATE)):
                        self._hold()
                        self._units += 1
                        return True
                except BROKEN as exc:
                    failures = self._failed(exc, failures)
                    continue
            await asyncio.sleep(GATE_POLL_S)

    async def _taking(self, command: Awaitable[T]) -> T:
        """A command that may take a lock: cancelled halfway, the session may hold one it does
        not know of (an advisory lock outlives the statement that took it), so the session goes.
        Only these: ending it would also let go the lock that other units under way hold."""
        try:
            return await command
        except BaseException as exc:
            if not isinstance(exc, BROKEN):
                conn = self._conn
                self._lost()
                if conn is not None:
                    self._end_session(conn)
            raise

    def extend(self) -> bool:
        if self._units and self._held:
            self._units += 1
            return True
        for carrier in self._carriers:
            if carrier.count:
                carrier.count += 1
                return True
        return False

    def end(self) -> None:
        for carrier in self._carriers:
            if carrier.count:
                carrier.count -= 1
                if not carrier.count:
                    self._carriers.remove(carrier)
                    self._track(self._release(carrier.conn))
                return
        self._units -= 1
        if self._units == 0 and self._held and not self._closed:
            task = asyncio.ensure_future(self._give_back_if_idle())
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    @contextlib.asynccontextmanager
    async def forgetting(
        self,
        at_gate: Callable[[], Awaitable[None]] | None = None,
        to_carry: Callable[[], int] | None = None,
    ) -> AsyncIterator[None]:
        # A session other than the units', so that it waits for this worker's units too (their
        # hooks run after the answer; this process's new units wait in narrmem.fence), and one
        # per forget, so that a forget that fails or is cancelled halfway lets its locks go by
        # ending its session.
        conn = await self._close_gate(at_gate)
        done = False
        carried = 0
        try:
            try:
                yield
            finally:
                with contextlib.suppress(*BROKEN):
                    # Letting go never waits: no answer in time is a stalled server (BROKEN).
                    if to_carry is None:
                        await conn.execute(OPEN_GATE, timeout=self._timeout_s)
                    else:
                        await conn.execute(HAND_OVER, timeout=self._timeout_s)
                        # Asked with no wait since the hand-over: a batch that holds from now on
                        # is counted, or holds on the units' session.
                        carried = to_carry()
                        if not carried:
                            await conn.execute(GIVE_BACK, timeout=self._timeout_s)
                    done = True
        finally:
            self._gate_held -= 1
            self._forget_sessions.discard(conn)
            if carried and done:
                self._carriers.append(_Carrier(conn, carried))
            elif carried:
                # The session is in doubt: its lock may be gone, and the units with it.
                log.warning(
                    "a forget's session ended while it held the fence for %d batch(es) of this worker "
                    "on their way; they are not fenced against other workers' forgets",
                    carried,
                )
                self._end_session(conn)
            else:
                self._keep_or_end(conn, done)

    def _keep_or_end(self, conn: Any, done: bool) -> None:
        """A forget's session that holds no lock any more (``done``) is kept for the next forget,
        up to a few; any other ends, and its locks with it."""
        if done and not self._closed and not conn.is_closed() and len(self._spare) < SPARE_SESSIONS:
            self._spare.append(conn)
        else:
            self._end_session(conn)

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that closing waits for."""
        task = asyncio.ensure_future(work)
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _release(self, conn: Any) -> None:
        """A carrier whose units have all ended gives the units lock back."""
        done = False
        with contextlib.suppress(*BROKEN):
            if not self._closed and not conn.is_closed():
                await conn.execute(GIVE_BACK, timeout=self._timeout_s)
                done = True
        self._keep_or_end(conn, done)

    async def _close_gate(self, at_gate: Callable[[], Awaitable[None]] | None) -> Any:
        """A session holding the gate and the units lock exclusively, once every other unit ended;
        ``at_gate`` is awaited once it holds the gate, before it waits for the units. Counted in
        ``_gate_held`` from the gate on (a write of received messages does not wait for it)."""
        while True:
            if self._closed:
                raise ClosedError("the memory is closed")
            spare = bool(self._spare)
            conn = self._spare.pop() if spare else await self._connect()
            self._forget_sessions.add(conn)
            try:
                await self._waiting(conn, CLOSE_GATE)
            except BaseException as exc:
                if spare and isinstance(exc, BROKEN) and not self._closed:
                    self._forget_sessions.discard(conn)
                    self._end_session(conn)
                    continue  # ended while it was spare (an idle timeout): another one
                self._gate_failed(conn, exc)
            break
        self._gate_held += 1
        try:
            if self._closed:  # closed while it waited at the gate
                raise ClosedError("the memory is closed")
            if at_gate is not None:
                await at_gate()
            await self._waiting(conn, TAKE_UNITS)
            if self._closed:
                raise ClosedError("the memory is closed")
        except BaseException as exc:
            self._gate_held -= 1
            self._gate_failed(conn, exc)
        return conn

    async def _waiting(self, conn: Any, command: str) -> None:
        """``command``, which waits for a lock as long as another session holds it (a forget for
        the units under way, a unit for a forget): while it waits, the server is asked every
        ``timeout_s`` on a session of its own whether it still answers. One that does not stalls,
        and the wait ends with :class:`StoreUnavailableError` (before, a forget or a unit held at
        the gate of a stalled server waited for as long as it stalled); the caller ends the
        session, and the lock it may hold with it."""
        waiting = asyncio.ensure_future(conn.execute(command))
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=self._timeout_s)
                if done:
                    waiting.result()
                    return
                if not await self._server_answers():
                    raise StoreUnavailableError(
                        f"PostgreSQL did not answer within {self._timeout_s:g} s while the fence waited"
                    )
        finally:
            if not waiting.done():
                waiting.cancel()  # not awaited: the session goes, and the command with it

    async def _server_answers(self) -> bool:
        """Whether the server answers at all: a refusal (too many sessions, starting up) is an
        answer; no answer within the limit, or no connection, is none."""
        try:
            probe = await asyncpg.connect(self._dsn, timeout=self._timeout_s)
        except asyncpg.PostgresError:
            return True
        except (OSError, asyncpg.InterfaceError):
            return False
        try:
            await probe.fetchval("SELECT 1", timeout=self._timeout_s)
            return True
        except asyncpg.PostgresError:
            return True
        except (OSError, asyncpg.InterfaceError):
            return False
        finally:
            probe.terminate()

    def _gate_failed(self, conn: Any, exc: BaseException) -> NoReturn:
        """A forget's session that failed to close the gate ends, and its locks with it."""
        self._forget_sessions.discard(conn)
        self._end_session(conn)
        if isinstance(exc, ClosedError):
            raise exc
        if self._closed:
            raise ClosedError("the memory is closed") from exc
        if isinstance(exc, BROKEN):
            raise self._error("the forget lost its connection to PostgreSQL", exc) from exc
        raise exc

    async def close(self) -> None:
        # Without waiting for the connection's lock: a unit may be waiting at the gate of another
        # worker's forget on it. Its command then fails (the session ends) and the unit with it.
        self._closed = True
        conns = [self._conn, *self._spare, *(carrier.conn for carrier in self._carriers)]
        self._conn = None
        self._spare.clear()
        self._carriers.clear()
        self._held = False
        for conn in conns:
            if conn is not None:
                conn.terminate()  # its session ends, and the units lock with it
        for conn in [*self._forget_sessions, *self._room_sessions]:
            self._end_session(conn)  # a forget or a room still waiting at the gate: the server ends it
        while self._giving_back:
            await asyncio.gather(*self._giving_back, return_exceptions=True)
        self._shut = True

    # --- the connection and the units lock ---------------------------------------------------

    def _end_session(self, conn: Any) -> None:
        """End a session that may be waiting for a lock. Its socket is closed at once, but a
        server waiting for a lock on its behalf does not look at the socket, and would take the
        lock and hold it a while: the server is asked to end it too (not once the close has
        ended: it ended what it could, and waits for no more tasks)."""
        session = self._sessions.pop(conn, None)
        if session is None:
            return  # ended here already, or its session never got as far as a lock
        conn.terminate()
        if self._shut:
            return
        task = asyncio.ensure_future(self._terminate_backend(*session))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _terminate_backend(self, pid: int, name: str) -> None:
        with contextlib.suppress(*BROKEN, StoreError):
            conn = await self._connect()
            try:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE pid = $1 AND application_name = $2",
                    pid,
                    name,
                )
            finally:
                await conn.close()

    async def _connection(self) -> Any:
        if self._closed:
            raise ClosedError("the memory is closed")
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        if self._conn is not None:
            self._lost()
        self._conn = await self._connect(command_timeout=self._timeout_s)
        return self._conn

    async def _connect(self, *, command_timeout: float | None = None) -> Any:
        try:
            conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s, command_timeout=command_timeout)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise self._error("cannot connect to PostgreSQL", exc) from exc
        # The session is ended by the server's own pid (behind a connection pooler the client's is
        # the pooler's key) and a name of its own: a pid outlives its session, on a server that
        # failed over or in a pooler that handed the server's session to another client (whose
        # reset clears the name), and ending it then ended someone else's.
        name = f"narrmem-fence-{uuid.uuid4().hex[:16]}"
        try:
            await conn.execute(f"{KEEPALIVE_SQL}SET application_name = '{name}';")
            pid = int(await asyncio.wait_for(conn.fetchval("SELECT pg_backend_pid()"), self._timeout_s))
        except BaseException as exc:
            conn.terminate()
            if isinstance(exc, (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)):
                raise self._error("cannot set up a session of the fence", exc) from exc
            raise
        self._sessions[conn] = (pid, name)
        return conn

    def _error(self, what: str, exc: BaseException) -> StoreError:
        """``what`` failed with ``exc``: unavailable when the server could not be reached."""
        if isinstance(exc, TimeoutError):
            return StoreUnavailableError(f"{what}: PostgreSQL did not answer within {self._timeout_s:g} s")
        kind = StoreUnavailableError if unreachable(exc) else StoreError
        return kind(f"{what}: {scrub(str(exc) or type(exc).__name__, self._dsn)}")

    def _hold(self) -> None:
        self._held = True

    def _lost(self) -> None:
        """The session is gone or in doubt: it is ended, and its locks with it."""
        if self._held and self._units:
            log.warning(
                "the connection fencing forgets against this worker's writes ended; %d unit(s) under way "
                "are not fenced against other workers' forgets until the next one",
                self._units,
            )
        conn, self._conn = self._conn, None
        if conn is not None:
            # Asked of the server too: a session the client dropped in a network cut lives on
            # there, holding the units lock every other worker's forget waits for.
            self._end_session(conn)
        self._held = False

    def _failed(self, exc: BaseException, failures: int) -> int:
        """A command of the fence failed: a new session next time, up to a few times in a row."""
        self._lost()
        # A command that found no answer in time is not tried again: the server stalls.
        if failures + 1 >= TRIES or isinstance(exc, TimeoutError):
            raise self._error("the fence between workers failed", exc) from exc
        return failures + 1

    async def _give_back(self, conn: Any) -> None:
        try:
            await conn.execute(GIVE_BACK)
        except BROKEN:
            self._lost()
            return
        except BaseException:
            self._lost()
            raise
        self._held = False

    async def _give_back_if_idle(self) -> None:
        with contextlib.suppress(StoreUnavailableError):  # no turn: the units' session is in doubt
            async with self._lock:
                if self._units == 0 and self._held and self._conn is not None:
                    await self._give_back(self._conn)
