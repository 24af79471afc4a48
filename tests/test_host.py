"""The plugin host: loading (entry points, disabled plugins), async/sync dispatch, firstresult,
call order, and isolation of plugins that raise."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path
from typing import Any

import pytest
from _helpers import count_rows, msg

import narrmem
from narrmem import PluginError, TriageDecision, TriggerEvent, hookimpl
from narrmem.testing import open_memory

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
BUILTINS = {
    "storage_sqlite",
    "storage_postgres",
    "embedder_sentence_transformers",
    "embedder_onnx",
    "triage",
    "recall_hybrid",
    "recall_intent",
    "recall_facts",
    "core_tools",
    "hippocampus",
    "retention",
    "proactive",
    "soul_narrative",
    "rtm",
    "graph",
}


class ErrorRecorder:
    """Records every ``narrmem_plugin_error`` report."""

    narrmem_name = "error_recorder"

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, BaseException]] = []

    @hookimpl
    def narrmem_plugin_error(self, plugin_name: str, hook_name: str, error: BaseException) -> None:
        self.reports.append((plugin_name, hook_name, error))


class Raiser:
    """Raises in one named hook (sync or async), optionally only for messages containing ``marker``."""

    narrmem_name = "raiser"

    def __init__(self, hook: str, *, marker: str | None = None) -> None:
        self.hook = hook
        self.marker = marker

    def _maybe_raise(self, hook: str, message: Any = None) -> None:
        if hook != self.hook:
            return
        if self.marker is not None and (message is None or self.marker not in message.text):
            return
        raise RuntimeError(f"boom in {hook}")

    @hookimpl
    def narrmem_triage(self, message: Any) -> None:
        self._maybe_raise("narrmem_triage", message)

    @hookimpl
    async def narrmem_before_store(self, message: Any) -> None:
        await asyncio.sleep(0)
        self._maybe_raise("narrmem_before_store", message)

    @hookimpl
    def narrmem_after_store(self, message: Any) -> None:
        self._maybe_raise("narrmem_after_store", message)

    @hookimpl
    def narrmem_recall_candidates(self) -> None:
        self._maybe_raise("narrmem_recall_candidates")

    @hookimpl
    async def narrmem_recall_prefetch(self) -> None:
        self._maybe_raise("narrmem_recall_prefetch")

    @hookimpl
    def narrmem_after_recall(self) -> None:
        self._maybe_raise("narrmem_after_recall")


# --- loading ------------------------------------------------------------------------------------


async def test_every_builtin_entry_point_is_loaded(memory: narrmem.Memory) -> None:
    with PYPROJECT.open("rb") as fh:
        declared = set(tomllib.load(fh)["project"]["entry-points"]["narrmem"])
    assert declared == BUILTINS
    names = memory.host.plugin_names()
    assert declared <= set(names)
    # The built-ins contributed what they exist for.
    assert {"narrmem_ingest", "narrmem_recall", "soul_narrative"} <= set(memory.tools.names())
    stats = await memory.stats()
    assert declared <= set(stats["plugins"])


async def test_class_entry_points_are_instantiated_per_memory(memory_factory: Any) -> None:
    first = await memory_factory()
    second = await memory_factory()
    a = first.host.pm.get_plugin("triage")
    b = second.host.pm.get_plugin("triage")
    assert type(a).__name__ == "Triage"
    assert a is not b


async def test_disabled_builtin_is_not_loaded_and_fallback_keeps_everything(tmp_path: Path) -> None:
    config = tmp_path / "narrmem.toml"
    config.write_text('[plugins]\ndisabled = ["triage"]\n')
    async with open_memory(tmp_path / "m", config_file=config) as mem:
        assert "triage" not in mem.host.plugin_names()
        assert mem.host.pm.is_blocked("triage")
        result = await mem.ingest(msg("1", "ok"))
    assert result.stored is True
    assert result.layer == "accumulate"
    assert result.reason == "no triage plugin answered"
    assert count_rows(tmp_path / "m") == 1


async def test_disabled_builtin_via_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NARRMEM_PLUGINS__DISABLED", '["triage"]')
    async with open_memory(tmp_path / "m") as mem:
        assert "triage" not in mem.host.plugin_names()
        assert (await mem.ingest(msg("1", "ok"))).stored is True


async def test_disabled_builtin_via_open_memory_plugins_table(tmp_path: Path) -> None:
    """``open_memory(folder, plugins={"disabled": [...]})``: a dict is the ``[plugins]`` table."""
    folder = tmp_path / "m"
    async with open_memory(folder, plugins={"disabled": ["triage"]}) as mem:  # type: ignore[arg-type]
        names = mem.host.plugin_names()
        result = await mem.ingest(msg("1", "ok"))
    assert "triage" not in names
    assert not [n for n in names if n.startswith("builtins.")], f"a non-plugin object was registered: {names}"
    assert {"storage_sqlite", "recall_hybrid", "core_tools"} <= set(names)
    assert (result.stored, result.layer) == (True, "accumulate")
    assert count_rows(folder) == 1


async def test_disabled_third_party_plugin_object_is_not_registered(tmp_path: Path) -> None:
    calls: list[str] = []

    class IgnoreEverything:
        narrmem_name = "x"

        @hookimpl
        def narrmem_triage(self, message: Any) -> TriageDecision:
            calls.append(message.message_id)
            return TriageDecision(layer="ignore", reason="x says no")

    config = tmp_path / "narrmem.toml"
    config.write_text('[plugins]\ndisabled = ["x"]\n')
    async with open_memory(tmp_path / "m", config_file=config, plugins=[IgnoreEverything()]) as mem:
        assert "x" not in mem.host.plugin_names()
        result = await mem.ingest(msg("1", "a message worth keeping"))
    assert calls == []
    assert result.stored is True

    # The same object, not disabled, is registered under its narrmem_name and answers.
    async with open_memory(tmp_path / "m2", plugins=[IgnoreEverything()]) as mem:
        assert "x" in mem.host.plugin_names()
        result = await mem.ingest(msg("1", "a message worth keeping"))
    assert calls == ["1"]
    assert (result.stored, result.layer, result.reason) == (False, "ignore", "x says no")


async def test_error_in_setup_hook_aborts_open(tmp_path: Path) -> None:
    class BadStartup:
        narrmem_name = "bad_startup"

        @hookimpl
        async def narrmem_startup(self) -> None:
            raise RuntimeError("cannot start")

    with pytest.raises(PluginError, match="plugin 'bad_startup' failed in narrmem_startup") as info:
        await open_memory(tmp_path / "m", plugins=[BadStartup()])
    assert isinstance(info.value.__cause__, RuntimeError)  # the plugin's own error, kept
    assert "cannot start" in str(info.value)


async def test_unknown_embedder_backend_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(narrmem.ConfigError, match=r"embedder\.backend"):
        await open_memory(tmp_path / "m", embedder={"backend": "nope"})


# --- dispatch: sync and async, firstresult, order ----------------------------------------------


async def test_sync_and_async_hookimpls_both_run(memory_factory: Any) -> None:
    class SyncShaper:
        narrmem_name = "sync_shaper"

        @hookimpl
        def narrmem_before_store(self, records: list[narrmem.MemoryRecord]) -> None:
            records[0].meta["sync"] = True

    class AsyncShaper:
        narrmem_name = "async_shaper"

        @hookimpl
        async def narrmem_before_store(self, records: list[narrmem.MemoryRecord]) -> None:
            await asyncio.sleep(0)
            records[0].importance = 0.9
            records[0].meta["async"] = True

    mem = await memory_factory(plugins=[SyncShaper(), AsyncShaper()])
    result = await mem.ingest(msg("1", "the sky was purple this evening"))
    [memory_id] = result.memory_ids
    stored = (await mem.store.get([memory_id], None))[memory_id]
    assert stored.meta["sync"] is True
    assert stored.meta["async"] is True
    assert stored.importance == pytest.approx(0.9)
    assert not mem.host.errors


async def test_async_triage_decision_wins_over_default(memory_factory: Any) -> None:
    class AsyncTriage:
        narrmem_name = "async_triage"

        @hookimpl
        async def narrmem_triage(self, message: Any) -> TriageDecision | None:
            await asyncio.sleep(0)
            if "scene" in message.text:
                return TriageDecision(layer="scene", reason="async says scene", type="moment", importance=0.8)
            return None  # falls through to the default triage

    mem = await memory_factory(plugins=[AsyncTriage()])
    scene = await mem.ingest(msg("1", "this is a scene to remember"))
    assert (scene.layer, scene.reason, scene.stored) == ("scene", "async says scene", True)
    record = scene.records[0]  # the episode; the built-in composer adds the scene beside it
    assert record.kind == "episode" and record.importance == pytest.approx(0.8)
    assert record.meta["layer"] == "scene"
    assert [r.kind for r in scene.records] == ["episode", "scene"]

    plain = await mem.ingest(msg("2", "an ordinary remark about lunch"))
    assert (plain.layer, plain.reason) == ("accumulate", "says something about the user's world")
    # None from the async plugin fell through to the default, which still ignores acknowledgements.
    ack = await mem.ingest(msg("3", "ok"))
    assert (ack.layer, ack.reason, ack.stored) == ("ignore", "acknowledgement", False)


async def test_later_registered_plugin_runs_first_and_wins_firstresult(memory_factory: Any) -> None:
    order: list[str] = []

    def make(name: str, layer: str | None) -> object:
        class Plugin:
            narrmem_name = name

            @hookimpl
            async def narrmem_triage(self, message: Any) -> TriageDecision | None:
                order.append(name)
                await asyncio.sleep(0)
                return None if layer is None else TriageDecision(layer=layer, reason=name)  # type: ignore[arg-type]

            @hookimpl
            def narrmem_before_store(self, records: list[narrmem.MemoryRecord]) -> None:
                records[0].meta.setdefault("order", []).append(name)

        return Plugin()

    mem = await memory_factory(
        plugins=[make("first", "scene"), make("second", "accumulate"), make("third", None)]
    )
    result = await mem.ingest(msg("1", "which plugin decides this message"))
    # Later registered runs first: third (None, falls through), then second answers; first never runs.
    assert order == ["third", "second"]
    assert (result.layer, result.reason) == ("accumulate", "second")
    assert result.records[0].meta["order"] == ["third", "second", "first"]


async def test_hookimpl_receives_only_the_arguments_it_names(memory_factory: Any) -> None:
    seen: dict[str, Any] = {}

    class Minimal:
        narrmem_name = "minimal"

        @hookimpl
        def narrmem_after_store(self, result: narrmem.IngestResult) -> None:
            seen["result"] = result

    mem = await memory_factory(plugins=[Minimal()])
    result = await mem.ingest(msg("1", "minimal plugins still work"))
    assert seen["result"] is result


async def test_triggers_reach_hook_and_callback_even_if_one_listener_raises(memory_factory: Any) -> None:
    delivered: list[str] = []

    class Emitter:
        narrmem_name = "emitter"

        @hookimpl
        def narrmem_after_store(self, message: Any, result: narrmem.IngestResult) -> None:
            result.triggers.append(
                TriggerEvent(kind="topic", label="cats", count=3, user_id=message.user_id, message_ids=["1"])
            )
            # In the message's chat, with no cause of its own: the host names the message.
            result.triggers.append(
                TriggerEvent(
                    kind="topic", label="dogs", count=3, user_id=message.user_id, chat_id=message.chat_id
                )
            )

        @hookimpl
        def narrmem_on_trigger(self, event: TriggerEvent) -> None:
            raise RuntimeError("listener broke")

    class Listener:
        narrmem_name = "listener"

        @hookimpl
        async def narrmem_on_trigger(self, event: TriggerEvent) -> None:
            delivered.append(f"hook:{event.label}")

    async def callback(event: TriggerEvent) -> None:
        delivered.append(f"callback:{event.label}:{event.cause_message_id}")

    recorder = ErrorRecorder()
    mem = await memory_factory(plugins=[Emitter(), Listener(), recorder])
    mem.on_trigger(callback)
    result = await mem.ingest(msg("1", "my cats again"))
    assert result.stored
    assert [t.label for t in result.triggers] == ["cats", "dogs"]
    assert delivered == ["hook:cats", "callback:cats:None", "hook:dogs", "callback:dogs:1"]
    assert [(p, h) for p, h, _ in recorder.reports] == [("emitter", "narrmem_on_trigger")] * 2


# --- isolation of a raising plugin --------------------------------------------------------------


@pytest.mark.parametrize("hook", ["narrmem_triage", "narrmem_before_store", "narrmem_after_store"])
async def test_raising_plugin_does_not_lose_the_message(tmp_path: Path, hook: str) -> None:
    recorder = ErrorRecorder()
    folder = tmp_path / "m"
    async with open_memory(folder, plugins=[Raiser(hook), recorder]) as mem:
        result = await mem.ingest(msg("1", "I adopted a greyhound named Pixel"))
        hits = await mem.recall("greyhound Pixel", user_id="u1")
    assert result.stored is True
    assert result.layer == "accumulate"
    assert len(result.memory_ids) == 1
    assert count_rows(folder) == 1
    assert [h.message_ids for h in hits] == [["1"]]
    # Reported through the error hook, with the plugin's name and the hook ...
    assert [(p, h) for p, h, _ in recorder.reports] == [("raiser", hook)]
    assert isinstance(recorder.reports[0][2], RuntimeError)
    # ... and in the result's notes.
    assert len(result.notes) == 1
    assert "raiser" in result.notes[0] and hook in result.notes[0] and "boom" in result.notes[0]


@pytest.mark.parametrize("hook", ["narrmem_recall_candidates", "narrmem_recall_prefetch"])
async def test_raising_recall_source_still_returns_other_sources_hits(memory_factory: Any, hook: str) -> None:
    recorder = ErrorRecorder()
    mem = await memory_factory(plugins=[Raiser(hook), recorder])
    await mem.ingest(msg("1", "I adopted a greyhound named Pixel"))
    hits = await mem.recall("greyhound", user_id="u1")
    assert [h.message_ids for h in hits] == [["1"]]
    assert {"vector", "keyword"} <= set(hits[0].sources)  # the built-in sources both answered
    assert [(p, h) for p, h, _ in recorder.reports] == [("raiser", hook)]


async def test_vector_sources_run_while_the_early_sources_are_still_working(memory_factory: Any) -> None:
    """The query's vector and the sources that need it do not wait for the early (keyword) chain:
    an early source that waits for a vector source to have run is not a deadlock."""

    class Waiter:
        narrmem_name = "waiter"

        def __init__(self) -> None:
            self.vector_sources_ran = asyncio.Event()
            self.waited = False

        @hookimpl
        async def narrmem_recall_prefetch(self) -> list[Any]:
            await asyncio.wait_for(self.vector_sources_ran.wait(), timeout=10)
            self.waited = True
            return []

        @hookimpl
        def narrmem_recall_candidates(self) -> list[Any]:
            self.vector_sources_ran.set()
            return []

    waiter, recorder = Waiter(), ErrorRecorder()
    mem = await memory_factory(plugins=[waiter, recorder])
    await mem.ingest(msg("1", "I adopted a greyhound named Pixel"))
    hits = await mem.recall("greyhound", user_id="u1")
    assert waiter.waited and recorder.reports == []
    assert [h.message_ids for h in hits] == [["1"]]


async def test_raising_error_handler_is_contained(memory_factory: Any) -> None:
    class BrokenHandler:
        narrmem_name = "broken_handler"

        @hookimpl
        def narrmem_plugin_error(self) -> None:
            raise RuntimeError("the handler itself fails")

    recorder = ErrorRecorder()
    # Registered first, so it runs after the broken handler: a raising handler must not stop the others.
    mem = await memory_factory(plugins=[recorder, Raiser("narrmem_after_store"), BrokenHandler()])
    result = await mem.ingest(msg("1", "handlers that fail must not break ingest"))
    assert result.stored is True
    assert [(p, h) for p, h, _ in recorder.reports] == [("raiser", "narrmem_after_store")]


async def test_error_notes_belong_to_the_message_that_caused_them(memory_factory: Any) -> None:
    """In one ingest_many call, a before_store error caused by message 2 must be noted on message 2."""
    recorder = ErrorRecorder()
    mem = await memory_factory(plugins=[Raiser("narrmem_before_store", marker="explode"), recorder])
    first, second = await mem.ingest_many(
        [msg("1", "a perfectly normal message"), msg("2", "this one will explode the plugin")]
    )
    assert first.stored and second.stored
    assert [(p, h) for p, h, _ in recorder.reports] == [("raiser", "narrmem_before_store")]
    assert first.notes == [], f"message 1 got message 2's error: {first.notes}"
    assert len(second.notes) == 1 and "narrmem_before_store" in second.notes[0]


async def test_error_notes_do_not_leak_into_a_later_ingest(memory_factory: Any) -> None:
    """An error raised during recall must not show up as a note on the next, unrelated ingest."""
    mem = await memory_factory(plugins=[Raiser("narrmem_after_recall")])
    await mem.ingest(msg("1", "something to recall later"))
    await mem.recall("something", user_id="u1")
    later = await mem.ingest(msg("2", "a later message that nothing goes wrong with"))
    assert later.stored
    assert later.notes == [], f"a recall error was attributed to an unrelated message: {later.notes}"


class _TriageWrapper:
    narrmem_name = "triage_wrapper"

    @hookimpl(wrapper=True)
    def narrmem_triage(self, message: Any) -> Any:
        return (yield)


class _OldStyleWrapper:
    narrmem_name = "old_style_wrapper"

    @hookimpl(hookwrapper=True)
    def narrmem_after_store(self) -> Any:
        yield


@pytest.mark.parametrize("plugin", [_TriageWrapper(), _OldStyleWrapper()], ids=["wrapper", "hookwrapper"])
async def test_a_wrapper_hookimpl_is_refused_naming_plugin_and_hook(tmp_path: Path, plugin: Any) -> None:
    with pytest.raises(PluginError) as info:
        async with open_memory(tmp_path / "m", plugins=[plugin]):
            pass
    assert plugin.narrmem_name in str(info.value)
    assert ("narrmem_triage" if "triage" in plugin.narrmem_name else "narrmem_after_store") in str(info.value)


async def test_host_finds_a_plugin_by_class(tmp_path: Path) -> None:
    from narrmem_plugins.graph import GraphPlugin

    async with open_memory(tmp_path / "m") as mem:
        assert isinstance(mem.host.plugin(GraphPlugin), GraphPlugin)
        with pytest.raises(PluginError, match="_TriageWrapper"):
            mem.host.plugin(_TriageWrapper)


class _PinnedSource:
    """A third-party recall source that always proposes one memory first."""

    narrmem_name = "pinned_source"

    def __init__(self) -> None:
        self.memory_id = 0

    @hookimpl
    def narrmem_recall_prefetch(self) -> list[narrmem.Candidate]:
        return [narrmem.Candidate(memory_id=self.memory_id, source="pinned", rank=0, score=1.0)]


@pytest.mark.parametrize(("weight", "pinned_first"), [(5.0, True), (0.0, False)])
async def test_a_recall_source_takes_its_fusion_weight_from_settings(
    tmp_path: Path, weight: float, pinned_first: bool
) -> None:
    source = _PinnedSource()
    async with open_memory(tmp_path / "m", plugins=[source], recall={"weights": {"pinned": weight}}) as mem:
        await mem.ingest(msg("m1", "my garden tomatoes ripened early this year"))
        other = await mem.ingest(msg("m2", "the garden tomatoes and the garden beans"))
        source.memory_id = other.memory_ids[0]
        hits = await mem.recall("my garden tomatoes ripened early this year", user_id="u1", k=2)
    assert (hits[0].id == source.memory_id) is pinned_first


class WrongReturns:
    """Returns values of the wrong type from hooks whose contract names the type."""

    narrmem_name = "wrong_returns"

    @hookimpl
    def narrmem_recall_candidates(self) -> Any:
        return {"memory_id": 1, "score": 0.9}  # a dict where a list of Candidate is due

    @hookimpl
    def narrmem_weigh(self) -> Any:
        return {1: "very"}  # weights must be numbers

    @hookimpl
    def narrmem_triage(self) -> Any:
        return "store"  # a string where a TriageDecision is due


async def test_a_plugin_returning_the_wrong_type_is_named_and_skipped(memory_factory: Any) -> None:
    recorder = ErrorRecorder()
    mem = await memory_factory(plugins=[WrongReturns(), recorder])
    result = await mem.ingest(msg("1", "I adopted a greyhound named Pixel"))
    assert result.stored is True  # the built-in triage decided
    hits = await mem.recall("greyhound", user_id="u1")
    assert [h.message_ids for h in hits] == [["1"]]
    reported = {(p, h) for p, h, _ in recorder.reports}
    assert reported == {
        ("wrong_returns", "narrmem_triage"),
        ("wrong_returns", "narrmem_recall_candidates"),
        ("wrong_returns", "narrmem_weigh"),
    }
    errors = {h: e for _, h, e in recorder.reports}
    assert isinstance(errors["narrmem_recall_candidates"], PluginError)
    assert "returned dict from narrmem_recall_candidates" in str(errors["narrmem_recall_candidates"])
    assert "list[Candidate]" in str(errors["narrmem_recall_candidates"])
    assert "returned str from narrmem_triage" in str(errors["narrmem_triage"])


def test_declared_checks_follow_the_hook_contracts() -> None:
    from narrmem.hook_returns import declared_check
    from narrmem.models import Candidate

    candidates = declared_check("narrmem_recall_candidates")
    assert candidates is not None
    check, written = candidates
    assert written == "list[Candidate]"
    assert check([Candidate(memory_id=1, score=0.5, source="x", rank=0)]) and check([])
    assert not check({"memory_id": 1}) and not check([{"memory_id": 1}])
    weigh = declared_check("narrmem_weigh")
    assert weigh is not None
    assert weigh[0]({1: 0.5, 2: 1}) and not weigh[0]({1: "x"}) and not weigh[0]({1: True})
    rank = declared_check("narrmem_rank")
    assert rank is not None
    assert rank[0]([(1, 0.5)]) and not rank[0]([(1, 0.5, 3)]) and not rank[0]([1])
    assert declared_check("narrmem_after_store") is None  # returns nothing: nothing to check


async def test_a_failing_turn_context_plugin_is_named_not_called_missing(tmp_path: Path) -> None:
    from narrmem.config import load_settings
    from narrmem.testing import HASH_EMBEDDER, TestingPlugin

    class FailingContext:
        narrmem_name = "failing_context"

        @hookimpl
        def narrmem_turn_context(self) -> None:
            raise RuntimeError("the facts table is locked")

    settings = load_settings(
        None, data_dir=str(tmp_path), embedder={"backend": HASH_EMBEDDER}, plugins={"disabled": ["graph"]}
    )
    plugins = [TestingPlugin(), FailingContext()]
    async with narrmem.Memory.open(settings=settings, plugins=plugins, load_entrypoints=False) as mem:
        with pytest.raises(PluginError) as refused:
            await mem.turn_context("how is my dog?", user_id="u1", chat_id="c1")
    assert "plugin 'failing_context' failed in narrmem_turn_context" in str(refused.value)
    assert "the facts table is locked" in str(refused.value) and "disabled" not in str(refused.value)


class _Misspelt:
    @hookimpl
    def narrmem_after_forgot(self) -> None:  # no such hook
        pass


async def test_a_plugin_added_to_an_open_memory_is_checked_as_at_load(tmp_path: Path) -> None:
    class Heard:
        def __init__(self) -> None:
            self.forgets: list[str | None] = []

        @hookimpl
        def narrmem_after_forget(self, user_id: str | None) -> None:
            self.forgets.append(user_id)

    async with open_memory(tmp_path / "m") as mem:
        before = mem.host.plugin_names()
        for refused in (_Misspelt(), _TriageWrapper()):
            with pytest.raises(PluginError):
                mem.host.register(refused, name="late")
            assert mem.host.plugin_names() == before  # nothing added
        heard = Heard()
        mem.host.register(heard, name="late")
        with pytest.raises(PluginError, match="already registered"):
            mem.host.register(Heard(), name="late")
        await mem.ingest(msg("m1", "I live in Lisbon", user="ann"))
        await mem.forget(user_id="ann")
    assert heard.forgets == ["ann"]
