"""Mem0's optional extras that this package does not install: off, with one line saying so.

Mem0 (mem0ai 2.2.1) loads spaCy (``mem0ai[nlp]``: entity boost, BM25 lemmas) and fastembed
(``mem0ai[extras]``: qdrant's BM25 keyword vectors) on first use, and where they are
missing warns and carries on without them: twice for spaCy (per process), once per qdrant
store. For a Memory on an engine that is the expected setup (semantic search and the KV of
the facts need neither; spaCy would also download a model), so :func:`skip_missing` marks
them as tried and missing before Mem0 tries, as Mem0 itself would after its warnings.
Installed extras are used as usual, and Mem0's other warnings are untouched.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from mem0.utils import spacy_models
from mem0.vector_stores.qdrant import Qdrant

logger = logging.getLogger(__name__)


def skip_missing(vector_store: Any) -> list[str]:
    """Turn off the extras that are not installed, for Mem0 and its qdrant ``vector_store``
    (Mem0 keeps spaCy's state per process); returns the extras turned off."""
    missing = []
    if importlib.util.find_spec("spacy") is None:
        spacy_models._load_failed_full = spacy_models._load_failed_lemma = True
        missing.append("spaCy (mem0ai[nlp]: entity boost)")
    if isinstance(vector_store, Qdrant) and importlib.util.find_spec("fastembed") is None:
        vector_store._bm25_encoder = False  # Mem0's mark of a failed fastembed import
        missing.append("fastembed (mem0ai[extras]: BM25 keyword search)")
    if missing:
        logger.info("Mem0 runs without %s, as expected: semantic search and the facts' KV "
                    "do not need them", " and ".join(missing))
    return missing
