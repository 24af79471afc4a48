"""Helpers shared by the benchmark scripts: percentiles, a plain-text table, machine facts, JSON output,
and a plugin that lends one loaded embedder to every ``Memory`` a benchmark opens.

The scripts import this module as ``_common`` (run them as ``python bench/NAME.py``: the script's own
folder is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from narrmem_plugins import embedder_onnx, embedder_sentence_transformers

from narrmem import Settings, hookimpl
from narrmem.embed import Embedder

SHARED_BACKEND = "bench-shared"


def allow_synthetic_dates() -> None:
    """Let a bench run's memories take its synthetic traffic's dates. The traffic is dated from
    fixed epochs and runs months past the wall clock (a million messages a minute apart), where a
    bot's own messages are refused once a day ahead ([storage] max_ts_ahead_s). Called where a
    bench runs as a program, so a process that imports a bench keeps the default."""
    os.environ.setdefault("NARRMEM_STORAGE__MAX_TS_AHEAD_S", str(10 * 365 * 86_400))


_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NARRMEM_", "TORCH_")


# --- statistics -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean/max in milliseconds, and the sample count."""
    ms = [s * 1000.0 for s in seconds]
    return {
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "mean_ms": float(np.mean(ms)) if ms else math.nan,
        "max_ms": max(ms) if ms else math.nan,
        "samples": len(ms),
    }


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


class LoopStallMonitor:
    """How long the event loop stays unavailable: a task asks to wake every ``interval`` seconds and
    records how late each wake-up is. Used as ``async with LoopStallMonitor() as stalls: ...``."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.late: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(self.interval)
            self.late.append(time.perf_counter() - start - self.interval)

    async def __aenter__(self) -> LoopStallMonitor:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def summary(self) -> dict[str, float]:
        ms = [x * 1000.0 for x in self.late]
        return {
            "max_ms": max(ms) if ms else math.nan,
            "p99_ms": percentile(ms, 99),
            "p50_ms": percentile(ms, 50),
            "wakeups": len(ms),
        }


# --- output -----------------------------------------------------------------------------------


def format_cell(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.{digits}f}"
    return str(value)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3) -> str:
    """A fixed-width text table; the first column is left-aligned, the others right-aligned."""
    cells = [[format_cell(v, digits) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(values)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(headers)), rule, *(line(r) for r in cells)])


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` atomically (a temp file renamed into place); NaN becomes null."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def parser_for(doc: str | None) -> argparse.ArgumentParser:
    """A bench script's argument parser, described by the first paragraph of its docstring."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)


def add_store_arguments(parser: argparse.ArgumentParser, postgres_help: str) -> None:
    """``--threads`` for the embedder and ``--backend`` (``postgres``: ``postgres_help``)."""
    parser.add_argument("--threads", type=int, default=None, help="embedder CPU threads (default: settings)")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite", help=postgres_help)


def params_of(args: argparse.Namespace) -> dict[str, Any]:
    """A run's parameters for its report: the command-line arguments but where the report and the
    config file are."""
    return {k: v for k, v in vars(args).items() if k not in {"out", "config"}}


def publish(report: dict[str, Any], out: str | None, show: Callable[[dict[str, Any]], None]) -> int:
    """Show ``report`` with ``show``, write it as JSON to ``out`` when given; the exit code (0)."""
    show(report)
    if out:
        write_json(out, report)
        print(f"wrote {out}")
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    return value


def now_iso() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


# --- machine ----------------------------------------------------------------------------------


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (``ru_maxrss`` is KiB on Linux)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":  # bytes there
        kib //= 1024
    return kib / 1024.0


def model_process_status(mem: Any) -> dict[str, float]:
    """The model's own process, when it runs in one (``embedder.runs_in``): its CPU seconds so far
    and its peak RSS (MiB), read from ``/proc``; zeros when the model runs in this process."""
    pid = getattr(mem.embedder, "model_pid", None)
    if pid is None:
        return {"cpu_s": 0.0, "peak_rss_mib": 0.0}
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as fh:
            peak = next((int(line.split()[1]) for line in fh if line.startswith("VmHWM:")), 0)
    except OSError:
        return {"cpu_s": 0.0, "peak_rss_mib": 0.0}
    ticks = os.sysconf("SC_CLK_TCK")
    # utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / ticks, "peak_rss_mib": peak / 1024}


def process_cpu_s(mem: Any) -> float:
    """CPU seconds of this process and of the model's own process, if it has one."""
    return time.process_time() + model_process_status(mem)["cpu_s"]


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for raw in Path("/proc/cpuinfo").read_text().splitlines():
            if raw.startswith("model name"):
                return raw.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for raw in Path("/proc/meminfo").read_text().splitlines():
            if raw.startswith("MemTotal:"):
                return round(int(raw.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def machine_info(settings: Settings | None = None) -> dict[str, Any]:
    """What ran the benchmark: CPUs, memory, Python and the versions of the libraries that matter."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {
            name: _version(name)
            for name in ("narrmem", "torch", "sentence-transformers", "faiss-cpu", "numpy", "bm25s")
        },
        # Thread and BLAS settings change the timings a lot on a small machine.
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }
    if settings is not None:
        info["embedder"] = settings.embedder.model_dump()
        info["storage_batch_size"] = settings.storage.batch_size
    return info


# --- one embedder for many memories -------------------------------------------------------------


class BorrowedEmbedder:
    """An embedder handed to a ``Memory`` that does not own it: ``close()`` leaves the model loaded."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    async def start(self) -> None:
        await self.inner.start()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await self.inner.embed(texts)

    async def close(self) -> None:
        """The owner closes ``inner`` once the run is over."""


class SharedEmbedderPlugin:
    """Registers the embedder backend ``bench-shared``, which returns the same loaded model to every
    ``Memory``. Everything else (triage, store, recall) stays the default plugins."""

    narrmem_name = "bench_shared_embedder"

    def __init__(self, embedder: BorrowedEmbedder) -> None:
        self.embedder = embedder

    @hookimpl
    def narrmem_register_embedders(self, register: Callable[[str, Callable[[Settings], Any]], None]) -> None:
        register(SHARED_BACKEND, lambda settings: self.embedder)


def default_embedder(settings: Settings) -> Embedder:
    """The embedder the built-in plugin of ``settings.embedder.backend`` would build."""
    built: dict[str, Callable[[Settings], Any]] = {}
    for module in (embedder_onnx, embedder_sentence_transformers):
        module.narrmem_register_embedders(register=built.__setitem__)
    backend = settings.embedder.backend
    if backend not in built:
        raise SystemExit(f"embedder.backend {backend!r} is not a built-in backend ({', '.join(built)})")
    embedder: Embedder = built[backend](settings)
    return embedder


async def start_shared_embedder(base: Settings) -> tuple[Embedder, SharedEmbedderPlugin, Settings]:
    """Load the model ``base`` names once: the loaded embedder (close it at the end), the plugin
    that lends it to every ``Memory``, and the settings that select it."""
    inner = default_embedder(base)
    await inner.start()
    return inner, SharedEmbedderPlugin(BorrowedEmbedder(inner)), with_shared_embedder(base)


def with_shared_embedder(settings: Settings) -> Settings:
    """The same settings with ``embedder.backend`` pointing at the shared embedder."""
    embedder = settings.embedder.model_copy(update={"backend": SHARED_BACKEND})
    return settings.model_copy(update={"embedder": embedder})


def with_threads(settings: Settings, threads: int | None) -> Settings:
    if threads is None:
        return settings
    embedder = settings.embedder.model_copy(update={"threads": threads})
    return settings.model_copy(update={"embedder": embedder})
