"""``examples/openai_client.py --base-url`` against the session's running server: the
example, run as a user runs it, stores its facts there and gets them injected."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from server_helpers import TIMEOUT

if TYPE_CHECKING:
    from inferscale_memory.server import ServerHandle

pytestmark = pytest.mark.engine
EXAMPLE = Path(__file__).parents[2] / "examples" / "openai_client.py"


def test_the_openai_example_answers_from_the_running_server_it_is_pointed_at(
        server: ServerHandle) -> None:
    env = {**os.environ, "OPENAI_API_KEY": "key-admin", "INFERSCALE_URL": "http://unused/v1"}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--base-url", f"{server.url}/v1"],
                          env=env, capture_output=True, text=True, timeout=3 * TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    kv = re.search(r"^\[kv\] injected (\d+) tokens, computed (\d+)", done.stdout, re.M)
    text = re.search(r"^\[text\] injected (\d+) tokens, computed (\d+)", done.stdout, re.M)
    assert kv and int(kv[1]) > 0, done.stdout
    assert text and int(text[1]) == 0 and int(text[2]) > int(kv[2]), done.stdout
    assert re.search(r"^streamed: \S", done.stdout, re.M), done.stdout
