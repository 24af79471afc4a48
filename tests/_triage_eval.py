"""Layer and scene-type accuracy of the built-in triage on labelled JSONL sets, through the real
pipeline (real embedding model, prototype check included). Not a test module: the triage tests
import :func:`score`, and it runs on its own to print the figures::

    python tests/_triage_eval.py tests/data/triage_blind.jsonl [more.jsonl ...] [--errors]
    python tests/_triage_eval.py --locomo /path/to/locomo-dev.json

``--locomo`` triages every turn of the LoCoMo file that ``bench/locomo.py`` reads (as that benchmark
ingests them, each speaker a user) and counts the layers and the evidence turns triage ignores.

Each line: ``{"text", "layer", "type"}`` (``type`` only for scenes). Two scene-type figures:
``type_accuracy`` over the messages both the label and triage call a scene (what the goal is set
on), and ``type_strict`` over every labelled scene (a scene triage missed counts as wrong).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from narrmem import Memory, Message
from narrmem.testing import open_memory


@dataclass
class Score:
    counts: Counter[str] = field(default_factory=Counter)  # rows, layer_right, scenes, typed, type_right
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    @property
    def layer_accuracy(self) -> float:
        return self.counts["layer_right"] / self.counts["rows"] if self.counts["rows"] else 0.0

    @property
    def type_accuracy(self) -> float:
        return self.counts["type_right"] / self.counts["typed"] if self.counts["typed"] else 0.0

    @property
    def type_strict(self) -> float:
        return self.counts["type_right"] / self.counts["scenes"] if self.counts["scenes"] else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "messages": self.counts["rows"],
            "layer_accuracy": round(self.layer_accuracy, 4),
            "type_accuracy": round(self.type_accuracy, 4),
            "type_strict": round(self.type_strict, 4),
            "scenes_labelled": self.counts["scenes"],
            "scenes_both": self.counts["typed"],
        }


def rows_of(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def score(memory: Memory, rows: list[dict[str, Any]], user_prefix: str) -> Score:
    """Triage every row as a first message of a new user (novelty never depends on row order)."""
    result = Score()
    for i, row in enumerate(rows):
        message = Message(
            text=row["text"],
            user_id=f"{user_prefix}-{i}",
            chat_id="eval",
            ts=datetime(2026, 5, 4, 9, 12, tzinfo=UTC),
            message_id=f"e{i}",
        )
        decision = await memory.triage(message)
        result.counts["rows"] += 1
        result.confusion[(row["layer"], decision.layer)] += 1
        right = decision.layer == row["layer"]
        result.counts["layer_right"] += right
        wrong_type = False
        if row["layer"] == "scene":
            result.counts["scenes"] += 1
            if decision.layer == "scene":
                result.counts["typed"] += 1
                result.counts["type_right"] += decision.type == row["type"]
                wrong_type = decision.type != row["type"]
        if not right or wrong_type:
            got = f"{decision.layer}/{decision.type}" if decision.layer == "scene" else decision.layer
            want = f"{row['layer']}/{row.get('type')}" if row["layer"] == "scene" else row["layer"]
            result.errors.append(f"want {want:<22} got {got:<22} {row['text']}")
    return result


async def _locomo(path: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    from locomo import DataNotes, load_conversations, turn_message  # type: ignore[import-not-found]

    conversations = load_conversations(path, None, DataNotes())
    layers: Counter[str] = Counter()
    ignored: list[str] = []
    evidence = {(c.sample_id, e) for c in conversations for q in c.questions for e in q.evidence}
    with tempfile.TemporaryDirectory() as folder:
        async with open_memory(Path(folder) / "store", real_model=True) as memory:
            for conv in conversations:
                for turn in conv.turns:
                    decision = await memory.triage(turn_message(conv, turn))
                    layers[decision.layer] += 1
                    if decision.layer == "ignore":
                        ignored.append(f"{conv.sample_id}:{turn.dia_id}")
    return {
        "turns": sum(layers.values()),
        "layers": dict(layers),
        "evidence_turns": len(evidence),
        "evidence_turns_ignored": sum(1 for i in ignored if tuple(i.split(":", 1)) in evidence),
    }


async def _main(paths: list[Path], show_errors: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        async with open_memory(Path(folder) / "store", real_model=True) as memory:
            for path in paths:
                result = await score(memory, rows_of(path), path.stem)
                print(json.dumps({"set": path.name, **result.summary()}))
                if show_errors:
                    print("\n".join(result.errors))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--locomo"]:
        print(json.dumps(asyncio.run(_locomo(Path(arguments[1])))))
    else:
        asyncio.run(_main([Path(a) for a in arguments if a != "--errors"], "--errors" in arguments))
