#!/usr/bin/env python
"""narrmem reliability benchmark: the four harnesses of ``tests/reliability`` in one command.

1. Crash: a child process ingests (single calls and ``ingest_many`` batches) or forgets on a data
   folder and is killed with SIGKILL at a random moment; the folder is reopened and checked
   (acknowledged messages lost, failed reopens, vector index against SQLite, interrupted forgets
   finished on reopen, traces of forgotten users left). The first run of each kind uses the real
   model. Then one forget is killed on entering each step of the store's forget in turn.
2. Isolation: probes of every read path (recall, context, turn_context, summary, every tool that
   reads memory) with other owners' secret tokens in three tenants' group and direct chats; then some
   people are forgotten and probed for again.
3. Leak: markers written through every surface, forget, close, and every byte of the data folder
   searched for the forgotten users' markers and vectors.
4. Fuzz: malformed inputs at every door (``run_fuzz`` of ``tests/reliability/fuzz.py``).

Quick by default (10 crash runs, 500 probes on the hash embedder, 6 leak users, 1,000 fuzz inputs);
``--long``: 48 crash runs, 3,000 probes on the real model, 12 leak users on the real model, 10,000
fuzz inputs. Seeds are fixed (``--seed``); a second run gives the same draws.

Usage:  python bench/reliability.py [--long] [--out bench/results/reliability.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import machine_info, now_iso, render_table, write_json

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QUICK = {"crash_runs": 10, "probes": 500, "leak_users": 6, "fuzz_inputs": 1000}
LONG = {"crash_runs": 48, "probes": 3000, "leak_users": 12, "fuzz_inputs": 10_000}


def run_crash_part(runs: int, seed: int, workdir: Path) -> dict[str, Any]:
    from tests.reliability.crash import run_crash

    return run_crash(runs, seed, workdir)


def run_crash_steps_part(seed: int, workdir: Path) -> dict[str, Any]:
    from tests.reliability.crash import FORGET_STEPS, run_crash

    return run_crash(len(FORGET_STEPS), seed, workdir, steps=FORGET_STEPS, real_model_runs=False)


def run_isolation_part(probes: int, seed: int, workdir: Path, real: bool) -> dict[str, Any]:
    from tests.reliability.isolation import run_isolation

    return run_isolation(probes, seed, workdir, real_model=real)


def run_leak_part(users: int, seed: int, workdir: Path, real: bool) -> dict[str, Any]:
    from tests.reliability.leak import run_leak

    return run_leak(users, seed, workdir, real_model=real)


def run_fuzz_part(count: int, seed: int, workdir: Path) -> dict[str, Any]:
    from tests.reliability.fuzz import run_fuzz

    return run_fuzz(count, seed, workdir)


def _timed(name: str, call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    print(f"running {name}...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        figures = call()
    except Exception as exc:  # one broken part must not hide the others' figures
        figures = {"error": f"{type(exc).__name__}: {exc}"}
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures


def rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(part, what was run, what failed, verdict) for the table."""
    readers: dict[str, Callable[[dict[str, Any]], tuple[str, dict[str, int]]]] = {
        "crash": _crash,
        "crash at forget steps": _crash,
        "isolation": _isolation,
        "leak": _leak,
        "fuzz": _fuzz,
    }
    out: list[tuple[str, str, str, str]] = []
    for name, read in readers.items():
        figures = results.get(name)
        if figures is None:
            continue
        if "error" in figures:
            out.append((name, "-", figures["error"], "error"))
            continue
        ran, bad = read(figures)
        out.append((name, ran, _failures(bad), _verdict(bad)))
    return out


def _crash(crash: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """What a crash part ran, and its failures by kind (as for each part below)."""
    bad = {
        "lost": crash["lost"] + crash["scenes_lost"],
        "failed reopens": crash["failed_reopens"],
        "index mismatches": crash["index_mismatches"],
        "half-done forgets": crash["forgets_half_done"],
        "leftover traces": crash["leftover_traces"],
        "integrity failures": crash["integrity_failures"],
        "steps not reached": len(crash["steps_not_reached"]),
    }
    steps = crash.get("steps_killed_at") or {}
    if steps:
        kinds = "killed on entering " + ", ".join(steps)
    else:
        kinds = ", ".join(f"{k} {v}" for k, v in crash["runs_by_kind"].items())
    ran = (
        f"{crash['runs']} runs ({kinds}); {crash['acknowledged']:,} acknowledged; "
        f"{crash['forgets_interrupted']} forgets interrupted, "
        f"{crash['forgets_completed_on_reopen']} finished on reopen; "
        f"{crash['rebuilds_needed']} index rebuilds on reopen"
    )
    return ran, bad


def _isolation(isolation: dict[str, Any]) -> tuple[str, dict[str, int]]:
    bad = {
        "foreign tokens": isolation["foreign_tokens"],
        "forgotten tokens": isolation["forgotten_found"],
        "unexpected errors": isolation["unexpected_errors"],
    }
    ran = (
        f"{isolation['probes']:,} probes over {len(isolation['by_path'])} paths "
        f"({'real model' if isolation['real_model'] else 'hash embedder'}); "
        f"{isolation['population']['people']} people, "
        f"{isolation['population']['messages']:,} messages; "
        f"own token found {isolation['own_found']}/{isolation['own_asked']}"
    )
    return ran, bad


def _leak(leak: dict[str, Any]) -> tuple[str, dict[str, int]]:
    bad = {
        "markers left": leak["leaked_markers"],
        "vectors left": leak["vectors_found"],
        "answers": leak["answers_with_forgotten"],
        "kept markers missed": leak["kept_markers"] - leak["kept_markers_found"],
    }
    ran = (
        f"{leak['forgotten']} of {leak['users']} users forgotten; "
        f"{leak['markers_forgotten']} markers, "
        f"{leak['vectors_checked']} vectors searched in {len(leak['files'])} files"
    )
    return ran, bad


def _fuzz(fuzz: dict[str, Any]) -> tuple[str, dict[str, int]]:
    bad = {
        key: value
        for key, value in fuzz.items()
        if key in ("untyped", "cli_tracebacks", "rows_changed_by_refused", "foreign_files_touched")
        and isinstance(value, int)
    }
    ran = f"{fuzz.get('inputs', 0):,} inputs; {fuzz.get('refused', 0):,} refused with a typed error"
    return ran, bad


def _failures(bad: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in bad.items() if count) or "none"


def _verdict(bad: dict[str, int]) -> str:
    return "FAIL" if any(bad.values()) else "ok"


def markdown(table: list[tuple[str, str, str, str]]) -> str:
    lines = ["| part | what ran | failures | verdict |", "| --- | --- | --- | --- |"]
    lines += [f"| {part} | {ran} | {failed} | {verdict} |" for part, ran, failed, verdict in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--long", action="store_true", help="the long variants (see above)")
    parser.add_argument("--seed", type=int, default=20260504)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "reliability.json"))
    parser.add_argument("--workdir", default=None, help="where the data folders go (default: a temp folder)")
    parser.add_argument(
        "--parts", default="crash,isolation,leak,fuzz", help="a comma-separated subset of these four"
    )
    args = parser.parse_args(argv)
    sizes = LONG if args.long else QUICK
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"crash", "isolation", "leak", "fuzz"})
    if unknown:
        parser.error(f"unknown part {unknown[0]}")
    with tempfile.TemporaryDirectory(prefix="narrmem-reliability-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        results: dict[str, dict[str, Any]] = {}
        seed = args.seed
        if "crash" in parts:
            results["crash"] = _timed(
                "crash", lambda: run_crash_part(sizes["crash_runs"], seed, work / "crash")
            )
            results["crash at forget steps"] = _timed(
                "crash at forget steps", lambda: run_crash_steps_part(seed, work / "crash-steps")
            )
        if "isolation" in parts:
            results["isolation"] = _timed(
                "isolation", lambda: run_isolation_part(sizes["probes"], seed, work / "isolation", args.long)
            )
        if "leak" in parts:
            results["leak"] = _timed(
                "leak", lambda: run_leak_part(sizes["leak_users"], seed, work / "leak", args.long)
            )
        if "fuzz" in parts:
            results["fuzz"] = _timed("fuzz", lambda: run_fuzz_part(sizes["fuzz_inputs"], seed, work / "fuzz"))
    table = rows(results)
    payload = {
        "benchmark": "reliability",
        "variant": "long" if args.long else "quick",
        "when": now_iso(),
        "seed": args.seed,
        "sizes": sizes,
        "machine": machine_info(),
        "results": results,
        "table": [dict(zip(("part", "ran", "failures", "verdict"), row, strict=True)) for row in table],
    }
    write_json(args.out, payload)
    print(markdown(table))
    print()
    walls = [(name, part["wall_s"]) for name, part in results.items()]
    print(render_table(["part", "wall s"], walls, digits=1))
    print(f"\nwritten to {args.out}")
    return 1 if any(row[3] != "ok" for row in table) else 0


if __name__ == "__main__":
    from _common import allow_synthetic_dates

    allow_synthetic_dates()
    raise SystemExit(main())
