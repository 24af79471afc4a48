"""Typed errors. Each one says which field, file or line is at fault."""

from __future__ import annotations

from typing import Any


class NarrmemError(Exception):
    """Base class of every error narrmem raises on purpose."""


class InputError(NarrmemError, ValueError):
    """Bad input at a boundary (a message, a tool call, a file line). ``field`` names the culprit."""

    def __init__(self, message: str, *, field: str | None = None, line: int | None = None) -> None:
        self.field = field
        self.line = line
        self.reason = message  # without the place, for a caller that names the place anew
        where = []
        if line is not None:
            where.append(f"line {line}")
        if field:
            where.append(f"field '{field}'")
        prefix = (", ".join(where) + ": ") if where else ""
        super().__init__(prefix + message)

    @classmethod
    def from_pydantic(cls, exc: Any, *, line: int | None = None, prefix: str = "") -> InputError:
        """Build from a ``pydantic.ValidationError``, naming the first failing field and listing all."""
        errors = exc.errors(include_url=False)
        parts = []
        for err in errors:
            loc = prefix + ".".join(str(p) for p in err["loc"]) if err["loc"] else prefix.rstrip(".")
            parts.append(f"{loc or '<root>'}: {err['msg']}")
        first = errors[0]["loc"] if errors else ()
        field = prefix + ".".join(str(p) for p in first) if first else (prefix.rstrip(".") or None)
        return cls("; ".join(parts), field=field, line=line)


class ConfigError(NarrmemError):
    """A config file, environment variable or plugin table is wrong."""


class ClockBehindError(InputError):
    """A message dated further past the memory's clock than it takes (``[storage]
    max_ts_ahead_s``): the sender's clock is ahead, or this machine's is behind. The bot
    integrations' messages, dated by their platform, are stored as dated instead
    (:func:`narrmem.ingest.dated_by_platform`)."""


class UnknownToolError(InputError):
    """A tool call names a tool nobody registered."""


class StoreError(NarrmemError):
    """The store could not do what was asked (for example an import that conflicts with stored rows)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached now: its server is down, restarting or refusing connections, a
    connection ended under the call, or it did not answer within its time limit
    (``[storage] timeout_s``). Worth trying again a moment later (503 with ``Retry-After`` over
    HTTP). A write that failed so may or may not have been made: ingest again with the same
    message id, which stores a message once."""


class ClosedError(StoreError):
    """A call on a memory that was closed: open it again (``Memory.open``) to use it."""


class PluginError(NarrmemError):
    """A plugin is missing or misbehaves in a way the host cannot recover from."""


class ModelProcessError(NarrmemError):
    """The embedding model's own process (``[embedder] runs_in``) did not start or load, or ended
    while a request waited on it; the next call starts a new one."""
