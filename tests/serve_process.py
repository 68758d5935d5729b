"""``inferscale-memory serve`` as a child process of a test: started, read, checked."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import psutil


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ServeProcess:
    """``inferscale-memory serve`` on a free port; its output (stdout and stderr) is
    collected line by line, and :meth:`wait_ready` waits for its serving line."""

    def __init__(self, env: dict[str, str], **popen: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "inferscale_memory.cli", "serve", "--port", str(free_port())],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            **popen)  # type: ignore[call-overload]
        self.output: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if "serving" in line and "/v1" in line:
                self._ready.set()

    def wait_ready(self, timeout: float = 600) -> list[psutil.Process]:
        """Wait for the serving line; return the server's child processes (vLLM's)."""
        assert self._ready.wait(timeout), "".join(self.output[-40:])
        return psutil.Process(self.process.pid).children(recursive=True)

    def finish(self) -> None:
        """Kill the server if it still runs, and read the rest of its output."""
        self.process.kill()
        self.process.wait(30)
        self._reader.join(10)
