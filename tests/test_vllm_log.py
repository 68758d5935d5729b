"""vLLM's output goes to a log file: what processes started while it is captured print
lands there (they inherit it), this process's output is restored afterwards, and the file
is removed on a clean close and kept on a failure."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inferscale_memory.vllm_log import VllmLog

CHILD = ("import sys, time; print('child out', flush=True); "
         "print('child err', file=sys.stderr, flush=True); time.sleep(0.5); "
         "print('child later', flush=True)")


@pytest.fixture(autouse=True)
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    level = logging.getLogger("vllm").level
    yield tmp_path
    logging.getLogger("vllm").setLevel(level)


def test_processes_started_while_captured_write_to_the_file(capfd: pytest.CaptureFixture[str],
                                                            temp_dir: Path) -> None:
    log = VllmLog(show=False)
    assert log.path is not None and log.path.parent == temp_dir
    with log.capturing():
        child = subprocess.Popen([sys.executable, "-c", CHILD])
        os.write(1, b"ours while starting\n")  # file descriptor 1, as vLLM's handlers write
    print("ours afterwards", flush=True)
    child.wait(30)  # it keeps the file after the block
    out, err = capfd.readouterr()
    assert out == "ours afterwards\n" and err == ""
    text = log.path.read_text()
    for line in ("child out", "child err", "child later", "ours while starting"):
        assert line in text
    assert log.tail(1) == "child later"
    assert logging.getLogger("vllm").level == logging.ERROR  # this process: errors only
    log.close(failed=False)
    assert not log.path.exists()


def test_the_file_is_kept_and_named_when_vllm_failed(caplog: pytest.LogCaptureFixture) -> None:
    log = VllmLog(show=False)
    assert log.path is not None
    with caplog.at_level(logging.WARNING, "inferscale_memory"):
        log.close(failed=True)
    assert log.path.exists() and str(log.path) in caplog.text


def test_shown_output_is_left_alone(capfd: pytest.CaptureFixture[str], temp_dir: Path) -> None:
    log = VllmLog(show=True)
    with log.capturing():
        subprocess.run([sys.executable, "-c", "print('vllm says')"], check=True)
    assert capfd.readouterr().out == "vllm says\n"
    assert log.path is None and log.tail() == "" and not list(temp_dir.iterdir())
    log.close(failed=True)
