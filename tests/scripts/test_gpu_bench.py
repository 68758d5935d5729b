"""scripts/gpu-bench.sh on a machine without a GPU: ``python`` and ``nvidia-smi`` are
doubles, so the script's own control flow is what is tested. A step that fails must fail
the script and be named, even when its output goes through a pipe."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-bench.sh"

# The python double logs each call and exits with $FAIL_STATUS when its arguments (and
# INFERSCALE_FUSED_INJECT) match $FAIL_WHEN, after printing a traceback-like last line.
PYTHON = """#!/bin/bash
echo "$* fused=${INFERSCALE_FUSED_INJECT:-1}" >> "$CALLS"
echo "WARNING vllm says something"
echo "| 10 | 1.0 (1.0) | 1.0 (1.0) | 1.00 | - |"
case "$* fused=${INFERSCALE_FUSED_INJECT:-1}" in
  $FAIL_WHEN) echo "torch.OutOfMemoryError: CUDA out of memory"; exit "$FAIL_STATUS" ;;
esac
exit 0
"""


def run_script(tmp_path: Path, *steps: str, fail_when: str = "never",
               status: int = 1, smi_status: int = 0) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(PYTHON)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho 'NVIDIA H200, 570, 143771 MiB'\n"
                                        f"exit {smi_status}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "CALLS": str(tmp_path / "calls"), "FAIL_WHEN": fail_when,
           "FAIL_STATUS": str(status)}
    return subprocess.run([str(SCRIPT), str(tmp_path / "out"), *steps], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_every_step_runs_and_the_script_succeeds(tmp_path: Path) -> None:
    done = run_script(tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(calls(tmp_path)) == 4  # tests, bench (fused, portable), tp2
    assert "| 10 | 1.0" in done.stdout and "WARNING" not in done.stdout
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} >= {"tests.log", "synthetic.log",
                                               "synthetic-portable.log", "synthetic-tp2.log"}


def test_a_crashed_step_fails_the_script_and_is_named(tmp_path: Path) -> None:
    # the portable path crashes (as it ran out of memory on the H200); its output went
    # through grep and tail, which hid the exit status
    done = run_script(tmp_path, fail_when="*synthetic-portable.json* fused=0", status=1)
    assert done.returncode != 0
    assert "synthetic-portable" in done.stderr and "FAILED" in done.stderr
    assert "CUDA out of memory" in done.stdout + done.stderr
    assert len(calls(tmp_path)) == 4  # the other steps still ran
    assert "tests" not in done.stderr.replace("synthetic", "")


def test_failing_tests_fail_the_script(tmp_path: Path) -> None:
    done = run_script(tmp_path, "tests", fail_when="*pytest*", status=2)
    assert done.returncode != 0 and "step tests FAILED (exit 2)" in done.stderr


def test_no_gpu_stops_before_any_step(tmp_path: Path) -> None:
    done = run_script(tmp_path, smi_status=9)
    assert done.returncode != 0 and "nvidia-smi" in done.stderr
    assert not (tmp_path / "calls").exists()


def test_an_unknown_step_is_refused(tmp_path: Path) -> None:
    done = run_script(tmp_path, "bench", "tp-2")
    assert done.returncode == 2 and "tp-2" in done.stderr
    assert not (tmp_path / "calls").exists()
