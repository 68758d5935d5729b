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
