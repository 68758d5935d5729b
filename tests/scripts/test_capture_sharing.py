"""scripts/capture_sharing.py: the prefix-cache count it reports (no model)."""

from __future__ import annotations

from script_module import load_script

sharing = load_script("capture_sharing")


def test_only_whole_blocks_of_an_identical_prefix_are_served() -> None:
    header = [1, 2, 3, 4]
    prompts = [
        header + [5, 6, 7, 8, 9],      # first: all 9 computed
        header + [5, 6, 7, 8, 10],     # two whole blocks shared: 1 computed
        header + [5, 6, 0, 8, 9],      # the second block differs: 9 - 4
        [0] + header[1:] + [5, 6, 7, 8],  # the first block differs: nothing served
        header + [5, 6, 7, 8],         # every block cached: the last token is computed
        header + [11, 5, 6, 7, 8],     # same tokens later, at another offset: not served
    ]
    assert sharing.computed_tokens(prompts, 4) == [9, 1, 5, 8, 1, 5]
