"""Settings: TOML, environment and explicit values; every unknown key in a file is an error that names it,
an unknown NARRMEM_ variable a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from _helpers import msg
from narrmem_plugins.recall_hybrid import HybridOptions

from narrmem import ConfigError, load_settings, plugin_options
from narrmem.config import Settings
from narrmem.testing import open_memory


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "narrmem.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults() -> None:
    settings = load_settings()
    assert settings.storage.batch_size == 256
    assert settings.embedder.backend == "onnx"
    assert settings.plugins.disabled == []


def test_toml_values_are_read(tmp_path: Path) -> None:
    path = _toml(tmp_path, 'data_dir = "somewhere"\n[storage]\nbatch_size = 3\n[embedder]\nthreads = 2\n')
    settings = load_settings(path)
    assert settings.data_dir == "somewhere"
    assert settings.storage.batch_size == 3
    assert settings.embedder.threads == 2


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('datadir = "x"\n', "datadir"),
        ("[storage]\nbatchsize = 5\n", "storage.batchsize"),
        ("[embedder]\nmodel = 'x'\n", "embedder.model"),
        ("[plugins]\ndisable = ['x']\n", "plugins.disable"),
        ("[storag]\nbatch_size = 5\n", "storag"),
    ],
)
def test_unknown_toml_key_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert key in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[storage]\nbatch_size = 0\n", "storage.batch_size"),
        ("[storage]\nbatch_size = 'lots'\n", "storage.batch_size"),
        ("[embedder]\ndevice = 'tpu'\n", "embedder.device"),
    ],
)
def test_bad_toml_value_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(_toml(tmp_path, text))


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(_toml(tmp_path, "[storage\nbatch_size = 3\n"))


def test_bad_environment_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NARRMEM_STORAGE__BATCH_SIZE", "abc")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "storage.batch_size" in str(info.value)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("NARRMEM_BOGUS", "not a setting"),
        ("NARRMEM_URL", "not a setting"),
        ("NARRMEM_DATADIR", "did you mean NARRMEM_DATA_DIR"),
        ("NARRMEM_STORAGES__BATCH_SIZE", "did you mean NARRMEM_STORAGE"),
        ("NARRMEM_STORAGE__BATCHSIZE", "did you mean NARRMEM_STORAGE__BATCH_SIZE"),
        ("NARRMEM_STORAGE", "set one key at a time"),
        ("NARRMEM_DATA_DIR__X", "data_dir has no keys"),
        ("NARRMEM_PLUGIN__GRAPH", "NARRMEM_PLUGIN__<NAME>__<KEY>"),
        # Read before 2026-12-06: a table's entry set, and a number's failing with no variable named.
        ("NARRMEM_STORAGE__BATCH_SIZE__NOTE", "a key is set whole"),
        ("NARRMEM_RECALL__WEIGHTS__VECTOR", "a key is set whole: NARRMEM_RECALL__WEIGHTS"),
    ],
)
def test_unknown_environment_variables_warn_and_are_not_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str, words: str
) -> None:
    """A variable of someone's own script that shares our prefix must not stop narrmem: it is
    named in a warning and ignored, and the settings stay the defaults."""
    value = '{"batch_size": 3}' if name == "NARRMEM_STORAGE" else "3"
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="narrmem.config"):
        settings = load_settings()
    assert settings.model_dump() == Settings().model_dump()
    [warning] = [r.getMessage() for r in caplog.records]
    assert name in warning and words in warning, warning


def test_documented_environment_forms_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NARRMEM_DATA_DIR", "/srv/memory")
    monkeypatch.setenv("NARRMEM_STORAGE__BATCH_SIZE", "3")
    monkeypatch.setenv("NARRMEM_RECALL__WEIGHTS", '{"vector": 0.5}')
    monkeypatch.setenv("NARRMEM_PLUGIN__GRAPH__AUTO_TASKS", "true")
    settings = load_settings()
    assert (settings.data_dir, settings.storage.batch_size) == ("/srv/memory", 3)
    assert settings.recall.weights == {"vector": 0.5}
    assert settings.plugin["graph"]["auto_tasks"] == "true"


async def test_a_misspelt_disabled_plugin_names_the_known_ones(tmp_path: Path) -> None:
    config = _toml(tmp_path, '[plugins]\ndisabled = ["triag"]\n')
    with pytest.raises(ConfigError) as caught:
        async with open_memory(tmp_path / "m", config_file=config):
            pass
    message = str(caught.value)
    assert "plugins.disabled" in message and "'triag'" in message
    assert "triage" in message and "graph" in message and "rtm" in message


def test_precedence_explicit_over_environment_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _toml(tmp_path, "[storage]\nbatch_size = 3\nbusy_timeout_ms = 10\n")
    assert load_settings(path).storage.batch_size == 3
    monkeypatch.setenv("NARRMEM_STORAGE__BATCH_SIZE", "7")
    settings = load_settings(path)
    assert settings.storage.batch_size == 7
    assert settings.storage.busy_timeout_ms == 10  # the file's other keys survive the merge
    assert load_settings(path, storage={"batch_size": 9}).storage.batch_size == 9


async def test_unknown_plugin_table_is_an_error(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[plugin.nope]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"plugin\.nope"):
        await open_memory(tmp_path / "m", config_file=path)


async def test_table_of_a_disabled_plugin_is_ignored(tmp_path: Path) -> None:
    """Disabling a plugin keeps its settings for when it is enabled again (the example config's
    own advice failed to open)."""
    path = _toml(
        tmp_path, '[plugins]\ndisabled = ["recall_hybrid"]\n[plugin.recall_hybrid]\ncandidates = 5\n'
    )
    async with await open_memory(tmp_path / "m", config_file=path) as memory:
        assert "recall_hybrid" not in memory.host.plugin_names()


async def test_unknown_key_in_a_plugin_table_names_it(tmp_path: Path) -> None:
    path = _toml(tmp_path, "[plugin.recall_hybrid]\ncandidate = 5\n")
    with pytest.raises(ConfigError, match=r"plugin\.recall_hybrid\.candidate"):
        await open_memory(tmp_path / "m", config_file=path)
    path = _toml(tmp_path, "[plugin.triage]\nmin_chars = -1\n")
    with pytest.raises(ConfigError, match=r"plugin\.triage\.min_chars"):
        await open_memory(tmp_path / "m2", config_file=path)


def test_plugin_options_helper(tmp_path: Path) -> None:
    settings = load_settings(_toml(tmp_path, "[plugin.recall_hybrid]\ncandidates = 7\nrrf_k = 10\n"))
    options = plugin_options(settings, "recall_hybrid", HybridOptions)
    assert (options.candidates, options.rrf_k) == (7, 10.0)
    assert plugin_options(settings, "absent", HybridOptions) == HybridOptions()


async def test_plugin_options_take_effect(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[plugin.triage]\nextra_acknowledgements = ["Roger that"]\nmin_chars = 6\n')
    async with open_memory(tmp_path / "m", config_file=path) as mem:
        roger = await mem.ingest(msg("1", "roger that!"))
        short = await mem.ingest(msg("2", "hey u"))
        kept = await mem.ingest(msg("3", "roger that, see you at the harbour"))
    assert (roger.layer, roger.reason) == ("ignore", "acknowledgement")
    assert (short.layer, short.reason) == ("ignore", "too short")
    assert kept.stored


async def test_batch_size_setting_controls_write_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NARRMEM_STORAGE__BATCH_SIZE", "2")
    chunks: list[int] = []
    async with open_memory(tmp_path / "m") as mem:
        assert mem.settings.storage.batch_size == 2
        results = await mem.ingest_many(
            [msg(str(i), f"message number {i} about sailing") for i in range(5)], progress=chunks.append
        )
    assert chunks == [2, 2, 1]
    assert all(r.stored for r in results)


def test_example_config_documents_every_key_with_its_default() -> None:
    import tomllib

    from narrmem_plugins.recall_hybrid import HybridOptions
    from narrmem_plugins.triage.options import TriageOptions

    from narrmem.config import EmbedderSettings, McpSettings, PluginsSettings, StorageSettings

    path = Path(__file__).parent.parent / "config.example.toml"
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    sections = {
        "storage": StorageSettings,
        "embedder": EmbedderSettings,
        "plugins": PluginsSettings,
        "mcp": McpSettings,
    }
    for name, model in sections.items():
        commented = {"embedder": {"model_path", "cache_dir"}, "storage": {"dsn"}}
        documented = set(raw[name]) | commented.get(name, set())
        assert documented == set(model.model_fields), name
        assert model.model_validate(raw[name]) == model(), name
    from narrmem_plugins.graph.options import GraphOptions
    from narrmem_plugins.hippocampus import HippocampusOptions
    from narrmem_plugins.proactive import ProactiveOptions
    from narrmem_plugins.recall_facts import FactsOptions
    from narrmem_plugins.recall_intent import IntentOptions
    from narrmem_plugins.retention import RetentionOptions
    from narrmem_plugins.rtm.options import RTMOptions

    plugins = {
        "triage": TriageOptions,
        "recall_hybrid": HybridOptions,
        "recall_intent": IntentOptions,
        "recall_facts": FactsOptions,
        "hippocampus": HippocampusOptions,
        "retention": RetentionOptions,
        "proactive": ProactiveOptions,
        "rtm": RTMOptions,
        "graph": GraphOptions,
    }
    assert set(raw["plugin"]) == set(plugins)
    load_settings(path)  # the whole file loads
    for name, model in plugins.items():
        assert set(raw["plugin"][name]) == set(model.model_fields), name
        assert model.model_validate(raw["plugin"][name]) == model(), name
