"""The onnx embedder's float32, int8 and int7 weights side by side: one text per call on one thread,
as a bot embeds a question or a message, alternated in one process so that all see the same machine.

Questions are the speed benchmark's generated questions; stored messages are its generated
messages in the speaker-attributed form a memory embeds (``Name said, "…"``). Also reported: how
close each quantized model's vectors are to float32's (cosine) and how often they agree on a
question's ten nearest messages.

    python bench/embedders.py [--n 200] [--seed 7] [--out bench/results/embedders.json]
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import numpy as np
from _chatgen import ChatGenerator
from _common import latency_summary, machine_info, now_iso, params_of, parser_for, publish, render_table
from narrmem_plugins.embedder_onnx import OnnxEmbedder, default_cache_dir

VARIANTS = ("none", "int8", "int7")
QUANTIZED = VARIANTS[1:]


async def timed(embedder: OnnxEmbedder, texts: list[str]) -> list[float]:
    seconds = []
    for text in texts:
        start = time.perf_counter()
        await embedder.embed([text])
        seconds.append(time.perf_counter() - start)
    return seconds


async def run(n: int, seed: int, rounds: int) -> dict[str, Any]:
    gen = ChatGenerator(seed)
    people = gen.people(20)
    questions = [gen.query() for _ in range(n)]
    messages = [f'{people[i % len(people)].name} said, "{gen.content()}"' for i in range(n)]
    embedders = {v: OnnxEmbedder(None, default_cache_dir(), quantize=v) for v in VARIANTS}
    try:
        for embedder in embedders.values():
            await embedder.start()
            await embedder.embed(questions[:20])  # warm the session's buffers
        times: dict[str, dict[str, list[float]]] = {v: {"question": [], "message": []} for v in VARIANTS}
        for round_ in range(rounds):
            # Alternate the order so neither variant always runs on a warmer or cooler machine.
            order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
            for variant in order:
                times[variant]["question"] += await timed(embedders[variant], questions)
                times[variant]["message"] += await timed(embedders[variant], messages)
        vectors = {v: (await e.embed(questions), await e.embed(messages)) for v, e in embedders.items()}
    finally:
        for embedder in embedders.values():
            await embedder.close()
    q32, m32 = vectors["none"]
    top32 = np.argsort(-(q32 @ m32.T), axis=1)[:, :10]
    summary = {
        v: {kind: latency_summary(seconds) for kind, seconds in kinds.items()} for v, kinds in times.items()
    }
    out: dict[str, Any] = {"latency": summary, "speedup_p50": {}, "cosine": {}, "top10_agreement": {}}
    for variant in QUANTIZED:
        q, m = vectors[variant]
        cosines = np.concatenate([np.sum(q32 * q, axis=1), np.sum(m32 * m, axis=1)])
        top = np.argsort(-(q @ m.T), axis=1)[:, :10]
        out["speedup_p50"][variant] = {
            kind: summary["none"][kind]["p50_ms"] / summary[variant][kind]["p50_ms"]
            for kind in ("question", "message")
        }
        out["cosine"][variant] = {"min": float(cosines.min()), "mean": float(cosines.mean())}
        out["top10_agreement"][variant] = float(
            np.mean([len(set(a) & set(b)) / 10 for a, b in zip(top32, top, strict=True)])
        )
    return out


def show(report: dict[str, Any]) -> None:
    rows = []
    for variant, kinds in report["results"]["latency"].items():
        for kind, s in kinds.items():
            rows.append([variant, kind, s["p50_ms"], s["p95_ms"]])
    print(render_table(["weights", "text", "p50 ms", "p95 ms"], rows, digits=2))
    results = report["results"]
    for variant in QUANTIZED:
        speedup, cosine = results["speedup_p50"][variant], results["cosine"][variant]
        print(
            f"{variant} against float32: speed-up at p50 questions {speedup['question']:.2f}x, stored "
            f"messages {speedup['message']:.2f}x; cosine min {cosine['min']:.4f}, mean {cosine['mean']:.4f}; "
            f"top-10 agreement {results['top10_agreement'][variant]:.3f}"
        )


def main() -> int:
    parser = parser_for(__doc__)
    parser.add_argument("--n", type=int, default=200, help="questions and messages per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each variant once per round")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = asyncio.run(run(args.n, args.seed, args.rounds))
    report = {"when": now_iso(), "machine": machine_info(), "params": params_of(args), "results": results}
    return publish(report, args.out, show)


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    sys.exit(main())
