"""The LoCoMo loader on a tiny file in the dataset's shape (written by conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferscale_memory.bench.locomo_dataset import load_locomo, parse_dia_ids, select
from inferscale_memory.errors import InvalidInputError


def test_observations_are_dated_facts_with_their_dialogue_ids(locomo_file: Path) -> None:
    conv = load_locomo(locomo_file)[0]
    assert conv.sample_id == "conv-a"
    assert [(f.text, f.dia_ids, f.session) for f in conv.facts("observations")] == [
        ("[8 May 2023] Ana moved to Berlin.", ("D1:1",), 1),
        ("[8 May 2023] Ben adopted a dog.", ("D1:2",), 1),
        ("[12 June 2023] Ana takes cello lessons.", ("D2:1",), 2),
        ("[12 June 2023] Ben's dog is called Rex.", ("D2:2", "D1:2"), 2),
    ]


def test_turns_are_dated_with_speaker_and_image_caption(locomo_file: Path) -> None:
    turns = load_locomo(locomo_file)[0].facts("turns")
    assert [t.text for t in turns] == [
        "[8 May 2023] Ana: I moved to Berlin last week!",
        "[8 May 2023] Ben: Nice. I adopted a dog. [shares a photo of a puppy]",
        "[12 June 2023] Ana: I started cello lessons.",
        "[12 June 2023] Ben: My dog is called Rex.",
    ]
    assert [t.dia_ids for t in turns] == [("D1:1",), ("D1:2",), ("D2:1",), ("D2:2",)]
    with pytest.raises(InvalidInputError):
        load_locomo(locomo_file)[0].facts("sessions")


def test_questions_of_categories_1_to_4_only(locomo_file: Path) -> None:
    conv = load_locomo(locomo_file)[0]
    assert [(q.index, q.category) for q in conv.questions] == [(0, 4), (1, 4), (3, 2), (4, 1)]
    assert conv.questions[1].evidence == ("D2:2", "D1:2")  # "D:1:2" repaired
    assert conv.questions[2].answer == "2023"  # integer answers become text


def test_parse_dia_ids_repairs_or_drops_malformed_ids() -> None:
    assert parse_dia_ids("D26:14, D26:34") == ("D26:14", "D26:34")
    assert parse_dia_ids(["D8:6; D9:17", "D", "D:11:26", "D8:6"]) == ("D8:6", "D9:17", "D11:26")
    assert parse_dia_ids([]) == ()


def test_select_by_index_or_id_with_a_seeded_limit(locomo_file: Path) -> None:
    conversations = load_locomo(locomo_file)
    assert [c.sample_id for c in select(conversations, ["1", "conv-a"])] == ["conv-b", "conv-a"]
    first = select(conversations, None, limit=2, seed=3)
    assert first == select(conversations, None, limit=2, seed=3)
    assert [len(c.questions) for c in first] == [2, 1]
    indices = [q.index for q in first[0].questions]
    assert indices == sorted(indices)
    seeds = {tuple(q.index for q in select(conversations, ["0"], 2, s)[0].questions)
             for s in range(20)}
    assert len(seeds) > 1
    with pytest.raises(InvalidInputError, match="no conversation"):
        select(conversations, ["conv-z"])


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError):
        load_locomo(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidInputError, match="list"):
        load_locomo(tmp_path / "bad.json")
