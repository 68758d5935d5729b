"""Where vLLM's own output goes: a log file by default, the terminal on request.

vLLM, torch and their engine processes print dozens of INFO and WARNING lines, progress
bars and library warnings while an engine starts, serves and stops. By default that output
goes to a log file: while vLLM starts its processes, this process's stdout and stderr point
at the file, so the engine processes inherit it as theirs; afterwards this process shows
vLLM's errors only. ``MemoryConfig(vllm_logs=True)`` (``INFERSCALE_VLLM_LOGS=1``, or
``--verbose`` on the command line) leaves everything on the terminal as vLLM prints it.

The file is removed when the engine closes cleanly and kept (its path logged) when vLLM
failed; an error of a failed start quotes its last lines.

Example:
    >>> log = VllmLog(show=False)  # doctest: +SKIP
    >>> with log.capturing():  # doctest: +SKIP
    ...     llm = AsyncLLM.from_engine_args(args)  # its processes write to log.path
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


class VllmLog:
    """One engine's vLLM output: a file (``show=False``) or the terminal (``show=True``)."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.path: Path | None = None
        if not show:
            fd, name = tempfile.mkstemp(prefix="inferscale-vllm-", suffix=".log")
            os.close(fd)
            self.path = Path(name)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Point this process's stdout and stderr (file descriptors 1 and 2) at the log
        file for the block; processes started in it keep writing there."""
        if self.path is None:
            yield
            return
        _flush()
        saved = os.dup(1), os.dup(2)
        target = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.dup2(target, 1)
            os.dup2(target, 2)
            yield
        finally:
            _flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in (*saved, target):
                os.close(fd)
        logging.getLogger("vllm").setLevel(logging.ERROR)  # this process: errors only

    def tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the file (empty when output is on the terminal)."""
        if self.path is None:
            return ""
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self, failed: bool) -> None:
        """Remove the file, or keep it and say where it is when vLLM ``failed``."""
        if self.path is None:
            return
        if failed:
            logger.warning("vLLM's log is kept in %s", self.path)
        else:
            self.path.unlink(missing_ok=True)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
