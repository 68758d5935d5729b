"""LoCoMo's answer scores (token F1, multi-hop partial F1), agreement, recall, stats."""

from __future__ import annotations

import math

import pytest

from inferscale_memory.bench.scoring import (
    agreement,
    evidence_recall,
    locomo_f1,
    normalize_answer,
    partial_f1,
    token_f1,
)
from inferscale_memory.bench.stats import mean, paired_difference, percentile


@pytest.mark.parametrize(("text", "expected"), [
    ("The Eiffel Tower", "eiffel tower"),
    ("Paris, France.", "paris france"),
    ("a cat and the dog", "cat dog"),
    ("  Tea!  ", "tea"),
    ("An apple", "apple"),
])
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(("prediction", "gold", "expected"), [
    ("Berlin", "Berlin", 1.0),
    ("berlin.", "The Berlin", 1.0),
    ("She lives in Berlin", "Berlin", 2 * 0.25 * 1 / 1.25),  # precision 1/4, recall 1
    ("London", "Berlin", 0.0),
    ("", "Berlin", 0.0),
    ("running dogs", "the dog runs", 1.0),  # Porter stems: run, dog
    ("7 May 2023", "7 May, 2023", 1.0),
    ("May 2023", "7 May 2023", 0.8),  # precision 1, recall 2/3
])
def test_token_f1(prediction: str, gold: str, expected: float) -> None:
    assert token_f1(prediction, gold) == pytest.approx(expected)


def test_partial_f1_scores_each_gold_part_by_its_best_piece() -> None:
    assert partial_f1("painting, hiking", "hiking, painting") == 1.0
    assert partial_f1("painting, hiking", "hiking, painting, swimming") == pytest.approx(2 / 3)
    assert partial_f1("painting and hiking", "hiking, painting") == pytest.approx(2 / 3)
    assert partial_f1("nothing", "hiking, painting") == 0.0


def test_locomo_f1_by_category() -> None:
    assert locomo_f1("hiking, painting", "painting, hiking", 1) == 1.0
    assert locomo_f1("hiking, painting", "painting, hiking", 4) == 1.0  # plain F1, same bag
    assert locomo_f1("green tea", "tea; green tea", 3) == pytest.approx(2 / 3)  # gold "tea"
    assert locomo_f1("green tea", "tea; green tea", 4) == pytest.approx(0.8)


def test_agreement() -> None:
    assert agreement([1, 2, 3], [1, 2, 3]) == (True, 1.0)
    assert agreement([1, 2, 3, 4], [1, 2, 9]) == (False, 0.5)
    assert agreement([5], [6]) == (False, 0.0)
    assert agreement([], []) == (True, 1.0)


def test_evidence_recall() -> None:
    assert evidence_recall(["D1:1", "D2:2"], [["D1:1"], ["D3:1", "D2:2"]]) == 1.0
    assert evidence_recall(["D1:1", "D2:2"], [["D1:1"]]) == 0.5
    assert evidence_recall(["D1:1"], []) == 0.0
    assert evidence_recall([], [["D1:1"]]) is None


def test_percentiles_and_means() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 51  # nearest rank of 99 * 0.5 = 49.5 -> index 50
    assert percentile(values, 90) == 90
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(values, 101)
    assert mean([1.0, None, 3.0]) == 2.0
    assert math.isnan(mean([None]))


def test_paired_difference() -> None:
    diff, half = paired_difference([0.5, 0.7, 0.6], [0.4, 0.5, 0.6])
    assert diff == pytest.approx(0.1)
    assert half == pytest.approx(1.96 * 0.1 / math.sqrt(3))
    with pytest.raises(ValueError):
        paired_difference([1.0], [])
