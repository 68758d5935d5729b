"""scripts/quality_sweep.py: the settings it parses (no engine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from inferscale_memory.config import MemoryConfig

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("quality_sweep",
                                              ROOT / "scripts" / "quality_sweep.py")
assert spec is not None and spec.loader is not None
sweep = importlib.util.module_from_spec(spec)
sys.modules["quality_sweep"] = sweep
spec.loader.exec_module(sweep)


def test_a_setting_names_the_config_fields_it_sets() -> None:
    name, levers = sweep.parse_setting("t3s4=rank,3,4,similarity")
    assert name == "t3s4"
    assert levers == {"fact_order": "rank", "recompute_tail": 3, "capture_context": 4,
                      "capture_context_order": "similarity"}
    # three fields: the context order is the config's default
    assert sweep.parse_setting("t4n4=rank,4,4")[1]["capture_context_order"] == (
        MemoryConfig.model_fields["capture_context_order"].default)
    config = MemoryConfig.load().replace(**levers)  # every field is the config's own
    assert (config.recompute_tail, config.capture_context_order) == (3, "similarity")
    assert not sweep.is_baseline(levers)
    assert sweep.is_baseline(sweep.parse_setting("base=rank,0,0")[1])
    for bad in ("x=rank,4", "x=rank,4,4,similarity,1"):
        with pytest.raises(SystemExit, match="NAME=order,tail,context"):
            sweep.parse_setting(bad)
