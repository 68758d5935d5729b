"""``inferscale-memory serve`` as a child process of a test: started, read, checked."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class ServeProcess:
    """``inferscale-memory serve`` on a port the system picks (``--port 0``: no other
    process can take it between a choice and the bind); its output (stdout and stderr) is
    collected line by line, and :meth:`wait_ready` waits for its serving line."""

    def __init__(self, env: dict[str, str], **popen: object) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "inferscale_memory.cli", "serve", "--port", "0"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            **popen)  # type: ignore[call-overload]
        self.output: list[str] = []
        self.serving = False
        self._ended = threading.Event()  # the serving line came, or the output ended
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                self.output.append(line)
                if "serving" in line and "/v1" in line:
                    self.serving = True
                    self._ended.set()
        finally:
            self._ended.set()

    def settled(self) -> bool:
        """Whether the serving line came or the server's output ended (it exited)."""
        return self._ended.is_set()

    def wait_ready(self, timeout: float = 600) -> list[psutil.Process]:
        """Wait for the serving line; return the server's child processes (vLLM's). A
        server that exits first fails the wait at once (also when a process it started
        still holds its output open)."""
        deadline = time.monotonic() + timeout
        while not self._ended.wait(0.2) and time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._reader.join(2)  # the lines it printed before it exited
                break
        assert self.serving, "".join(self.output[-40:])
        return psutil.Process(self.process.pid).children(recursive=True)

    def finish(self) -> None:
        """Kill the server if it still runs, and read the rest of its output."""
        self.process.kill()
        self.process.wait(30)
        self._reader.join(10)
