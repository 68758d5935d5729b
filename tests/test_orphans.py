"""vLLM's processes end with the process that owns the engine: after ``kill -9`` of
``inferscale-memory serve``, its EngineCore and Worker do not live on holding memory
(a supervisor that restarts the server would pile them up; on a GPU they hold its memory).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.engine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_engine_processes_end_when_the_server_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "INFERSCALE_STORE_PATH": str(tmp_path / "memory.sqlite"),
           "INFERSCALE_DATA_DIR": str(tmp_path), "INFERSCALE_KV_CACHE_GB": "1",
           "INFERSCALE_MAX_MODEL_LEN": "2048", "INFERSCALE_CAPTURE_CONTEXT": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "inferscale_memory.cli", "serve", "--port", str(free_port())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready = threading.Event()
    output: list[str] = []

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            output.append(line)
            if "serving" in line and "/v1" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    children: list[psutil.Process] = []
    try:
        assert ready.wait(600), "".join(output[-40:])
        children = psutil.Process(server.pid).children(recursive=True)
        assert children, "vLLM runs its engine core in a process of its own"
        server.send_signal(signal.SIGKILL)
        server.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(child) for child in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = [(child.pid, child.name()) for child in children if alive(child)]
        assert not orphans, f"still running after the server's kill -9: {orphans}"
    finally:
        server.kill()
        for child in children:
            if alive(child):
                child.kill()
