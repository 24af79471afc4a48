#!/usr/bin/env python
"""Fit the hybrid recall's answer model (``narrmem_plugins.answer_ranking``) on LoCoMo-format data.

Every question of the tuning conversations (the first ``--tuning``, as in ``bench/locomo.py``) is
asked through the normal recall pipeline; the fused candidates it ranks are captured through the
``narrmem_rank`` hook (a plugin that looks and answers nothing), each gets the model's signals,
and a memory is labelled 1 when its turns include the question's evidence. A logistic regression
(scikit-learn, L2 with C = ``--c`` on standardized signals) is fitted on the tuning part only.

The weights are printed and written as a narrmem TOML config (``--out``). Validate them with the
benchmark, which prints the tuning and validation parts side by side:

    python bench/fit_ranker.py --data PATH/locomo-dev.json --keep /tmp/locomo --out /tmp/answer.toml
    python bench/locomo.py --data PATH/locomo-dev.json --keep /tmp/locomo --no-baselines \
        --config /tmp/answer.toml

Weights that raise tuning recall but lower validation recall are not taken.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _common import start_shared_embedder
from locomo import INGESTED_MARK, DataNotes, RunState, ingest_conversation, load_conversations
from narrmem_plugins.answer_ranking import SIGNALS, AnswerWeights, answer_signals
from narrmem_plugins.recall_hybrid import HybridOptions
from sklearn.linear_model import LogisticRegression
from tqdm import tqdm

from narrmem import Memory, hookimpl, load_settings
from narrmem.models import Candidate, MemoryRecord
from narrmem.ranking import reciprocal_rank_fusion


class CandidateCapture:
    """Keeps what each ranking saw; answers nothing, so the hybrid plugin still ranks."""

    name = "fit_ranker_capture"

    def __init__(self) -> None:
        self.seen: list[tuple[list[Candidate], dict[int, MemoryRecord]]] = []

    @hookimpl(tryfirst=True)
    def narrmem_rank(
        self, candidates: list[Candidate], records: dict[int, MemoryRecord]
    ) -> list[tuple[int, float]] | None:
        self.seen.append((list(candidates), dict(records)))
        return None


async def collect(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, HybridOptions]:
    notes = DataNotes()
    conversations = load_conversations(Path(args.data), None, notes, args.tuning)
    tuning = [c for c in conversations if c.part == "tuning"]
    inner, shared, settings = await start_shared_embedder(load_settings(args.config))
    options = HybridOptions.model_validate(settings.plugin.get("recall_hybrid", {}))
    weights = options.fusion_weights(settings.recall.weights)
    rows: list[tuple[float, ...]] = []
    labels: list[int] = []
    try:
        for conv in tuning:
            folder = Path(args.keep) / conv.sample_id
            folder.mkdir(parents=True, exist_ok=True)
            capture = CandidateCapture()
            async with Memory.open(folder, settings=settings, plugins=[shared, capture]) as mem:
                if not (folder / INGESTED_MARK).exists():
                    with tqdm(total=len(conv.turns), desc=f"{conv.sample_id} ingest", file=sys.stderr) as bar:
                        await ingest_conversation(mem, conv, RunState(), bar)
                    (folder / INGESTED_MARK).write_text(conv.sample_id, encoding="utf-8")
                for question in conv.questions:
                    capture.seen.clear()
                    await mem.recall(question.text, chat_id=conv.sample_id, k=10, reinforce=False)
                    [(candidates, records)] = capture.seen
                    fused = reciprocal_rank_fusion(
                        candidates, k=options.rrf_k, weights=weights, normalize=True
                    )
                    signals = answer_signals(
                        fused,
                        candidates,
                        records,
                        rrf_k=options.rrf_k,
                        window_minutes=options.answer.window_minutes,
                        source_weights=weights,
                    )
                    evidence = set(question.evidence)
                    for mid, values in signals.items():
                        rows.append(values)
                        labels.append(1 if evidence & set(records[mid].message_ids) else 0)
    finally:
        await inner.close()
    return np.asarray(rows, dtype=np.float64), np.asarray(labels), options


def fit(x: np.ndarray, y: np.ndarray, c: float, window_minutes: float) -> AnswerWeights:
    # Other sources (the graph's facts, plugins) hardly occur in LoCoMo: not fitted, they take the
    # keyword weight (see narrmem_plugins.answer_ranking).
    fitted = [i for i, name in enumerate(SIGNALS) if name != "other_sources"]
    x = x[:, fitted]
    mean, spread = x.mean(axis=0), x.std(axis=0) + 1e-9
    model = LogisticRegression(C=c, max_iter=5000).fit((x - mean) / spread, y)
    raw = model.coef_[0] / spread
    bias = float(model.intercept_[0] - np.sum(model.coef_[0] * mean / spread))
    values: dict[str, Any] = {SIGNALS[i]: round(float(w), 3) for i, w in zip(fitted, raw, strict=True)}
    values["other_sources"] = values["keyword"]
    return AnswerWeights(bias=round(bias, 3), window_minutes=window_minutes, **values)


def as_toml(weights: AnswerWeights) -> str:
    lines = ["[plugin.recall_hybrid.answer]"]
    lines += [f"{name} = {value}" for name, value in weights.model_dump().items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, help="a LoCoMo-format JSON file")
    parser.add_argument(
        "--keep", required=True, help="one store per conversation, reused by bench/locomo.py --keep"
    )
    parser.add_argument("--tuning", type=int, default=3, help="the first N conversations are the tuning part")
    parser.add_argument("--config", help="a narrmem TOML config (the other recall settings)")
    parser.add_argument("--c", type=float, default=0.1, help="inverse L2 strength of the regression")
    parser.add_argument("--out", help="write the weights here as a narrmem TOML config")
    args = parser.parse_args(argv)
    x, y, options = asyncio.run(collect(args))
    weights = fit(x, y, args.c, options.answer.window_minutes)
    print(f"{len(y)} candidates of the tuning part, {int(y.sum())} of them evidence")
    text = as_toml(weights)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    raise SystemExit(main())
