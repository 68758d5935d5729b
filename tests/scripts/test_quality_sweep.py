"""scripts/quality_sweep.py: the settings it parses (no engine)."""

from __future__ import annotations

import pytest
from script_module import load_script

from inferscale_memory.config import MemoryConfig

sweep = load_script("quality_sweep")


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
