"""vLLM's processes end when the process that owns the engine dies.

vLLM runs its engine core (and, on some executors, each worker) in child processes. When
the owner dies without shutting the engine down (``kill -9``, an OOM kill), nothing tells
them: they live on holding host and GPU memory, and a supervisor that restarts the server
piles them up. The engine marks its children with :data:`OWNER_ENV`; each of them watches
its parent (the engine core watches the owner, a worker the engine core) and ends when the
parent is gone, so the whole tree follows the owner.

A Ctrl-C in a terminal interrupts the whole process group, vLLM's processes included; they
ignore it (:func:`leave_interrupts_to_owner`), so the owner shuts the engine down in order
instead of finding its engine already dead.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)
OWNER_ENV = "INFERSCALE_ENGINE_OWNER"  # pid of the process that started the engine
POLL_S = 0.5
GRACE_S = 10.0  # after SIGTERM (vLLM's own shutdown), the hard exit

_watching = False


def mark_owner() -> None:
    """Called by the engine's owner before vLLM starts its processes (they inherit it)."""
    os.environ[OWNER_ENV] = str(os.getpid())


def watch_parent() -> None:
    """In a process vLLM started for an engine: end it when its parent dies.

    Idempotent; does nothing in the owner itself or outside an engine's process tree.
    """
    global _watching
    owner = os.environ.get(OWNER_ENV)
    if _watching or owner is None or owner == str(os.getpid()):
        return
    _watching = True
    parent = os.getppid()
    threading.Thread(target=_watch, args=(parent,), name="inferscale-lifeline",
                     daemon=True).start()


def leave_interrupts_to_owner() -> None:
    """In a process vLLM started for an engine: ignore SIGINT (the owner gets it too and
    stops the engine with SIGTERM, or :func:`watch_parent` ends it if the owner dies)."""
    owner = os.environ.get(OWNER_ENV)
    if owner is None or owner == str(os.getpid()):
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _watch(parent: int) -> None:
    while os.getppid() == parent:  # a dead parent's children are handed to another
        time.sleep(POLL_S)
    logger.warning("the engine's owner (pid %d) is gone: stopping pid %d", parent,
                   os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)  # vLLM's handler shuts the process down
    time.sleep(GRACE_S)
    os._exit(1)
