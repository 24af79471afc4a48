"""narrmem's loggers, and how much they write when something goes wrong for a long time.

A bot calls narrmem on every message: a store away for an hour, a plugin that fails on every
message or a webhook receiver that is down would otherwise write the same line (and its
traceback) tens of thousands of times an hour. Every logger made here (the ``narrmem`` ones,
which plugins use as well) lets a line of one kind through at most :attr:`RepeatFilter.burst`
times a :data:`WINDOW_S` window; the last one let through says that more are held back, and the
first one after the window says how many were. A line's kind is its logger, level and message
before its values are put in, its string values (which name the plugin, route, tool or lock at
fault: one plugin failing on every message does not hide another's failure) and its error's
type; a line whose string values differ for each item (an event's id) names its kind itself with
``extra={"repeats_as": ...}``. Lines below WARNING pass as they are (``--verbose`` is for looking
closely). ``REPEATS.burst = 0`` lets every line through.

An expected failure carries no traceback: the store cannot be reached now (its message, which
says why, is kept), the memory is closed, or an input was refused (its field and line are kept,
not its text, which may quote the input). Only the error logged decides, not what it was raised
while handling: a bug met in an ``except StoreUnavailableError`` block keeps its traceback.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
BURST = 5
# A string value longer than this is not part of a line's kind (a message, not a name).
NAME_CHARS = 80
# Kinds of line remembered at once: the oldest go first (a line built with its values already in
# it is a kind of its own).
KINDS_KEPT = 1024


@dataclass
class _Run:
    started: float
    shown: int = 1
    held: int = 0


class RepeatFilter(logging.Filter):
    """See the module's docstring. One is shared by every narrmem logger; ``clock`` is a
    monotonic clock in seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, burst: int = BURST) -> None:
        super().__init__()
        self.clock = clock
        self.burst = burst
        self._runs: OrderedDict[tuple[object, ...], _Run] = OrderedDict()
        self._lock = threading.Lock()  # loggers are called from worker threads too

    def __len__(self) -> int:
        """How many kinds of line are remembered now."""
        return len(self._runs)

    def reset(self) -> None:
        with self._lock:
            self._runs.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or self.burst <= 0:
            return True
        try:
            return self._filter(record)
        except Exception:  # a log line must never fail its caller: let it through as it is
            return True

    def _filter(self, record: logging.LogRecord) -> bool:
        key = _kind(record)
        _without_expected_traceback(record)
        now = self.clock()
        with self._lock:
            run = self._runs.get(key)
            if run is None or now - run.started >= WINDOW_S:
                held = run.held if run is not None else 0
                self._runs[key] = _Run(now)
                self._runs.move_to_end(key)
                while len(self._runs) > KINDS_KEPT:
                    self._runs.popitem(last=False)
                if held:
                    _add(record, f"[{held} more like this before were not shown]")
                return True
            self._runs.move_to_end(key)
            run.shown += 1
            if run.shown <= self.burst:
                if run.shown == self.burst:
                    _add(
                        record,
                        f"[more like this in the next {WINDOW_S - (now - run.started):.0f} s are not shown]",
                    )
                return True
            run.held += 1
            return False


def _add(record: logging.LogRecord, note: str) -> None:
    # Kept apart from the arguments: the message is formatted with them later.
    record.msg = f"{record.msg} {note.replace('%', '%%') if record.args else note}"


def _kind(record: logging.LogRecord) -> tuple[object, ...]:
    named = getattr(record, "repeats_as", None)
    if named is not None:
        values: tuple[object, ...] = (str(named),)
    elif isinstance(record.args, tuple):
        values = tuple(a for a in record.args if isinstance(a, str) and len(a) <= NAME_CHARS)
    else:
        values = ()
    error = record.exc_info[0].__name__ if isinstance(record.exc_info, tuple) and record.exc_info[0] else None
    return (record.name, record.levelno, str(record.msg), error, *values)


def _expected(error: BaseException) -> str | None:
    """How an expected failure is said instead of its traceback; ``None`` for any other."""
    from narrmem.errors import ClosedError, InputError, StoreUnavailableError

    if isinstance(error, (StoreUnavailableError, ClosedError)):
        return f"{type(error).__name__}: {error}"
    if isinstance(error, InputError):
        where = ", ".join(
            part
            for part in (
                f"field {error.field!r}" if error.field else "",
                f"line {error.line}" if error.line else "",
            )
            if part
        )
        return f"{type(error).__name__}{' in ' + where if where else ''}"
    return None


def _without_expected_traceback(record: logging.LogRecord) -> None:
    if not isinstance(record.exc_info, tuple) or record.exc_info[1] is None:
        return
    said = _expected(record.exc_info[1])
    if said is not None:
        record.exc_info = None
        record.exc_text = None
        _add(record, f"({said})")


REPEATS = RepeatFilter()


def logger(name: str) -> logging.Logger:
    """The logger ``name`` (``narrmem`` or ``narrmem.<part>``), with the shared filter."""
    log = logging.getLogger(name)
    if REPEATS not in log.filters:
        log.addFilter(REPEATS)
    return log
