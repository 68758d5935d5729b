"""Mem0's telemetry is off with this package, whichever of the two was imported first.

Each case runs in a fresh interpreter (the import order is the point) and checks Mem0's own
switch: its module globals and the sender it builds at import. Nothing can be sent here
anyway (no network): the test checks the switch, not the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Prints Mem0's switch as mem0ai 2.2.1 reads it, and what its capture functions would send.
CHECK = """
import types
from mem0.memory import main, telemetry
sent = []
telemetry._get_oss_telemetry = lambda: sent.append("oss")
telemetry.client_telemetry.capture_event = lambda *args, **kwargs: sent.append("client")
telemetry.capture_event("mem0.search", None)
telemetry.capture_client_event("mem0.search", types.SimpleNamespace(user_email=None))
print(telemetry.MEM0_TELEMETRY, main.MEM0_TELEMETRY,
      telemetry.client_telemetry.posthog is None, sent)
"""


def mem0_switch(imports: list[str], folder: Path, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "MEM0_TELEMETRY"}
    environ.update(MEM0_DIR=str(folder), **env)
    code = "\n".join(f"import {name}" for name in imports) + CHECK
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("imports", [["mem0", "mem0_inferscale"], ["mem0_inferscale", "mem0"]],
                         ids=["mem0-first", "adapter-first"])
def test_telemetry_is_off_in_either_import_order(imports: list[str], tmp_path: Path) -> None:
    assert mem0_switch(imports, tmp_path) == "False False True []"


def test_mem0s_own_switch_still_turns_it_on(tmp_path: Path) -> None:
    # MEM0_TELEMETRY=true set by the user is Mem0's documented opt-in: left as Mem0 read it.
    on = mem0_switch(["mem0", "mem0_inferscale"], tmp_path, MEM0_TELEMETRY="true")
    assert on == "True True False ['oss', 'client']"
