"""The forgetting curve. Importance at time t is a function of the stored importance, the time its
decay clock started (the last reinforcement, or creation) and t: nothing depends on how often a
decay pass ran.

| stored importance | decay starts after (days since last reinforced) |
| --- | --- |
| < 0.5 | 7 |
| 0.5 – < 0.7 | 30 |
| 0.7 – < 0.8 | 90 |
| >= 0.8 | never (core memory) |

After it starts, importance falls exponentially toward 0 with time constant 150 days (a half-life
of about 104 days): monotone, never negative, and a memory below 0.5 that is never recalled keeps
at most 0.5·e^(-365/150) ≈ 0.044 a year after its decay started.
"""

from __future__ import annotations

import math
from datetime import datetime

BANDS: tuple[tuple[float, float], ...] = ((0.5, 7.0), (0.7, 30.0), (0.8, 90.0))
PERMANENT = 0.8
TIME_CONSTANT_DAYS = 150.0
REINFORCEMENT = 0.05
FADED = 0.1  # below this after decay a memory counts as faded (it is still stored and findable)


def decay_starts_after(importance: float) -> float | None:
    """Days after the clock start when decay begins; ``None`` for a core memory."""
    for upper, days in BANDS:
        if importance < upper:
            return days
    return None


def effective(importance: float, since: datetime, now: datetime) -> float:
    """Importance after decay at ``now`` for a memory whose decay clock started at ``since``."""
    start = decay_starts_after(importance)
    if start is None:
        return importance
    age_days = (now - since).total_seconds() / 86_400
    if age_days <= start:
        return importance
    return importance * math.exp(-(age_days - start) / TIME_CONSTANT_DAYS)


def reinforced(importance: float, since: datetime, now: datetime) -> float:
    """Importance after a recall at ``now``: what was left after decay, plus 0.05, capped at 1."""
    return min(1.0, effective(importance, since, now) + REINFORCEMENT)
