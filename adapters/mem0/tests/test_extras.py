"""Mem0's optional extras that are not installed (spaCy, fastembed): one line, no warnings."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from mem0.utils import spacy_models

import mem0_inferscale
from inferscale_memory import MemoryEngine

pytestmark = pytest.mark.engine
USER = "m0-extras"


def test_a_memory_on_the_engine_says_once_that_extras_are_off_and_keeps_other_warnings(
        engine: MemoryEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Mem0 tries spaCy once per process: start from a process where it has not tried.
    monkeypatch.setattr(spacy_models, "_load_failed_full", False)
    monkeypatch.setattr(spacy_models, "_load_failed_lemma", False)
    caplog.set_level(logging.INFO)
    memory = mem0_inferscale.from_engine(engine, folder=str(tmp_path))
    try:
        memory.add("Omar grows tomatoes on his balcony.", user_id=USER, infer=False)
        assert memory.search("tomatoes", filters={"user_id": USER})["results"]
        # Mem0's own warnings still show (an identity key in metadata is dropped).
        memory.add("Omar works as a baker.", user_id=USER, infer=False,
                   metadata={"user_id": "someone-else"})
    finally:
        memory.vector_store.client.close()
        memory.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warnings if "mem0ai[" in w or "spaCy" in w or "fastembed" in w]
    assert any("ignoring metadata['user_id']" in w for w in warnings)
    said = [r.getMessage() for r in caplog.records if r.name == "mem0_inferscale.extras"]
    assert len(said) == 1 and "spaCy" in said[0] and "fastembed" in said[0]
