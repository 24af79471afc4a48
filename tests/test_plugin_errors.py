"""A plugin that misbehaves is named: a name two plugins claim, a hook that raises while a memory
opens or exports, a registration pluggy refuses, a ranker that ranks what it was not given, a
tool that clashes, raises or answers out of shape. Each is a narrmem error saying which plugin,
where each used to be a bare ``ValueError``, a pluggy error, a silent skip or an empty recall."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _helpers import msg
from pydantic import BaseModel, ConfigDict

import narrmem
from narrmem import ConfigError, InputError, PluginError, hookimpl
from narrmem.config import load_settings
from narrmem.testing import TestingPlugin, open_memory
from narrmem.tools import Tool

EXAMPLE_CONFIG = Path(__file__).parent.parent / "config.example.toml"

# --- names claimed twice --------------------------------------------------------------------------


class Distributions:
    """Installs distributions the way pip leaves them (a dist-info folder with entry points), in a
    site folder first on ``sys.path``, as importlib.metadata sees a real install."""

    def __init__(self, site: Path) -> None:
        self.site = site
        self.modules: list[str] = []

    def install(self, distribution: str, module: str, entry_point: str) -> None:
        (self.site / f"{module}.py").write_text(
            "from narrmem import hookimpl\n\n"
            "class Plugin:\n"
            "    @hookimpl\n"
            "    def narrmem_stats(self):\n"
            f"        return {{{module!r}: 1}}\n"
        )
        info = self.site / f"{distribution}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[narrmem]\n{entry_point} = {module}:Plugin\n")
        self.modules.append(module)


@pytest.fixture
def distributions(tmp_path: Path) -> Iterator[Distributions]:
    site = tmp_path / "site"
    site.mkdir()
    installed = Distributions(site)
    sys.path.insert(0, str(site))
    try:
        yield installed
    finally:
        sys.path.remove(str(site))
        for module in installed.modules:
            sys.modules.pop(module, None)


def _open_with_entry_points(folder: Path, **overrides: Any) -> Any:
    settings = load_settings(None, data_dir=str(folder), embedder={"backend": "hash"}, **overrides)
    return narrmem.Memory.open(settings=settings, plugins=[TestingPlugin()], load_entrypoints=True)


async def test_two_distributions_claiming_one_plugin_name_is_an_error_naming_both(
    distributions: Distributions, tmp_path: Path
) -> None:
    """The second used to replace the first without a word (sorted by name, then the first won)."""
    distributions.install("first-dist", "first_mod", "shared_name")
    distributions.install("second-dist", "second_mod", "shared_name")
    with pytest.raises(PluginError, match="'shared_name' is claimed twice") as info:
        async with _open_with_entry_points(tmp_path / "m"):
            pass
    assert "first-dist" in str(info.value) and "second-dist" in str(info.value)


async def test_a_third_party_plugin_named_like_a_builtin_is_an_error_naming_both(
    distributions: Distributions, tmp_path: Path
) -> None:
    """It used to be skipped: the author's triage never ran, and nothing said so."""
    distributions.install("my-triage", "my_triage", "triage")
    with pytest.raises(PluginError, match="'triage' is claimed twice") as info:
        async with _open_with_entry_points(tmp_path / "m"):
            pass
    assert "'narrmem'" in str(info.value) and "my-triage" in str(info.value)


async def test_a_name_claimed_twice_and_disabled_loads_neither(
    distributions: Distributions, tmp_path: Path
) -> None:
    distributions.install("first-dist", "first_mod", "shared_name")
    distributions.install("second-dist", "second_mod", "shared_name")
    async with _open_with_entry_points(tmp_path / "m", plugins={"disabled": ["shared_name"]}) as mem:
        assert "shared_name" not in mem.host.plugin_names()


class _Named:
    def __init__(self, name: str) -> None:
        self.narrmem_name = name

    @hookimpl
    def narrmem_stats(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("taken", ["triage", "twice"])
async def test_a_plugin_object_under_a_taken_name_is_a_plugin_error(tmp_path: Path, taken: str) -> None:
    """Was pluggy's bare ``ValueError``."""
    plugins = [_Named(taken)] if taken == "triage" else [_Named(taken), _Named(taken)]
    with pytest.raises(PluginError, match=f"'{taken}' is claimed twice"):
        async with open_memory(tmp_path / "m", plugins=plugins):
            pass


# --- set-up, registration and export errors --------------------------------------------------------


class _RaisesIn:
    narrmem_name = "raises_in"

    def __init__(self, hook: str, error: Exception) -> None:
        self.hook = hook
        self.error = error

    def _maybe(self, hook: str) -> None:
        if hook == self.hook:
            raise self.error

    @hookimpl
    def narrmem_configure(self) -> None:
        self._maybe("narrmem_configure")

    @hookimpl
    async def narrmem_startup(self) -> None:
        self._maybe("narrmem_startup")

    @hookimpl
    def narrmem_export_records(self) -> None:
        self._maybe("narrmem_export_records")


@pytest.mark.parametrize("hook", ["narrmem_configure", "narrmem_startup"])
async def test_a_setup_hook_that_raises_is_a_plugin_error_naming_plugin_and_hook(
    tmp_path: Path, hook: str
) -> None:
    with pytest.raises(PluginError, match=f"plugin 'raises_in' failed in {hook}: ValueError") as info:
        async with open_memory(tmp_path / "m", plugins=[_RaisesIn(hook, ValueError("bad"))]):
            pass
    assert isinstance(info.value.__cause__, ValueError)


async def test_a_narrmem_error_from_a_setup_hook_passes_unchanged(tmp_path: Path) -> None:
    refusal = ConfigError("plugin.raises_in.colour: not a colour")
    with pytest.raises(ConfigError) as info:
        async with open_memory(tmp_path / "m", plugins=[_RaisesIn("narrmem_configure", refusal)]):
            pass
    assert info.value is refusal


async def test_an_export_hook_that_raises_is_a_plugin_error_naming_it(tmp_path: Path) -> None:
    """Export and import call their hooks unisolated (a file without a plugin's part is worse than
    none): the error reaches the caller, now naming the plugin."""
    async with open_memory(
        tmp_path / "m", plugins=[_RaisesIn("narrmem_export_records", OSError("disk"))]
    ) as mem:
        with pytest.raises(PluginError, match="plugin 'raises_in' failed in narrmem_export_records"):
            await mem.host.call("narrmem_export_records", isolate=False, memory=mem)
        with pytest.raises(PluginError, match="plugin 'raises_in' failed in narrmem_export_records"):
            await mem.host.call_named("narrmem_export_records", isolate=False, memory=mem)


class _UnknownArgument:
    narrmem_name = "unknown_argument"

    @hookimpl
    def narrmem_stats(self, memroy: Any) -> None:  # misspelt: the hook has no such argument
        pass


async def test_a_hookimpl_with_an_argument_its_hook_lacks_is_a_plugin_error(tmp_path: Path) -> None:
    """Was pluggy's own ``PluginValidationError``, which a caller catching narrmem errors missed."""
    with pytest.raises(PluginError, match="plugin 'unknown_argument' cannot be registered") as info:
        async with open_memory(tmp_path / "m", plugins=[_UnknownArgument()]):
            pass
    assert "memroy" in str(info.value)


# --- a ranker's strays ---------------------------------------------------------------------------


class _StrayRanker:
    """Ranks an id no source proposed first, then the candidates as the sources ranked them."""

    narrmem_name = "stray_ranker"

    @hookimpl(tryfirst=True)
    def narrmem_rank(self, candidates: list[Any]) -> list[tuple[int, float]]:
        ids = list(dict.fromkeys(c.memory_id for c in candidates))
        return [(987_654, 1.0)] + [(mid, 0.9 - i * 0.01) for i, mid in enumerate(ids)]


class _ErrorRecorder:
    narrmem_name = "error_recorder"

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, BaseException]] = []

    @hookimpl
    def narrmem_plugin_error(self, plugin_name: str, hook_name: str, error: BaseException) -> None:
        self.reports.append((plugin_name, hook_name, error))


async def test_a_ranked_id_that_is_no_candidate_is_skipped_and_its_ranker_reported(tmp_path: Path) -> None:
    """One made-up id first used to end the hits before they began: an empty recall, no report."""
    recorder = _ErrorRecorder()
    async with open_memory(tmp_path / "m", plugins=[_StrayRanker(), recorder]) as mem:
        await mem.ingest(msg("m1", "I adopted a cat named Pixel"))
        await mem.ingest(msg("m2", "my cat Pixel is grey"))
        hits = await mem.recall("what is my cat called?", user_id="u1")
    assert hits, "the candidates the ranker ranked are still recalled"
    assert {hit.text for hit in hits} <= {"I adopted a cat named Pixel", "my cat Pixel is grey"}
    [(plugin, hook, error)] = recorder.reports
    assert (plugin, hook) == ("stray_ranker", "narrmem_rank")
    assert isinstance(error, PluginError) and "987654" in str(error)


# --- a disabled plugin's table ------------------------------------------------------------------------


async def test_the_example_config_opens_with_a_plugin_it_has_a_table_for_disabled(tmp_path: Path) -> None:
    """config.example.toml's own comment suggests ``disabled = ["recall_hybrid"]``; its
    ``[plugin.recall_hybrid]`` table then failed the open as a table of no loaded plugin."""
    async with open_memory(
        tmp_path / "m", config_file=EXAMPLE_CONFIG, plugins={"disabled": ["recall_hybrid"]}
    ) as mem:
        assert "recall_hybrid" not in mem.host.plugin_names()
        assert (await mem.ingest(msg("m1", "I adopted a cat named Pixel"))).stored


async def test_a_table_of_a_plugin_neither_loaded_nor_disabled_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"plugin\.recal_hybrid: no plugin of that name"):
        async with open_memory(
            tmp_path / "m", plugins={"disabled": ["recall_hybrid"]}, plugin={"recal_hybrid": {}}
        ):
            pass


# --- tools ----------------------------------------------------------------------------------------------


class EchoInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    word: str


class EchoOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int


def _tool(name: str, handler: Callable[[Any, EchoInput], Any]) -> Tool:
    return Tool(
        name=name, description="test", input_model=EchoInput, output_model=EchoOutput, handler=handler
    )


class _Tools:
    def __init__(self, name: str, tools: list[Tool]) -> None:
        self.narrmem_name = name
        self.tools = tools

    @hookimpl
    def narrmem_register_tools(self, register: Callable[[Tool], None]) -> None:
        for tool in self.tools:
            register(tool)


async def _counted(memory: Any, args: EchoInput) -> EchoOutput:
    return EchoOutput(count=len(args.word))


async def test_a_tool_name_registered_by_two_plugins_names_both(tmp_path: Path) -> None:
    plugins = [_Tools("one", [_tool("echo", _counted)]), _Tools("two", [_tool("echo", _counted)])]
    with pytest.raises(PluginError, match="tool 'echo' is registered twice") as info:
        async with open_memory(tmp_path / "m", plugins=plugins):
            pass
    assert "plugin 'one'" in str(info.value) and "plugin 'two'" in str(info.value)


async def _raises(memory: Any, args: EchoInput) -> EchoOutput:
    raise KeyError("count")


async def _refuses(memory: Any, args: EchoInput) -> EchoOutput:
    raise InputError("not a word I know", field="word")


async def _out_of_shape(memory: Any, args: EchoInput) -> dict[str, Any]:
    return {"count": "many"}


async def test_a_tool_that_fails_is_a_plugin_error_naming_tool_and_plugin(tmp_path: Path) -> None:
    tools = [_tool("raises", _raises), _tool("refuses", _refuses), _tool("out_of_shape", _out_of_shape)]
    async with open_memory(
        tmp_path / "m", plugins=[_Tools("mine", [*tools, _tool("echo", _counted)])]
    ) as mem:
        with pytest.raises(PluginError, match=r"tool 'raises' \(plugin 'mine'\) failed: KeyError") as info:
            await mem.call_tool("raises", {"word": "x"})
        assert isinstance(info.value.__cause__, KeyError)
        with pytest.raises(PluginError, match=r"tool 'out_of_shape' \(plugin 'mine'\) returned a dict"):
            await mem.call_tool("out_of_shape", {"word": "x"})
        # A tool's own refusal, and a caller's bad arguments, stay InputErrors (HTTP 422).
        with pytest.raises(InputError, match="not a word I know"):
            await mem.call_tool("refuses", {"word": "x"})
        with pytest.raises(InputError, match="word"):
            await mem.call_tool("echo", {"word": 5})
        assert await mem.call_tool("echo", {"word": "four"}) == {"count": 4}
