"""Configuration: one validated object from kwargs, env and a file; typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferscale_memory import ConfigError, MemoryConfig, MemoryEngine, ModelPreparationError


def test_precedence_kwargs_over_env_over_file(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"k": 3, "max_tokens": 50, "dtype": "bfloat16"}))
    monkeypatch.setenv("INFERSCALE_K", "7")
    monkeypatch.setenv("INFERSCALE_ENFORCE_EAGER", "true")
    config = MemoryConfig.load(path, max_tokens=64)
    assert (config.k, config.max_tokens, config.dtype, config.enforce_eager) == (
        7, 64, "bfloat16", True)


@pytest.mark.parametrize("values", [
    {"k": 0}, {"k": "many"}, {"k": True}, {"max_fact_tokens": -1}, {"kv_cache_gb": 0},
    {"gpu_memory_utilization": 1.5}, {"unknown_key": 1}, {"engine_args": "x"},
    {"enforce_eager": "perhaps"}, {"model": 5}, {"max_model_len": 8},
    {"index": "faiss"}, {"index": 1},
    {"qdrant_url": "http://qdrant:6333"},  # without index="qdrant"
    {"qdrant_path": "/srv/qdrant"}, {"qdrant_api_key": "k"},
    {"index": "qdrant", "qdrant_path": "/srv/qdrant", "qdrant_url": "http://qdrant:6333"},
    {"index": "qdrant", "qdrant_path": "/srv/qdrant", "qdrant_api_key": "k"},
    {"index": "qdrant", "qdrant_url": "qdrant:6333"}, {"index": "qdrant", "qdrant_path": ""},
    {"index": "qdrant", "qdrant_collection": "a/b"}, {"index": "qdrant", "qdrant_collection": ""},
    {"fact_order": "random"}, {"fact_order": 1}, {"recompute_tail": -1},
    {"recompute_tail": "two"}, {"recompute_tail": 1.5}, {"capture_context": -1},
    {"capture_context": 33}, {"kv_pool_gb": 0}, {"kv_host_pool_gb": -1},
    {"kv_host_pool_gb": "lots"}, {"kv_host_pool_gb": True},
])
def test_broken_values_raise_config_error(values: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        MemoryConfig.from_dict(values)


def test_broken_config_file_raises_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError):
        MemoryConfig.load(bad)
    with pytest.raises(ConfigError):
        MemoryConfig.load(tmp_path / "missing.json")
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError):
        MemoryConfig.load(bad)


def test_engine_with_broken_config_fails_before_starting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        MemoryEngine(k=-3, store_path=str(tmp_path / "m.sqlite"))
    with pytest.raises(ModelPreparationError):
        MemoryEngine(str(tmp_path / "no-such-model"), store_path=str(tmp_path / "m.sqlite"))
    assert not (tmp_path / "m.sqlite").exists()


def test_index_settings_from_env_and_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MemoryConfig.load().index == "exact"
    assert MemoryConfig.load(store_path="/srv/m.sqlite").resolved_qdrant_path is None
    qdrant = MemoryConfig.load(index="qdrant", store_path="/srv/m.sqlite")
    assert qdrant.resolved_qdrant_path == "/srv/m.sqlite.qdrant"  # one folder per store file
    assert qdrant.qdrant_collection == "inferscale_facts"
    memory = MemoryConfig.load(index="qdrant", store_path=":memory:")
    assert memory.resolved_qdrant_path == ":memory:"
    monkeypatch.setenv("INFERSCALE_INDEX", "qdrant")
    monkeypatch.setenv("INFERSCALE_QDRANT_URL", "https://qdrant.internal:6333")
    monkeypatch.setenv("INFERSCALE_QDRANT_API_KEY", "sk-qdrant")
    server = MemoryConfig.load()
    assert (server.index, server.qdrant_url, server.qdrant_api_key) == (
        "qdrant", "https://qdrant.internal:6333", "sk-qdrant")
    assert server.resolved_qdrant_path is None
    assert "sk-qdrant" not in repr(server)  # a secret stays out of logs
    with pytest.raises(ConfigError, match="not both"):
        MemoryConfig.load(qdrant_path="/srv/q")  # the env's url and a path


def test_quality_levers_from_env_and_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = MemoryConfig.load()
    # The quality-safe default of docs/quality.md (GPU, LoCoMo, two models).
    assert (defaults.fact_order, defaults.recompute_tail, defaults.capture_context) == (
        "rank", 4, 4)
    monkeypatch.setenv("INFERSCALE_FACT_ORDER", "time")
    monkeypatch.setenv("INFERSCALE_RECOMPUTE_TAIL", "2")
    monkeypatch.setenv("INFERSCALE_CAPTURE_CONTEXT", "3")
    config = MemoryConfig.load(recompute_tail=4)
    assert (config.fact_order, config.recompute_tail, config.capture_context) == ("time", 4, 3)
    with pytest.raises(ConfigError, match="recompute_tail"):
        MemoryConfig.load(recompute_tail=-2)
    assert defaults.capture_context_order == "added"
    monkeypatch.setenv("INFERSCALE_CAPTURE_CONTEXT_ORDER", "similarity")
    assert MemoryConfig.load().capture_context_order == "similarity"
    with pytest.raises(ConfigError, match="capture_context_order"):
        MemoryConfig.load(capture_context_order="recent")
    # capture_context_from was measured and removed (docs/quality.md): a setting that
    # still names it is refused, not silently ignored.
    with pytest.raises(ConfigError, match="capture_context_from"):
        MemoryConfig.load(capture_context_from="recent")


@pytest.mark.parametrize("cache_dtype", ["int8_per_token_head", "fp8_per_token_head",
                                         "fp8_inc", "nvfp4", "int8"])
def test_a_kv_cache_the_library_cannot_serve_is_refused_before_vllm_starts(
        cache_dtype: str, tmp_path: Path) -> None:
    # Per-token scales or packed elements: a moved key cannot be re-quantized in place.
    with pytest.raises(ConfigError, match=f"kv_cache_dtype='{cache_dtype}' is not supported"):
        MemoryConfig.load(engine_args={"kv_cache_dtype": cache_dtype})
    with pytest.raises(ConfigError, match="kv_cache_dtype='fp8'"):  # what to use instead
        MemoryEngine(store_path=str(tmp_path / "m.sqlite"),
                     engine_args={"kv_cache_dtype": cache_dtype})
    assert not (tmp_path / "m.sqlite").exists()  # refused before anything was opened


@pytest.mark.parametrize("cache_dtype", ["auto", "bfloat16", "float16", None, "fp8",
                                         "fp8_e4m3", "fp8_e5m2"])
def test_the_models_dtype_and_fp8_kv_caches_are_accepted(cache_dtype: str | None) -> None:
    config = MemoryConfig.load(engine_args={"kv_cache_dtype": cache_dtype})
    assert config.engine_args["kv_cache_dtype"] == cache_dtype


def test_replace_validates_like_a_new_config(tmp_path: Path) -> None:
    config = MemoryConfig.load(k=3, store_path=tmp_path / "m.sqlite")  # a path-like is kept as str
    assert config.store_path == str(tmp_path / "m.sqlite")
    changed = config.replace(fact_order="time", recompute_tail=0)
    assert (changed.k, changed.fact_order, changed.recompute_tail) == (3, "time", 0)
    assert (config.fact_order, config.recompute_tail) == ("rank", 4)  # the original stays
    with pytest.raises(ConfigError, match="fact_order"):
        config.replace(fact_order="random")
    with pytest.raises(ConfigError, match="unknown config keys"):
        config.replace(fact_ordr="time")
    with pytest.raises(ConfigError, match="not both"):  # the cross-field checks run too
        MemoryConfig.load(index="qdrant", qdrant_path="/srv/q").replace(qdrant_url="http://q")


def test_errors_name_the_field_however_the_config_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"capture_context: .*32; got 33"):
        MemoryConfig(capture_context=33)
    with pytest.raises(ConfigError, match="kv_pool_gb"):
        MemoryConfig.load(kv_pool_gb=True)
    monkeypatch.setenv("INFERSCALE_ENGINE_ARGS", '{"max_logprobs": 5}')
    assert MemoryConfig.load().engine_args == {"max_logprobs": 5}
    monkeypatch.setenv("INFERSCALE_MAX_TOKENS", "zero")
    with pytest.raises(ConfigError, match="max_tokens"):
        MemoryConfig.load()
    monkeypatch.setenv("INFERSCALE_ENGINE_ARGS", "{not json")
    with pytest.raises(ConfigError, match="INFERSCALE_"):
        MemoryConfig.load()


def test_schema_limits_merge_over_the_defaults_from_kwargs_env_and_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.schema_limits import SchemaLimits

    defaults = vars(SchemaLimits())
    assert MemoryConfig().schema_limits == defaults
    assert MemoryConfig(schema_limits={"properties": 5000}).schema_limits == {
        **defaults, "properties": 5000}
    monkeypatch.setenv("INFERSCALE_SCHEMA_LIMITS", '{"tools": 4}')
    assert MemoryConfig.load().schema_limits["tools"] == 4
    path = tmp_path / "config.json"
    path.write_text('{"schema_limits": {"depth": 8}}')
    monkeypatch.delenv("INFERSCALE_SCHEMA_LIMITS")
    assert MemoryConfig.load(path).schema_limits == {**defaults, "depth": 8}
    with pytest.raises(ConfigError, match=r"unknown schema_limits keys \['colour'\]; known "
                                          r"keys: \['schema_bytes', 'properties'"):
        MemoryConfig(schema_limits={"colour": 3})
    for bad in ({"properties": -1}, {"properties": True}, {"properties": "many"}, [5]):
        with pytest.raises(ConfigError, match="schema_limits"):
            MemoryConfig(schema_limits=bad)


def test_a_pool_that_cannot_fit_is_refused_before_the_engine_opens_anything(
        tmp_path: Path) -> None:
    # sizing.check_memory runs in MemoryEngine (and so in the server) before the store
    # opens and vLLM starts: a pool no machine of ours holds, on a CPU or a GPU.
    from inferscale_memory.bench.shapes import write_dummy_model

    folder = write_dummy_model(tmp_path / "model", "qwen2.5-0.5b")
    with pytest.raises(ConfigError, match=r"kv_pool_gb=100000\.0 does not fit"):
        MemoryEngine(str(folder), store_path=str(tmp_path / "m.sqlite"), kv_pool_gb=100000)
    assert not (tmp_path / "m.sqlite").exists()
