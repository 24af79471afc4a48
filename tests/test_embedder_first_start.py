"""A machine's first start of the ``onnx`` embedder: several processes may start at once on one
cache, a start may be killed mid-export, the cache may be read-only, a cached file may be damaged,
and the model folder may be short of a file. Each ends in a working model or a clear error naming
the setting, never in another process's half-written file, and leaves no store behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from narrmem_plugins.embedder_onnx import (
    STALE_PARTIAL_S,
    OnnxEmbedder,
    export,
    partial_file,
    quantize_weights,
)

from narrmem.doors import cli
from narrmem.embed import packaged_model_path
from narrmem.errors import ConfigError

pytestmark = pytest.mark.slow

FIRST_START = """
import asyncio, sys
from pathlib import Path
from narrmem_plugins.embedder_onnx import OnnxEmbedder


async def main():
    embedder = OnnxEmbedder(None, Path(sys.argv[1]), quantize="int7")
    [vector] = await embedder.embed(["I adopted a greyhound named Pixel"])
    await embedder.close()
    print(round(float(vector @ vector), 3))


asyncio.run(main())
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 export, made once for the tests that quantize it."""
    target = tmp_path_factory.mktemp("export") / "model.onnx"
    export(packaged_model_path(), target)
    return target


def test_three_first_starts_at_once_all_get_the_model(tmp_path: Path) -> None:
    """The quantization wrote onnxruntime's "-inferred" copy of the model beside it, under one
    name for every process, and deleted it: of first starts at once, some read another's
    half-written copy ("Failed to find proper ai.onnx domain") or found it gone."""
    starts = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_START, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for start in starts:
        out, err = start.communicate(timeout=600)
        assert start.returncode == 0, err
        assert out.split() == ["1.0"]
    names = sorted(p.name for p in (tmp_path / "onnx").iterdir())
    assert len(names) == 2 and any(n.endswith("-int7.onnx") for n in names), names  # nothing else stays


def test_the_quantization_leaves_a_file_beside_the_model_alone(tmp_path: Path, exported: Path) -> None:
    source = tmp_path / "model.onnx"
    shutil.copy(exported, source)
    theirs = tmp_path / "model-inferred.onnx"  # the name onnxruntime's copy took
    theirs.write_text("someone's own file", encoding="utf-8")
    quantize_weights(source, tmp_path / "model-int7.onnx", seven_bit=True)
    assert theirs.read_text(encoding="utf-8") == "someone's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model-inferred.onnx",
        "model-int7.onnx",
        "model.onnx",
    ]


def test_partial_files_are_unique_and_never_stay(tmp_path: Path) -> None:
    """Named by the process id, two first starts in two containers sharing the cache (each process
    1) wrote one file; a failed or killed export left its partial file for good."""
    target = tmp_path / "model.onnx"
    with partial_file(target) as one, partial_file(target) as two:
        assert one != two and one.exists() and two.exists()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError), partial_file(target) as failed:
        failed.write_text("half", encoding="utf-8")
        raise RuntimeError("the export failed")
    assert list(tmp_path.iterdir()) == []
    killed, recent = tmp_path / "model.onnx.a1b2.partial", tmp_path / "model.onnx.c3d4.partial"
    for left in (killed, recent):
        left.write_text("half", encoding="utf-8")
    old = time.time() - STALE_PARTIAL_S - 60
    os.utime(killed, (old, old))
    with partial_file(target):
        pass
    # The killed process's file goes; a file another start is writing now stays.
    assert sorted(tmp_path.iterdir()) == [recent]


def test_a_quantization_that_fails_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(b"not a model")
    with pytest.raises(Exception):  # noqa: B017 - onnx's own error for a file that is not a model
        quantize_weights(source, tmp_path / "model-int7.onnx", seven_bit=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_model_folder_short_of_a_file_is_named(tmp_path: Path, missing: str) -> None:
    """It was blamed on embedder.cache_dir, or (no tokenizer) an internal error after the export."""
    folder = tmp_path / "model"
    shutil.copytree(packaged_model_path(), folder)
    (folder / missing).unlink()
    with pytest.raises(ConfigError, match=f"embedder.model_path: .* has no {missing}"):
        OnnxEmbedder(str(folder), tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def _demo(data: Path, cache: Path, capsys: pytest.CaptureFixture[str], *more: str) -> tuple[int, str]:
    os.environ["NARRMEM_EMBEDDER__CACHE_DIR"] = str(cache)
    try:
        code = cli.main(["demo", "--data", str(data), *more])
    finally:
        del os.environ["NARRMEM_EMBEDDER__CACHE_DIR"]
    return code, capsys.readouterr().err


def test_a_cache_the_first_start_cannot_write_leaves_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The error named the cache, and the store it had made meanwhile refused the next try."""
    unwritable = Path("/sys/narrmem-cache")  # refused to anyone, root included
    code, err = _demo(tmp_path / "data", unwritable, capsys)
    assert code == 2 and "embedder.cache_dir" in err and str(unwritable / "onnx") in err, err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("runs_in", ["thread", "process"])
def test_a_damaged_cached_model_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], runs_in: str
) -> None:
    cache = tmp_path / "cache"
    embedder = OnnxEmbedder(None, cache, quantize="int7")
    damaged = embedder.model_file()
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"\x08\x07cut short")
    embedder.model_file("none").write_bytes(b"\x08\x07cut short")
    os.environ["NARRMEM_EMBEDDER__RUNS_IN"] = runs_in
    try:
        code, err = _demo(tmp_path / "data", cache, capsys)
    finally:
        del os.environ["NARRMEM_EMBEDDER__RUNS_IN"]
    assert code == 2, err
    assert str(damaged) in err and "delete it" in err, err
    assert damaged.read_bytes() == b"\x08\x07cut short"  # not narrmem's to remove unasked


@pytest.mark.parametrize(
    ("command", "module", "extra"), [("mcp", "mcp", "mcp"), ("serve", "uvicorn", "server")]
)
def test_a_command_whose_extra_is_not_installed_names_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    module: str,
    extra: str,
) -> None:
    """A traceback, and for ``mcp`` a new store made before it."""
    monkeypatch.setitem(sys.modules, module, None)  # importing it now fails, as without the extra
    code = cli.main([command, "--data", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2 and f"pip install 'narrmem[{extra}]'" in err, err
    assert not (tmp_path / "data").exists()
