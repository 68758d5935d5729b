"""Fixtures of the benchmark tests: a tiny LoCoMo-format file and an engine double."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_helpers import LOCOMO, FakeEngine


@pytest.fixture
def locomo_file(tmp_path: Path) -> Path:
    path = tmp_path / "locomo-tiny.json"
    path.write_text(json.dumps(LOCOMO))
    return path


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()
