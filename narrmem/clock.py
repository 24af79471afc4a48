"""Time comes from a clock object so that tests and replays are deterministic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that only moves when told to; for tests and replays."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start time")
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        """Move on by ``delta`` of time that passes: ``hours=3`` across a change to or from daylight
        saving time is three hours, whatever the clock's zone shows (an aware datetime's own
        arithmetic is wall-clock: it moved four, and ``days=1`` 23 hours in spring)."""
        zone = self._now.tzinfo
        self._now = (self._now.astimezone(UTC) + timedelta(**delta)).astimezone(zone)
        return self._now

    def set(self, when: datetime) -> None:
        if when.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware time")
        self._now = when
