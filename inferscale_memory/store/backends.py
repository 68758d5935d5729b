"""Which vector index a config names: :func:`open_index`.

The factory sits apart from the backends so that none of them imports it:
:mod:`~inferscale_memory.store.qdrant` builds on :mod:`~inferscale_memory.store.index`,
and this module is the one place that knows both (``tests/test_imports.py`` refuses an
import cycle, a lazy import included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inferscale_memory.store.index import ExactIndex, VectorIndex

if TYPE_CHECKING:
    from inferscale_memory.config import MemoryConfig


def open_index(config: MemoryConfig, dim: int | None = None) -> VectorIndex:
    """Return the vector index that ``config`` names (``index`` and ``qdrant_*``).

    Qdrant is imported only when named: ``qdrant-client`` is the ``qdrant`` extra.

    Example:
        >>> from inferscale_memory import MemoryConfig
        >>> type(open_index(MemoryConfig.load(store_path=":memory:"))).__name__
        'ExactIndex'

    Raises:
        MissingDependencyError: ``index="qdrant"`` without ``qdrant-client`` installed.
        StoreError: The Qdrant server cannot be reached or its folder is in use.
    """
    if config.index == "qdrant":
        from inferscale_memory.store.qdrant import QdrantIndex

        return QdrantIndex.from_config(config, dim)
    return ExactIndex(dim)
