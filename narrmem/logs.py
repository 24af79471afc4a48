"""narrmem's loggers, and how much they write when something goes wrong for a long time.

A bot calls narrmem on every message: a store away for an hour, a plugin that fails on every
message or a webhook receiver that is down would otherwise write the same line (and its
traceback) tens of thousands of times an hour. Every logger made here (the ``narrmem`` ones,
which plugins use as well) lets a line of one kind, its logger, level and unformatted message,
through at most :data:`BURST` times a :data:`WINDOW_S` window; the last one let through says that
more are held back, and the first one after the window says how many were. Lines below WARNING
pass as they are (``--verbose`` is for looking closely).

An expected failure carries no traceback: the store cannot be reached now, the memory is closed,
or the input was refused. The line names the error's kind; the traceback of such an error says
nothing an operator can act on, and a traceback prints the error's text, which for a refused
input may quote it.
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

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self._runs: OrderedDict[tuple[str, int, str], _Run] = OrderedDict()
        self._lock = threading.Lock()  # loggers are called from worker threads too

    def __len__(self) -> int:
        """How many kinds of line are remembered now."""
        return len(self._runs)

    def reset(self) -> None:
        with self._lock:
            self._runs.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        _without_expected_traceback(record)
        key = (record.name, record.levelno, str(record.msg))
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
                    _add(record, f"[{held} more like this in the {WINDOW_S:g} s before were not shown]")
                return True
            run.shown += 1
            if run.shown <= BURST:
                if run.shown == BURST:
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


def _expected(error: BaseException | None) -> str | None:
    from narrmem.errors import ClosedError, InputError, StoreUnavailableError

    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, (StoreUnavailableError, ClosedError, InputError)):
            return type(error).__name__
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def _without_expected_traceback(record: logging.LogRecord) -> None:
    if not record.exc_info or record.exc_info[1] is None:
        return
    kind = _expected(record.exc_info[1])
    if kind is not None:
        record.exc_info = None
        record.exc_text = None
        _add(record, f"({kind})")


REPEATS = RepeatFilter()


def logger(name: str) -> logging.Logger:
    """The logger ``name`` (``narrmem`` or ``narrmem.<part>``), with the shared filter."""
    log = logging.getLogger(name)
    if REPEATS not in log.filters:
        log.addFilter(REPEATS)
    return log
