"""Mem0 runs offline here: no telemetry, its files under the test's folders."""

import os

os.environ.setdefault("MEM0_TELEMETRY", "false")
