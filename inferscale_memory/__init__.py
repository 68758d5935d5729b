"""inferscale-memory: GPU-native memory for LLM memory frameworks.

Each fact's KV cache is computed once by the serving engine (vLLM), kept on the engine's
device, and injected into vLLM's paged KV cache when an answer needs it.

Example:
    >>> from inferscale_memory import MemoryEngine               # doctest: +SKIP
    >>> engine = MemoryEngine()
    >>> engine.memory.add("Caroline moved to Berlin in May 2023.", user_id="caroline")
    >>> engine.chat([{"role": "user", "content": "Where does Caroline live?"}],
    ...             user_id="caroline").text
"""

from inferscale_memory.config import MemoryConfig
from inferscale_memory.engine import MemoryEngine
from inferscale_memory.errors import (
    ConfigError,
    ContextLengthError,
    EngineClosedError,
    EngineDiedError,
    EngineError,
    FactNotFoundError,
    InferScaleError,
    InvalidInputError,
    MissingDependencyError,
    ModelPreparationError,
    RequestFailedError,
    SchemaError,
    StoreError,
    UnknownUserError,
    UnsupportedVersionError,
)
from inferscale_memory.results import ChatChunk, ChatMetrics, ChatResult, KVStats
from inferscale_memory.store import Fact, MemoryStore, ScoredFact

__version__ = "0.1.0"

__all__ = [
    "ChatChunk",
    "ChatMetrics",
    "ChatResult",
    "ConfigError",
    "ContextLengthError",
    "EngineClosedError",
    "EngineDiedError",
    "EngineError",
    "Fact",
    "FactNotFoundError",
    "InferScaleError",
    "InvalidInputError",
    "KVStats",
    "MemoryConfig",
    "MemoryEngine",
    "MemoryStore",
    "MissingDependencyError",
    "ModelPreparationError",
    "RequestFailedError",
    "SchemaError",
    "ScoredFact",
    "StoreError",
    "UnknownUserError",
    "UnsupportedVersionError",
]
