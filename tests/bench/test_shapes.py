"""``bench synthetic``'s model shapes, KV cache dtypes and sweeps, without an engine: the
model folders vLLM would load, the pool's facts per GiB, the command line, and the errors
that stop a run before vLLM starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferscale_memory.bench.shapes import SHAPES, write_dummy_model, write_random_model
from inferscale_memory.bench.sweep import format_sweep, run_sweep
from inferscale_memory.bench.synthetic import (
    WARMUP_CAPTURES,
    capture_count,
    captured_facts,
    format_report,
    pool_details,
    run_synthetic,
    workload_pool_gb,
)
from inferscale_memory.cli import main
from inferscale_memory.errors import ConfigError
from inferscale_memory.fields import kv_cache_dtype_problem
from inferscale_memory.sizing import GIB

NO_ENGINE = {"ks": [0, 10], "trials": 1, "concurrency": 2, "output_len": 1,
             "vllm_floor": False}


def test_qwen_7b_folder_is_the_published_architecture(tmp_path: Path) -> None:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(write_dummy_model(tmp_path / "q", "qwen2.5-7b"))
    assert cfg.architectures == ["Qwen2ForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        28, 28, 4)
    assert cfg.hidden_size // cfg.num_attention_heads == 128  # head_dim
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (3584, 18944, 152064)
    assert cfg.rope_parameters["rope_theta"] == 1e6 and cfg.tie_word_embeddings is False


def test_the_70b_shape_is_a_serialized_fp8_checkpoint_for_vllm(tmp_path: Path) -> None:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    folder = write_dummy_model(tmp_path / "l", "llama-3.1-70b-fp8")
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"]) == (80, 64, 8, 128)
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]) == (
        8192, 28672, 128256)
    # vLLM reads it as fp8 weights on disk: Fp8LinearMethod creates float8_e4m3fn weights
    # that the dummy loader fills in place (never bf16, which would not fit one H200)
    quant = Fp8Config.from_config(cfg["quantization_config"])
    assert quant.is_checkpoint_fp8_serialized and quant.activation_scheme == "dynamic"
    assert quant.weight_block_size is None  # per-tensor weight scales


def test_random_weights_are_refused_for_shapes_they_cannot_write(tmp_path: Path) -> None:
    for shape in ("llama-3.1-70b-fp8", "qwen2.5-7b"):
        with pytest.raises(ValueError, match=shape):
            write_random_model(tmp_path / shape, shape)
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize(("shape", "dtype", "token_bytes", "per_gib", "weights"), [
    ("qwen2.5-7b", "auto", 57344, 585, "bfloat16"),
    ("qwen2.5-7b", "fp8", 28672, 1170, "bfloat16"),
    ("llama-3.1-8b", "auto", 131072, 256, "bfloat16"),
    ("llama-3.1-8b", "fp8", 65536, 512, "bfloat16"),
    ("llama-3.1-70b-fp8", "auto", 327680, 102, "fp8"),
    ("llama-3.1-70b-fp8", "fp8", 163840, 204, "fp8")])
def test_pool_details_give_facts_per_gib_of_the_shape_and_dtype(
        shape: str, dtype: str, token_bytes: int, per_gib: int, weights: str) -> None:
    details = pool_details(shape, dtype)
    assert details["weights"] == weights and details["kv_cache_dtype"] == dtype
    assert details["pool"] == {"kv_bytes_per_token": token_bytes, "fact_tokens": 32,
                               "facts_per_gib": per_gib}


def test_tensor_parallel_ranks_hold_their_share_of_kv_heads() -> None:
    assert pool_details("llama-3.1-70b-fp8", "auto", 2)["pool"]["facts_per_gib"] == 204


def test_the_default_pool_holds_every_fact_the_run_captures() -> None:
    facts = WARMUP_CAPTURES + capture_count([0, 10, 50, 100], 64)
    assert captured_facts([0, 10, 50, 100], 64, 0) == facts
    # the default context's timed captures are as many facts again
    assert captured_facts([0, 10, 50, 100], 64, 4) == facts + capture_count([0, 10, 50, 100], 64)
    for shape in SHAPES:
        for dtype in ("auto", "fp8"):
            token_bytes = pool_details(shape, dtype)["pool"]["kv_bytes_per_token"]
            for held in (facts, captured_facts([0, 10, 50, 100], 64, 4)):
                budget = workload_pool_gb(token_bytes, held) * GIB
                assert budget >= (held * 32 + 32) * token_bytes  # no eviction during the run
    # the 70B shape's bf16 KV outgrows the library's default pool (4 GiB)
    assert workload_pool_gb(327680, facts) == 5.0


def test_the_report_gives_the_pool_line() -> None:
    report = {"shape": "llama-3.1-70b-fp8", **pool_details("llama-3.1-70b-fp8", "fp8"),
              "capture_facts_per_s": 50.0, "recompute_tail": 4, "ttft": [],
              "throughput": {"concurrency": 2, "k": 1, "output_len": 1,
                             "text": {"requests_per_s": 1.0}, "kv": {"requests_per_s": 2.0}}}
    report["pool"]["kv_pool_gb"] = 3.0
    assert ("weights fp8, KV cache fp8: 160 KiB per token, 204 facts of 32 tokens per GiB "
            "of pool (computed); kv_pool_gb 3.0") in format_report(report)


def synthetic_args(*extra: str) -> Any:
    import argparse

    from inferscale_memory.bench.cli import add_bench_parser

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "synthetic", *extra])


def test_the_command_line_takes_lists_of_shapes_and_kv_cache_dtypes() -> None:
    args = synthetic_args("--shape", "qwen2.5-7b,llama-3.1-70b-fp8", "--kv-cache-dtype",
                          "auto,fp8", "--kv-pool-gb", "6")
    assert args.shape == ["qwen2.5-7b", "llama-3.1-70b-fp8"]
    assert args.kv_cache_dtype == ["auto", "fp8"] and args.kv_pool_gb == 6.0
    defaults = synthetic_args()
    assert (defaults.shape, defaults.kv_cache_dtype, defaults.kv_pool_gb) == (
        ["llama-3.1-8b"], None, None)  # None: engine_args' kv_cache_dtype, else auto
    assert defaults.capture_context is None  # the config's, as --recompute-tail
    assert synthetic_args("--capture-context", "0").capture_context == 0
    for bad in (["--kv-cache-dtype", "int8"], ["--shape", "llama-3.1-9b"]):
        with pytest.raises(SystemExit):
            synthetic_args(*bad)


def test_bench_locomo_takes_every_quality_field_of_the_config() -> None:
    """Each field of QUALITY_FIELDS has its option (run_bench hands them to the engine
    by name; None: the config's)."""
    import argparse

    from inferscale_memory.bench.cli import add_bench_parser
    from inferscale_memory.config import QUALITY_FIELDS

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    defaults = parser.parse_args(["bench", "locomo", "--dataset", "d.json"])
    assert all(getattr(defaults, name) is None for name in QUALITY_FIELDS)
    args = parser.parse_args(["bench", "locomo", "--dataset", "d.json",
                              "--capture-context-order", "similarity"])
    assert args.capture_context_order == "similarity"


@pytest.mark.skipif(kv_cache_dtype_problem("int8") is None, reason="int8 is served now")
def test_a_kv_cache_dtype_the_library_refuses_stops_the_run_before_vllm_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "synthetic", "--shape", "llama-tiny", "--engine-args",
                 '{"kv_cache_dtype": "int8"}', "--workdir", str(tmp_path), "--no-vllm-floor",
                 "--kv-pool-gb", "100000"])  # were int8 taken, the sizing check stops it
    assert code == 2
    assert "error: invalid config: kv_cache_dtype='int8' is not supported" in (
        capsys.readouterr().err)


def test_a_pool_that_cannot_fit_stops_the_run_before_vllm_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "synthetic", "--shape", "llama-tiny", "--kv-pool-gb", "100000",
                 "--workdir", str(tmp_path), "--no-vllm-floor"])
    err = capsys.readouterr().err
    assert code == 2 and "kv_pool_gb=100000.0" in err and "does not fit" in err


def test_a_sweep_records_each_run_and_goes_on_after_a_failure(tmp_path: Path) -> None:
    out = tmp_path / "shapes.json"
    # real runs that stop before vLLM starts: the pool cannot fit on any machine
    runs = run_sweep(["llama-tiny", "qwen2.5-7b"], ["auto", "fp8"], out, run_synthetic,
                     workdir=tmp_path, kv_pool_gb=100000.0, **NO_ENGINE)
    assert [(r["shape"], r["kv_cache_dtype"]) for r in runs] == [
        ("llama-tiny", "auto"), ("llama-tiny", "fp8"), ("qwen2.5-7b", "auto"),
        ("qwen2.5-7b", "fp8")]
    assert all(r["error"].startswith("ConfigError: ") for r in runs)
    assert "does not fit" in runs[0]["error"]
    # each run's dtype reached the engine's config (the check reads its engine_args)
    assert "kv_cache_dtype=auto" in runs[0]["error"]
    assert ("kv_cache_dtype=fp8" in runs[1]["error"]
            or "kv_cache_dtype='fp8' is not supported" in runs[1]["error"])
    assert json.loads(out.read_text()) == {"runs": runs}
    table = format_sweep(runs, [0, 10])
    assert "| qwen2.5-7b | bfloat16 | fp8 | 1,170 | failed: ConfigError: " in table


def test_a_failed_run_keeps_its_measured_points(tmp_path: Path) -> None:
    def run(shape: str, kv_cache_dtype: str, save: Any, **options: Any) -> dict[str, Any]:
        report = {"shape": shape, **pool_details(shape, kv_cache_dtype),
                  "capture_facts_per_s": 10.0, "ttft": [], "complete": False}
        save(report)
        if kv_cache_dtype == "fp8":
            raise ConfigError("engine died")
        save({**report, "complete": True})
        return {**report, "complete": True}

    out = tmp_path / "shapes.json"
    runs = run_sweep(["llama-tiny"], ["fp8", "auto"], out, run)
    assert runs[0]["capture_facts_per_s"] == 10.0 and runs[0]["error"] == (
        "ConfigError: engine died")
    assert runs[1]["complete"] is True and "error" not in runs[1]
    assert json.loads(out.read_text())["runs"] == runs
    assert "| llama-tiny | bfloat16 | auto | 4,096 | 10 | - |" in format_sweep(runs, [])
    with_context = {**runs[1], "capture_context": 4, "capture_context_facts_per_s": 3.0}
    assert "| 10 (3) | - |" in format_sweep([with_context], [])
