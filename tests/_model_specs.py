"""Models for the model-process tests: picklable specs whose module the child imports (the tests'
folder is on ``sys.path``, which the child takes from its parent)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthModel:
    """A text's row is (its length, the child's pid); each call takes ``seconds`` and is logged
    to ``log`` (one line per call: its texts joined by '|'), when given."""

    seconds: float = 0.0
    log: str | None = None
    fail_on: str | None = None
    print_on_load: bool = False
    load_seconds: float = 0.0

    def load(self) -> Callable[[list[str]], np.ndarray]:
        if self.print_on_load:
            print("a library that prints while it loads")
        time.sleep(self.load_seconds)

        def encode(texts: list[str]) -> np.ndarray:
            if self.fail_on is not None and self.fail_on in texts:
                raise ValueError(f"cannot embed {self.fail_on!r}")
            time.sleep(self.seconds)
            if self.log is not None:
                with open(self.log, "a", encoding="utf-8") as out:
                    out.write("|".join(texts) + "\n")
            return np.array([[float(len(t)), float(os.getpid())] for t in texts], dtype=np.float32)

        return encode


@dataclass(frozen=True)
class BrokenModel:
    def load(self) -> Callable[[list[str]], np.ndarray]:
        raise RuntimeError("no weights in this folder")
