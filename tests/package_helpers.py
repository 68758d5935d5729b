"""Tests of a missing weights package: the package is hidden, and starting a process fails."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest


def hide_package(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """``module`` is not installed (for ``find_spec``), and any ``subprocess.Popen`` fails
    the test (the library must not install it at run time)."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == module else real(name, *args)

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the library started a process at run time: {args}")

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
