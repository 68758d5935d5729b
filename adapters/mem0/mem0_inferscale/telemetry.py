"""Mem0's telemetry, switched off for this package whichever was imported first.

Mem0 (mem0ai 2.2.1) reads ``MEM0_TELEMETRY`` once, when ``mem0`` is first imported, into
module globals that its capture functions check at each call (``mem0.memory.telemetry``,
and ``mem0.memory.main``, which imports it by name), and builds its hosted client's sender
then. Setting the variable after ``import mem0`` changes nothing, so this sets the globals
themselves: the same switch in either import order.
"""

from __future__ import annotations

import os

from mem0.memory import main, telemetry


def switch_off() -> None:
    """Turn Mem0's telemetry off, unless ``MEM0_TELEMETRY`` is set (Mem0's own switch,
    which Mem0 has read: ``MEM0_TELEMETRY=true`` opts in)."""
    if "MEM0_TELEMETRY" in os.environ:
        return
    telemetry.MEM0_TELEMETRY = False
    main.MEM0_TELEMETRY = False
    telemetry.client_telemetry.close()  # the sender Mem0 built at import; it sent nothing
