"""Shutdown is silent and complete: a program that uses an engine prints only its own
lines, exits 0, and leaves no vLLM process behind, whether it closes the engine (``with``),
forgets to (interpreter exit), is interrupted by Ctrl-C, or is the server stopped by a
signal. vLLM's own output goes to a log file unless asked for (``vllm_logs``).

The programs run the tiny random-weight model with ``enforce_eager`` (``INFERSCALE_MODEL``,
``INFERSCALE_ENFORCE_EAGER``): what is under test is how the engine's processes end, not
what the model says, and a start then takes seconds instead of minutes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from serve_process import ServeProcess, alive

pytestmark = pytest.mark.engine

SCRIPT = """
import os, sys, psutil
from inferscale_memory import MemoryEngine

def engine_processes():  # multiprocessing's resource tracker lives until this one exits
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]

def answer(engine):
    reply = engine.chat([{"role": "user", "content": "Say hi."}], max_tokens=4)
    print("answer:", bool(reply.text), flush=True)
    print("children:", *engine_processes(), flush=True)

if __name__ == "__main__":
    options = dict(store_path=":memory:", kv_cache_gb=1, max_model_len=2048,
                   capture_context=0)
    if sys.argv[1] == "close":
        with MemoryEngine(**options) as engine:
            answer(engine)
            print("healthy:", engine.healthy, flush=True)
        print("healthy:", engine.healthy, flush=True)
        print("left:", *engine_processes())
    elif sys.argv[1] == "exit":
        engine = MemoryEngine(**options)  # never closed: the interpreter's exit does it
        answer(engine)
    elif sys.argv[1] == "start-fails":
        from inferscale_memory.fact_kv import FactKV
        from inferscale_memory.store import MemoryStore

        async def header_fails(self):
            raise RuntimeError("header capture failed")

        def close(self, _close=MemoryStore.close):
            print("store closed", flush=True)
            _close(self)

        FactKV.capture_header = header_fails
        MemoryStore.close = close
        try:
            MemoryEngine(**options)
        except RuntimeError as exc:
            print("failed:", exc, flush=True)
        print("left:", *engine_processes(), flush=True)
    elif sys.argv[1] == "interrupt":
        with MemoryEngine(**options) as engine:
            answer(engine)
            try:
                while True:
                    engine.chat([{"role": "user", "content": "Count to ten."}], max_tokens=32)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
"""


class Programs:
    """Starts a test's programs as a terminal does: each in a session of its own (its
    process group then holds it and vLLM's processes), with Ctrl-C raising
    KeyboardInterrupt even when the shell that started pytest ignores SIGINT (a background
    job; Python keeps an inherited SIG_IGN). :meth:`end` kills what is left of them."""

    def __init__(self, tmp_path: Path, tiny_model: Path, temp: Path) -> None:
        self.tmp_path, self.temp = tmp_path, temp
        self.env = {**os.environ, "INFERSCALE_DATA_DIR": str(tmp_path), "TMPDIR": str(temp),
                    "INFERSCALE_MODEL": str(tiny_model), "INFERSCALE_ENFORCE_EAGER": "true"}
        self.env.pop("VLLM_LOGGING_LEVEL", None)  # vLLM's default verbosity, as a user has it
        self.groups: list[int] = []

    @staticmethod
    def terminal_signals() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    def popen(self) -> dict[str, object]:
        """Keyword arguments of ``subprocess.Popen`` for a program started as a terminal does."""
        return dict(start_new_session=True, preexec_fn=self.terminal_signals)

    def started(self, pid: int) -> None:
        self.groups.append(pid)  # a session leader's pid is its group's id

    def end(self) -> None:
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


@pytest.fixture
def programs(tmp_path: Path, tiny_model: Path) -> Iterator[Programs]:
    """Whatever the test's outcome, what is left of its programs is killed after its checks,
    so that a failure leaves no engine running to slow the tests after it. Their TMPDIR is
    short: vLLM's socket paths under it must fit in 107 characters (``sockaddr_un``)."""
    temp = Path(tempfile.mkdtemp(prefix="shutdown-"))
    started = Programs(tmp_path, tiny_model, temp)
    try:
        yield started
    finally:
        started.end()
        shutil.rmtree(temp, ignore_errors=True)


def run_script(programs: Programs, mode: str,
               interrupt: bool = False) -> tuple[int, str, str]:
    script = programs.tmp_path / "program.py"
    script.write_text(textwrap.dedent(SCRIPT))
    program = subprocess.Popen([sys.executable, str(script), mode], env=programs.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               **programs.popen())  # type: ignore[call-overload]
    programs.started(program.pid)
    if interrupt:
        assert program.stdout is not None
        lines = []
        for line in program.stdout:  # wait until it answers, then Ctrl-C the whole group
            lines.append(line)
            if line.startswith("children:"):
                time.sleep(1)
                os.killpg(program.pid, signal.SIGINT)
                break
        out, err = program.communicate(timeout=120)
        return program.returncode, "".join(lines) + out, err
    out, err = program.communicate(timeout=600)
    return program.returncode, out, err


def children_of(out: str) -> list[int]:
    [line] = [line for line in out.splitlines() if line.startswith("children:")]
    return [int(pid) for pid in line.split()[1:]]


def assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 30
    processes = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            processes.append(psutil.Process(pid))
    while any(alive(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p.pid for p in processes if alive(p)], "vLLM processes left running"


@pytest.mark.parametrize("mode", ["close", "exit"])
def test_a_program_prints_only_its_own_lines_and_leaves_no_process(programs: Programs,
                                                                   mode: str) -> None:
    code, out, err = run_script(programs, mode)
    assert code == 0, err
    assert err == "", err  # no vLLM log line, warning, progress bar or shutdown error
    assert [line.split(":")[0] for line in out.splitlines()] == \
        ["answer", "children"] + (["healthy", "healthy", "left"] if mode == "close" else [])
    if mode == "close":  # while it runs, then once closed
        assert [line for line in out.splitlines() if line.startswith("healthy")] == \
            ["healthy: True", "healthy: False"]
    children = children_of(out)
    assert children, "vLLM runs its engine core in a process of its own"
    if mode == "close":
        assert out.splitlines()[-1] == "left:"  # none once close() returned
    assert_gone(children)
    assert not list(programs.temp.glob("inferscale-vllm-*"))  # vLLM's log is removed


def test_ctrl_c_stops_the_program_cleanly(programs: Programs) -> None:
    code, out, err = run_script(programs, "interrupt", interrupt=True)
    assert code == 0, err
    assert "interrupted" in out.splitlines()
    assert err == "", err
    assert_gone(children_of(out))


def test_the_server_stops_on_a_signal_with_only_its_own_lines(programs: Programs) -> None:
    server = ServeProcess({**programs.env,
                           "INFERSCALE_STORE_PATH": str(programs.tmp_path / "memory.sqlite"),
                           "INFERSCALE_KV_CACHE_GB": "1", "INFERSCALE_MAX_MODEL_LEN": "2048"},
                          **programs.popen())
    programs.started(server.process.pid)
    try:
        children = [p.pid for p in server.wait_ready()]
        os.killpg(server.process.pid, signal.SIGINT)  # Ctrl-C in its terminal
        assert server.process.wait(120) == 0, "".join(server.output)
    finally:
        server.finish()
    output = server.output
    # Only the project's own lines: its log records and the serving line.
    own = [line for line in output
           if line.startswith(("INFO inferscale_memory", "inferscale-memory serving"))
           or line.startswith("WARNING inferscale_memory.server.run: no API keys")]
    assert output and own == output, "".join(output)
    assert_gone(children)


def test_a_port_in_use_fails_the_server_at_once_before_an_engine_starts(
        programs: Programs) -> None:
    # The port is bound before the engine starts: a taken one is a clear error in seconds,
    # not a traceback after a minutes-long start, and no socket vLLM opens meanwhile can
    # take the server's port (CI once lost a run so).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        program = subprocess.run(
            [sys.executable, "-m", "inferscale_memory.cli", "serve", "--port", str(port)],
            env={**programs.env, "INFERSCALE_STORE_PATH": str(programs.tmp_path / "m.sqlite")},
            capture_output=True, text=True, timeout=120, **programs.popen())
    assert program.returncode == 2, program.stderr
    assert f"error: cannot serve on 127.0.0.1:{port}" in program.stderr, program.stderr
    assert "starting vLLM" not in program.stderr, program.stderr
    assert not (programs.tmp_path / "m.sqlite").exists()  # nor was the store opened


@pytest.mark.parametrize(("host", "port"), [("127.0.0.1", 65536), ("127.0.0.1", -1),
                                            ("no-such-host.invalid", 8000)])
def test_an_address_that_cannot_be_bound_is_a_config_error_before_anything_starts(
        host: str, port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inferscale_memory.errors import ConfigError
    from inferscale_memory.server import serve

    # A model that does not exist: reaching the engine would be another error.
    monkeypatch.setenv("INFERSCALE_MODEL", str(tmp_path / "no-model"))
    monkeypatch.setenv("INFERSCALE_STORE_PATH", str(tmp_path / "m.sqlite"))
    api_keys = tmp_path / "keys.json"  # with keys the server binds the host it is given
    api_keys.write_text('{"key-a": ["alice"]}')
    with pytest.raises(ConfigError, match=f"cannot serve on {host}:{port}"):
        serve(host=host, port=port, api_keys_path=api_keys)
    assert not (tmp_path / "m.sqlite").exists()


def test_an_engine_that_fails_to_start_leaves_no_process_and_closes_its_store(
        programs: Programs) -> None:
    # The vLLM engine and the store are opened before the header is captured; a failure
    # there must not leak them until the interpreter exits.
    code, out, err = run_script(programs, "start-fails")
    assert code == 0, err
    lines = out.splitlines()
    assert "failed: header capture failed" in lines and "store closed" in lines, out
    assert lines.index("store closed") < lines.index("failed: header capture failed")
    assert [line for line in lines if line.startswith("left:")] == ["left:"], out
