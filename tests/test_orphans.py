"""vLLM's processes end with the process that owns the engine: after ``kill -9`` of
``inferscale-memory serve``, its EngineCore and Worker do not live on holding memory
(a supervisor that restarts the server would pile them up; on a GPU they hold its memory).
The server runs the tiny random-weight model with ``enforce_eager``: only its processes matter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from serve_process import ServeProcess, alive

pytestmark = pytest.mark.engine


def test_engine_processes_end_when_the_server_is_killed(tmp_path: Path,
                                                        tiny_model: Path) -> None:
    env = {**os.environ, "INFERSCALE_STORE_PATH": str(tmp_path / "memory.sqlite"),
           "INFERSCALE_DATA_DIR": str(tmp_path), "INFERSCALE_KV_CACHE_GB": "1",
           "INFERSCALE_MAX_MODEL_LEN": "2048", "INFERSCALE_CAPTURE_CONTEXT": "0",
           "INFERSCALE_MODEL": str(tiny_model), "INFERSCALE_ENFORCE_EAGER": "true"}
    server = ServeProcess(env)
    children: list[psutil.Process] = []
    try:
        children = server.wait_ready()
        assert children, "vLLM runs its engine core in a process of its own"
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = [(child.pid, child.name()) for child in children if alive(child)]
        assert not orphans, f"still running after the server's kill -9: {orphans}"
    finally:
        if not children:  # it failed before they were read: end them all the same
            with contextlib.suppress(psutil.Error):
                children = psutil.Process(server.process.pid).children(recursive=True)
        server.finish()
        for child in children:
            if alive(child):
                child.kill()
