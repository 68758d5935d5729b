"""The durable fact store: facts, embeddings and a per-user vector index.

:class:`MemoryStore` is the entry point; :class:`VectorIndex` is the interface of the
index backends (:class:`ExactIndex` in-process by default;
:class:`~inferscale_memory.store.qdrant.QdrantIndex` with the ``qdrant`` extra).
:func:`open_index` builds the one a :class:`~inferscale_memory.MemoryConfig` names.
"""

from inferscale_memory.store.backends import open_index
from inferscale_memory.store.facts import Fact, ScoredFact
from inferscale_memory.store.index import ExactIndex, VectorIndex
from inferscale_memory.store.memory_store import MemoryStore

__all__ = ["ExactIndex", "Fact", "MemoryStore", "ScoredFact", "VectorIndex", "open_index"]
