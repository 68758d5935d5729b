"""A script that starts an engine without ``if __name__ == "__main__":`` is told so in
one line, in the process that vLLM spawns, before anything heavy is loaded.

vLLM spawns its engine processes; multiprocessing's spawn runs the parent's main script
again in each (``spawn._fixup_main_from_path``, as module ``__mp_main__``). The tests run
that step on its own, as the spawned process does, so no engine is started.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

from inferscale_memory.engine import UNGUARDED

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    """The README's first Python example."""
    match = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert match is not None
    return match.group(1)


def rerun_as_spawned(script: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as a process that multiprocessing spawned from it would."""
    code = f"from multiprocessing import spawn; spawn._fixup_main_from_path({str(script)!r})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=script.parent)


def unguarded(example: str) -> str:
    """``example`` with its ``if __name__ == "__main__":`` block at the top level."""
    head, _, body = example.partition('if __name__ == "__main__":')
    return head + textwrap.dedent(body.split("\n", 1)[1])


def test_the_readme_example_runs_again_in_a_spawned_process(tmp_path: Path) -> None:
    example = readme_example()
    assert 'if __name__ == "__main__":' in example and "MemoryEngine()" in example
    script = tmp_path / "app.py"
    script.write_text(example)
    done = rerun_as_spawned(script)
    assert done.returncode == 0, done.stderr


def test_a_missing_guard_is_named_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(unguarded(readme_example()))
    assert "\nengine = MemoryEngine()" in script.read_text()
    done = rerun_as_spawned(script)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == \
        f"inferscale_memory.errors.EngineError: {UNGUARDED}"
