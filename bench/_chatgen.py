"""Seeded generator of realistic chat traffic for the speed benchmark.

Messages come from templates with filled slots across plans, preferences, work, family, hobbies,
feelings and small talk, in English and some Chinese, plus bare acknowledgements ("ok", "thanks", "👍",
"好的") that narrmem's default triage ignores. Everything comes from one ``random.Random(seed)``, so a
seed always yields the same traffic.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

_DATA = json.loads((Path(__file__).parent / "data" / "chatgen.json").read_text(encoding="utf-8"))
# The words and templates messages are made of, by slot and by category; how often each category
# comes up (Chinese about one message in eight); the acknowledgements and reactions the default
# triage ignores; the recall queries.
SLOTS: dict[str, tuple[str, ...]] = {slot: tuple(words) for slot, words in _DATA["slots"].items()}
TEMPLATES: dict[str, tuple[str, ...]] = {name: tuple(t) for name, t in _DATA["templates"].items()}
WEIGHTS: dict[str, float] = _DATA["weights"]
ACKNOWLEDGEMENTS: tuple[str, ...] = tuple(_DATA["acknowledgements"])
QUERIES: tuple[str, ...] = tuple(_DATA["queries"])
_SLOT = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Person:
    user_id: str
    name: str


FIRST_NAMES: tuple[str, ...] = tuple(_DATA["first_names"])


class ChatGenerator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._categories = list(WEIGHTS)
        self._weights = [WEIGHTS[c] for c in self._categories]

    def fill(self, template: str) -> str:
        return _SLOT.sub(lambda m: self.rng.choice(SLOTS[m.group(1)]), template)

    def content(self) -> str:
        """A message the default triage keeps."""
        [category] = self.rng.choices(self._categories, weights=self._weights)
        return self.fill(self.rng.choice(TEMPLATES[category]))

    def acknowledgement(self) -> str:
        """A message the default triage ignores."""
        return self.rng.choice(ACKNOWLEDGEMENTS)

    def message(self, ack_share: float = 0.2) -> str:
        return self.acknowledgement() if self.rng.random() < ack_share else self.content()

    def query(self) -> str:
        return self.fill(self.rng.choice(QUERIES))

    def unique_contents(self, n: int, max_tries: int = 50) -> list[str]:
        """``n`` distinct content messages (a counter suffix keeps them distinct past the templates')."""
        seen: dict[str, None] = {}
        tries = 0
        while len(seen) < n:
            text = self.content()
            if text in seen:
                tries += 1
                if tries > max_tries * n:
                    text = f"{text} ({len(seen)})"
                else:
                    continue
            seen[text] = None
        return list(seen)

    def people(self, n: int) -> list[Person]:
        return [Person(f"u{i:05d}", f"{self.rng.choice(FIRST_NAMES)} {i}") for i in range(n)]
