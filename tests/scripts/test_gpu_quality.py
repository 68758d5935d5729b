"""scripts/gpu-quality.sh's background job on a machine without a GPU: ``python3`` and the
vLLM installer are doubles, the job's folders are temporary. The job keeps going after a
failed part (as it did), but ``poll`` must name every failed part and exit non-zero."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-quality.sh"

# Logs each call; fails (exit 3) when "$*" matches $FAIL_WHEN; `--pick` prints settings.
PYTHON3 = """#!/bin/bash
echo "$*" >> "$CALLS"
case "$*" in $FAIL_WHEN) echo "Traceback: RuntimeError: engine died"; exit 3 ;; esac
case "$*" in *--pick*) echo "t4=rank,4,0 c16=rank,0,16" ;; *) echo "| base | 10 | 0.5 |" ;; esac
"""


def setup(tmp_path: Path, install_status: int = 0,
          models: tuple[str, ...] = ("0.5b", "1.5b")) -> dict[str, str]:
    bin_dir, stage, q = tmp_path / "bin", tmp_path / "stage", tmp_path / "quality"
    for folder in (bin_dir, stage, q):
        folder.mkdir()
    (bin_dir / "python3").write_text(PYTHON3)
    (bin_dir / "python3").chmod(0o755)
    (stage / "remote-install.sh").write_text(f"echo installing\nexit {install_status}\n")
    for size in ("0.5b", "1.5b"):
        folder = tmp_path / f"model-{size}"
        folder.mkdir()
        if size in models:
            (folder / "model.ok").write_text(f"/models/{size}\n")
        else:
            (folder / "model.failed").touch()
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "CALLS": str(tmp_path / "calls"), "FAIL_WHEN": "never",
            "QUALITY_DIR": str(q), "VLLM_STAGE": str(stage), "MODELS_DIR": str(tmp_path)}


def job(env: dict[str, str], fail_when: str = "never") -> subprocess.CompletedProcess[str]:
    """The background job, run in the foreground, then ``poll``."""
    env = {**env, "FAIL_WHEN": fail_when}
    subprocess.run(["bash", str(SCRIPT), "run"], cwd=ROOT, env=env, timeout=60)
    return subprocess.run(["bash", str(SCRIPT), "poll", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_clean_job_polls_zero(tmp_path: Path) -> None:
    done = job(setup(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILED" not in done.stdout + done.stderr
    calls = (tmp_path / "calls").read_text()
    assert calls.count("--model") == 2 and "--pick" in calls and "bench synthetic" in calls
    # each model's halves table, made on the GPU machine from its settings' run folders
    analyses = [line for line in calls.splitlines() if "quality_analysis.py" in line]
    assert len(analyses) == 2 and any(line.endswith("q0.5b base t4n4 t4n2 t4n1")
                                      for line in analyses), analyses
    assert any(line.endswith("q1.5b base t4 c16") for line in analyses), analyses
    assert "| base | 10 | 0.5 |" in (tmp_path / "quality" / "analysis-1.5b.md").read_text()


def test_a_failed_sweep_is_named_and_polls_non_zero(tmp_path: Path) -> None:
    done = job(setup(tmp_path), fail_when="*--model /models/0.5b*")
    assert done.returncode == 1
    assert "sweep 0.5b" in done.stderr and "rc=3" in done.stderr
    assert "1.5b" not in done.stderr  # the rest of the job ran and passed
    assert "bench synthetic" in (tmp_path / "calls").read_text()


def test_a_failed_pick_is_named(tmp_path: Path) -> None:
    done = job(setup(tmp_path), fail_when="*--pick*")
    assert done.returncode == 1 and "pick of the 1.5b settings rc=3" in done.stderr
    assert (tmp_path / "calls").read_text().count("--model") == 2  # 1.5b's baseline ran


def test_a_failed_synthetic_is_named(tmp_path: Path) -> None:
    done = job(setup(tmp_path), fail_when="*bench synthetic*")
    assert done.returncode == 1 and "synthetic rc=3" in done.stderr
    assert "sweep" not in done.stderr


def test_a_failed_install_polls_non_zero(tmp_path: Path) -> None:
    done = job(setup(tmp_path, install_status=1))
    assert done.returncode == 1 and "install" in done.stderr
    assert not (tmp_path / "calls").exists()


def test_a_failed_model_conversion_is_named_at_once(tmp_path: Path) -> None:
    # a conversion that failed (model.failed) is not waited for (900 s) but reported
    done = job(setup(tmp_path, models=("0.5b",)))
    assert done.returncode == 1 and "1.5b model" in done.stderr


def test_poll_of_a_running_job_says_so(tmp_path: Path) -> None:
    env = setup(tmp_path)
    done = subprocess.run(["bash", str(SCRIPT), "poll", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still running" in done.stdout


def test_poll_copies_the_results_to_out(tmp_path: Path) -> None:
    env = setup(tmp_path)
    job(env)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(["bash", str(SCRIPT), "poll", "0"], cwd=ROOT,
                          env={**env, "OUT": str(out)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} == {"job.log", "quality.tgz"}
    done = subprocess.run(["bash", str(SCRIPT), "poll", "0"], cwd=ROOT,
                          env={**env, "OUT": str(tmp_path / "missing")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "packing" in done.stderr


def test_poll_of_a_running_sweep_makes_its_halves_so_far(tmp_path: Path) -> None:
    # a machine can be taken back mid-run: each poll leaves the finished k's halves
    env = {**setup(tmp_path), "REPO_COPY": str(tmp_path / "repo")}
    for name, rows in (("t4n4", True), ("t3n4", True), ("empty", False)):
        folder = tmp_path / "quality" / "q1.5b" / name
        folder.mkdir(parents=True)
        if rows:
            (folder / "requests.jsonl").write_text("{}\n")
    done = subprocess.run(["bash", str(SCRIPT), "poll", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still running" in done.stdout
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 1 and "quality_analysis.py" in calls[0], calls
    assert calls[0].endswith("q1.5b t3n4 t4n4"), calls  # the folders with rows only
    assert "| base | 10 | 0.5 |" in done.stdout  # the partial table is printed
    assert (tmp_path / "quality" / "partial-1.5b.md").exists()
